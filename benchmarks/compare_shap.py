"""Our ``kernel_shap`` against shap's ``KernelExplainer`` on the same model function, features, masker and background.

Run from attnaudit's venv: ``python -m benchmarks.compare_shap --venv /tmp/shap-venv`` (the venv of
``benchmarks/shap_venv.sh``; without it, or without ``../shared/data/sst2``, it says so and exits 0 having written
nothing). Never part of ``make test``.

The case: SmolLM2-135M-Instruct explains its next token after ``"Review: {text}\\nSentiment:"`` for the first
``--n`` GLUE SST-2 dev sentences of ``--min-words`` to ``--max-words`` words (7 to 8: ``2^M`` coalitions per call cost
minutes on this machine's one thread at ``M`` = 10); the features are the sentence's words (spans given as
``--segments`` JSON spans, so the template's tokens are no feature and always stay); the explained value is the
probability of the predicted next token; the masker is the baseline token (``--baseline``, ``unk`` by default:
every token of a perturbed word replaced by it, the length kept), so shap's background is the one row of zeros
(every word perturbed) and the explained row the one of ones. shap runs in a persistent worker
(``benchmarks/shap_worker.py --serve``) on the same weights (the folder attnaudit's GGUF cache de-quantised,
float32), ``l1_reg=False``.

Two regimes per sentence, with ``M`` words:

* **exact**: ``2^M`` samples. shap enumerates every coalition; ours does too (``samples ≥ 2^M``); both must equal the
  exact Shapley values: max |ours − shap| ≤ ``TOLERANCE``;
* **sampled**: ``--samples`` coalitions (below ``2^M``). shap enumerates the smallest and largest coalition sizes its
  budget covers and samples the rest; ours draws Captum's random coalitions. Each is reported against the exact
  values of the first regime (max |·|, and Spearman's ρ), no tolerance.

Timing: ``--repeats`` interleaved rounds (:func:`benchmarks.common.time_interleaved`, one untimed warm-up each), one
torch thread on both sides; shap's time is taken in this process around the worker call (JSON of ``M`` numbers each
way), its own time inside the worker is recorded beside it. Writes ``benchmarks/results/shap_comparison.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (OpenMP reads it once)

import argparse  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPEATS, ROOT, PeerWorker, time_interleaved, write_result  # noqa: E402

TEMPLATE = "Review: {text}\nSentiment:"
SHAP_VENV = Path(os.environ.get("ATTNAUDIT_SHAP_VENV", "/tmp/shap-venv"))
SHAP_INSTALL = "benchmarks/shap_venv.sh /tmp/shap-venv  (or set ATTNAUDIT_SHAP_VENV to such a venv)"
WORKER = ROOT / "benchmarks" / "shap_worker.py"
TOLERANCE = 1e-5
"""Largest allowed max |ours − shap| when both enumerate every coalition (float32 models, float64 fits)."""


def shap_python(venv: Path = SHAP_VENV) -> Path | None:
    """The shap venv's python, or None when the venv (with shap installed) is absent."""
    python = venv / "bin" / "python"
    found = list((venv / "lib").glob("python*/site-packages/shap/explainers")) if python.exists() else []
    return python if found else None


class Worker(PeerWorker):
    """The persistent shap worker: one JSON request per line, one answer per line."""

    def __init__(self, python: Path, threads: int = 1) -> None:
        super().__init__(python, WORKER, threads, "shap", RuntimeError)


def word_spans(text: str, start: int = 0) -> list[list[int]]:
    """``[start, end)`` character spans of ``text``'s whitespace-separated words, shifted by ``start``."""
    return [[m.start() + start, m.end() + start] for m in re.finditer(r"\S+", text)]


def prepare(run: Any, prompt: str, spans: list[list[int]] | None, baseline: str) -> dict[str, Any]:
    """The next-token case of ``prompt`` with its features (``spans``, else every token): the batch, and what the
    worker needs to build the same model function (ids, each position's feature, baseline and pad ids, target)."""
    import torch

    from attnaudit.explain.generation import decoder_rows, encode_exactly
    from attnaudit.explain.helpers.features import feature_groups
    from attnaudit.explain.helpers.perturbation import token_baseline
    from attnaudit.explain.helpers.segments import segment_text
    from attnaudit.models.interface import language_model

    model = language_model(run.model, "the shap comparison")
    with model.next_token_decision():
        ids = encode_exactly(model.tokenizer, prompt)
        batch = decoder_rows(model, ids, [], 1)
        if spans is not None:
            batch = segment_text(model, batch, prompt, "span", [tuple(s) for s in spans], None)
        with torch.no_grad():
            target = int(model(batch).probs[0].argmax())
        groups = feature_groups(model, batch)[0]
    return {"batch": batch, "ids": ids, "groups": groups.tolist(), "target": target, "pad": int(model.config.pad_id),
            "baseline": None if baseline == "delete" else token_baseline(model, baseline), "baseline_name": baseline,
            "features": int(groups.max()) + 1}


def ours(run: Any, case: dict[str, Any], samples: int, seed: int) -> list[float]:
    """Our ``kernel_shap`` of the case, one value per feature (read at each feature's first token)."""
    import torch

    from attnaudit.explain import get_explanation
    from attnaudit.models.interface import language_model

    with language_model(run.model, "the shap comparison").next_token_decision():
        scores = get_explanation("kernel_shap")(run, case["batch"], samples=samples, seed=seed, baseline=case["baseline_name"])[0]
    groups = torch.tensor(case["groups"])
    return [float(scores[(groups == g).nonzero()[0, 0]]) for g in range(case["features"])]


def theirs(worker: Worker, folder: Path, case: dict[str, Any], samples: int, seed: int) -> dict[str, Any]:
    """shap's ``KernelExplainer`` on the same case in the worker."""
    return worker.ask(op="explain", model=str(folder), ids=case["ids"], groups=case["groups"], baseline=case["baseline"],
                      pad=case["pad"], target=case["target"], nsamples=samples, seed=seed)


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def compare_sentence(run: Any, worker: Worker, folder: Path, text: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both regimes on one sentence, timed in interleaved rounds."""
    prompt = TEMPLATE.format(text=text)
    case = prepare(run, prompt, word_spans(text, TEMPLATE.index("{text}")), args.baseline)
    m = case["features"]
    budgets = {"exact": 1 << m, "sampled": args.samples}
    fns, inside = {}, {}
    for regime, samples in budgets.items():
        fns[f"ours_{regime}"] = lambda samples=samples: ours(run, case, samples, args.seed)

        def peer(samples: int = samples, regime: str = regime) -> list[float]:
            answer = theirs(worker, folder, case, samples, args.seed)
            inside.setdefault(regime, []).append(answer["seconds"])
            return answer["values"]

        fns[f"shap_{regime}"] = peer
    timing, out = time_interleaved(fns, args.repeats, ratios={r: (f"shap_{r}", f"ours_{r}") for r in budgets})
    exact = out["shap_exact"]
    record: dict[str, Any] = {"text": text, "features": m, "tokens": len(case["ids"]),
                              "explained_token": run.model.tokenizer.decode([case["target"]]), "exact_shapley": exact, "timing": timing}
    record["exact"] = {"samples": budgets["exact"], "ours": out["ours_exact"], "max_abs_diff": max_diff(out["ours_exact"], exact),
                       "agree": max_diff(out["ours_exact"], exact) <= TOLERANCE, "shap_seconds_inside_worker": inside["exact"][1:]}
    record["sampled"] = {
        "samples": args.samples, "ours": out["ours_sampled"], "shap": out["shap_sampled"],
        "ours_vs_exact_max_abs": max_diff(out["ours_sampled"], exact), "shap_vs_exact_max_abs": max_diff(out["shap_sampled"], exact),
        "ours_vs_shap_max_abs": max_diff(out["ours_sampled"], out["shap_sampled"]),
        "ours_vs_exact_spearman": spearman(out["ours_sampled"], exact), "shap_vs_exact_spearman": spearman(out["shap_sampled"], exact),
        "shap_seconds_inside_worker": inside["sampled"][1:],
    }
    record["max_abs_exact_value"] = max(abs(v) for v in exact)
    return record


def short_sentences(data_dir: Path, n: int, low: int = 7, high: int = 8) -> list[str] | None:
    """The first ``n`` SST-2 dev sentences of ``low`` to ``high`` words, or None without the file."""
    from benchmarks.compare_inseq import sentences

    found = sentences(data_dir, 10_000)
    if found is None:
        return None
    return [s for s in found if low <= len(s.split()) <= high][:n]


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, default=SHAP_VENV, help="the shap venv (benchmarks/shap_venv.sh)")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--n", type=int, default=3, help="SST-2 dev sentences (of --min-words to --max-words words)")
    parser.add_argument("--min-words", type=int, default=7, help="fewest words (features) of a sentence: 2^M must exceed --samples")
    parser.add_argument("--max-words", type=int, default=8, help="most words (features) of a sentence: 2^M coalitions per exact call")
    parser.add_argument("--samples", type=int, default=48, help="the sampled regime's coalitions (both sides)")
    parser.add_argument("--baseline", default="unk", help="the masker: the token a perturbed word's tokens become (unk, pad, eos), or delete")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    python = shap_python(args.venv)
    texts = short_sentences(args.data_dir, args.n, args.min_words, args.max_words)
    if python is None or not texts:
        why = f"no shap venv; build it with {SHAP_INSTALL}" if python is None else f"no SST-2 dev sentences in {args.data_dir}"
        print(f"nothing written: {why}")
        return None
    import torch

    from attnaudit.resolve import name_model
    from benchmarks.compare_inseq import smollm2_folder

    torch.set_num_threads(1)
    run = name_model(source="smollm2").load("cpu", None)
    worker = Worker(python)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            folder, label = smollm2_folder(run, Path(scratch))
            versions = worker.ask(op="load", model=str(folder), threads=1)["versions"]
            cases = [compare_sentence(run, worker, folder, text, args) for text in texts]
    finally:
        worker.close()
    result = {
        "agree": all(c["exact"]["agree"] for c in cases),
        "tolerance": f"exact regime (2^M samples, both enumerate): max |ours − shap| <= {TOLERANCE:g}",
        "cases": cases,
        "model": label, "template": TEMPLATE, "features": "the sentence's words (JSON spans); template tokens always kept",
        "explained": "p(predicted next token)", "masker": f"baseline token {args.baseline!r} (shap: background row of zeros)",
        "samples": args.samples, "seed": args.seed, "threads": 1, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "peer": {"library": "shap KernelExplainer (l1_reg=False)", "versions": versions},
    }
    write_result("shap_comparison", result)
    return result


if __name__ == "__main__":
    out = main()
    for c in (out or {}).get("cases", []):
        t = c["timing"]
        print(f"{c['text'][:40]!r} M={c['features']}: exact max|ours-shap| {c['exact']['max_abs_diff']:.1e} (agree={c['exact']['agree']}), "
              f"shap/ours time {t['exact']['median']:.2f}x; sampled {c['sampled']['samples']}: "
              f"ours-exact {c['sampled']['ours_vs_exact_max_abs']:.1e}, shap-exact {c['sampled']['shap_vs_exact_max_abs']:.1e}, "
              f"shap/ours time {t['sampled']['median']:.2f}x")
