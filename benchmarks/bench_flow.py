"""Attention flow: :func:`attnaudit.flow.flow` against the per-pair networkx reference.

Both run in this process on the same random attention (1 sentence, 6 layers, 12 heads
fused by mean, 12 tokens); each is timed 3 times and the medians compared.  Writes
``benchmarks/results/flow.json``.  Run: ``.venv/bin/python benchmarks/bench_flow.py``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.flow import flow, flow_networkx  # noqa: E402
from benchmarks.common import write_result  # noqa: E402

SHAPE = {"batch": 1, "layers": 6, "heads": 12, "tokens": 12}
RUNS = 3
TOLERANCE = 1e-4


def _median_seconds(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    """Median wall time of ``RUNS`` calls, and the last result."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> dict:
    """Run the comparison, write the result file and return its content."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    B, L, H, T = SHAPE["batch"], SHAPE["layers"], SHAPE["heads"], SHAPE["tokens"]
    attentions = tuple(
        (2.0 * torch.randn(B, H, T, T, generator=g, dtype=torch.float64)).softmax(-1)
        for _ in range(L)
    )
    ours_s, ours = _median_seconds(lambda: flow(attentions, head_fusion="mean"))
    peer_s, peer = _median_seconds(lambda: flow_networkx(attentions, head_fusion="mean"))
    max_diff = float((ours - peer).abs().max())
    result = {
        "ratio": peer_s / ours_s,
        "agree": max_diff <= TOLERANCE,
        "max_abs_diff": max_diff,
        "ours_s": ours_s,
        "peer_s": peer_s,
        "peer": "networkx.maximum_flow_value per (source, sink) pair",
        "shape": SHAPE,
    }
    write_result("flow", result)
    return result


if __name__ == "__main__":
    out = main()
    print(
        f"attention flow: ours {out['ours_s']:.4f}s, networkx {out['peer_s']:.2f}s, "
        f"ratio {out['ratio']:.0f}x, agree={out['agree']} (max |diff| {out['max_abs_diff']:.1e})"
    )
