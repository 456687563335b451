"""The global attention adversary's objectives and sub-runs (Wiegreffe & Pinter 2019; the CoNLL tagging study).

A model like the audited one is trained to predict as it does while its attention diverges from
the base's: W&P's ``TVD − λ·KL`` for classifiers, ``NLL(base tags) − λ·KL`` for taggers. The
global-adversary test trains them over a grid of λ; the diagnostic and probe tests reuse the same
sub-runs (same folder, same hash), so they live here, below the tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit.algorithms.metrics import output_change, row_mean
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import AttentionLayer, AttentionModel, ModelOutput
from attnaudit.run import Run
from attnaudit.training.adversary import LossFn, SubRun, Variant, subrun_dir, train_variant

SUBRUN_TEST = "global-adversary"
"""The test whose folder holds the adversary sub-runs (shared with diagnostic and probe)."""


def differentiable_kl(p: Tensor, q: Tensor, eps: float = 1e-10) -> Tensor:
    """``KL(p ‖ q)`` in nats along the last axis with finite gradients at exact zeros.

    Same value as :func:`attnaudit.algorithms.metrics.kl` (the same ``eps`` smoothing of ``q``, which keeps
    ``log q`` finite), but ``p·log p`` uses ``log max(p, tiny)``: ``xlogy``'s derivative is
    ``-inf`` at ``p = 0`` (padding keys), which the masked softmax backward turns into NaN.
    """
    tiny = torch.finfo(p.dtype).tiny
    q_smooth = (q + eps) / (1.0 + q.shape[-1] * eps)
    return (p * (p.clamp_min(tiny).log() - q_smooth.log())).sum(-1)


def _rows(layer: AttentionLayer) -> Tensor:
    """Real query rows ``(B,Q)`` of an attention record (all rows for single-query attention)."""
    if layer.query_mask is not None:
        return layer.query_mask.bool()
    size, _, q, _ = layer.weights.shape
    return layer.mask.new_ones(size, q, dtype=torch.bool)


def _reference(base: AttentionModel) -> Callable[[Batch], ModelOutput]:
    """``fn(batch) -> base output`` in eval mode without gradient (the fixed model the adversary tracks)."""
    base.eval()

    def fn(batch: Batch) -> ModelOutput:
        with torch.no_grad():
            return base(batch)

    return fn


def classification_loss(base: AttentionModel, lam: float) -> LossFn:
    """W&P: ``mean_i [TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv ‖ α_base)]``, KL averaged over heads and query rows."""
    reference, layer = _reference(base), base.explained_layer

    def loss(batch: Batch, output: ModelOutput) -> Tensor:
        ref = reference(batch)
        mine, theirs = output.trace[layer], ref.trace[layer]
        change = output_change(output.probs, ref.probs)
        divergence = row_mean(differentiable_kl(mine.weights, theirs.weights), _rows(theirs))
        return (change - lam * divergence).mean()

    return loss


KL_SCALES = ("token", "entry")


def tagging_loss(base: AttentionModel, lam: float, kl_scale: str = "token") -> LossFn:
    """The tagging study: ``NLL(ŷ_adv, base tags) − λ·KL(α_base ‖ α_adv)``, NLL a mean over real tokens.

    KL: mean over real (token, head) rows (``token``) or over the entries of every sentence's
    ``heads × n × n`` attention (``entry``: each sentence's row sum divided by ``heads · n²``,
    pooled over the batch like one unpadded ``kl_div(reduction="mean")``).
    """
    if kl_scale not in KL_SCALES:
        raise AttnAuditError(f"--kl-scale must be one of {', '.join(KL_SCALES)}, got {kl_scale!r}")
    reference, layer = _reference(base), base.explained_layer

    def loss(batch: Batch, output: ModelOutput) -> Tensor:
        ref = reference(batch)
        real = batch.mask.bool()
        target = ref.logits.argmax(-1).masked_fill(~real, -100)
        logits = output.logits
        nll = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
        theirs, mine = ref.trace[layer], output.trace[layer]
        per_row = differentiable_kl(theirs.weights, mine.weights)
        rows = _rows(theirs)[:, None, :].expand_as(per_row).to(per_row.dtype)
        total = (per_row * rows).sum()
        if kl_scale == "entry":
            lengths = batch.mask.sum(-1).to(per_row.dtype)  # n per sentence
            return nll - lam * total / (per_row.shape[1] * (lengths**2).sum()).clamp_min(1.0)
        return nll - lam * total / rows.sum().clamp_min(1.0)

    return loss


INITS = ("scratch", "base")


DEFAULT_INIT = {"classification": "scratch", "pair": "scratch", "tagging": "base"}


def resolve_init(run: Run, init: str) -> str:
    """``init`` or, when empty, the task's default: a fresh model for W&P's classification
    adversary; the base's weights for the tagging study, so that its attention starts at KL 0 from
    the base's (a fresh Transformer's starts nats away, beyond the study's KL scale, breakpoint ≈ 0.33).
    """
    return init or DEFAULT_INIT[run.task.task_type]


def adversary_variant(run: Run, lam: float, init: str = "scratch", kl_scale: str = "token") -> Variant:
    """The adversary of ``run`` at ``λ``: classification (W&P) or tagging objective by task type."""
    if init not in INITS:
        raise AttnAuditError(f"--init must be one of {', '.join(INITS)}, got {init!r}")
    tagging = run.task.task_type == "tagging"
    if kl_scale != "token" and not tagging:
        raise AttnAuditError("--kl-scale entry applies to the tagging objective only")
    loss = tagging_loss(run.model, lam, kl_scale) if tagging else classification_loss(run.model, lam)
    objective = "nll(base tags) - lambda*kl(base||adv)" if tagging else "tvd - lambda*kl(adv||base)"
    key: dict[str, Any] = {"kind": "adversary", "objective": objective, "lambda": float(lam)}
    if init == "base":
        key["init"] = init  # absent for scratch, the default, so earlier sub-runs keep their hash
    if kl_scale != "token":
        key["kl_scale"] = kl_scale  # likewise absent at the default
    return Variant(key=key, loss=loss, start=run.model if init == "base" else None)


def check_lambdas(lambdas: Sequence[float]) -> None:
    """Every λ finite and non-negative, checked before the first adversary trains."""
    bad = [lam for lam in lambdas if not math.isfinite(lam) or lam < 0]
    if bad:
        raise AttnAuditError(f"λ must be finite and non-negative, got {', '.join(f'{lam:g}' for lam in bad)}")


def adversary(
    run: Run, lam: float, seed: int, epochs: int | None = None, init: str = "", kl_scale: str = "token"
) -> SubRun:
    """The global adversary at ``λ`` (trained, or loaded when finished); shared with ``diagnostic`` and ``probe``.

    ``init``: ``scratch``, ``base`` or empty for the task's default (:func:`resolve_init`);
    ``kl_scale``: the tagging KL's normalisation (``token`` or ``entry``, see the module docstring).
    """
    check_lambdas([lam])
    init = resolve_init(run, init)
    suffix = ("-from-base" if init == "base" else "") + ("" if kl_scale == "token" else f"-kl-{kl_scale}")
    out = subrun_dir(run, SUBRUN_TEST, f"lambda-{lam:g}-seed-{seed}" + suffix)
    variant = adversary_variant(run, lam, init, kl_scale)
    return train_variant(run, out, variant, epochs=epochs, seed=seed, label=f"adversary λ={lam:g} ({init})")
