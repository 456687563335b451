"""Attention normalisers and the one function that applies interventions to a layer.

Every model computes attention through :func:`normalise` and :func:`apply_weight_interventions`
/ :func:`apply_key_interventions`, so an intervention means the same thing in every family.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import Intervention

NORMALISERS = ("softmax", "entmax15", "sparsemax", "entmax:<alpha>")


def check_normaliser(name: str) -> str:
    """Validate a normaliser name; return it unchanged."""
    if name in ("softmax", "entmax15", "sparsemax"):
        return name
    if name.startswith("entmax:"):
        try:
            alpha = float(name.split(":", 1)[1])
        except ValueError:
            alpha = 0.0
        if alpha >= 1.0:
            return name
    raise AttnAuditError(
        f"unknown attention normaliser {name!r}; choose softmax, entmax15, sparsemax or entmax:<alpha >= 1>"
    )


def normalise(scores: Tensor, mask: Tensor, name: str = "softmax", masked: bool = False) -> Tensor:
    """Turn scores ``(..., K)`` into distributions over the keys where ``mask`` is True.

    ``mask`` broadcasts against ``scores`` (e.g. ``(B,1,1,K)``). Padded keys get exactly 0.
    ``masked``: the scores already hold the mask (a model's own additive mask, its dtype's minimum or at
    most :func:`~attnaudit.models.hf.attention.masked_below` at every hidden key): a softmax then
    needs no fill, as its exponent is exactly 0 there, and only rows that read no key are zeroed.
    """
    check_normaliser(name)
    if masked and name == "softmax":
        out = torch.softmax(scores, dim=-1)
        blind = ~mask.any(-1, keepdim=True)  # rows reading no key: zeros, not eager's uniform row
        return out.masked_fill(blind, 0.0) if bool(blind.any()) else out
    hidden = ~mask  # broadcast by masked_fill, never expanded: (B,1,Q,K) stays one byte per pair, not per head
    # A large finite negative rather than -inf: entmax's sort-based threshold handles it,
    # and fully-masked rows (padding queries) stay finite instead of NaN.
    filled = scores.masked_fill(hidden, torch.finfo(scores.dtype).min / 4)
    if name == "softmax":
        out = torch.softmax(filled, dim=-1)
    elif name.startswith("entmax:") and float(name.split(":", 1)[1]) == 1.0:
        out = torch.softmax(filled, dim=-1)
    else:
        # imported here: softmax models (every Hugging Face model) run without the entmax package
        from entmax import entmax15, entmax_bisect, sparsemax

        if name == "entmax15":
            out = entmax15(filled, dim=-1)
        elif name == "sparsemax":
            out = sparsemax(filled, dim=-1)
        else:
            out = entmax_bisect(filled, alpha=float(name.split(":", 1)[1]), dim=-1)
    return out.masked_fill(hidden, 0.0)


def apply_key_interventions(keys: Tensor, interventions: Sequence[Intervention]) -> Tensor:
    """Replace the per-head keys ``(B,H,K,dh)`` of a layer (tensor or function), in order."""
    for iv in interventions:
        if iv.keys is not None:
            keys = iv.keys(keys) if callable(iv.keys) else _given(iv.keys, keys)
    return keys


def apply_value_interventions(values: Tensor, interventions: Sequence[Intervention]) -> Tensor:
    """Replace the per-head values ``(B,H,K,dh)`` of a layer (tensor or function), in order."""
    for iv in interventions:
        if iv.values is not None:
            values = iv.values(values) if callable(iv.values) else _given(iv.values, values)
    return values


def _given(tensor: Tensor, current: Tensor) -> Tensor:
    """A replacement for ``current`` ``(B,H,K,dh)``: broadcast, and given per key/value head (as a Hugging Face
    grouped-query layer records them) repeated for the query heads that read each."""
    tensor = tensor.to(current.device, current.dtype)
    heads = tensor.shape[1] if tensor.dim() == 4 else current.shape[1]
    if 1 < heads < current.shape[1] and current.shape[1] % heads == 0:
        tensor = tensor.repeat_interleave(current.shape[1] // heads, 1)
    return tensor.expand_as(current)


def normaliser_for(default: str, interventions: Sequence[Intervention]) -> str:
    """The normaliser to use: the last intervention that swaps it wins."""
    for iv in interventions:
        if iv.normaliser is not None:
            default = check_normaliser(iv.normaliser)
    return default


def weights_replaced(interventions: Sequence[Intervention]) -> bool:
    """Whether the first weights intervention is a tensor: the layer's own scores then never reach its
    output (nor any weights function), so a family may skip computing them (reruns with given weights)."""
    first = next((iv.weights for iv in interventions if iv.weights is not None), None)
    return isinstance(first, Tensor)


def apply_weight_interventions(
    weights: Tensor, key_mask: Tensor, interventions: Sequence[Intervention]
) -> Tensor:
    """Replace a layer's weights ``(B,H,Q,K)`` (tensor or function of them), in order."""
    for iv in interventions:
        if iv.weights is None:
            continue
        if callable(iv.weights):
            weights = iv.weights(weights, key_mask)
        else:
            weights = iv.weights.to(weights.device, weights.dtype).expand_as(weights)
    return weights


def restrict(weights: Tensor, allowed: Tensor) -> Tensor:
    """Weights ``(B,H,Q,K)`` restricted to the ``allowed`` pairs (e.g. a causal mask).

    Rows that put weight on a forbidden key lose it and are renormalised over the allowed
    keys; rows that did not are returned unchanged (bit for bit)."""
    kept = weights * allowed.to(weights.dtype)
    leaked = (weights.detach() * (~allowed).to(weights.dtype)).abs().sum(-1, keepdim=True) > 0
    total = kept.sum(-1, keepdim=True)
    return torch.where(leaked & (total > 0), kept / total.clamp_min(torch.finfo(kept.dtype).tiny), kept)


def attention_weights(
    scores: Tensor,
    key_mask: Tensor,
    normaliser: str,
    interventions: Sequence[Intervention],
    allowed: Tensor | None = None,
    masked: bool = False,
) -> Tensor:
    """Scores ``(B,H,Q,K)`` -> weights, with normaliser swaps and weight replacements applied.

    ``allowed`` ``(B,1,Q,K)``: which query may read which key (a decoder's causal and padding
    mask; None: every real key). Weight functions still receive ``key_mask`` ``(B,K)``; what
    they return is then :func:`restrict`-ed, so a replacement cannot make a token read a later
    one (uniform becomes uniform over the keys each query sees). ``masked``: see :func:`normalise`."""
    name = normaliser_for(normaliser, interventions)
    weights = normalise(scores, key_mask[:, None, None, :] if allowed is None else allowed, name, masked)
    replaced = apply_weight_interventions(weights, key_mask, interventions)
    return replaced if allowed is None or replaced is weights else restrict(replaced, allowed)
