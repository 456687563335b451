"""Feasibility of issue #44 item 3 (batched retraining): is one stacked BiLSTM over K models faster than K
``nn.LSTM`` passes on this CPU?

Not the batched trainer itself: this times the part of a ROAR step's retrains that dominates them, the
BiLSTM encoder's forward and backward on one training batch of SST's shape (batch 32, up to 25 tokens,
300-d embeddings, 128 units per direction: the ``madsen2022-sst`` preset), for K models of the same shape
(the K methods of one recursive step see the same sentences in the same order; only the masked ids differ).

* ``separate``: K ``nn.LSTM(bidirectional)`` calls over packed sequences, as :class:`attnaudit.models.rnn.
  RecurrentEncoder` runs them, each followed by its backward;
* ``stacked``: the K models' weights stacked ``(K, 4H, ·)``; the input projection of all time steps in one
  batched matmul, then one ``baddbmm`` per time step and direction for all K models, padded positions
  leaving the state unchanged (which is what packing computes); one backward.

Both are checked equal (outputs and every weight's gradient, float32 tolerance) before timing. The timings
are :func:`benchmarks.common.time_interleaved` (median of interleaved rounds).

The roofline part says how much any batching could win on this CPU: the separate path's achieved GFLOP/s
(its matmul FLOPs counted from the packed token count: per direction and token ``2·4H·(E + H)`` forward,
twice that backward) against the best single-matmul rate this CPU reaches at the same thread count
(a 512-square float32 matmul, the fastest size here, in the same interleaved rounds). Their ratio bounds
the speedup of any batched trainer that does the same FLOPs: a bound under 3 means issue #44's 3x goal cannot be met by batching on this machine.
On a GPU (``--device cuda``) every timed call ends with ``torch.cuda.synchronize()``, and ``--matmul`` sets the
square matmul that stands for the peak (512 suits this CPU; a GPU needs thousands to leave launch overhead behind).
Run: ``.venv/bin/python benchmarks/bench_batched_lstm.py [--models 5] [--repeats 7] [--threads 1] [--device cpu|cuda]
[--matmul 512]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import time_interleaved, write_result  # noqa: E402


def separate(lstms: list[nn.LSTM], x: Tensor, mask: Tensor) -> list[Tensor]:
    """Each model's padded outputs ``(B, T, 2H)`` over packed sequences (zero at padding)."""
    lengths = mask.sum(-1).cpu()
    outs = []
    for lstm, xk in zip(lstms, x):
        packed = pack_padded_sequence(xk, lengths, batch_first=True, enforce_sorted=False)
        out, _ = lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[2])
        outs.append(out * mask[..., None])
    return outs


def stack(lstms: list[nn.LSTM]) -> dict[str, Tensor]:
    """The models' LSTM weights stacked along a new first axis, as leaf tensors that train."""
    names = [n for n, _ in lstms[0].named_parameters()]
    return {n: torch.stack([dict(m.named_parameters())[n].detach() for m in lstms]).requires_grad_() for n in names}


def direction(weights: dict[str, Tensor], suffix: str, x: Tensor, mask: Tensor, reverse: bool) -> Tensor:
    """One direction of K LSTMs: ``x (K, B, T, E)`` -> ``(K, B, T, H)``, state kept over padding."""
    w_ih, w_hh = weights[f"weight_ih_l0{suffix}"], weights[f"weight_hh_l0{suffix}"]
    bias = weights[f"bias_ih_l0{suffix}"] + weights[f"bias_hh_l0{suffix}"]
    k, b, t, _ = x.shape
    hidden = w_hh.shape[-1]
    projected = torch.bmm(x.reshape(k, b * t, -1), w_ih.transpose(1, 2)).reshape(k, b, t, -1) + bias[:, None, None, :]
    h = x.new_zeros(k, b, hidden)
    c = x.new_zeros(k, b, hidden)
    outs: list[Tensor] = [h] * t
    for step in (range(t - 1, -1, -1) if reverse else range(t)):
        gates = torch.baddbmm(projected[:, :, step], h, w_hh.transpose(1, 2))
        i, f, g, o = gates.chunk(4, -1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        real = mask[None, :, step, None]
        h, c = torch.where(real, h_new, h), torch.where(real, c_new, c)
        outs[step] = h_new * real
    return torch.stack(outs, 2)


def stacked(weights: dict[str, Tensor], x: Tensor, mask: Tensor) -> Tensor:
    """K bidirectional LSTMs at once: ``(K, B, T, 2H)``, zero at padding."""
    return torch.cat([direction(weights, "", x, mask, False), direction(weights, "_reverse", x, mask, True)], -1)


def setup(models: int, batch: int, width: int, embed: int, hidden: int, seed: int = 0,
          device: str = "cpu") -> tuple[list[nn.LSTM], Tensor, Tensor]:
    """``models`` BiLSTMs, a batch of ``x (K, B, T, E)`` (zero at padding) and its mask, drawn on the CPU with
    ``seed`` (the same numbers on every device), then moved to ``device``."""
    torch.manual_seed(seed)
    lstms = [nn.LSTM(embed, hidden, batch_first=True, bidirectional=True) for _ in range(models)]
    lengths = torch.randint(4, width + 1, (batch,))
    lengths[0] = width
    mask = torch.arange(width)[None, :] < lengths[:, None]
    x = torch.randn(models, batch, width, embed) * mask[None, :, :, None]
    return [m.to(device) for m in lstms], x.to(device), mask.to(device)


def check(lstms: list[nn.LSTM], x: Tensor, mask: Tensor) -> dict[str, float]:
    """Largest differences of outputs and weight gradients between the two ways."""
    outs = separate(lstms, x, mask)
    probe = torch.randn(len(lstms), *outs[0].shape).to(x.device)
    sum((o * p).sum() for o, p in zip(outs, probe)).backward()
    weights = stack(lstms)
    out = stacked(weights, x, mask)
    (out * probe).sum().backward()
    out = out.detach()
    out_diff = max(float((out[k] - outs[k].detach()).abs().max()) for k in range(len(lstms)))
    grad_diff = max(
        float((weights[n].grad[k] - dict(m.named_parameters())[n].grad).abs().max())
        for n in weights for k, m in enumerate(lstms)
    )
    return {"max_output_difference": out_diff, "max_gradient_difference": grad_diff}


def lstm_flops(mask: Tensor, embed: int, hidden: int) -> float:
    """Matmul FLOPs of one model's bidirectional LSTM forward + backward over the packed tokens of ``mask``."""
    tokens = int(mask.sum())
    forward = 2 * tokens * 2 * 4 * hidden * (embed + hidden)  # 2 directions x multiply-add
    return 3.0 * forward  # the backward computes the input and the weight gradients: twice the forward


MATMUL = 512
"""The square float32 matmul that stands for this CPU's peak rate (the fastest size of 256 … 2048 here)."""


def roofline(timing: dict[str, Any], flops: float, matmuls: int, size: int = MATMUL) -> dict[str, Any]:
    """The separate path's achieved GFLOP/s against the matmul's, per interleaved round (so both ran under the
    same load), and the bound they set on any batched trainer doing the same FLOPs."""
    separate, peak = timing["seconds"]["separate"], timing["seconds"]["matmul"]
    achieved = {k: flops / separate[k] / 1e9 for k in ("min", "median", "max")}
    rate = {k: matmuls * 2 * size**3 / peak[k] / 1e9 for k in ("min", "median", "max")}
    scale = matmuls * 2 * size**3 / flops  # the matmul's FLOPs over the separate path's
    bound = {k: scale * v for k, v in timing["separate_over_matmul"].items() if k in ("min", "median", "max")}
    return {
        "flops_per_round": flops, "separate_gflops": achieved, "matmul_gflops": rate, "matmul_size": size,
        "speedup_bound": bound, "fraction_of_peak": 1 / bound["median"],
        "reading": "per round, the separate path's GFLOP/s over the matmul's: a batched trainer doing the same FLOPs "
                   "cannot beat the peak, so peak / achieved bounds its speedup",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=25)
    parser.add_argument("--embed", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="batched_lstm")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N (every timed call synchronises)")
    parser.add_argument("--matmul", type=int, default=MATMUL, help="the square float32 matmul that stands for the peak")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no GPU here; use --device cpu")
    torch.set_num_threads(args.threads)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both paths, so they agree
    lstms, x, mask = setup(args.models, args.batch, args.width, args.embed, args.hidden, device=args.device)
    equal = check(lstms, x, mask)
    assert equal["max_output_difference"] < 1e-5 and equal["max_gradient_difference"] < 1e-4, equal
    weights = stack(lstms)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def one_at_a_time() -> None:
        for out in separate(lstms, x, mask):
            out.sum().backward()
        sync()

    def together() -> None:
        stacked(weights, x, mask).sum().backward()
        sync()

    flops = lstm_flops(mask, args.embed, args.hidden) * args.models
    matmuls = max(1, round(flops / (2 * args.matmul**3)))
    a, b = torch.randn(args.matmul, args.matmul, device=args.device), torch.randn(args.matmul, args.matmul, device=args.device)

    def peak() -> None:
        for _ in range(matmuls):
            a @ b
        sync()

    timing, _ = time_interleaved({"separate": one_at_a_time, "stacked": together, "matmul": peak}, args.repeats,
                                 ratios={"speedup": ("separate", "stacked"), "separate_over_matmul": ("separate", "matmul")})
    payload: dict[str, Any] = {
        "what": "BiLSTM encoder forward + backward of one SST-shaped training batch for K models: K nn.LSTM calls "
                "(packed) vs one stacked bmm LSTM",
        "shape": {"models": args.models, "batch": args.batch, "max_tokens": args.width, "embed": args.embed, "hidden": args.hidden},
        "threads": args.threads, "device": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "equal": equal, "timing": timing,
        "speedup_median": timing["speedup"]["median"],
        "roofline": roofline(timing, flops, matmuls, args.matmul),
    }
    write_result(args.name, payload)
    print(f"K={args.models}: separate {timing['seconds']['separate']['median'] * 1e3:.1f} ms, stacked "
          f"{timing['seconds']['stacked']['median'] * 1e3:.1f} ms, speedup {timing['speedup']['median']:.2f}x; {equal}; "
          f"separate at {payload['roofline']['fraction_of_peak']:.0%} of the matmul peak: any batching <= "
          f"{payload['roofline']['speedup_bound']['median']:.2f}x")


if __name__ == "__main__":
    main()
