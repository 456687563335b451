"""``decompx``: DecompX (Modarressi et al. 2023). Every token's state is kept as a sum of one vector per
input token, ``x_i = Σ_k x_i⁽ᵏ⁾`` (at the input, ``x_i⁽ⁱ⁾ = x_i``), and the decomposition is carried
through every layer and the classification head to the logits, so that the per-token parts of the
predicted logit add up to it exactly.

Per layer (post-LN): attention mixes the parts with the layer's weights, ``Σ_h α^h_ij x_j⁽ᵏ⁾ W_V^h W_O^h``,
and the residual adds ``x_i⁽ᵏ⁾``; each layer norm acts on a part by its linear map with the whole
state's mean-free spread (Kobayashi et al. 2021); a dense layer maps each part, and an activation
multiplies each part by ``act(z)/z`` of the whole pre-activation ``z`` (the paper's zero-origin
approximation, exact for the sum). Each bias (``b_V W_O + b_O``, the norms' β, the dense biases) is
split among the parts in proportion to ``|⟨part, bias⟩|`` (the paper's default "absdot"); in the first
layer, where token ``k``'s part is its own state, ``b_V`` travels with its value instead, as in the
authors' code. The head
pools (``[CLS]`` or the mean over real tokens) and applies its dense layers the same way. The score of
token ``k`` is its part of the predicted class's logit, signed.

Post-LN encoders with a dense head only (our Transformer classifier, BERT, DistilBERT, RoBERTa).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.residual import ELEMENTS, rows
from attnaudit.explain.registry import explained_class, explanation, on_items
from attnaudit.models.interface import (
    AttentionLayer,
    AttentionModel,
    Dense,
    NormParams,
    evaluation,
)


def with_bias(parts: Tensor, bias: Tensor | None) -> Tensor:
    """``bias`` split among the parts ``(..., K, d)`` in proportion to ``|⟨part, bias⟩|`` ("absdot")."""
    if bias is None:
        return parts
    weights = (parts @ bias).abs()
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-12)
    return parts + weights[..., None] * bias


def through_dense(parts: Tensor, layer: Dense) -> Tensor:
    """Parts ``(..., K, d)`` through ``act(z W + b)``: each part mapped, the bias split, then scaled by
    ``act(z)/z`` of the whole ``z`` (0 where ``z = 0``, where every activation here is 0)."""
    weight, bias, act = layer
    parts = with_bias(parts @ weight, bias)
    if act is None:
        return parts
    whole = parts.sum(-2, keepdim=True)
    slope = torch.where(whole != 0, act(whole) / torch.where(whole != 0, whole, 1.0), 0.0)
    return parts * slope


def through_norm(parts: Tensor, norm: NormParams) -> Tensor:
    """Parts ``(B,T,K,d)`` through a layer norm: its linear map with the whole state's spread, β split."""
    return with_bias(norm.linear(parts, norm.scale(parts.sum(2))[:, :, None]), norm.bias)


def through_layer(model: AttentionModel, record: AttentionLayer, layer: int, parts: Tensor) -> Tensor:
    """Parts ``(B,T,K,d)`` of the states entering post-LN layer ``layer`` -> those of its output."""
    pieces = model.residual_norms(layer)
    w_v, b_v, w_o, heads = model.value_output_maps(layer)
    b, t, k, _ = parts.shape
    values = (parts @ w_v).view(b, t, k, heads, -1)
    mixed = torch.einsum("bhij,bjkhe->bikhe", record.weights, values).reshape(b, t, k, -1) @ w_o
    bias: Tensor | None = b_v @ w_o
    if layer == 0:  # each input token's own value bias is its own, as the token's value is (the authors' code)
        per_head = torch.einsum("he,hed->hd", b_v.view(heads, -1), w_o.view(heads, -1, w_o.shape[1]))
        mixed, bias = mixed + torch.einsum("bhik,hd->bikd", record.weights, per_head), None
    if pieces.output_bias is not None:
        bias = pieces.output_bias if bias is None else bias + pieces.output_bias
    h = through_norm(with_bias(mixed + parts, bias), pieces.attention_norm)
    ffn = h
    for dense in pieces.ffn_layers:
        ffn = through_dense(ffn, dense)
    return through_norm(h + ffn, pieces.ffn_norm)


def decomposed_logits(model: AttentionModel, records: list[AttentionLayer]) -> Tensor:
    """The logits of a batch as one part per input token, ``(B,K,C)``."""
    first = records[0]
    x, mask = first.inputs, first.mask
    eye = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    parts = eye[None, :, :, None] * (x * mask[..., None].to(x.dtype))[:, :, None, :]
    for layer, record in enumerate(records):
        parts = through_layer(model, record, layer, parts)
    head = model.head_layers()
    assert head is not None  # _check refuses a model without one
    if head.pool == "first":
        pooled = parts[:, 0]
    else:
        real = mask.to(x.dtype)[:, :, None, None]
        pooled = (parts * real).sum(1) / real.sum(1).clamp_min(1.0)
    for dense in head.layers:
        pooled = through_dense(pooled, dense)
    return pooled


def _check(model: AttentionModel) -> str | None:
    if model.residual_norms(0).placement != "post" or not model.residual_norms(0).ffn_layers:
        return "DecompX is implemented for post-LN encoders with a dense feed-forward block"
    if model.head_layers() is None:
        return f"{type(model).__name__} has no classification head DecompX can decompose (pooling + dense layers)"
    return None


@explanation(
    "decompx", "DecompX: each token's part of the predicted logit, decomposed through every layer and the head (Modarressi et al. 2023)",
    ("prediction", "residual_ln"), check=_check, default=False, order=63,
)
def decompx(model: AttentionModel, batch: Batch) -> Tensor:
    """DecompX scores ``(B,K)``: token ``k``'s part of the predicted class's logit (they sum to the logit)."""
    with evaluation(model), torch.no_grad():
        out = model(batch)
        records = list(out.trace.layers)
        b, t, d = records[0].inputs.shape
        width = max([d, *(dense[0].shape[1] for dense in model.residual_norms(0).ffn_layers)])
        step = max(1, ELEMENTS // (t * t * width))
        logits = torch.cat([
            decomposed_logits(model, [rows(r, slice(i, i + step)) for r in records]) for i in range(0, b, step)
        ])
        scores = logits.gather(2, explained_class(batch, out.logits)[:, None, None].expand(-1, t, 1)).squeeze(2)
        if batch.contrast is not None:
            scores = scores - logits.gather(2, batch.contrast.to(logits.device)[:, None, None].expand(-1, t, 1)).squeeze(2)
    return on_items(model, batch, scores)
