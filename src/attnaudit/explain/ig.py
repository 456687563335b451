"""``ig``: Integrated Gradients (Captum) of ``ŷ`` w.r.t. the item embeddings, zero baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain.registry import check_task, decision_score, explained_class, explanation, hierarchical, token_scores
from attnaudit.models.interface import AttentionModel, evaluation

# Activations one Integrated Gradients pass may hold for its backward pass, in floats (about
# 0.5 GB in float32), and at most this many interpolated inputs per pass: a fixed number of rows
# would need 40 GB for ten 60-token prompts of a 30-layer LLM, and 4096 rows keep the small models fast.
_PASS_ACTIVATIONS = 1 << 27
_PASS_ROWS = 4096


def pass_rows(model: AttentionModel, length: int) -> int:
    """Interpolated inputs of ``length`` tokens per forward-backward pass: a rough count of the
    activations each keeps (per layer, the residual-width states, the feed-forward ones and every
    head's attention matrix) within :data:`_PASS_ACTIVATIONS`."""
    c = model.config
    per_token = 8 * max(c.d_model, c.hidden_dim, c.embed_dim) + 3 * c.d_ff + 2 * c.heads * length
    per_row = length * max(c.layers, 1) * per_token
    return max(1, min(_PASS_ROWS, _PASS_ACTIVATIONS // max(per_row, 1)))


@explanation(
    "ig", "Integrated Gradients of ŷ w.r.t. the embeddings, zero baseline, |Σ_d| per token (Captum)",
    ("prediction", "gradients"), order=40,
)
def integrated_gradients(model: AttentionModel, batch: Batch, steps: int = 50, absolute: bool = True) -> Tensor:
    """Integrated Gradients (Captum) of ``ŷ`` w.r.t. the item embeddings, zero baseline, ``(B, K)``
    (``ŷ``: the predicted class's probability, or the batch's explained class's, minus its contrast's).

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
            probs = model(batch).probs
            chosen = explained_class(batch, probs)
            contrast = batch.contrast.to(probs.device) if batch.contrast is not None else None
            embeddings = model.embed(batch)
        nested = hierarchical(model)
        passage = embeddings if nested else embeddings[:, :t]
        rest = None if nested or embeddings.shape[1] == t else embeddings[:, t:]

        def forward(
            x: Tensor, tokens: Tensor, mask: Tensor, features: Tensor | None, query: Tensor | None,
            query_mask: Tensor | None, tail: Tensor | None, target: Tensor | None, target_mask: Tensor | None,
            explained: Tensor, contrast: Tensor | None,
        ) -> Tensor:
            emb = x if tail is None else torch.cat([x, tail], 1)
            sub = Batch(tokens=tokens, mask=mask, features=features, query=query, query_mask=query_mask,
                        target=target, target_mask=target_mask, explained=explained, contrast=contrast)
            return decision_score(sub, model(sub, embeddings=emb).probs)[:, None]  # column 0: what is explained

        per_pass = max(1, pass_rows(model, t) // max(len(batch), 1))
        attributions = IntegratedGradients(forward).attribute(
            passage,
            target=0,
            additional_forward_args=(batch.tokens, batch.mask, batch.features, batch.query, batch.query_mask, rest,
                                     batch.target, batch.target_mask, chosen, contrast),
            n_steps=steps,
            internal_batch_size=len(batch) * min(steps, per_pass),
        )
    return token_scores(attributions.sum(-1).detach(), model, batch, absolute)
