"""What the perturbation explainers share: coalitions of feature groups, their perturbed inputs and the decision
value of each, in batches.

A *coalition* is a set of an instance's feature groups (:func:`~attnaudit.explain.helpers.features.feature_groups`:
tokens, or segments) that stay as they are; every other group is perturbed as one unit by the ``baseline``:
``delete`` (its items removed, later tokens moving up, as leave-one-out does), a token (every item replaced by
the tokenizer's ``unk``/``pad``/``mask``/``eos`` token, the length kept: Captum's ``TextTokenInput`` baselines) or
``zero`` (zero input embeddings). Its *value* ``v(S)`` is what the other methods explain: the explained class's
probability ``ŷ`` (the prediction of the unperturbed input, or ``batch.explained``), minus the contrast class's
when the batch has one.

Many coalitions run in one forward pass, in passes of bounded size, identical coalitions once; a causal decoder
(:attr:`~attnaudit.models.interface.LanguageModel.continues_prefix`) keeps the full pass's keys and values of
the tokens before a coalition's first perturbed position and reruns only the rest (as leave-one-out does).
Random draws follow Captum's own calls to torch's generator seeded once per instance, so a seed gives the
coalitions and permutations Captum draws after ``torch.manual_seed(seed)`` for that instance alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain.helpers.baselines import baseline_token
from attnaudit.explain.helpers.features import feature_groups
from attnaudit.explain.helpers.items import compact_items
from attnaudit.explain.registry import check_task, choice, explained_class, hierarchical, item_mask
from attnaudit.models.interface import AttentionModel, evaluation, language_model

DEFAULT_BASELINE = "delete"
"""What a perturbed group becomes unless ``baseline`` says otherwise: removed from the input (leave-one-out's and
ERASER's removal)."""
_PASS_ELEMENTS = 1 << 21
"""Activation elements per batched forward pass of whole perturbed inputs."""
_PASS_TOKENS = 512
"""Tokens per pass of a decoder's continuations after the kept prefix."""
_PASS_ROWS = 256
"""Rows per pass at the most (a continuation's prefix keys and values travel with each row)."""
_CHUNK_ROWS = 1 << 14
"""Coalitions handled at once (their masks, deduplication), whatever their number in all ..."""
_CHUNK_ELEMENTS = 1 << 24
"""... and at most this many mask elements (coalitions × items: 128 MB of int64 for deduplication) at once."""


def token_baseline(model: AttentionModel, name: str) -> int:
    """The id of the tokenizer's (our vocabularies': ``pad`` 0, ``unk`` 1) ``unk``/``pad``/``mask``/``eos`` token
    (:func:`~attnaudit.explain.helpers.baselines.baseline_token`); a one-line error when the model has none."""
    return baseline_token(model, name, who="perturbation", other="delete")


def baseline_reason(model: AttentionModel, baseline: str) -> str | None:
    """Why ``baseline`` cannot perturb this model's inputs (a token it lacks), or None."""
    name = choice("baseline", baseline)
    if name in ("delete", "zero"):
        return None
    try:
        token_baseline(model, name)
    except AttnAuditError as error:
        return str(error)
    return None


@dataclass
class Perturber:
    """One batch ready for coalitions: its explained items, their groups, the unperturbed pass and decision."""

    model: AttentionModel
    batch: Batch
    baseline: str
    items: Tensor
    """``(B, K)`` bool: the explained items."""
    groups: Tensor
    """``(B, K)`` long: each item's group, -1 where no item."""
    counts: list[int]
    """Groups per instance."""
    full: Tensor
    """``(B,)`` float64: ``v`` of every group kept."""
    classes: Tensor
    output: object | None
    token: int | None

    def values(self, rows: Tensor, present: Tensor) -> Tensor:
        """``(R,)`` float64: ``v`` of each coalition, instance ``rows[r]`` keeping the groups ``present[r]``
        (``(R, M)`` bool over group numbers; columns past an instance's groups are ignored)."""
        out = torch.empty(len(rows), dtype=torch.float64)
        size = max(1, min(_CHUNK_ROWS, _CHUNK_ELEMENTS // (self.items.shape[1] + 1)))
        for start in range(0, len(rows), size):
            part = slice(start, start + size)
            out[part] = self._chunk(rows[part], present[part])
        return out

    def _chunk(self, rows: Tensor, present: Tensor) -> Tensor:
        device = self.items.device
        rows, present = rows.to(device), present.to(device)
        groups = self.groups[rows]
        kept = present.gather(1, groups.clamp_min(0)) | (groups < 0)  # (R, K): items staying, and every non-item
        unique, inverse = torch.unique(torch.cat([rows[:, None], kept.long()], 1), dim=0, return_inverse=True)
        urows, ukept = unique[:, 0], unique[:, 1:].bool()
        values = self.full[urows.cpu()].clone()
        changed = (self.items[urows] & ~ukept).any(1)
        todo = changed.nonzero()[:, 0]
        if len(todo):
            values[todo.cpu()] = self._perturbed_values(urows[todo], ukept[todo])
        return values[inverse.cpu()]

    def _perturbed_values(self, rows: Tensor, kept: Tensor) -> Tensor:
        if self.output is not None:
            probs = self._continued(rows, kept)
        else:
            probs = self._recomputed(rows, kept)
        return self.score(rows, probs)

    def score(self, rows: Tensor, probs: Tensor) -> Tensor:
        """``(R,)`` float64: the explained class's probability (minus the contrast's) of instance ``rows[r]``."""
        rows = rows.to(probs.device)
        value = probs.gather(1, self.classes.to(probs.device)[rows][:, None])[:, 0]
        if self.batch.contrast is not None:
            value = value - probs.gather(1, self.batch.contrast.to(probs.device)[rows][:, None])[:, 0]
        return value.double().cpu()

    def _sequences(self, rows: Tensor, kept: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Flat tokens: the perturbed ``(R, T)`` tokens (left-aligned), their lengths and each row's first changed position."""
        batch, pad = self.batch, self.model.config.pad_id
        real = batch.mask.bool()[rows]
        tokens = batch.tokens[rows]
        removed = self.items[rows] & ~kept
        first = torch.where(removed.any(1), removed.long().argmax(1), real.sum(1))
        if self.baseline == "delete":
            staying = real & ~removed
            order = torch.sort((~staying).to(torch.int8), dim=1, stable=True).indices
            lengths = staying.sum(1)
            tokens = tokens.gather(1, order)
            empty = lengths == 0  # nothing left: the input is read as one padding token (a model needs one)
            lengths = lengths.clamp_min(1)
            first = torch.minimum(first, lengths - 1)
        else:
            tokens = tokens.masked_fill(removed, int(self.token if self.token is not None else pad))
            lengths, empty = real.sum(1), torch.zeros_like(first, dtype=torch.bool)
        valid = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        tokens = tokens.masked_fill(~valid | empty[:, None], pad)
        return tokens, lengths, first

    def _continued(self, rows: Tensor, kept: Tensor) -> Tensor:
        """Probabilities ``(R, C)`` of a causal decoder continuing from the unperturbed keys and values before
        each row's first changed position (the last token at least is rerun: it predicts)."""
        hf = language_model(self.model, "a decoder's perturbation from a key/value prefix")
        tokens, lengths, first = self._sequences(rows, kept)
        start = torch.minimum(first, lengths - 1).clamp_min(0)
        span = lengths - start
        order = torch.argsort(span, descending=True, stable=True)
        spans = span[order].tolist()
        out, at = [], 0
        while at < len(rows):
            size = min(_PASS_ROWS, max(1, _PASS_TOKENS // max(spans[at], 1)))
            sub = order[at : at + size]
            at += size
            steps = torch.arange(int(span[sub].max()), device=tokens.device)[None, :]
            valid = steps < span[sub][:, None]
            source = (start[sub][:, None] + steps).clamp_max(tokens.shape[1] - 1)
            rest = hf.encode(Batch(tokens=tokens[sub].gather(1, source).masked_fill(~valid, self.model.config.pad_id), mask=valid))
            rest.extra["prefix"] = hf.prefix_from(self.output, rows[sub], start[sub])  # type: ignore[arg-type]
            out.append(hf.decode(rest, keep_layers=()).probs)
        return torch.cat(out)[torch.argsort(order)]

    def _recomputed(self, rows: Tensor, kept: Tensor) -> Tensor:
        """Probabilities ``(R, C)`` of the perturbed inputs run whole, longest first, in passes of bounded size."""
        batch, model = self.batch, self.model
        lengths = batch.mask.bool()[rows].reshape(len(rows), -1).sum(1)
        order = torch.argsort(lengths, descending=True, stable=True)
        c = model.config
        per_row = batch.tokens[0].numel() * (batch.tokens.shape[-1] + max(c.d_model, c.hidden_dim, c.embed_dim))
        size = max(1, min(_PASS_ROWS * 16, _PASS_ELEMENTS // max(per_row, 1)))
        out = []
        for at in range(0, len(rows), size):
            sub = order[at : at + size]
            out.append(self._run(rows[sub], kept[sub]))
        return torch.cat(out)[torch.argsort(order)]

    def _run(self, rows: Tensor, kept: Tensor) -> Tensor:
        batch, model = self.batch, self.model
        if self.baseline == "delete":
            staying = batch.mask.bool()[rows] & (kept | ~self.items[rows]) if batch.tokens.dim() == 2 else kept | ~self.items[rows]
            if batch.tokens.dim() == 3:
                staying = staying & batch.mask.bool()[rows].any(-1)
            sub = compact_items(batch, rows, staying, model.config.pad_id)
            empty = ~sub.mask.reshape(len(rows), -1).any(1)
            if empty.any():  # nothing left: one padding token
                mask = sub.mask.clone()
                mask.view(len(rows), -1)[empty, 0] = True
                sub = dataclasses.replace(sub, mask=mask)
            return model.logits_forward(sub).probs
        removed = self.items[rows] & ~kept
        tokens, mask = batch.tokens[rows], batch.mask.bool()[rows]
        if tokens.dim() == 3:
            removed = removed[:, :, None] & mask
        sub = Batch(tokens=tokens, mask=batch.mask[rows], features=_rows(batch.features, rows), query=_rows(batch.query, rows),
                    query_mask=_rows(batch.query_mask, rows), target=_rows(batch.target, rows), target_mask=_rows(batch.target_mask, rows))
        if self.baseline != "zero":
            return model.logits_forward(dataclasses.replace(sub, tokens=tokens.masked_fill(removed, int(self.token or 0)))).probs
        embeddings = model.embed(sub)
        flat = removed
        if embeddings.dim() == 3 and embeddings.shape[1] > flat.shape[1]:  # a pair model's question follows: it stays
            flat = torch.cat([flat, flat.new_zeros(len(rows), embeddings.shape[1] - flat.shape[1])], 1)
        return model.logits_forward(sub, embeddings=embeddings.masked_fill(flat[..., None], 0.0)).probs


def _rows(t: Tensor | None, rows: Tensor) -> Tensor | None:
    return None if t is None else t[rows.to(t.device)]


@contextlib.contextmanager
def perturbing(model: AttentionModel, batch: Batch, baseline: str = DEFAULT_BASELINE) -> Iterator[Perturber]:
    """A :class:`Perturber` for ``batch`` (eval mode, no gradients for the block); a one-line error for a
    ``baseline`` the model cannot take."""
    check_task(model)
    baseline = choice("baseline", baseline)
    reason = baseline_reason(model, baseline)
    if reason:
        raise AttnAuditError(reason)
    token = None if baseline in ("delete", "zero") else token_baseline(model, baseline)
    items = item_mask(model, batch)
    groups = feature_groups(model, batch)
    counts = (groups.max(1).values + 1).clamp_min(0).tolist()
    prefix = (
        getattr(model, "continues_prefix", False) and baseline != "zero" and batch.tokens.dim() == 2
        and not hierarchical(model) and items.shape == batch.mask.shape
    )
    with evaluation(model), torch.no_grad():
        if prefix:
            output = model.decode(model.encode(batch))  # every layer's keys and values: the prefixes
            trace: object | None = output.trace
        else:
            output, trace = model.logits_forward(batch), None
        classes = explained_class(batch, output.probs)
        perturber = Perturber(model, batch, baseline, items, groups, counts, torch.zeros(0), classes, trace, token)
        perturber.full = perturber.score(torch.arange(len(batch)), output.probs)
        yield perturber


def spread(model: AttentionModel, batch: Batch, groups: Tensor, per_group: list[Tensor]) -> Tensor:
    """``(B, K)`` scores: each item the attribution of its group (``per_group[b]`` over instance ``b``'s groups), 0 elsewhere."""
    out = torch.zeros(groups.shape, dtype=torch.float32, device=groups.device)
    for b, values in enumerate(per_group):
        if len(values):
            row = groups[b]
            at = row >= 0
            out[b, at] = values.to(out)[row[at]]
    return out


def seeded(seed: int) -> contextlib.AbstractContextManager[object]:
    """The block's draws from torch's global CPU generator seeded with ``seed`` (the state restored after),
    so each instance draws what Captum draws for it after ``torch.manual_seed(seed)``."""

    @contextlib.contextmanager
    def block() -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield

    return block()


def weighted_linear_fit(x: Tensor, y: Tensor, weights: Tensor) -> Tensor:
    """Coefficients of the weighted least-squares fit ``y ≈ x @ c + b`` with an intercept, as scikit-learn's
    ``LinearRegression(fit_intercept=True).fit(x, y, sample_weight=weights)`` computes them (Captum's
    ``SkLearnLinearRegression``: weighted centring, rows scaled by √w, minimum-norm least squares), in float64."""
    x, y, w = x.double().cpu(), y.double().cpu(), weights.double().cpu()
    mean_x = (w[:, None] * x).sum(0) / w.sum()
    mean_y = (w * y).sum() / w.sum()
    root = w.sqrt()
    xc, yc = (x - mean_x) * root[:, None], (y - mean_y) * root
    return torch.linalg.lstsq(xc, yc[:, None], driver="gelsd").solution[:, 0]
