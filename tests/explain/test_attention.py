"""The explained attention: per layer and head, HAN's word layer, range checks."""

from __future__ import annotations

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.explain import item_mask
from attnaudit.explain.helpers.attention import attention_per_head
from attnaudit.explain.methods.attention import attention_importance


@pytest.mark.parametrize("family", ["bilstm", "transformer", "han"])
def test_attention_importance_is_the_explained_attention(runs: dict, family: str) -> None:
    run, batch = runs[family]
    mask = item_mask(run, batch)
    attention = attention_importance(run, batch)
    torch.testing.assert_close(attention.sum(1), torch.ones(len(batch)))
    heads = attention_per_head(run, batch)
    torch.testing.assert_close(heads[:, -1].mean(1), attention)
    assert (heads.permute(0, 3, 1, 2)[~mask] == 0).all()
    with torch.no_grad():
        record = run.model(batch).trace[run.model.explained_layer]
    expected = record.weights.mean(1).mean(1) if family != "transformer" else None
    if expected is not None:  # one query row: the weights themselves, averaged over heads
        torch.testing.assert_close(attention, expected.reshape(len(batch), -1)[:, : mask.shape[1]] * mask)
    if family == "transformer":
        assert heads.shape[1:3] == (2, 2)
        torch.testing.assert_close(attention_importance(run.model, batch, layer=0, head=1), heads[:, 0, 1])
        with pytest.raises(AttnAuditError, match="head 5 out of range"):
            attention_importance(run, batch, head=5)
        with pytest.raises(AttnAuditError, match="out of range"):
            attention_importance(run, batch, layer=2)
    if family == "han":
        words = attention_importance(run, batch, layer=0)
        assert words.shape == (len(batch), batch.tokens.shape[1] * batch.tokens.shape[2])
