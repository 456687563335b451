"""Row-only capture against the forward a user runs anyway: SmolLM2-135M with SDPA, no weights.

Most explanations and the single-attention tests read one query row per instance (a decoder's
predicting token). ``model.rows_forward`` (:func:`attnaudit.models.hf.attention._rows_only`) runs
transformers' SDPA for every query's output and the model's eager code for that row alone, in every
layer. For each sequence length T (``--lengths``; one sequence of T random token ids, seed 0) two
operations run side by side in ``--repeats`` interleaved rounds (:func:`benchmarks.common.time_interleaved`):

* ``peer``: the HF model's forward with ``attn_implementation="sdpa"`` (a copy of the same weights),
  next-token logits at the last position, no weights, no KV cache;
* ``ours``: ``rows_forward``: the same logits and every layer's ``(H, K)`` weights at the last row,
  then the ``attention`` explanation read from them.

``cost`` = ours / peer per round (goal ≤ 1.5). Agreement, per T: the logits against the peer's, and every
layer's row against the full eager capture (``model(batch)``: HF's eager attention through our adapter,
itself checked against transformers' ``output_attentions`` by ``benchmarks.architecture_matrix``).

Writes ``benchmarks/results/capture_rows_<device>.json``. Run (CPU, one thread of the shared 2 cores)::

    python -m benchmarks.bench_capture_rows --lengths 32,128,512,2048 --repeats 5 --threads 1

GPU: ``--device cuda --weights random --dtype bfloat16`` (the random weights of the same architecture:
time does not depend on their values).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.types import Batch  # noqa: E402
from attnaudit.explain.helpers.attention import explained_attention  # noqa: E402
from attnaudit.models.hf import (
    DTYPES,  # noqa: E402
    HFModel,  # noqa: E402
)
from attnaudit.seed import resolve_device  # noqa: E402
from benchmarks.bench_llm_scale import device_name, load_model, synchronised, token_batch  # noqa: E402
from benchmarks.common import ratio_span, time_interleaved, write_result  # noqa: E402


def sdpa_copy(model: HFModel, device: torch.device) -> torch.nn.Module:
    """The same weights as a plain transformers model with SDPA attention."""
    peer = copy.deepcopy(model.hf)
    peer.set_attn_implementation("sdpa")
    return peer.to(device).eval()


def agreement(model: HFModel, peer: torch.nn.Module, batch: Batch) -> dict[str, float]:
    """Max abs differences: the row-only pass's logits to SDPA's, and its row of every layer to the full eager capture's."""
    with torch.no_grad():
        rows = model.rows_forward(batch)
        full = model(batch)
        logits = peer(input_ids=batch.tokens, attention_mask=batch.mask.long(), use_cache=False, logits_to_keep=1).logits[:, -1]
    weights = max(
        float((kept.weights[:, :, 0] - whole.weights[:, :, -1]).abs().max()) for kept, whole in zip(rows.trace.layers, full.trace.layers)
    )
    return {
        "logits_vs_sdpa": float((rows.logits - logits).abs().max()),
        "weights_vs_eager_capture": weights,
        "rows_only_layers": sum(layer.rows is not None for layer in rows.trace.layers),
    }


def measure(model: HFModel, peer: torch.nn.Module, length: int, args: argparse.Namespace) -> dict[str, Any]:
    """Timing and agreement at one length."""
    device = torch.device(args.device)
    batch = token_batch(length, model.config.vocab_size, device)

    def sdpa() -> torch.Tensor:
        return peer(input_ids=batch.tokens, attention_mask=batch.mask.long(), use_cache=False, logits_to_keep=1).logits[:, -1]

    def rows() -> torch.Tensor:
        out = model.rows_forward(batch)
        return explained_attention(model, batch, out.trace)

    fns = {"ours": synchronised(rows, device), "peer": synchronised(sdpa, device)}
    timing, _ = time_interleaved(fns, args.repeats, ratios={"cost": ("ours", "peer")})
    return {"length": length, "timing": timing, "agreement": agreement(model, peer, batch)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="32,128,512,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--weights", choices=("real", "random"), default="real")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    args.device = str(device)
    model, _ = load_model(args.weights, DTYPES[args.dtype], device)
    peer = sdpa_copy(model, device)
    lengths = [int(x) for x in args.lengths.split(",")]
    results = [measure(model, peer, length, args) for length in lengths]
    for row in results:
        print(f"T={row['length']}: rows-only / SDPA {ratio_span(row['timing']['cost'])}", row["agreement"])
    payload = {
        "command": "python -m benchmarks.bench_capture_rows " + " ".join(sys.argv[1:] if argv is None else argv),
        "what": "SmolLM2-135M, one sequence of T random tokens: our row-only capture (every layer's weights at the "
                "predicting token, the attention explanation read from them) against transformers' SDPA forward "
                "without weights; cost = ours / SDPA per round",
        "device": device_name(device), "dtype": args.dtype, "weights": args.weights,
        "threads": torch.get_num_threads(), "goal": "cost <= 1.5 at every T",
        "lengths": results,
    }
    write_result(f"capture_rows_{device.type}", payload)
    return payload


if __name__ == "__main__":
    main()
