"""``alti``: ALTI, Aggregation of Layer-wise Token-to-token Interactions (Ferrando et al. 2022).

Per layer, the attention block's output ``y_i = Σ_j T_i(x_j)`` is decomposed as by Kobayashi et al.
(2021) (:func:`~attnaudit.explain.helpers.residual.attention_block_parts`; the bias terms, which belong to
no token, left out). Token ``j``'s contribution to ``i`` is how much closer ``T_i(x_j)`` is to ``y_i``
than the origin is, in the Manhattan (L1) distance the paper uses:
``c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``, rows normalised to 1 and rolled out through the layers.
Under L1, ``y_i`` can be farther from every share than from the origin; such a row has no positive
contribution and stays 0 (the paper's normalisation would divide by 0), so the scores then sum to < 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.residual import attention_block_parts, layers_up_to, rolled_contributions, token_map
from attnaudit.explain.helpers.rollout import explained_record
from attnaudit.explain.registry import explanation
from attnaudit.models.interface import AttentionLayer, AttentionModel


def alti_layer(model: AttentionModel, record: AttentionLayer, layer: int) -> Tensor:
    """ALTI's unnormalised ``c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)`` of one layer, ``(B,Q,K)``, 0 at padding."""
    parts = attention_block_parts(model, record, layer)
    y = parts.sum(2, keepdim=True)
    closer = y.abs().sum(-1) - (y - parts).abs().sum(-1)
    return closer.clamp_min(0.0)


@explanation(
    "alti", "ALTI: L1 proximity of each token's share to the attention block's output, rolled out (Ferrando et al. 2022)",
    ("residual_ln",), default=False, order=58,
)
def alti(model: AttentionModel, batch: Batch) -> Tensor:
    """ALTI scores ``(B,K)``: per-layer contributions, rows normalised to 1, rolled out to the explained
    layer and read at the explanation query."""
    trace, index, record = explained_record(model, batch)
    with torch.no_grad():
        maps = [token_map(alti_layer, model, r, layer) for layer, r in layers_up_to(trace, index)]
    return rolled_contributions(model, batch, maps, record)
