"""Our gradient attributions on a decoder LLM against Captum run on the Hugging Face model directly.

SmolLM2-135M-Instruct classifies ``--n`` GLUE SST-2 dev sentences zero-shot (the ``sst2``
prompt ``Review: {text}\\nSentiment:`` and verbalizer `` negative``/`` positive``). On the same
token ids:

* ``ig`` (our registry method: Captum ``IntegratedGradients`` through our model interface, of
  the predicted class's probability w.r.t. the token embeddings, zero baseline) against Captum's
  ``LayerIntegratedGradients`` on the embedding layer of a plain copy of HF's model (eager
  attention, HF's own forward, softmax over the verbalizer logits at the last real token). Captum
  takes a layer's baseline in *input* space (token ids), so the copy gets one extra embedding
  row of zeros and the baseline is that id at every position: the same zero baseline, the same
  ``--steps`` (Gauss–Legendre) and the same target.
* ``input_gradient`` (ours: ``|Σ_d ∂z_ŷ/∂e|``, the predicted verbalizer logit, attention live;
  a plain gradient, not gradient × input) against Captum's ``Saliency(abs=False)`` on the copy,
  summed over ``d``, absolute value.

Tolerance: ``TOLERANCE`` relative to the largest attribution (both sides do the same float32
operations, but in a different batching and order). Timing: ``--repeats`` interleaved rounds of
all four (:func:`benchmarks.common.time_interleaved`; only the two gradients get an untimed
warm-up call), one torch thread.
Writes ``benchmarks/results/llm_captum.json``.
Run: ``nice -n 5 .venv/bin/python -m benchmarks bench_llm_captum --data-dir ../shared/data``.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPEATS, headline, time_interleaved, write_result  # noqa: E402

TOLERANCE = 1e-4
"""Largest allowed ``|ours − Captum|`` over the largest ``|attribution|`` of the batch."""


def peer_model(hf: nn.Module) -> tuple[nn.Module, int]:
    """A plain copy of HF's model (eager attention) with one extra, all-zero embedding row; its id.

    The extra row is only ever read by the baseline, so the copy's forward on real ids is HF's."""
    peer = copy.deepcopy(hf).eval()
    peer.set_attn_implementation("eager")
    zero_id = peer.get_input_embeddings().weight.shape[0]
    peer.resize_token_embeddings(zero_id + 1, mean_resizing=False)
    with torch.no_grad():
        peer.get_input_embeddings().weight[zero_id].zero_()
    return peer, zero_id


def _classify(peer: nn.Module, verbalizer: Tensor, mask: Tensor, **inputs: Tensor) -> Tensor:
    """HF's forward; the verbalizer logits at each row's last real token (right padding)."""
    logits = peer(attention_mask=mask.long(), **inputs).logits
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logits[rows, mask.long().sum(1) - 1][:, verbalizer]


def captum_saliency(peer: nn.Module, verbalizer: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """``|Σ_d ∂z_ŷ/∂e|`` by Captum ``Saliency(abs=False)`` on HF's forward, ``(B, T)`` (0 at pads)."""
    from captum.attr import Saliency

    def forward(embeds: Tensor, mask: Tensor) -> Tensor:
        return _classify(peer, verbalizer, mask, inputs_embeds=embeds)

    embeds = peer.get_input_embeddings()(ids).detach().requires_grad_(True)
    with torch.no_grad():
        target = forward(embeds, mask).argmax(-1)
    grads = Saliency(forward).attribute(embeds, target=target, abs=False, additional_forward_args=(mask,))
    return grads.sum(-1).abs() * mask


def captum_layer_ig(peer: nn.Module, zero_id: int, verbalizer: Tensor, ids: Tensor, mask: Tensor, steps: int) -> Tensor:
    """``|Σ_d IG|`` by Captum ``LayerIntegratedGradients`` on HF's embedding layer, zero baseline, ``(B, T)``."""
    from captum.attr import LayerIntegratedGradients

    def forward(ids: Tensor, mask: Tensor) -> Tensor:
        return _classify(peer, verbalizer, mask, input_ids=ids).softmax(-1)

    with torch.no_grad():
        target = forward(ids, mask).argmax(-1)
    per_pass = max(1, 4096 // len(ids))
    attributions = LayerIntegratedGradients(forward, peer.get_input_embeddings()).attribute(
        ids, baselines=torch.full_like(ids, zero_id), target=target, additional_forward_args=(mask,),
        n_steps=steps, internal_batch_size=len(ids) * min(steps, per_pass),
    )
    return attributions.sum(-1).abs() * mask


def compare(run: Any, batch: Any, steps: int) -> dict[str, Callable[[], Tensor]]:
    """The four attributions of ``batch`` as zero-argument functions: ours and Captum's, for both methods."""
    from attnaudit.explain.methods.ig import integrated_gradients
    from attnaudit.explain.methods.input_gradient import input_gradient

    peer, zero_id = peer_model(run.model.hf)
    verbalizer = run.model.verbalizer_ids
    return {
        "ours": lambda: integrated_gradients(run, batch, steps=steps),
        "peer": lambda: captum_layer_ig(peer, zero_id, verbalizer, batch.tokens, batch.mask, steps),
        "ours_input_gradient": lambda: input_gradient(run, batch),
        "peer_input_gradient": lambda: captum_saliency(peer, verbalizer, batch.tokens, batch.mask),
    }


def difference(ours: Tensor, peer: Tensor, items: Tensor) -> dict[str, float | bool]:
    """Max abs difference on the explained items (a zero-shot prompt's text tokens: ours are 0 on the
    template, Captum attributes every token), the largest attribution there, and whether it is
    within :data:`TOLERANCE`."""
    real = items.bool()
    diff = float((ours[real] - peer[real]).abs().max())
    scale = float(peer[real].abs().max())
    return {"max_abs_diff": diff, "max_abs_attribution": scale, "agree": diff <= TOLERANCE * scale}


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison, write the result file and return its content."""
    from attnaudit.explain import item_mask
    from attnaudit.hf import load_hf

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNAUDIT_DATA"), help="default $ATTNAUDIT_DATA")
    parser.add_argument("--n", type=int, default=3, help="GLUE SST-2 dev sentences (the first of at most --max-words words)")
    parser.add_argument("--max-words", type=int, default=10)
    parser.add_argument("--steps", type=int, default=16, help="integration steps (both sides)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run = load_hf("smollm2", task="sst2", data_dir=args.data_dir, device="cpu")
    examples = [ex for ex in run.data().test if len(ex.tokens) <= args.max_words][: args.n]
    batch = run.collate(examples)
    fns = compare(run, batch, args.steps)
    timing, out = time_interleaved(fns, args.repeats, ratios={
        "ratio": ("peer", "ours"), "ratio_input_gradient": ("peer_input_gradient", "ours_input_gradient"),
    }, warmup=("ours_input_gradient", "peer_input_gradient"))  # IG's passes are long enough to need none
    items = item_mask(run, batch)
    ig = difference(out["ours"], out["peer"], items)
    grad = difference(out["ours_input_gradient"], out["peer_input_gradient"], items)
    result = {
        **headline(timing),
        "agree": bool(ig["agree"] and grad["agree"]),
        "max_abs_diff": max(ig["max_abs_diff"], grad["max_abs_diff"]),
        "tolerance": f"max |ours − Captum| <= {TOLERANCE:g} × max |Captum attribution| (real tokens)",
        "ig": ig,
        "input_gradient": grad,
        "timing": timing,
        "peer": "Captum LayerIntegratedGradients (embedding layer) and Saliency(abs=False) on a plain copy of HF's model",
        "model": "SmolLM2-135M-Instruct (embedded GGUF, float32), zero-shot sst2 prompt",
        "n": len(examples),
        "tokens": int(batch.mask.sum()),
        "steps": args.steps,
    }
    write_result("llm_captum", result)
    return result


if __name__ == "__main__":
    out = main()
    print(
        f"SmolLM2, {out['n']} prompts ({out['tokens']} tokens): IG ours {out['ours_s']:.2f}s vs Captum LayerIG "
        f"{out['peer_s']:.2f}s (ratio {out['ratio']:.2f}), max |diff| {out['ig']['max_abs_diff']:.1e} of "
        f"{out['ig']['max_abs_attribution']:.1e}; input gradient max |diff| {out['input_gradient']['max_abs_diff']:.1e} "
        f"of {out['input_gradient']['max_abs_attribution']:.1e}; agree={out['agree']}"
    )
