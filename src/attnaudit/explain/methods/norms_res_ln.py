"""``norms_res_ln``: Kobayashi et al. (2021)'s norm of each input token's share of the output of the
attention block, residual connection and (the linear part of) layer norm included, read at the
explanation query of the explained layer. The decomposition itself (:func:`attention_block_parts`)
is shared with ``globenc`` and ``alti``.

Post-LN (BERT, our Transformer): ``h_i = LN(Σ_j Σ_h α^h_ij f_h(x_j) + x_i + b_O)`` splits into
``h_i = Σ_j g_i(Σ_h α^h_ij f_h(x_j) + δ_ij x_i) + g_i(b_O) + β`` with
``g_i(z) = γ ⊙ (z − mean z) / s_i`` and ``s_i`` the standard deviation of the whole LN input of token
``i``; the share of token ``j`` is ``g_i(…)``. Pre-LN (Llama, GPT-2): ``h_i = x_i + Σ_j α_ij f(LN(x_j)) + b_O``;
the norm acts on each token before it is mixed, so the share of ``j`` is ``α_ij f(LN(x_j)) + δ_ij x_i``.
The bias terms belong to no token and are left out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.residual import (
    attention_block_parts,
    token_map,
)
from attnaudit.explain.helpers.rollout import explained_record
from attnaudit.explain.registry import explanation, on_items, query_row
from attnaudit.models.interface import AttentionModel


@explanation(
    "norms_res_ln", "‖share of token j in the attention block's output‖, residual and layer norm included (Kobayashi et al. 2021)",
    ("residual_ln",), default=False, order=56,
)
def norms_res_ln(model: AttentionModel, batch: Batch) -> Tensor:
    """Kobayashi et al.'s (2021) attention + residual + layer-norm contribution norm ``‖T_i(x_j)‖`` of the
    explained layer, read at the explanation query, ``(B,K)``."""
    _, index, record = explained_record(model, batch)
    with torch.no_grad():
        norms = token_map(lambda m, r, layer: attention_block_parts(m, r, layer).norm(dim=-1), model, record, index)
    return on_items(model, batch, query_row(model, norms, record.query_mask))
