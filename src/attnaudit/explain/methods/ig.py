"""``ig``: Integrated Gradients (Captum) of ``ŷ`` w.r.t. the item embeddings, zero baseline (or a token's embedding)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from attnaudit.data.batching import length_groups
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain.helpers.baselines import baseline_token
from attnaudit.explain.helpers.gradients import prefix_integrated_gradients
from attnaudit.explain.registry import (
    check_task,
    choice,
    decision_score,
    decision_values,
    explained_class,
    explanation,
    hierarchical,
    reduce_dimensions,
)
from attnaudit.models.interface import AttentionModel, evaluation

# Activations one Integrated Gradients pass may hold for its backward pass, in floats (about
# 0.5 GB in float32), and at most this many interpolated inputs per pass: a fixed number of rows
# would need 40 GB for ten 60-token prompts of a 30-layer LLM, and 4096 rows keep the small models fast.
_PASS_ACTIVATIONS = 1 << 27
_PASS_ROWS = 4096


DELETE_IS_NO_EMBEDDING = "baseline 'delete' removes tokens (leave-one-out, erasures); IG integrates from an embedding: zero, unk, pad, mask or eos"


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
    ("prediction", "gradients"), order=40, target_side=True,
    settings_check=lambda model, settings: DELETE_IS_NO_EMBEDDING if settings.get("baseline") == "delete" else None,
)
def integrated_gradients(
    model: AttentionModel, batch: Batch, steps: int = 50, absolute: bool = True, reduction: str = "abs_sum",
    score: str = "probability", baseline: str = "zero", rule: str = "gausslegendre", weight: str = "none",
) -> Tensor:
    """Integrated Gradients (Captum) of ``ŷ`` w.r.t. the item embeddings, zero baseline, ``(B, K)``
    (``ŷ``: the predicted class's probability, or the batch's explained class's, minus its contrast's).

    The attributions ``(e − e')_{t,d} · ∫ ∂ŷ/∂e_{t,d}`` are reduced per token by ``reduction``:
    ``abs_sum`` ``|Σ_d|`` (the default, like ``gradient``: scores rank magnitude regardless of
    direction), ``l2`` ``‖·‖₂`` (inseq's) or ``sum`` ``Σ_d`` (signed: a row then sums to
    ``f(x) − f(x')`` up to the integration error, completeness). ``absolute=False`` is
    ``reduction="sum"`` (kept for existing callers). HAN sums its tokens' values per sentence.
    ``score``: what is integrated, ``probability`` (the default) or ``logit``. ``baseline`` ``e'``:
    ``zero`` embeddings (the default), or at every item the embedding of the tokenizer's ``unk``,
    ``pad``, ``mask`` or ``eos`` token (inseq's is ``unk``; a one-line error when the model has none).
    ``rule``: where the ``steps`` lie on the path (Captum's rules, :data:`~attnaudit.explain.registry.RULES`);
    ``weight="scale"`` multiplies each step's gradient by its position ``α`` on the path
    (:data:`~attnaudit.explain.registry.STEP_WEIGHTS`): with ``rule="riemann_right"``, ``score="logit"`` and the
    gold label explained, Madsen et al. 2022's "integrated gradient", ``|1/n Σ_i α_i ∇z(α_i e)·e|``.
    Pair models: only the passage embeddings are integrated; the question stays as it is.
    """
    from captum.attr import IntegratedGradients

    check_task(model)
    if steps < 1:
        raise AttnAuditError(f"integrated gradients needs steps >= 1, got {steps}")
    reduction, score, baseline = choice("reduction", reduction), choice("score", score), choice("baseline", baseline)
    rule, weight = choice("rule", rule), choice("weight", weight)
    if baseline == "delete":
        raise AttnAuditError(f"ig: {DELETE_IS_NO_EMBEDDING}")
    if not absolute:
        if reduction not in ("abs_sum", "sum"):
            raise AttnAuditError(f"ig: absolute=False is reduction='sum'; it does not combine with reduction={reduction!r}")
        reduction = "sum"
    shared = prefix_integrated_gradients(model, batch, steps, score,
                                         lambda one: None if baseline == "zero" else baseline_embeddings(model, one, baseline),
                                         rule, weight == "scale")
    if shared is not None:  # a generated sequence's steps: one pass of the longest row per step of the path
        return reduce_dimensions(shared.detach(), model, batch, reduction)
    groups = _groups(model, batch)
    if len(groups) > 1:  # each group without the longer ones' padding: IG runs the model once per step
        options = {"steps": steps, "reduction": reduction, "score": score, "baseline": baseline, "rule": rule, "weight": weight}
        parts = [(index, integrated_gradients(model, batch.select(index), **options)) for index in groups]
        out = parts[0][1].new_zeros(len(batch), batch.tokens.shape[1])
        for index, part in parts:
            out[index.to(out.device), : part.shape[1]] = part
        return out
    t = batch.tokens.shape[1]
    with evaluation(model):
        with torch.no_grad():
            probs = model.logits_forward(batch).probs
            chosen = explained_class(batch, probs)
            contrast = batch.contrast.to(probs.device) if batch.contrast is not None else None
            embeddings = model.embed(batch)
            nested = hierarchical(model)
            whole = nested or model.target_items  # an encoder-decoder's target side is integrated too
            passage = embeddings if whole else embeddings[:, :t]
            reference = None if baseline == "zero" else baseline_embeddings(model, batch, baseline)[:, : passage.shape[1]]
        rest = None if whole or embeddings.shape[1] == t else embeddings[:, t:]

        def forward(
            x: Tensor, tokens: Tensor, mask: Tensor, features: Tensor | None, query: Tensor | None,
            query_mask: Tensor | None, tail: Tensor | None, target: Tensor | None, target_mask: Tensor | None,
            explained: Tensor, contrast: Tensor | None, start: Tensor, end: Tensor,
        ) -> Tensor:
            emb = x if tail is None else torch.cat([x, tail], 1)
            sub = Batch(tokens=tokens, mask=mask, features=features, query=query, query_mask=query_mask,
                        target=target, target_mask=target_mask, explained=explained, contrast=contrast)
            out = decision_score(sub, decision_values(model.logits_forward(sub, embeddings=emb), score))
            if weight == "scale":  # Captum has no per-step weight: α ∇f is the gradient of α·f with α, read off the point, held constant
                out = out * path_position(x, start, end).detach()
            return out[:, None]  # column 0: what is explained

        per_pass = max(1, pass_rows(model, t) // max(len(batch), 1))
        attributions = IntegratedGradients(forward).attribute(
            passage,
            baselines=reference,
            target=0,
            additional_forward_args=(batch.tokens, batch.mask, batch.features, batch.query, batch.query_mask, rest,
                                     batch.target, batch.target_mask, chosen, contrast,
                                     torch.zeros_like(passage) if reference is None else reference, passage),
            n_steps=steps,
            method=rule,
            internal_batch_size=len(batch) * min(steps, per_pass),
        )
    return reduce_dimensions(attributions.detach(), model, batch, reduction)


def path_position(point: Tensor, start: Tensor, end: Tensor) -> Tensor:
    """Per row, the ``α`` with ``point = start + α (end − start)`` (least squares over the row; 0 where start = end)."""
    span = (end - start).flatten(1)
    return ((point - start).flatten(1) * span).sum(1) / (span * span).sum(1).clamp_min(torch.finfo(span.dtype).tiny)


def _groups(model: AttentionModel, batch: Batch) -> list[Tensor]:
    """Instances of similar length (:func:`~attnaudit.data.batching.length_groups`) where a group's scores are
    its members' with the padding cut (flat tokens, the explained items all on the source side); else one group."""
    if batch.tokens.dim() != 2 or hierarchical(model) or model.target_items:
        return [torch.arange(len(batch))]
    return length_groups(batch.mask.sum(1).cpu())


def baseline_embeddings(model: AttentionModel, batch: Batch, name: str) -> Tensor:
    """The embeddings ``model.embed`` gives ``batch`` with every token (of the passage: a pair model's question
    stays) replaced by the ``name`` token. ``embed`` returns the input token embeddings before any positions
    or token types (those are added inside the model's forward), so every position gets the same vector."""
    token = baseline_token(model, name)
    tokens = torch.full_like(batch.tokens, token)
    target = batch.target
    if model.target_items and target is not None:  # the earlier target tokens too, after the start token
        target = torch.cat([target[:, :1], torch.full_like(target[:, 1:], token)], 1)
    return model.embed(dataclasses.replace(batch, tokens=tokens, target=target))
