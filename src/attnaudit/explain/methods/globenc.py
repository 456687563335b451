"""``globenc``: GlobEnc (Modarressi et al. 2022). Per layer, Kobayashi et al. (2021)'s decomposition of
attention + residual + first layer norm, carried on through the second residual connection and layer
norm (the feed-forward network, non-linear, is left out of the decomposition but counts in the second
norm's scale); the norms of the shares, rows normalised, are rolled out through the layers."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.residual import attention_block_parts, layers_up_to, residual_parts, rolled_contributions, token_map
from attnaudit.explain.helpers.rollout import explained_record
from attnaudit.explain.registry import explanation
from attnaudit.models.interface import AttentionLayer, AttentionModel


def layer_shares(model: AttentionModel, record: AttentionLayer, layer: int) -> Tensor:
    """``(B,Q,K,d)``: token ``j``'s share of token ``i``'s output of the whole layer, FFN left out.

    Post-LN: ``out_i = LN₂(h_i + ffn(h_i))``; the share ``T_i(x_j)`` of ``h_i = LN₁(whole_i)`` becomes
    ``γ₂ ⊙ (T_i(x_j) − mean) / s₂_i`` with ``s₂_i`` the spread of the whole LN₂ input. Pre-LN: the
    second residual passes ``h`` on unchanged, so the shares are those of the attention block."""
    norms = model.residual_norms(layer)
    if norms.placement != "post":  # the second residual passes h on (its feed-forward branch is left out)
        return attention_block_parts(model, record, layer)
    parts, whole = residual_parts(model, record, layer)
    shares = norms.attention_norm.linear(parts, norms.attention_norm.scale(whole)[:, :, None])
    h = norms.attention_norm(whole)
    return norms.ffn_norm.linear(shares, norms.ffn_norm.scale(h + norms.ffn(h))[:, :, None])


def shares_norm(model: AttentionModel, record: AttentionLayer, layer: int) -> Tensor:
    """GlobEnc's unnormalised ``N_ij = ‖share of j in i's layer output‖`` of one layer, ``(B,Q,K)``."""
    return layer_shares(model, record, layer).norm(dim=-1)


@explanation(
    "globenc", "GlobEnc: attention + both residuals and layer norms per layer, rolled out (Modarressi et al. 2022)",
    ("residual_ln",), default=False, order=57,
)
def globenc(model: AttentionModel, batch: Batch) -> Tensor:
    """GlobEnc scores ``(B,K)``: per layer ``N_ij = ‖share of j in i's layer output‖``, rows normalised to 1,
    rolled out (``R = N_l ⋯ N_1``) to the explained layer and read at the explanation query."""
    trace, index, record = explained_record(model, batch)
    with torch.no_grad():
        maps = [token_map(shares_norm, model, r, layer) for layer, r in layers_up_to(trace, index)]
    return rolled_contributions(model, batch, maps, record)
