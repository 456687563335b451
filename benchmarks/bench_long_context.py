"""Long context: SmolLM2-135M-Instruct's next token explained at T = 1,024 … 8,192 tokens (its limit) on the CPU: the
peak memory and time of each against transformers' own forward and inseq 0.7.1's attention and saliency.

Every case runs in a fresh process (one thread, ``OMP_WAIT_POLICY=PASSIVE``, address space capped at ``--cap-gb``, so
a case that would exhaust the shared machine fails alone and is recorded as such), which loads the model, then does
the one operation on the same first T tokens of a text made of SST-2 training sentences:

* ``hf_forward``: transformers' model with ``attn_implementation="sdpa"``, ``model(input_ids)`` under ``no_grad``
  (logits at every position, as a plain call gives them); ``hf_forward_last``: the same with ``logits_to_keep=1``
  (the next token's logits alone, the least a next-token forward needs);
* ``ours_attention``, ``ours_gradient``, ``ours_input_gradient``: ``attnaudit.explain.explain_text(run, text,
  methods=[M], max_length=T)`` (what ``attnaudit explain --hf smollm2 --max-length T --method M`` runs: the decision,
  every layer's and head's attention row of the explained position, the method), ``input_gradient`` with inseq's
  definitions (``score=probability, reduction=l2``);
* ``inseq_attention``, ``inseq_saliency``: in inseq's venv (``benchmarks/inseq_venv.sh``), ``inseq.load_model(folder,
  M)`` and ``model.attribute(text, method=M, generation_args={"max_new_tokens": 1})``: one generated token
  attributed (inseq re-tokenises the decoded text; the length it read is recorded).

Both load the same safetensors folder (attnaudit's GGUF cache of the embedded model, float32). Per case: ``seconds``
(the operation alone, one run: memory is the measure here, not a speed claim), ``peak_rss_mb`` (the process's
peak resident memory, ``ru_maxrss``, loading included), ``loaded_rss_mb`` (resident after loading) and
``operation_peak_mb`` (the peak resident memory during the operation alone: the kernel's peak counter is reset after
loading, ``/proc/self/clear_refs``). ``ratio``: ours / ``hf_forward`` of the same T, per measure.
``loaded_anon_mb`` / ``loaded_file_mb`` (and ``after_*`` once the operation is done) split the resident memory into
the process's own (``RssAnon``) and pages of mapped files (``RssFile``): transformers maps the safetensors file and
reads a weight's pages when the first forward touches them, so its ``loaded_rss_mb`` holds few of the 538 MB of
weights; attnaudit's load runs a dry batch through the model (the checks of :class:`HFModel`), which pages all of them
in. Both hold the same weights once the operation has run (``after_file_mb``); ``peak_rss_mb`` compares the two.

Run: ``python -m benchmarks.bench_long_context --venv /tmp/inseq-venv --data-dir ../shared/data``; writes
``benchmarks/results/long_context.json``. Never part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (1024, 2048, 4096, 8192)
OURS = {"ours_attention": ("attention", {}), "ours_gradient": ("gradient", {}),
        "ours_input_gradient": ("input_gradient", {"score": "probability", "reduction": "l2"})}
HF = ("hf_forward", "hf_forward_last")
PEER = {"inseq_saliency": "saliency", "inseq_attention": "attention"}
ORDER = ("hf_forward", "ours_attention", "ours_input_gradient", "inseq_saliency", "inseq_attention", "ours_gradient", "hf_forward_last")
"""The order cases run in at each T (what matters most first)."""


def _status(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(case: str, folder: str, ids_path: str, length: int) -> dict[str, Any]:
    """One case in this (fresh) process: load, reset the peak counter, run the operation once."""
    import torch

    torch.set_num_threads(1)
    payload = json.loads(Path(ids_path).read_text())
    ids, text = payload["ids"][:length], payload["text"]
    result: dict[str, Any] = {}
    if case in HF:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa", dtype=torch.float32).eval()

        def operation() -> None:
            extra = {"logits_to_keep": 1} if case == "hf_forward_last" else {}
            with torch.no_grad():
                model(input_ids=torch.tensor([ids]), use_cache=False, **extra)
    elif case in OURS:
        from attnaudit.explain.text import explain_text
        from attnaudit.hf import load_hf

        run = load_hf(folder, device="cpu")
        method, options = OURS[case]

        def operation() -> None:
            explained = explain_text(run, text, methods=[method], max_length=length, options=options)
            result["tokens"] = len(explained.tokens)
    else:
        import inseq

        model = inseq.load_model(folder, PEER[case])
        model.model.eval()
        prompt = model.tokenizer.decode(ids)

        def operation() -> None:
            out = model.attribute(prompt, method=PEER[case], show_progress=False, generation_args={"max_new_tokens": 1, "do_sample": False})
            result["tokens"] = len(out.sequence_attributions[0].target) - 1
    result.update(loaded_rss_mb=_status("VmRSS"), loaded_anon_mb=_status("RssAnon"), loaded_file_mb=_status("RssFile"))
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident counter restarts here
    start = time.perf_counter()
    operation()
    result.update(seconds=time.perf_counter() - start, operation_peak_mb=_status("VmHWM"),
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  after_anon_mb=_status("RssAnon"), after_file_mb=_status("RssFile"))
    result.setdefault("tokens", length)
    return result


def text_ids(folder: Path, data_dir: Path, length: int) -> dict[str, Any]:
    """SST-2 training sentences joined until they exceed ``length`` tokens, and their token ids."""
    import csv

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    with (data_dir / "sst2" / "train.tsv").open(encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        pieces: list[str] = []
        for row in rows:
            pieces.append(row["sentence"].strip())
            if len(pieces) % 50 == 0 and len(tokenizer(" ".join(pieces))["input_ids"]) > length + 64:
                break
    text = " ".join(pieces)
    return {"text": text, "ids": tokenizer(text)["input_ids"]}


def spawn(python: str, case: str, folder: Path, ids_path: Path, length: int, cap_gb: float) -> dict[str, Any]:
    """One case in a fresh process under the address-space cap; its answer, or how it failed."""
    cap = int(cap_gb * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT / "src")}
    command = [python, str(Path(__file__).resolve()), "--child", case, "--folder", str(folder), "--ids", str(ids_path), "--length", str(length)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, preexec_fn=limit, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
    memory = any(word in done.stderr for word in ("can't allocate memory", "MemoryError", "not enough memory", "std::bad_alloc"))
    return {"failed": "out of memory under the cap" if memory else f"exit {done.returncode}", "error": tail}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, help="inseq's venv (benchmarks/inseq_venv.sh); without it inseq is left out")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--cases", help="comma-separated cases to run (default: all but ours_gradient, which costs as much as "
                        "ours_input_gradient)")
    parser.add_argument("--name", default="long_context", help="the result file's name (parts measured side by side)")
    parser.add_argument("--merge", help="comma-separated result names whose lengths make up --name (no measuring)")
    parser.add_argument("--cap-gb", type=float, default=12.0, help="address-space cap of every case's process (GiB)")
    parser.add_argument("--child"), parser.add_argument("--folder"), parser.add_argument("--ids"), parser.add_argument("--length", type=int)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.folder, args.ids, args.length)), flush=True)
        return None
    sys.path.insert(0, str(ROOT))
    from attnaudit.hf import load_hf
    from attnaudit.models.hf import gguf_cache_folder
    from attnaudit.pretrained import smollm2_path
    from benchmarks.common import write_result

    if args.merge:
        return merge(args.name, args.merge.split(","))
    if not (args.data_dir / "sst2" / "train.tsv").is_file():
        print(f"no {args.data_dir / 'sst2' / 'train.tsv'}: nothing measured")
        return None
    folder = gguf_cache_folder(Path(smollm2_path()))
    if not (folder / "model.safetensors").is_file():
        load_hf("smollm2", device="cpu")  # writes the cache
    lengths = [int(x) for x in args.lengths.split(",")]
    scratch = ROOT / "benchmarks" / "runs"
    scratch.mkdir(parents=True, exist_ok=True)
    ids_path = scratch / f"{args.name}_ids.json"
    known = json.loads(ids_path.read_text()) if ids_path.is_file() else {}
    if known.get("for_length") != max(lengths):  # the text depends on the data and the longest T alone
        ids_path.write_text(json.dumps({**text_ids(folder, args.data_dir, max(lengths)), "for_length": max(lengths)}))
    peer_python = args.venv / "bin" / "python" if args.venv is not None and (args.venv / "bin" / "python").is_file() else None
    cases = [*HF, *OURS, *(PEER if peer_python is not None else ())]
    chosen = args.cases.split(",") if args.cases else [c for c in cases if c != "ours_gradient"]
    cases = sorted((c for c in cases if c in chosen), key=ORDER.index)
    rows: list[dict[str, Any]] = []
    for length in lengths:
        row: dict[str, Any] = {"tokens": length, "cases": {}, "ratio_to_hf_forward": {}}
        rows.append(row)
        for case in cases:
            python = str(peer_python) if case in PEER else sys.executable
            row["cases"][case] = answer = spawn(python, case, folder, ids_path, length, args.cap_gb)
            print(f"T={length} {case}: {answer}", flush=True)
            row["ratio_to_hf_forward"] = ratios(row["cases"])
            write_result(args.name, summary(rows, args.cap_gb, cases, peer_python is not None))  # each case as it completes
    return summary(rows, args.cap_gb, cases, peer_python is not None)


def ratios(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each completed case's figures over ``hf_forward``'s at the same T (none without it)."""
    base = cases.get("hf_forward")
    if not base or "failed" in base:
        return {}
    return {name: {measure: got[measure] / base[measure] for measure in ("peak_rss_mb", "operation_peak_mb", "seconds")}
            for name, got in cases.items() if name != "hf_forward" and "failed" not in got}


def merge(name: str, parts: list[str]) -> dict[str, Any]:
    """``name``'s result from the lengths of ``parts`` (each measured by its own command, recorded under ``parts``)."""
    from benchmarks.common import RESULTS, write_result

    loaded = [json.loads((RESULTS / f"{part}.json").read_text()) for part in parts]
    by_length: dict[int, dict[str, Any]] = {}
    for part in loaded:  # parts may measure different cases of one T
        for row in part["lengths"]:
            by_length.setdefault(row["tokens"], {"tokens": row["tokens"], "cases": {}})["cases"].update(row["cases"])
    rows = [by_length[length] for length in sorted(by_length)]
    for row in rows:
        row["ratio_to_hf_forward"] = ratios(row["cases"])
    cases = sorted({case for part in loaded for case in part["cases"]}, key=ORDER.index)
    payload = summary(rows, loaded[0]["cap_gb"], cases, any(part["peer"] is not None for part in loaded))
    payload["parts"] = [{key: part[key] for key in ("name", "command", "commit", "load_average")} for part in loaded]
    write_result(name, payload)
    return payload


def summary(rows: list[dict[str, Any]], cap_gb: float, cases: list[str], peer: bool) -> dict[str, Any]:
    """The result file's payload from the lengths measured so far."""
    ours_worst = max((r["ratio_to_hf_forward"][c]["peak_rss_mb"] for r in rows for c in OURS if c in r["ratio_to_hf_forward"]), default=None)
    payload = {
        "model": "SmolLM2-135M-Instruct (embedded GGUF de-quantised by attnaudit's cache, float32, the same folder for all)",
        "text": "SST-2 training sentences in file order joined by spaces, cut to the first T tokens",
        "protocol": "one fresh process per case and T, one thread, OMP_WAIT_POLICY=PASSIVE, one run each (memory figures; the "
                    "seconds are single runs, not a speed claim)",
        "cap_gb": cap_gb, "cases": cases, "ours": {c: OURS[c] for c in OURS if c in cases}, "peer": PEER if peer else None,
        "goal": "no out-of-memory up to 8,192 tokens; peak memory of ours <= 1.3x hf_forward's at every T",
        "ours_worst_peak_ratio": ours_worst, "lengths": rows,
    }
    return payload


if __name__ == "__main__":
    main()
