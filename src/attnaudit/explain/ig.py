"""``ig``: Integrated Gradients (Captum) of ``ŷ`` w.r.t. the item embeddings, zero baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain.base import check_task, explanation, hierarchical, token_scores
from attnaudit.models.base import AttentionModel, evaluation


@explanation(
    "ig", "Integrated Gradients of ŷ w.r.t. the embeddings, zero baseline, |Σ_d| per token (Captum)",
    ("prediction", "gradients"), order=40,
)
def integrated_gradients(model: AttentionModel, batch: Batch, steps: int = 50, absolute: bool = True) -> Tensor:
    """Integrated Gradients (Captum) of ``ŷ`` w.r.t. the item embeddings, zero baseline, ``(B, K)``.

    Attributions are summed over the embedding dimension per token; with ``absolute``
    (the default, like ``gradient``) the sum's absolute value is taken, so scores rank
    magnitude regardless of direction. HAN sums its tokens' values per sentence.
    ``absolute=False`` keeps the sign, so a row sums to ``f(x) − f(0)`` up to the
    integration error (completeness). Pair models: only the passage embeddings are
    integrated; the question stays as it is.
    """
    from captum.attr import IntegratedGradients

    check_task(model)
    if steps < 1:
        raise AttnAuditError(f"integrated gradients needs steps >= 1, got {steps}")
    t = batch.tokens.shape[1]
    with evaluation(model):
        with torch.no_grad():
            target = model(batch).probs.argmax(-1)
            embeddings = model.embed(batch)
        nested = hierarchical(model)
        passage = embeddings if nested else embeddings[:, :t]
        rest = None if nested or embeddings.shape[1] == t else embeddings[:, t:]

        def forward(
            x: Tensor, tokens: Tensor, mask: Tensor, features: Tensor | None,
            query: Tensor | None, query_mask: Tensor | None, tail: Tensor | None,
        ) -> Tensor:
            emb = x if tail is None else torch.cat([x, tail], 1)
            sub = Batch(tokens=tokens, mask=mask, features=features, query=query, query_mask=query_mask)
            return model(sub, embeddings=emb).probs

        per_pass = max(1, 4096 // max(len(batch), 1))
        attributions = IntegratedGradients(forward).attribute(
            passage,
            target=target,
            additional_forward_args=(batch.tokens, batch.mask, batch.features, batch.query, batch.query_mask, rest),
            n_steps=steps,
            internal_batch_size=len(batch) * min(steps, per_pass),
        )
    return token_scores(attributions.sum(-1).detach(), model, batch, absolute)
