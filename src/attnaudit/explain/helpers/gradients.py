"""The gradient of the explained decision with respect to the input embeddings."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.explain.registry import choice, decision_score, decision_values
from attnaudit.models.interface import AttentionModel, evaluation


def decision_gradient(model: AttentionModel, batch: Batch, score: str = "logit") -> tuple[Tensor, Tensor]:
    """``(embeddings, ∂s/∂embeddings)``: the gradient of each example's decision score ``s`` (its explained
    class's logit or probability, ``score``, minus its contrast's) with respect to its input embeddings,
    attention live (under whatever backward rules are active)."""
    score = choice("score", score)
    with evaluation(model), torch.enable_grad():
        shared = model.prefix_gradient_forward(batch)
        if shared is not None:  # a generated sequence's steps: one pass over the sequence, one batched backward per row
            sequence, _rows, out = shared
            scores = decision_score(batch, decision_values(out, score))
            (grads,) = torch.autograd.grad(scores, sequence, grad_outputs=torch.eye(len(scores), dtype=scores.dtype, device=scores.device),
                                           is_grads_batched=True)
            # each row's gradient is 0 beyond its own tokens (causal), where its embeddings are padding
            return sequence.detach().expand(len(scores), -1, -1), grads[:, 0]
        embeddings = model.embed(batch).detach().requires_grad_(True)
        values = decision_values(model.logits_forward(batch, embeddings=embeddings), score)
        (grad,) = torch.autograd.grad(decision_score(batch, values).sum(), embeddings)
    return embeddings.detach(), grad


def prefix_integrated_gradients(
    model: AttentionModel, batch: Batch, steps: int, score: str, reference: Callable[[Batch], Tensor | None],
    rule: str = "gausslegendre", scaled: bool = False,
) -> Tensor | None:
    """Integrated Gradients ``(B,T,d)`` (Captum's Gauss–Legendre ``steps``, multiplied by ``e − e'``) of a batch whose rows
    are prefixes of one sequence (a causal decoder's generated steps), or None where the model cannot share the pass
    (:meth:`~attnaudit.models.interface.AttentionModel.prefix_gradient_forward`).

    A row's path point at ``α`` is ``e' + α(e − e')`` over its own positions, the prefix of the longest row's point at
    the same ``α`` (the baseline is per position), and a causal position reads only the positions before it: so one
    pass over the longest row's point gives every row's score, and one batched backward each row's gradient. ``steps``
    passes of one sequence instead of ``steps × B`` rows; the attributions are Captum's for every row (up to float
    rounding). ``reference(one)``: the baseline embeddings of the one-row batch ``one`` (None: zero); ``rule``: Captum's
    quadrature rule; ``scaled``: each step's gradient times its ``α`` (``ig``'s ``weight="scale"``)."""
    from captum.attr._utils.approximation_methods import approximation_parameters

    if batch.tokens.dim() != 2 or len(batch) < 2:
        return None
    one = batch.select(batch.mask.sum(1).argmax().reshape(1).cpu())
    with evaluation(model), torch.no_grad():
        inputs = model.embed(one)
        base = reference(one)
        base = torch.zeros_like(inputs) if base is None else base[:, : inputs.shape[1]]
    step_sizes, alphas = (make(steps) for make in approximation_parameters(rule))
    total: Tensor | None = None
    given = batch
    with evaluation(model):
        for alpha, size in zip(alphas, step_sizes, strict=True):
            with torch.enable_grad():
                shared = model.prefix_gradient_forward(batch, embeddings=base + alpha * (inputs - base))
            if shared is None:
                return None
            if given.explained is None:  # the prediction's class, from the input itself (once, the pass being shareable)
                with torch.no_grad():
                    given = dataclasses.replace(batch, explained=model.logits_forward(batch).probs.argmax(-1))
            point, _rows, out = shared
            with torch.enable_grad():
                scores = decision_score(given, decision_values(out, score))
                (grads,) = torch.autograd.grad(scores, point, grad_outputs=torch.eye(len(scores), dtype=scores.dtype, device=scores.device),
                                               is_grads_batched=True)
            size = size * alpha if scaled else size
            total = grads[:, 0] * size if total is None else total + grads[:, 0] * size
    assert total is not None
    return total * (inputs - base)  # a row's gradient is 0 beyond its own tokens (causal)
