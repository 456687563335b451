"""``loo``: leave-one-out, the output change when an item is *removed* from the input (Jain & Wallace 2019).

Computed with family-specific shortcuts (renormalised scores for ``average``, suffix/prefix
reruns for a single-layer ``bilstm``, sentence reassembly for HAN, the tokens after the removed
one continuing from the kept keys and values for a causal decoder, batched full recomputation
otherwise); :func:`loo_importance_reference` is the plain Captum ``FeatureAblation`` version
used to check them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn

from attnaudit.algorithms.metrics import output_change, rank_items, top_items
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain.helpers.baselines import baseline_token
from attnaudit.explain.helpers.features import feature_groups
from attnaudit.explain.helpers.items import compact_items
from attnaudit.explain.helpers.segments import perturbed_rows, replacement_ids, replacements
from attnaudit.explain.registry import (
    check_task,
    choice,
    explanation,
    get_explanation,
    hierarchical,
    item_mask,
    item_names,
    takes_run,
)
from attnaudit.models.interface import AttentionModel, Cache, ModelOutput, evaluation, language_model
from attnaudit.models.normalisers import normalise
from attnaudit.models.rnn import (
    AttentionClassifier,
    AverageEncoder,
    PairAttentionClassifier,
    RecurrentEncoder,
)

# Elements (floats) one chunk of leave-one-out rows may occupy in its largest tensor:
# 2**23 floats = 32 MB keeps memory bounded for long documents without slowing short ones.
_CHUNK_ELEMENTS = 1 << 23
# Activation elements per batched forward pass of the leave-one-out recomputation: passes of
# a few hundred short sentences run faster on CPU than one pass over every deletion at once.
_PASS_ELEMENTS = 1 << 21
# Tokens per pass of a decoder's leave-one-out continuations: a few hundred rows of tokens keep
# the matrix products at full speed on CPU while rows of similar length share a pass.
_PASS_TOKENS = 512


def _single_items(mask: Tensor) -> Tensor:
    """``(B,)`` True for instances with fewer than two items (no ranking, no leave-one-out)."""
    return mask.sum(-1) < 2


def _select_extra(extra: dict[str, Any], index: Tensor, batch_size: int) -> dict[str, Any]:
    """``cache.extra`` for the rows ``index``: per-instance tensors are gathered, the rest kept."""
    return {
        key: value[index] if isinstance(value, Tensor) and value.dim() and value.shape[0] == batch_size else value
        for key, value in extra.items()
    }




def _drop_one(mask: Tensor, rows: Tensor) -> Tensor:
    """``(R, K)`` item masks: instance ``rows[:,0]``'s items without item ``rows[:,1]``."""
    keep = mask[rows[:, 0]].clone()
    keep[torch.arange(len(rows), device=rows.device), rows[:, 1]] = False
    return keep


def _chunks(n: int, per_row: int, budget: int = _CHUNK_ELEMENTS) -> Iterator[slice]:
    """Slices of ``range(n)`` such that ``rows * per_row`` stays within ``budget`` elements."""
    size = max(1, budget // max(per_row, 1))
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


LooMethod = Callable[[AttentionModel, Batch, Tensor, Tensor, Cache, ModelOutput], Tensor]


def _loo_recompute(
    model: AttentionModel, batch: Batch, mask: Tensor, rows: Tensor, cache: Cache, output: ModelOutput
) -> Tensor:
    """Probabilities ``(R,C)`` with one item removed per row, by full forward passes.

    For encoders whose every state may change when a token goes (CNN windows, Transformer
    self-attention, the flat GRU). All deletions of a batch run together, sorted by length
    so each pass pads only to its own longest row, in passes of :data:`_PASS_ELEMENTS`.
    """
    order = torch.argsort(mask.sum(1)[rows[:, 0]], descending=True, stable=True)
    width = max(model.config.d_model, model.config.hidden_dim, model.config.embed_dim)
    per_row = batch.tokens[0].numel() * (batch.tokens.shape[-1] + width)
    out = []
    for part in _chunks(len(rows), per_row, _PASS_ELEMENTS):
        sub = rows[order[part]]
        kept = _drop_one(batch.mask.bool(), sub)  # every real token but the removed item (a prompt's template stays)
        out.append(model.logits_forward(compact_items(batch, sub[:, 0], kept, model.config.pad_id)).probs)
    probs = torch.cat(out)
    return probs[torch.argsort(order)]


def _loo_decoder(
    model: AttentionModel, batch: Batch, mask: Tensor, rows: Tensor, cache: Cache, output: ModelOutput
) -> Tensor:
    """Leave-one-out for a causal decoder, rerunning only the tokens after the removed one.

    Under a causal mask the tokens before item ``i`` never see it, so their keys and values
    are the full pass's: each deletion continues from them (:class:`~attnaudit.models.hf.attention.KeyValuePrefix`; a model
    that :attr:`~attnaudit.models.hf.model.HFModel.continues_prefix`) and runs only
    the later tokens, at positions moved up by one. When ``i`` is the last token the one before
    it is rerun, so the continuation still ends at the token that predicts. All deletions of a
    batch run together, longest first, in passes of :data:`_PASS_ELEMENTS`; the template of a
    prompt stays, as in :func:`_loo_recompute`.
    """
    hf = language_model(model, "leave-one-out from a key/value prefix")  # _loo_method picks this where continues_prefix
    lengths = batch.mask.sum(1)
    n = lengths[rows[:, 0]]
    start = torch.minimum(rows[:, 1], n - 2).clamp_min(0)  # first rerun position; the prefix is [0, start)
    span = n - start - 1  # tokens rerun: [start, n) without i
    order = torch.argsort(span, descending=True, stable=True)
    spans = span[order].tolist()
    t = batch.tokens.shape[1]
    out = []
    first_row = 0
    while first_row < len(rows):  # passes of about _PASS_TOKENS tokens, rows of similar length together
        size = max(1, _PASS_TOKENS // max(spans[first_row], 1))
        sub = order[first_row : first_row + size]
        first_row += size
        b, i, first = rows[sub, 0], rows[sub, 1], start[sub]
        steps = torch.arange(int(span[sub].max()), device=rows.device)[None, :]
        source = first[:, None] + steps
        source = (source + (source >= i[:, None]).long()).clamp_max(t - 1)  # skip the removed token
        valid = steps < span[sub][:, None]
        tokens = batch.tokens[b].gather(1, source).masked_fill(~valid, model.config.pad_id)
        rest = hf.encode(Batch(tokens=tokens, mask=valid))
        rest.extra["prefix"] = hf.prefix_from(output.trace, b, first)
        out.append(hf.decode(rest, keep_layers=()).probs)
    probs = torch.cat(out)
    return probs[torch.argsort(order)]


def _loo_context_free(
    model: AttentionModel, batch: Batch, mask: Tensor, rows: Tensor, cache: Cache, output: ModelOutput
) -> Tensor:
    """Leave-one-out for context-free states (the ``average`` encoder) without re-encoding.

    A state depends only on its own token and the attention scores only on the state (and
    the question, which does not change), so removing item ``i`` = renormalising the
    original scores without ``i``: one ``(K, K)`` weight matrix per instance (row ``i``
    leaves out item ``i``) gives every leave-one-out context in one matmul. The classifier
    sees the states only through the context vector, so each context is decoded as a
    one-state cache (a single key always gets weight 1), which runs the model's own
    output layers on it.
    """
    record = output.trace[0]
    assert record.scores is not None  # the single-attention models record their scores
    scores, values = record.scores[:, 0, 0], record.inputs
    b_size, k = mask.shape
    others = ~torch.eye(k, dtype=torch.bool, device=mask.device)
    contexts = []
    for part in _chunks(b_size, k * (k + values.shape[-1])):
        keep = mask[part][:, None, :] & others
        weights = normalise(scores[part][:, None, :].expand(-1, k, -1), keep, model.config.attention)
        contexts.append(torch.bmm(weights, values[part]))
    context = torch.cat(contexts)[rows[:, 0], rows[:, 1]]
    single = Cache(
        states=context[:, None, :],
        mask=torch.ones(len(rows), 1, dtype=torch.bool, device=mask.device),
        extra=_select_extra(cache.extra, rows[:, 0], b_size),
    )
    return model.decode(single).probs


def _lstm_run(
    proj: Tensor,
    index: Tensor,
    lengths: Tensor,
    w_hh: Tensor,
    h0: Tensor,
    c0: Tensor,
    keep_cells: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """One LSTM direction for ``R`` rows, each from its own start state.

    ``proj`` ``(N, 4h)`` holds precomputed input projections (biases included); row ``r``
    reads ``proj[index[r, s]]`` at step ``s < lengths[r]``. Hand-written rather than
    ``nn.LSTM`` because ``nn.LSTM`` neither starts different rows from different cell
    states in one packed call nor returns the cell state of every step, and leave-one-out
    needs both. Rows are sorted by length so step ``s`` only computes the rows still
    running (as packing does). Returns hidden (and optionally cell) states ``(R, S, h)``,
    zero past each row's length. (``index_select`` throughout: advanced indexing is
    several times slower on CPU.)
    """
    r, steps = index.shape
    hidden = w_hh.shape[1]
    order = torch.argsort(lengths, descending=True, stable=True)
    running = (lengths[order][None, :] > torch.arange(steps, device=lengths.device)[:, None]).sum(1).tolist()
    index = index.index_select(0, order).t().contiguous()  # (S, R): step s reads index[s, :n]
    h, c = h0.index_select(0, order), c0.index_select(0, order)
    hs = proj.new_zeros(r, steps, hidden)
    cs = proj.new_zeros(r, steps, hidden) if keep_cells else None
    w = w_hh.t()
    for s, n in enumerate(running):
        if n == 0:
            break
        h, c = h[:n], c[:n]
        gates = torch.addmm(proj.index_select(0, index[s, :n]), h, w)
        act = gates.sigmoid()  # PyTorch's gate order i, f, g, o; g's sigmoid is unused
        g = gates[:, 2 * hidden : 3 * hidden].tanh()
        c = torch.addcmul(act[:, hidden : 2 * hidden] * c, act[:, :hidden], g)
        h = act[:, 3 * hidden :] * c.tanh()
        hs[:n, s] = h
        if cs is not None:
            cs[:n, s] = c
    unsort = torch.argsort(order)
    return hs.index_select(0, unsort), None if cs is None else cs.index_select(0, unsort)


def _loo_bilstm(
    model: AttentionModel, batch: Batch, mask: Tensor, rows: Tensor, cache: Cache, output: ModelOutput
) -> Tensor:
    """Leave-one-out for a single-layer biLSTM, rerunning only what the deletion changes.

    Removing token ``i`` leaves the forward states before ``i`` and the backward states after
    ``i`` unchanged. For every deletion at once, the forward direction restarts from the
    original state at ``i-1`` over the suffix, the backward direction from the original
    state at ``i+1`` over the prefix; input projections are computed once per token.
    Then attention and the output layers run on the new states with ``i`` masked out
    (attention is order-free, so a masked key is a removed one).
    """
    lstm = cast(RecurrentEncoder, model.encoder).rnn  # _loo_method picks this for a 1-layer biLSTM encoder only
    assert isinstance(lstm, nn.LSTM)
    hidden = lstm.hidden_size
    emb = model.embed(batch)
    b_size, t = mask.shape
    lengths = mask.sum(1)
    steps = torch.arange(t, device=mask.device)
    base = torch.arange(b_size, device=mask.device)[:, None] * t  # row offsets into the flat (B*T) tensors

    def projection(suffix: str) -> Tensor:
        w_ih, b_ih, b_hh = (getattr(lstm, f"{n}_l0{suffix}") for n in ("weight_ih", "bias_ih", "bias_hh"))
        return torch.addmm(b_ih + b_hh, emb.reshape(b_size * t, -1), w_ih.t())

    def flat(states: Tensor) -> Tensor:
        return states.reshape(b_size * t, hidden)

    pf, pb = projection(""), projection("_reverse")
    w_f, w_b = (getattr(lstm, f"weight_hh_l0{suffix}") for suffix in ("", "_reverse"))
    zeros = emb.new_zeros(b_size, hidden)
    hf, cf = _lstm_run(pf, base + steps, lengths, w_f, zeros, zeros, keep_cells=True)
    # The backward direction reads each instance from its own last real token.
    reverse = (lengths[:, None] - 1 - steps[None, :]).clamp_min(0)
    hb_rev, cb_rev = _lstm_run(pb, base + reverse, lengths, w_b, zeros, zeros, keep_cells=True)
    assert cf is not None and cb_rev is not None
    flip = reverse[:, :, None].expand(-1, -1, hidden)
    hf, cf, hb, cb = flat(hf), flat(cf), flat(hb_rev.gather(1, flip)), flat(cb_rev.gather(1, flip))

    out = []
    for part in _chunks(len(rows), t * 8 * hidden):
        sub = rows[part]
        b, i = sub[:, 0], sub[:, 1]
        n, row0, col = lengths[b], base[b], i[:, None]
        # Forward: restart after i from the state at i-1 (zero state when i = 0).
        prev = (row0[:, 0] + i - 1).clamp_min(0)
        live = (i > 0).to(emb.dtype)[:, None]
        index = row0 + (col + 1 + steps[None, : t - 1]).clamp_max(t - 1)
        h0, c0 = hf.index_select(0, prev) * live, cf.index_select(0, prev) * live
        f_out, _ = _lstm_run(pf, index, n - 1 - i, w_f, h0, c0)
        # Backward: restart before i from the state at i+1 (zero state when i is the last token).
        nxt = row0[:, 0] + (i + 1).clamp_max(t - 1)
        live = (i + 1 < n).to(emb.dtype)[:, None]
        index = row0 + (col - 1 - steps[None, : t - 1]).clamp_min(0)
        h0, c0 = hb.index_select(0, nxt) * live, cb.index_select(0, nxt) * live
        b_out, _ = _lstm_run(pb, index, i, w_b, h0, c0)

        # New states: rerun outputs after i (forward) and before i (backward), the originals elsewhere.
        original = (row0 + steps).reshape(-1)
        after = (steps[None, :] - col - 1).clamp(0, t - 2)[:, :, None].expand(-1, -1, hidden)
        before = (col - 1 - steps[None, :]).clamp(0, t - 2)[:, :, None].expand(-1, -1, hidden)
        new_f = torch.where(
            (steps[None, :] > col)[:, :, None], f_out.gather(1, after), hf.index_select(0, original).view(-1, t, hidden)
        )
        new_b = torch.where(
            (steps[None, :] < col)[:, :, None], b_out.gather(1, before), hb.index_select(0, original).view(-1, t, hidden)
        )
        keep = _drop_one(mask, sub)
        states = torch.cat([new_f, new_b], -1) * keep[:, :, None].to(emb.dtype)
        restart = Cache(states=states, mask=keep, extra=_select_extra(cache.extra, b, b_size))
        out.append(model.decode(restart).probs)
    return torch.cat(out)


def _loo_han(
    model: AttentionModel, batch: Batch, mask: Tensor, rows: Tensor, cache: Cache, output: ModelOutput
) -> Tensor:
    """Leave-one-sentence-out for HAN without rerunning the word GRU.

    Each sentence is encoded on its own, so the word-GRU states of the remaining
    sentences do not change; the layer-0 cache is re-assembled without the sentence and
    the word attention, sentence GRU, sentence attention and output are rerun.
    """
    b_size, s, w = batch.mask.shape
    states = cache.states.reshape(b_size, s, w, -1)
    words = cache.mask.reshape(b_size, s, w)
    out = []
    for part in _chunks(len(rows), s * w * states.shape[-1]):
        sub = rows[part]
        b = sub[:, 0]
        keep = _drop_one(mask, sub)
        count = keep.sum(1)
        width = max(int(count.max()), 1)
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
        valid = torch.arange(width, device=keep.device)[None, :] < count[:, None]
        kept_words = words[b].gather(1, order[:, :, None].expand(-1, -1, w)) & valid[:, :, None]
        kept = states[b].gather(1, order[:, :, None, None].expand(-1, -1, w, states.shape[-1]))
        kept = kept * kept_words[..., None].to(kept.dtype)
        restart = Cache(
            states=kept.reshape(len(sub) * width, w, -1),
            mask=kept_words.reshape(len(sub) * width, w),
            layer=0,
            extra={"sentence_mask": kept_words.any(-1)},
        )
        out.append(model.decode(restart).probs)
    return torch.cat(out)


def _loo_method(model: AttentionModel) -> LooMethod:
    """The fastest exact leave-one-out for this model family (a causal decoder continues from the
    prefix before the removed token; a wrapping biLSTM starts from its
    ``<s>``/``</s>`` states, which the suffix/prefix shortcut does not know: full recomputation)."""
    if hierarchical(model):
        return _loo_han
    if getattr(model, "continues_prefix", False):
        return _loo_decoder
    if isinstance(model, (AttentionClassifier, PairAttentionClassifier)):
        encoder = model.encoder
        if isinstance(encoder, AverageEncoder):
            return _loo_context_free
        if isinstance(encoder, RecurrentEncoder) and isinstance(encoder.rnn, nn.LSTM) and not model.wraps:
            rnn = encoder.rnn
            if rnn.num_layers == 1 and rnn.bidirectional and rnn.bias and not rnn.proj_size:
                return _loo_bilstm
    return _loo_recompute


def _finish_loo(changes: Tensor, mask: Tensor) -> Tensor:
    """0 at padding; NaN at the item of a one-item instance (removing it leaves no input)."""
    changes = changes * mask.to(changes.dtype)
    return changes.masked_fill(_single_items(mask)[:, None] & mask, float("nan"))


ZERO_IS_NO_TOKEN = "baseline 'zero' is IG's (zero embeddings); leave-one-out removes (delete) or replaces tokens (unk, pad, mask, eos)"


@explanation(
    "loo", "output change (|Δŷ|; TVD multi-class) when the item (or segment) is removed from the input (Jain & Wallace 2019)",
    ("prediction",), order=30, grouped=True,
    settings_check=lambda model, settings: ZERO_IS_NO_TOKEN if settings.get("baseline") == "zero" else None,
)
def loo_importance(
    model: AttentionModel, batch: Batch, loo_tokens: int | None = None, baseline: str = "delete", replace: str | None = None,
) -> Tensor:
    """Leave-one-out: output change (:func:`~attnaudit.algorithms.metrics.output_change`) when item i is removed.

    ``(B, K)``; |Δŷ| for binary models, TVD for multi-class. Exact removal (later items
    move up), computed by the cheapest exact route for the family: renormalised scores
    for ``average``, suffix/prefix reruns for ``bilstm``, sentence reassembly for HAN, and
    batched full recomputation otherwise. One-item instances get NaN.
    ``loo_tokens`` K (approximate, opt-in): only each instance's K items of highest ``gradient``
    importance are removed; the others score 0, below every removed one (a causal decoder's cost
    is one rerun of the later tokens per removal, so the exact mode grows with the square of the length).
    With segments (``Batch.segments``), another ``baseline`` than ``delete`` (the token ``unk``, ``pad``, ``mask`` or
    ``eos`` in place of each removed token) or ``replace`` (``"Dave=Sarah"``: a segment reading ``Dave`` replaced
    by the tokens of ``Sarah``, the others by the baseline), each group of
    :func:`~attnaudit.explain.helpers.features.feature_groups` is perturbed as one unit (:func:`_loo_groups`).
    """
    check_task(model)
    baseline = choice("baseline", baseline)
    if baseline == "zero":
        raise AttnAuditError(f"loo: {ZERO_IS_NO_TOKEN}")
    if batch.segments is not None or baseline != "delete" or replace:
        if loo_tokens is not None:
            raise AttnAuditError("--loo-tokens applies to token deletion; not with segments, --baseline or --replace")
        return _loo_groups(model, batch, baseline, replacements(replace) if replace else {})
    mask = item_mask(model, batch)
    removed = mask & ~_single_items(mask)[:, None]
    if loo_tokens is not None:
        removed = removed & _highest_gradient(model, batch, mask, loo_tokens)
    with evaluation(model), torch.no_grad():
        cache = model.encode(batch)
        output = model.decode(cache)
        full = output.probs
        changes = full.new_zeros(mask.shape)
        rows = removed.nonzero()
        if len(rows):
            dropped = _loo_method(model)(model, batch, mask, rows, cache, output)
            changes[rows[:, 0], rows[:, 1]] = output_change(dropped, full[rows[:, 0]])
    return _finish_loo(changes, mask)


def _loo_groups(model: AttentionModel, batch: Batch, baseline: str, replace: dict[str, str]) -> Tensor:
    """Leave-one-out over groups (segments): each group removed (``delete``) or replaced as one unit, by full forward
    passes in chunks; every item of a group carries its output change; NaN for an instance with a single group."""
    if hierarchical(model) or batch.tokens.dim() != 2 or model.target_items:
        raise AttnAuditError("loo: segments and baselines apply to flat token inputs (not HAN, not an encoder-decoder's target)")
    groups = feature_groups(model, batch)
    fill = None if baseline == "delete" else baseline_token(model, baseline, who="loo", other="delete")
    names = item_names(model, batch) if replace else []
    lookup = {key.casefold(): value for key, value in replace.items()}
    perturbations: list[tuple[int, list[int], list[int] | None]] = []
    where: list[tuple[int, Tensor]] = []
    for b in range(len(batch)):
        real = batch.mask[b].bool()
        place = (real.long().cumsum(0) - 1)[: groups.shape[1]]  # a position's index among the row's real tokens
        count = int(groups[b].max()) + 1
        for g in range(count if count > 1 else 0):
            at = (groups[b] == g).nonzero().squeeze(1)
            positions = place[at].tolist()
            name = names[b][g].strip() if names and g < len(names[b]) else None
            if name is not None and (name in replace or name.casefold() in lookup):
                tokens: list[int] | None = replacement_ids(model, int(batch.tokens[b, at[0]]), replace.get(name, lookup.get(name.casefold(), "")))
            else:
                tokens = None if fill is None else [fill] * len(positions)
            perturbations.append((b, positions, tokens))
            where.append((b, at))
    with evaluation(model), torch.no_grad():
        full = model.logits_forward(batch).probs
        changes = full.new_zeros(groups.shape)
        step = max(1, _PASS_ELEMENTS // max(batch.tokens.shape[1] * max(model.config.d_model, model.config.embed_dim, 1), 1))
        for first in range(0, len(perturbations), step):
            part = perturbations[first : first + step]
            probs = model.logits_forward(perturbed_rows(batch, part, model.config.pad_id)).probs
            change = output_change(probs, full[[b for b, _, _ in part]])
            for (b, at), value in zip(where[first : first + step], change.tolist()):
                changes[b, at] = value
    single = (groups.max(1).values < 1)[:, None] & (groups >= 0)
    return changes.masked_fill(single, float("nan"))


def _highest_gradient(model: AttentionModel, batch: Batch, mask: Tensor, count: int) -> Tensor:
    """``(B, K)`` True at each instance's ``count`` items of highest gradient importance (ties by position)."""
    if count < 1:
        raise AttnAuditError(f"--loo-tokens must be at least 1, got {count}")
    ranks = rank_items(get_explanation("gradient").fn(model, batch), mask)  # the registry's gradient method
    return top_items(ranks, mask, torch.full((len(mask),), count, device=mask.device))


@takes_run
def loo_importance_reference(model: AttentionModel, batch: Batch) -> Tensor:
    """Leave-one-out with Captum ``FeatureAblation``: the check for :func:`loo_importance`.

    The ablated input is a ``keep`` indicator per item; the forward function removes the
    items whose indicator is 0 (:func:`compact_items`) and returns the output change against the
    unperturbed prediction, so Captum's attribution ``f(x) − f(x without i)`` is ``−LOO``.
    One full forward pass per item position, as Captum does it.
    """
    from captum.attr import FeatureAblation

    check_task(model)
    mask = item_mask(model, batch)
    everyone = torch.arange(len(batch), device=mask.device)
    fixed = batch.mask.bool() & ~mask if batch.items is not None else torch.zeros_like(mask)  # a prompt's template stays
    with evaluation(model), torch.no_grad():
        full = model.logits_forward(batch).probs

        def forward(keep: Tensor) -> Tensor:
            sub = compact_items(batch, everyone, ((keep > 0.5) & mask) | fixed, model.config.pad_id)
            return output_change(model.logits_forward(sub).probs, full)

        attributions = FeatureAblation(forward).attribute(mask.to(full.dtype), baselines=0.0)
    return _finish_loo(-attributions, mask)
