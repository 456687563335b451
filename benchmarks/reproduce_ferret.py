"""ferret-xai 0.4.2 as a peer of our faithfulness metrics: the same fine-tuned MiniLM, the same SST-2 sentences.

ferret (Attanasio et al. 2023) computes AOPC comprehensiveness and sufficiency for Gradient and
Integrated Gradients on Hugging Face models. It needs transformers < 5 and numpy < 2, so it runs
from its own virtual environment (``benchmarks/ferret_venv.sh DIR``, or ``--make-venv``) as a
subprocess, ``benchmarks/ferret_worker.py``, exchanging JSON files with this script.

1. The fine-tuned MiniLM: ``--run`` (an ``attnaudit finetune --task sst2`` run), else
   ``benchmarks/runs/minilm-sst2-N``, fine-tuned here like ``attnaudit finetune --task sst2
   --limit N`` with its defaults, N = ``--finetune-limit`` (reused when finished). ferret loads the run's
   ``hf/`` folder with transformers 4.x; the logits of both sides are compared first.
2. ``--limit`` GLUE-dev sentences (our ``sst2`` test split): a sample stratified by label, or the first
   ones with ``--limit-order first`` (the documented figures).
3. a. IDENTICAL scores: our ``gradient`` and ``ig`` scores go to ferret's evaluators. Per bin
      (1, 5, 10, 20, 50 %) at our ``k = ⌈f·n⌉`` (clipped to [1, n−1]) they must equal our
      comprehensiveness / sufficiency within ``--tolerance``; ferret's default AOPC (thresholds
      10..100 %, ``k = ⌊p·n⌋``, positive scores only, repeated sets skipped) is compared with the
      same definition computed by our perturbation code. Every perturbed input that ferret's
      decode → re-tokenise turns into other wordpieces is counted (the cause of what differs).
   b. End to end: ferret's own GradientExplainer / IntegratedGradientExplainer (×input) with its
      default evaluators beside our registry methods with our metrics (delete mode), and the
      Kendall τ between the two tools' token scores per sentence ([CLS]/[SEP] dropped).
   c. Time: explanations + both metrics for ``--time-sentences`` sentences, ours and ferret's
      interleaved over ``--repeats`` rounds (:func:`benchmarks.common.time_interleaved`).

Writes ``benchmarks/results/ferret.json``. Run:
``nice -n 5 .venv/bin/python benchmarks/reproduce_ferret.py --venv /tmp/ferret-venv --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats as sstats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.types import Batch, Example  # noqa: E402
from attnaudit.experiments.eraser_metrics import BINS, perturbation_probs, perturbed_probs, predictions, removable_items, top_count  # noqa: E402
from attnaudit.explain import EXPLANATIONS  # noqa: E402
from attnaudit.io import read_json  # noqa: E402
from attnaudit.run import Run, load_run  # noqa: E402
from benchmarks.common import RUNS, add_limit_order, headline, matmul_rate, time_interleaved, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "ferret_worker.py"
METHODS = ("gradient", "ig")
FERRET_THRESHOLDS = np.arange(0.1, 1.1, 0.1)  # ferret 0.4.2's default removal thresholds ("perc")


def tuned_run(args: argparse.Namespace) -> Run:
    """The fine-tuned MiniLM: ``--run``, else fine-tuned here (reused when finished)."""
    if args.run:
        return load_run(args.run, device="cpu", data_dir=args.data_dir)
    from attnaudit.training.finetune import finetune

    # `attnaudit finetune --task sst2 --limit N` with its defaults (lr 2e-5, batch 16, seed 0)
    return finetune("sst2", RUNS / f"minilm-sst2-{args.finetune_limit}", hf="minilm", epochs=1,
                    limit=args.finetune_limit, seed=0, data_dir=args.data_dir, device="cpu")


def ferret_sets(scores: np.ndarray) -> list[np.ndarray]:
    """The token sets ferret 0.4.2's default AOPC removes, in order (indices into ``scores``).

    For each threshold ``p`` of 10 %..100 %: the top ``⌊p·n⌋`` scores, keeping only positive ones
    (``only_pos``); none when that is empty; a set equal to the previous one is skipped.
    """
    out: list[np.ndarray] = []
    last: set[int] | None = None
    for p in FERRET_THRESHOLDS:
        v = int(p * len(scores))
        if not 0 < v <= len(scores):
            continue
        top = [int(i) for i in np.array(scores).argsort()[-v:][::-1] if scores[i] > 0]
        if not top or (last is not None and set(top) == last):
            continue
        last = set(top)
        out.append(np.asarray(top))
    return out


def ferret_default_ours(run: Run, batch: Batch, scores: dict[str, torch.Tensor], pred: torch.Tensor,
                        full: torch.Tensor) -> dict[str, np.ndarray]:
    """ferret's default AOPC definition computed with our perturbation code (delete mode), ``(B,)`` per metric.

    As in ferret: no set → comprehensiveness 0, sufficiency 1.
    """
    items = removable_items(run.model, batch).cpu()
    real = batch.mask.cpu()
    out: dict[str, np.ndarray] = {}
    for method, values in scores.items():
        rows, keeps, owner = [], [], []
        for b in range(len(batch)):
            positions = torch.nonzero(items[b]).squeeze(1)
            for chosen in ferret_sets(values[b][positions].numpy()):
                top = torch.zeros_like(items[b])
                top[positions[torch.as_tensor(chosen)]] = True
                keeps += [real[b] & ~top, real[b] & ~(items[b] & ~top)]
                rows += [b, b]
                owner += [b, b]
        if not keeps:
            out[f"{method}_comp"], out[f"{method}_suff"] = np.zeros(len(batch)), np.ones(len(batch))
            continue
        probs = perturbed_probs(run.model, batch, torch.tensor(rows), torch.stack(keeps), pred, "delete").numpy()
        comp, suff = np.zeros(len(batch)), np.ones(len(batch))
        owner_arr = np.asarray(owner)
        for b in range(len(batch)):
            mine = probs[owner_arr == b]
            if mine.size:
                comp[b] = float(full[b]) - mine[0::2].mean()
                suff[b] = float(full[b]) - mine[1::2].mean()
        out[f"{method}_comp"], out[f"{method}_suff"] = comp, suff
    return out


def our_chunk(run: Run, examples: list[Example], steps: int) -> list[dict[str, Any]]:
    """Our side for one chunk: token ids, logits, scores, ``k`` per bin, metrics per bin and AOPC."""
    batch = run.collate(examples)
    scores = {m: EXPLANATIONS[m](run.model, batch, steps=steps, seed=0).detach().double().cpu() for m in METHODS}
    pred, full = predictions(run.model, batch)
    with torch.no_grad():
        logits = run.model(batch).logits.double().cpu()
    n = removable_items(run.model, batch).cpu().sum(1)
    ks = torch.stack([top_count(n, p) for p in BINS], 1)
    removed, kept = perturbation_probs(run.model, batch, scores, BINS, "delete")  # (M, F, B)
    fdef = ferret_default_ours(run, batch, scores, pred, full)
    lengths = batch.mask.sum(1).tolist()
    rows = []
    for b, length in enumerate(lengths):
        row: dict[str, Any] = {
            "text": run.collate.texts([examples[b]])[0], "ids": batch.tokens[b, :length].tolist(),
            "logits": logits[b].tolist(), "target": int(pred[b]), "n": int(n[b]), "ks": ks[b].tolist(),
            "scores": {m: s[b, :length].tolist() for m, s in scores.items()},
        }
        for j, m in enumerate(METHODS):
            row[f"{m}_comp_bins"] = (float(full[b]) - removed[j, :, b].numpy()).tolist()
            row[f"{m}_suff_bins"] = (float(full[b]) - kept[j, :, b].numpy()).tolist()
            for key in ("comp", "suff"):
                row[f"{m}_{key}_aopc"] = float(np.mean(row[f"{m}_{key}_bins"]))
                row[f"{m}_{key}_ferret_default"] = float(fdef[f"{m}_{key}"][b])
        rows.append(row)
    return rows


def our_round(run: Run, examples: list[Example], steps: int, chunk: int) -> None:
    """The timed work on our side: both explanations and both metrics (delete mode, our bins), in the
    batches ``attnaudit run faithfulness`` makes (:meth:`~attnaudit.run.Run.sorted_batches`: by length)."""
    for _, batch in run.sorted_batches(examples, chunk):
        scores = {m: EXPLANATIONS[m](run.model, batch, steps=steps, seed=0).detach().double().cpu() for m in METHODS}
        perturbation_probs(run.model, batch, scores, BINS, "delete")


def arithmetic_floor(run: Run, examples: list[Example], steps: int, chunk: int) -> dict[str, Any]:
    """What :func:`our_round` must compute at the least: the linear-layer arithmetic of its model passes as run
    (2 operations per weight of the attention blocks per row a linear layer is given, padding included, twice more
    for a pass that is differentiated: the gradient w.r.t. the inputs, no weight gradients) and the seconds that
    takes at the rate of a large float32 matrix product on the same threads."""
    flop = {"forward_only": 0, "forward_backward": 0}

    def count(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        rows = args[0].numel() // module.in_features  # type: ignore[operator]
        flop["forward_backward" if torch.is_grad_enabled() else "forward_only"] += 2 * rows * module.weight.numel()  # type: ignore[operator]

    linears = [m for block in run.model.layers for m in block.modules() if isinstance(m, torch.nn.Linear)]
    handles = [m.register_forward_pre_hook(count) for m in linears]
    try:
        our_round(run, examples, steps, chunk)
    finally:
        for handle in handles:
            handle.remove()
    gflop = (flop["forward_only"] + 2 * flop["forward_backward"]) / 1e9
    rate = matmul_rate()
    return {"forward_gflop": {k: v / 1e9 for k, v in flop.items()}, "linear_gflop": gflop, "matmul_gflop_per_s": rate,
            "seconds_at_matmul_rate": gflop / rate,
            "what": "linear-layer arithmetic of the attention blocks in every model pass of one round of ours, as run (2 FLOP "
                    "per weight per row given, padding included), x2 for passes with a backward (input gradients only); "
                    "at a 2048-square float32 matmul's rate"}


# --------------------------------------------------------------------------- ferret's side


def worker_python(venv: Path, make: bool) -> Path:
    """The ferret venv's python; built with ``benchmarks/ferret_venv.sh`` when ``make`` and absent."""
    python = venv / "bin" / "python"
    if not python.exists() and make:
        subprocess.run(["bash", str(HERE / "ferret_venv.sh"), str(venv)], check=True)
    if not python.exists():
        sys.exit(f"error: {python} not found; build it with benchmarks/ferret_venv.sh {venv} (or pass --make-venv)")
    return python


def job(run: Run, rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON the worker reads: model folder, settings and our per-sentence data."""
    keep = ("text", "ids", "target", "ks", "scores")
    return {"model_dir": str(Path(run.path) / "hf"), "threads": args.threads, "ig_steps": args.ig_steps,
            "methods": list(METHODS), "sentences": [{k: r[k] for k in keep} for r in rows]}


def ferret_measure(python: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """Run ``ferret_worker.py measure`` on ``payload``; its JSON answer."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "job.json"), Path(tmp, "out.json")
        src.write_text(json.dumps(payload), encoding="utf-8")
        subprocess.run([str(python), str(WORKER), "measure", str(src), str(dst)], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": str(payload["threads"]), "PYTHONWARNINGS": "ignore"})
        return json.loads(dst.read_text(encoding="utf-8"))


class FerretServer:
    """``ferret_worker.py serve``: one timed ferret round per request, the model loaded once."""

    def __init__(self, python: Path, payload: dict[str, Any], folder: Path) -> None:
        path = folder / "serve.json"
        path.write_text(json.dumps(payload), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": str(payload["threads"]), "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen([str(python), str(WORKER), "serve", str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.read()  # {"ready": true}
        self.inner: list[float] = []

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("ferret worker stopped")
        return json.loads(line)

    def round(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        self.inner.append(float(self.read()["seconds"]))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# --------------------------------------------------------------------------- comparisons


def agreement(ours: np.ndarray, theirs: np.ndarray, tol: float) -> dict[str, Any]:
    """Max and mean absolute difference and the fraction within ``tol`` over the finite pairs."""
    diff = np.abs(np.asarray(ours, float) - np.asarray(theirs, float))
    diff = diff[np.isfinite(diff)]
    if not diff.size:
        return {"n": 0}
    return {"n": int(diff.size), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "fraction_within_tolerance": float(np.mean(diff <= tol))}


def identical_scores(rows: list[dict[str, Any]], answer: dict[str, Any], tol: float) -> dict[str, Any]:
    """3a: our metrics and ferret's evaluators on the same scores, per bin and for ferret's default AOPC."""
    out: dict[str, Any] = {}
    for m in METHODS:
        given = answer["given"][m]
        positive = sum(all(v > 0 for v in r["scores"][m][1:-1]) for r in rows)
        entry: dict[str, Any] = {"sentences_with_all_scores_positive": positive}
        for key in ("comp", "suff"):
            ours = np.array([r[f"{m}_{key}_bins"] for r in rows])
            theirs = np.array([g["bins"][key] for g in given])
            changed = np.array([g["bins"][f"{key}_changed"] for g in given], dtype=bool)
            entry[f"{key}_per_bin"] = {
                "all": agreement(ours, theirs, tol),
                "ferret_input_unchanged": agreement(ours[~changed], theirs[~changed], tol),
                "ferret_input_retokenised": agreement(ours[changed], theirs[changed], tol),
                "retokenised_perturbations": int(changed.sum()),
                "by_bin": {f"{p:g}%": agreement(ours[:, i], theirs[:, i], tol) for i, p in enumerate(BINS)},
            }
            fd_ours = np.array([r[f"{m}_{key}_ferret_default"] for r in rows])
            fd_theirs = np.array([g["default"][key] for g in given])
            retok = np.array([g["default_retokenised"] for g in given], dtype=bool)
            entry[f"{key}_ferret_default_aopc"] = {
                **agreement(fd_ours, fd_theirs, tol),
                "ferret_mean": float(np.mean(fd_theirs)), "ours_same_definition_mean": float(np.mean(fd_ours)),
                "sentences_ferret_input_unchanged": agreement(fd_ours[~retok], fd_theirs[~retok], tol),
                "sentences_with_a_retokenised_input": int(retok.sum()),
            }
        entry["retokenised_examples"] = [g["bins"]["example"] for g in given if "example" in g["bins"]][:3]
        out[m] = entry
    return out


def kendall(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall τ-b (scipy), NaN for fewer than two items."""
    return float(sstats.kendalltau(a, b)[0]) if len(a) >= 2 else math.nan


def end_to_end(rows: list[dict[str, Any]], answer: dict[str, Any]) -> dict[str, Any]:
    """3b: each tool's own explanations and metrics side by side; τ between their token scores."""
    out: dict[str, Any] = {}
    for m in METHODS:
        own = answer["own"][m]
        taus, abs_taus = [], []
        for r, f in zip(rows, own):
            if len(f["scores"]) != len(r["scores"][m]):
                continue
            ours, theirs = np.array(r["scores"][m][1:-1]), np.array(f["scores"][1:-1])
            taus.append(kendall(ours, theirs))
            abs_taus.append(kendall(ours, np.abs(theirs)))
        entry: dict[str, Any] = {}
        for key in ("comp", "suff"):
            ours = np.array([r[f"{m}_{key}_aopc"] for r in rows])
            entry[f"aopc_{key}"] = {"ours": float(np.nanmean(ours)), "ferret": float(np.mean([f["default"][key] for f in own])),
                                    "ours_n": int(np.isfinite(ours).sum())}
        for name, values in (("kendall_tau", taus), ("kendall_tau_vs_abs_ferret", abs_taus)):
            arr = np.array(values)
            arr = arr[np.isfinite(arr)]
            entry[name] = {"mean": float(arr.mean()), "median": float(np.median(arr)), "min": float(arr.min()),
                           "max": float(arr.max()), "fraction_positive": float(np.mean(arr > 0)), "n": int(arr.size)}
        out[m] = entry
    return out


def checks(rows: list[dict[str, Any]], answer: dict[str, Any]) -> dict[str, Any]:
    """Same inputs and same model: token ids equal, and the largest logit difference."""
    same = [r["ids"] == ids for r, ids in zip(rows, answer["ids"])]
    diff = max(float(np.max(np.abs(np.array(r["logits"]) - np.array(f)))) for r, f in zip(rows, answer["logits"]))
    preds = sum(int(np.argmax(f)) == r["target"] for r, f in zip(rows, answer["logits"]))
    return {"sentences": len(rows), "token_ids_equal": int(sum(same)), "logits_max_abs_diff": diff,
            "same_prediction": preds, "ferret_attn_implementation": answer["attn_implementation"],
            "ferret_versions": answer["versions"]}


def timing(run: Run, python: Path, rows: list[dict[str, Any]], examples: list[Example], own: dict[str, Any],
           args: argparse.Namespace) -> dict[str, Any]:
    """3c: ours vs ferret's explanations + both metrics on the first ``--time-sentences`` sentences, interleaved."""
    count = min(args.time_sentences, len(rows))
    with tempfile.TemporaryDirectory() as tmp:
        server = FerretServer(python, job(run, rows[:count], args), Path(tmp))
        try:
            record, _ = time_interleaved(
                {"ours": lambda: our_round(run, examples[:count], args.ig_steps, args.chunk), "peer": server.round},
                args.repeats,
            )
        finally:
            server.close()
    record["sentences"] = count
    record["perturbed_inputs_per_round"] = {
        "ours": 2 * len(BINS) * len(METHODS) * count,
        "ferret": sum(2 * len(ferret_sets(np.array(f["scores"][1:-1]))) for m in METHODS for f in own[m][:count]),
    }
    record["peer_seconds_inside_worker"] = server.inner
    record["our_arithmetic_floor"] = floor = arithmetic_floor(run, examples[:count], args.ig_steps, args.chunk)
    floor["best_ratio_at_the_floor"] = record["seconds"]["peer"]["median"] / floor["seconds_at_matmul_rate"]
    record["work"] = (f"ours: gradient + ig ({args.ig_steps} steps) and comprehensiveness + sufficiency at bins "
                      f"{list(BINS)} % (delete), batches of {args.chunk} by length as `attnaudit run faithfulness` makes them; "
                      "ferret: GradientExplainer + "
                      f"IntegratedGradientExplainer ({args.ig_steps} steps) + AOPC_Comprehensiveness/Sufficiency "
                      "with ferret's defaults (up to 10 thresholds), one sentence at a time")
    return record


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNAUDIT_DATA", "../shared/data"), help="default $ATTNAUDIT_DATA")
    parser.add_argument("--run", help="a fine-tuned MiniLM run (attnaudit finetune --task sst2 ...)")
    parser.add_argument("--finetune-limit", type=int, default=4000, help="SST-2 phrases to fine-tune on without --run")
    parser.add_argument("--limit", type=int, default=100, help="GLUE-dev sentences to compare")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="absolute tolerance on probability differences")
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--chunk", type=int, default=16, help="sentences per batch on our side")
    parser.add_argument("--time-sentences", type=int, default=20, help="sentences per timed round")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--venv", default=os.environ.get("ATTNAUDIT_FERRET_VENV", str(RUNS / "ferret-venv")),
                        help="ferret's virtual environment (default $ATTNAUDIT_FERRET_VENV, else benchmarks/runs/ferret-venv)")
    parser.add_argument("--make-venv", action="store_true", help="build --venv with benchmarks/ferret_venv.sh if missing")
    parser.add_argument("--name", default="ferret", help="result name: benchmarks/results/NAME.json")
    add_limit_order(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    python = worker_python(Path(args.venv), args.make_venv)
    run = tuned_run(args)
    examples = run.examples("test", args.limit, data_dir=args.data_dir, order=args.limit_order)
    rows = [row for start in range(0, len(examples), args.chunk)
            for row in our_chunk(run, examples[start : start + args.chunk], args.ig_steps)]
    answer = ferret_measure(python, job(run, rows, args))
    metrics = read_json(Path(run.path) / "metrics.json")
    result: dict[str, Any] = {
        "run": str(run.path), "finetune": run.info.get("finetune"), "glue_dev_accuracy": metrics["test"].get("accuracy"),
        "sentences": len(rows), "limit_order": args.limit_order, "tolerance": args.tolerance, "ig_steps": args.ig_steps, "threads": args.threads,
        "bins": list(BINS), "checks": checks(rows, answer),
        "identical_scores": identical_scores(rows, answer, args.tolerance),
        "end_to_end": end_to_end(rows, answer),
        "ferret_measure_seconds": answer["seconds"],
    }
    if args.repeats:
        result["timing"] = timing(run, python, rows, examples, answer["own"], args)
        result.update(headline(result["timing"]))
    result["load_average"] = list(os.getloadavg())
    write_result(args.name, result)
    print(json.dumps({k: result[k] for k in ("checks", "identical_scores", "end_to_end")}, indent=1)[:6000])
    return result


if __name__ == "__main__":
    main()
