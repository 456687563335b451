"""Leave-one-out on a decoder LLM: prefix reuse against rerunning the whole prompt per deletion.

SmolLM2-135M-Instruct classifies the first ``--n`` GLUE SST-2 dev sentences zero-shot (the
``sst2`` prompt and verbalizer), one batch. ``ours`` is the registry's ``loo`` (each deletion
continues from the full pass's keys and values of the tokens before the removed one and reruns
only the tokens after it: :func:`attnaudit.explain.methods.loo._loo_decoder`); ``peer`` is the same
method with the batched full recomputation every other Transformer gets
(:func:`attnaudit.explain.methods.loo._loo_recompute`). Both give the same scores (the largest
difference is recorded). Timing: ``--repeats`` interleaved rounds
(:func:`benchmarks.common.time_interleaved`, wall seconds) plus the CPU seconds of each call,
one torch thread. Writes ``benchmarks/results/llm_loo.json``.
Run: ``nice -n 5 .venv/bin/python -m benchmarks bench_llm_loo --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.explain import item_mask  # noqa: E402
from attnaudit.explain.methods import loo  # noqa: E402
from attnaudit.hf import load_hf  # noqa: E402
from attnaudit.models.interface import evaluation  # noqa: E402
from benchmarks.common import REPEATS, stats, time_interleaved, write_result  # noqa: E402

TOLERANCE = 1e-5  # |Δŷ| of float32 passes that differ only in how the prefix's keys and values were computed


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--n", type=int, default=8, help="SST-2 dev sentences (one batch)")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = load_hf("smollm2", task="sst2", data_dir=args.data_dir, device="cpu")
    batch = run.collate(run.data().test[: args.n])
    model = run.model
    assert loo._loo_method(model) is loo._loo_decoder
    cpu: dict[str, list[float]] = {"ours": [], "peer": []}

    def timed(name: str, route: Callable[..., Any]) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            saved = loo._loo_method
            loo._loo_method = lambda _model: route  # type: ignore[assignment]
            start = time.process_time()
            try:
                with evaluation(model):
                    return loo.loo_importance(model, batch)
            finally:
                cpu[name].append(time.process_time() - start)
                loo._loo_method = saved  # type: ignore[assignment]

        return call

    record, outputs = time_interleaved(
        {"ours": timed("ours", loo._loo_decoder), "peer": timed("peer", loo._loo_recompute)}, args.repeats
    )
    mask = item_mask(model, batch)
    difference = (outputs["ours"] - outputs["peer"])[mask].nan_to_num().abs().max().item()
    payload = {
        "what": "leave-one-out of SmolLM2-135M-Instruct zero-shot on SST-2: prefix reuse (ours) vs full reruns (peer)",
        "sentences": args.n,
        "deletions": int(mask.sum()),
        "tokens": int(batch.mask.sum()),
        "ratio": record["ratio"]["median"],
        "max_abs_diff": difference,
        "agree": difference <= TOLERANCE,
        "timing": record,
        "cpu_seconds": {name: stats(values[1:]) for name, values in cpu.items()},  # the first call is the warm-up
    }
    write_result("llm_loo", payload)
    print({"difference": difference, "wall": {k: v["median"] for k, v in record["seconds"].items()},
           "cpu": {k: v["median"] for k, v in payload["cpu_seconds"].items()}})
    return payload


if __name__ == "__main__":
    main()
