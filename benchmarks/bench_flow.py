"""Attention flow: :func:`attnaudit.algorithms.attention_graph.flow` against the per-pair networkx reference.

Both run in this process on the same random attention (1 sentence, 6 layers, 12 heads
fused by mean, 12 tokens), timed in ``--repeats`` interleaved rounds
(:func:`benchmarks.common.time_interleaved`).  Writes ``benchmarks/results/flow.json``.
Run: ``.venv/bin/python -m benchmarks.bench_flow [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.algorithms.attention_graph import flow, flow_networkx  # noqa: E402
from benchmarks.common import REPEATS, headline, time_interleaved, write_result  # noqa: E402

SHAPE = {"batch": 1, "layers": 6, "heads": 12, "tokens": 12}
TOLERANCE = 1e-4


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison, write the result file and return its content."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    B, L, H, T = SHAPE["batch"], SHAPE["layers"], SHAPE["heads"], SHAPE["tokens"]
    attentions = tuple(
        (2.0 * torch.randn(B, H, T, T, generator=g, dtype=torch.float64)).softmax(-1)
        for _ in range(L)
    )
    timing, out = time_interleaved(
        {"ours": lambda: flow(attentions, head_fusion="mean"), "peer": lambda: flow_networkx(attentions, head_fusion="mean")},
        args.repeats,
    )
    max_diff = float((out["ours"] - out["peer"]).abs().max())
    result = {
        **headline(timing),
        "agree": max_diff <= TOLERANCE,
        "max_abs_diff": max_diff,
        "timing": timing,
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
