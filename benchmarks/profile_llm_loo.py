"""Where exact leave-one-out's time goes on SmolLM2 zero-shot: rerun tokens, seconds, rate against the CPU's.

On the first ``--sentences`` GLUE SST-2 dev sentences (the audit's ``importance`` batches: by length,
``--batch-size``), counts the deletions leave-one-out makes (every text token of every prompt) and the
tokens a causal decoder reruns for them (the tokens after the removed one, the prompt's template
included; the earlier ones continue from the kept keys and values), times ``loo`` per batch, and
converts the tokens to floating-point operations (2 per parameter of the blocks a token passes: the
embedding table is a lookup and the LM head reads the verbalizer's rows of the last token alone).
Beside it, the rate of a large single-precision matrix product on the same threads: the ceiling.
Extrapolated to ``--limit`` sentences. Writes ``benchmarks/results/profile_llm_loo.json``. Run:
``python -m benchmarks.profile_llm_loo --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.explain import EXPLANATIONS, item_mask  # noqa: E402
from attnaudit.hf import load_hf  # noqa: E402
from benchmarks.common import matmul_rate, write_result  # noqa: E402


def rerun_tokens(mask: torch.Tensor, items: torch.Tensor) -> tuple[int, int]:
    """Deletions and rerun tokens of a causal decoder's leave-one-out for one batch (as ``explain.methods.loo._loo_decoder``)."""
    lengths = mask.sum(1)
    rows = (items & (items.sum(1) >= 2)[:, None]).nonzero()
    n = lengths[rows[:, 0]]
    start = torch.minimum(rows[:, 1], n - 2).clamp_min(0)
    return len(rows), int((n - start - 1).sum())


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--sentences", type=int, default=24)
    parser.add_argument("--limit", type=int, default=500, help="sentences to extrapolate to")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = load_hf("smollm2", task="sst2", data_dir=args.data_dir, device="cpu")
    model = run.model
    blocks = sum(p.numel() for name, p in model.hf.named_parameters() if ".layers." in name)
    examples = run.examples("test", args.sentences, data_dir=args.data_dir, order="first")
    deletions = tokens = 0
    seconds = 0.0
    for _, batch in run.sorted_batches(examples, args.batch_size):
        count, rerun = rerun_tokens(batch.mask.bool(), item_mask(model, batch))
        deletions, tokens = deletions + count, tokens + rerun
        start = time.perf_counter()
        EXPLANATIONS["loo"].fn(model, batch)  # the method itself, not the registry's memo
        seconds += time.perf_counter() - start
    gflop = 2 * blocks * tokens / 1e9
    scale = args.limit / args.sentences
    result = {
        "sentences": args.sentences, "batch_size": args.batch_size, "threads": args.threads,
        "block_parameters": blocks, "deletions": deletions, "rerun_tokens": tokens, "loo_seconds": seconds,
        "gflop": gflop, "gflops_per_second": gflop / seconds, "matmul_gflops_per_second": matmul_rate(),
        "extrapolated": {"limit": args.limit, "rerun_tokens": tokens * scale, "tflop": gflop * scale / 1e3,
                         "seconds": seconds * scale},
    }
    result["extrapolated"]["seconds_at_matmul_rate"] = gflop * scale / result["matmul_gflops_per_second"]
    write_result("profile_llm_loo", result)
    print({k: result[k] for k in ("deletions", "rerun_tokens", "loo_seconds", "gflops_per_second", "matmul_gflops_per_second")})
    return result


if __name__ == "__main__":
    main()
