"""The registry of explanation methods and what every method shares.

An explanation scores the *items* of the attention that the single-attention tests examine
(``model.explained_layer``): tokens for the recurrent/convolutional/average classifiers and
Transformers, passage tokens for pair/QA models, sentences for HAN. Every method is a function
``fn(model, batch, **options) -> Tensor (B, K)``, 0 at padding, registered once with
:func:`explanation`: its name, a one-line description, what it needs (:data:`NEEDS`) and any
further condition on the model. The tests, the report's heatmaps and the command line find the
methods here (:func:`list_explanations`, :func:`choose`) and nowhere else.

The decision explained is the predicted class of the unperturbed model, ``ŷ`` its probability
(Jain & Wallace 2019). Tagging and seq2seq models make one decision per token, not one per
instance, so no explanation applies to them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError, named, spelled, unknown
from attnaudit.explain.helpers.items import hierarchical, item_mask, model_of
from attnaudit.models.interface import AttentionModel, ModelOutput, take_rows
from attnaudit.run import Run

ExplainFn = Callable[..., Tensor]
"""``fn(model, batch, **options) -> (B, K)`` over the explained items, 0 at padding."""
Check = Callable[[AttentionModel], "str | None"]
SettingsCheck = Callable[[AttentionModel, "dict[str, Any]"], "str | None"]
"""``(model, settings) -> None | reason``: where a method's definition depends on its options (its settings, :meth:`Explanation.settings`)."""

NEEDS: dict[str, tuple[str, Check]] = {
    "prediction": (
        "a prediction to explain (a trained head)",
        lambda m: None if m.trained_head else "this model has no trained classification head, so it makes no prediction to explain",
    ),
    "gradients": ("a backward pass through the model", lambda m: None),
    "self_attention": (
        "stacked token-to-token self-attention (Transformers)",
        lambda m: None if m.self_attention else f"{type(m).__name__} has no stack of token-to-token self-attention layers",
    ),
    "value_output": ("per-head value and output projections (Transformers)", lambda m: m.lacks("value_output")),
    "residual_ln": (
        "the residual connections, layer norms and feed-forward map around each attention layer (Transformers)",
        lambda m: m.lacks("residual_norms"),
    ),
    "value_zeroing": (
        "zeroing one token's value vector in a self-attention layer (its per-head value/output maps, residuals, norms)",
        lambda m: (reason := m.lacks("residual_norms")) and f"cannot zero a token's value vector: {reason}",
    ),
    "lrp": ("relevance rules for every norm, activation and attention product (Transformers)", lambda m: m.lacks("lrp")),
}
"""What a method may need: a description for listings and the check, ``model -> None | reason``."""


@dataclass(frozen=True)
class Explanation:
    """One registered method: ``name``, the function, ``about`` (one line), ``needs`` (keys of
    :data:`NEEDS`), an optional further ``check``, ``default`` (part of the set a test takes
    when it compares every explanation; False for costly ones, variants and baselines),
    ``order`` (listing order, then name) and ``per_example`` (an example's scores do not depend on
    the batch it is in, so :func:`memoised` shares them between batches; False for ``random``,
    whose draws follow the batch's shape)."""

    name: str
    fn: ExplainFn
    about: str
    needs: tuple[str, ...] = ()
    check: Check | None = None
    default: bool = True
    order: int = 100
    per_example: bool = True
    target_side: bool = False
    """It scores an encoder-decoder's earlier target tokens too, within :meth:`attnaudit.models.interface.LanguageModel.target_side`."""
    settings_check: SettingsCheck | None = None
    grouped: bool = False
    """It perturbs each group of :func:`~attnaudit.explain.helpers.features.feature_groups` as one unit itself (leave-one-out,
    Shapley, ...), so its scores are per group already; the others' item scores are summed per segment (:func:`per_segment`)."""
    reads_rows: bool = False
    """It reads the explained rows' attention alone (:meth:`~attnaudit.models.interface.AttentionModel.rows_forward`), which a
    causal decoder's generation can keep as it makes the tokens (:meth:`~attnaudit.models.interface.LanguageModel.continuation`)."""

    def applies(self, target: AttentionModel | Run, offered: dict[str, Any] | None = None) -> str | None:
        """Why this method cannot explain a model (or a run's model) with the ``offered`` options (the defaults
        for the rest); None when it can."""
        model = model_of(target)
        task = model.config.task_type
        if task not in ("classification", "pair"):
            return f"explanations score one decision per instance; a {task} model makes one per token"
        for need in self.needs:
            reason = NEEDS[need][1](model)
            if reason:
                return reason
        reason = self.check(model) if self.check else None
        if reason is None and self.settings_check is not None:
            reason = self.settings_check(model, self.settings(offered or {}))
        return reason

    @property
    def options(self) -> tuple[str, ...]:
        """The keyword options ``fn`` takes after ``(model, batch)`` (ig: ``steps``; random: ``seed``)."""
        return tuple(list(inspect.signature(self.fn).parameters)[2:])

    def settings(self, offered: dict[str, Any]) -> dict[str, Any]:
        """The value of each of its :attr:`options` a call with ``offered`` uses: the offered one, else the
        default (what ``explained.meta["definitions"]`` records per method)."""
        parameters = inspect.signature(self.fn).parameters
        return {name: offered.get(name, parameters[name].default) for name in self.options}

    def __call__(self, target: AttentionModel | Run, batch: Batch, **offered: Any) -> Tensor:
        """The scores ``(B, K)`` for a model (or a run's model), passing on the ``offered`` options the
        method takes (a test offers its ``steps`` and ``seed`` to every method); a one-line error when
        the method does not apply to the model."""
        reason = self.applies(target, offered)
        if reason:
            raise AttnAuditError(f"explanation {self.name!r} does not apply to this model: {reason}")
        taken = {k: v for k, v in offered.items() if k in self.options}
        segmented = batch.segments is not None
        # the classes explained and contrasted are part of what is computed: scores of the gold class are not the prediction's
        chosen = tuple(None if t is None else tuple(t.tolist()) for t in (batch.explained, batch.contrast))
        name = (self.name, tuple(sorted(taken.items())), getattr(model_of(target), "target_items", False), segmented and self.grouped, chosen)

        def compute() -> Tensor:
            return self.fn(target, batch, **taken).detach()

        remember = remembered_rows if self.per_example else remembered
        scores = remember(target, name, batch, compute).clone()
        return per_segment(target, batch, scores) if segmented and not self.grouped else scores


class Memo(dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]]):
    """What :func:`memoised` keeps: key -> (the examples it is about, the value); ``held``: the bytes of
    the values stored under a budget (:func:`remembered`)."""

    held: int = 0

    def clear(self) -> None:
        super().clear()
        self.held = 0


_MEMOS: dict[int, Memo] = {}
V = TypeVar("V")


def remembered(
    target: AttentionModel | Run, name: tuple[Any, ...], batch: Batch, compute: Callable[[], V],
    size: Callable[[V], int] | None = None, budget: int = 0,
) -> V:
    """``compute()`` for ``batch``, once per ``name`` (a hashable tuple: what is computed, with its
    options) and batch within :func:`memoised`, every time outside it. With ``size`` (bytes of a
    value), a value is kept only while the memo's values kept that way stay within ``budget`` bytes
    (past it, each asker computes its own). The value is shared: callers must not change it in place."""
    memo = _MEMOS.get(id(model_of(target)))
    if memo is None:
        return compute()
    key = (name, tuple(map(id, batch.examples)), tuple(batch.tokens.shape))
    if key in memo:
        return memo[key][1]
    value = compute()
    cost = 0 if size is None else size(value)
    if size is None or memo.held + cost <= budget:
        memo[key] = (tuple(batch.examples), value)  # holding the examples: no other object can take their ids
        memo.held += cost
    return value


def remembered_rows(target: AttentionModel | Run, name: tuple[Any, ...], batch: Batch, compute: Callable[[], Tensor]) -> Tensor:
    """Scores ``(B, K)`` of ``compute()``, kept per example within :func:`memoised`: each example's row
    up to its last real item is stored, and a batch whose every example has one is assembled from
    them (0 at padding, as every method gives), whatever batch they were computed in (an audit's
    report explains its first instances in batches of its own). Values are equal to a fresh
    computation up to float rounding; outside the block ``compute()`` runs every time."""
    memo = _MEMOS.get(id(model_of(target)))
    if memo is None:
        return compute()
    width = batch.tokens.shape[1]
    keys = [(name, "example", id(example)) for example in batch.examples]
    if keys and all(key in memo for key in keys):
        rows = [memo[key][1] for key in keys]
        out = rows[0].new_zeros(len(rows), width)
        for b, row in enumerate(rows):
            out[b, : len(row)] = row
        return out
    values = compute()
    if values.dim() == 2 and values.shape[1] == width:  # items along the batch's own axis 1 (tokens; HAN: sentences)
        mask = batch.mask.bool()
        lengths = (mask.any(-1) if mask.dim() == 3 else mask).sum(1).tolist()
        for key, example, row, n in zip(keys, batch.examples, values, lengths):
            memo[key] = ((example,), row[:n].clone())  # the entry holds the example (see remembered)
    return values


@contextlib.contextmanager
def memoised(model: AttentionModel) -> Iterator[Memo]:
    """Within the block, each explanation of ``model`` is computed once per example and options
    (:func:`remembered_rows`), and each value a test asks for through :func:`remembered` (such as the
    prepared pass of the single-attention tests) once per batch (the same example objects, in order,
    at the same width): a later asker gets it back instead of a recomputation (an audit's importance,
    rollout and faithfulness tests all take the gradient of the same length-sorted batches, and its
    report explains its first instances with the scores the tests computed).
    The values are those of the weights the model had then: whoever changes the weights clears
    the memo it is given (the audit does so when a test leaves them changed)."""
    memo = Memo()
    _MEMOS[id(model)] = memo
    try:
        yield memo
    finally:
        _MEMOS.pop(id(model), None)


EXPLANATIONS: dict[str, Explanation] = {}


def explanation(
    name: str, about: str, needs: Iterable[str] = (), check: Check | None = None, default: bool = True, order: int = 100,
    per_example: bool = True, target_side: bool = False, settings_check: SettingsCheck | None = None, grouped: bool = False,
    reads_rows: bool = False,
) -> Callable[[ExplainFn], ExplainFn]:
    """Decorator registering ``fn(model, batch, **options) -> (B, K)`` as explanation ``name``;
    the function itself is returned unchanged."""
    wanted = tuple(needs)
    unknown = [n for n in wanted if n not in NEEDS]
    if unknown:
        raise ValueError(f"explanation {name!r}: unknown need(s) {unknown}; known: {list(NEEDS)}")

    def add(fn: ExplainFn) -> ExplainFn:
        method = takes_run(fn)
        register(Explanation(name, method, about, wanted, check, default, order, per_example, target_side, settings_check, grouped, reads_rows))
        return method

    return add


def takes_run(fn: ExplainFn) -> ExplainFn:
    """``fn(model, batch, ...)`` that also takes a :class:`~attnaudit.run.Run` in place of its model."""

    @functools.wraps(fn)
    def call(target: AttentionModel | Run, batch: Batch, *args: Any, **kwargs: Any) -> Tensor:
        return fn(model_of(target), batch, *args, **kwargs)

    return call


def register(method: Explanation) -> Explanation:
    """Add ``method`` to the registry (replacing one of the same name) and keep it in listing order."""
    EXPLANATIONS[method.name] = method
    ordered = sorted(EXPLANATIONS.values(), key=lambda m: (m.order, m.name))
    EXPLANATIONS.clear()
    EXPLANATIONS.update((m.name, m) for m in ordered)
    return method


def unregister(name: str) -> None:
    """Remove explanation ``name`` (tests register throw-away methods)."""
    EXPLANATIONS.pop(name, None)


def list_explanations(target: AttentionModel | Run, default: bool = False) -> list[Explanation]:
    """The registered methods that apply to a model (or a run's model), in listing order;
    ``default``: only those a test takes when it compares every explanation."""
    model = model_of(target)
    return [m for m in EXPLANATIONS.values() if (m.default or not default) and m.applies(model) is None]


def default_names() -> list[str]:
    """Names of the ``default`` methods, in listing order (a test's default "every explanation")."""
    return [m.name for m in EXPLANATIONS.values() if m.default]


def get_explanation(name: str) -> Explanation:
    """The method ``name``; a one-line error listing the registered ones otherwise."""
    if name not in EXPLANATIONS:
        raise AttnAuditError(f"unknown explanation {name!r}; available: {', '.join(EXPLANATIONS)}")
    return EXPLANATIONS[name]


def choose(
    names: Iterable[str],
    allowed: Iterable[str] | None = None,
    option: str = "--methods",
    model: AttentionModel | Run | None = None,
    offered: dict[str, Any] | None = None,
) -> dict[str, Explanation]:
    """The methods ``names`` (order kept, repeats dropped), each registered, in ``allowed`` (default:
    all) and, given a ``model``, applying to it with the ``offered`` options; a one-line error naming ``option`` otherwise."""
    choices = list(EXPLANATIONS if allowed is None else allowed)
    wanted = list(dict.fromkeys(spelled(n, choices) or n for n in names))
    strays = [n for n in wanted if n not in choices]
    if strays:
        raise AttnAuditError(f"{option}: {unknown('method', strays[0], choices)}")
    if not wanted:
        raise AttnAuditError(f"{option}: no method given; choose from {', '.join(choices)}")
    chosen = {n: EXPLANATIONS[n] for n in wanted}
    if model is not None:
        for method in chosen.values():
            reason = method.applies(model, offered)
            if reason:
                raise AttnAuditError(f"{option}: {method.name} does not apply to this model: {reason}")
    return chosen


def applying(
    names: Sequence[str], model: AttentionModel | Run, option: str, defaults: Sequence[str]
) -> tuple[dict[str, Explanation], dict[str, str]]:
    """The methods ``names`` for ``model``: when they are a test's ``defaults``, those that do not apply are left out
    and returned apart (name -> why, for the result's notes); a method the user named that does not apply is a
    one-line error (:func:`choose`)."""
    if list(names) != list(defaults):
        return choose(names, option=option, model=model), {}
    chosen = choose(names, option=option)
    dropped = {name: reason for name, method in chosen.items() if (reason := method.applies(model))}
    return {name: method for name, method in chosen.items() if name not in dropped}, dropped


# --------------------------------------------------------------------------- helpers the methods share


def methods_for(
    run: Run, names: Sequence[str] | None, offered: dict[str, Any] | None = None
) -> tuple[dict[str, Explanation], dict[str, str]]:
    """The methods to compute for ``run`` with the ``offered`` options (``names``, or the default ones that apply)
    and the default ones skipped (name -> why not)."""
    if names is not None:
        return choose(names, option="--method", model=run.model, offered=offered), {}
    chosen, skipped = {}, {}
    for method in EXPLANATIONS.values():
        if method.default:
            reason = method.applies(run.model, offered)
            if reason:
                skipped[method.name] = reason
            else:
                chosen[method.name] = method
    if not chosen:
        raise AttnAuditError(f"no explanation method applies to this model: {'; '.join(f'{k}: {v}' for k, v in skipped.items())}")
    return chosen, skipped


def check_task(model: AttentionModel) -> None:
    """A one-line error unless ``model`` makes one decision per instance (classification, pair)."""
    task = model.config.task_type
    if task not in ("classification", "pair"):
        raise AttnAuditError(f"importance explains one decision per instance; a {task} model makes one per token")


def item_values(values: Tensor, items: Tensor, groups: Tensor | None = None) -> list[list[float]]:
    """Each row's ``values`` ``(B, K)`` at its items (``items``: :func:`item_mask`), in position order; with ``groups``
    (:func:`item_groups`: a batch with segments) one value per segment instead, in the order of the text, read at the
    segment's first item (every item of a segment carries the segment's score, :func:`per_segment`).

    The one mapping from positions to explained items: ``attnaudit explain``'s JSON, CSV and terminal, the
    report's heatmaps and the explorer all read scores through it (a zero-shot prompt's items are its
    ``{text}`` span, not its first positions)."""
    keep = items.to(values.device)
    if groups is not None:
        keep = keep & first_items(groups.to(values.device))
    return [row[mask].tolist() for row, mask in zip(values, keep)]


def first_items(groups: Tensor) -> Tensor:
    """``(B, K)`` True at the first item of each group (groups numbered 0, 1, ... in position order, -1: none)."""
    before = torch.cat([groups.new_full((len(groups), 1), -1), groups.cummax(1).values[:, :-1]], 1)
    return (groups >= 0) & (groups > before)


def item_groups(target: AttentionModel | Run, batch: Batch) -> Tensor | None:
    """``(B, K)`` each item's segment (:func:`~attnaudit.explain.helpers.features.feature_groups`) when ``batch`` has
    segments, else None (every item its own feature)."""
    if batch.segments is None:
        return None
    from attnaudit.explain.helpers.features import feature_groups

    return feature_groups(model_of(target), batch)


def per_segment(target: AttentionModel | Run, batch: Batch, values: Tensor) -> Tensor:
    """Item scores ``(B, K)`` aggregated per segment: every item of a segment carries the **sum** of its segment's item
    scores (Captum's feature-mask convention), 0 at items of no segment. The one place where a method's token scores
    become segment scores (gradient, input x gradient, IG, attention, rollout, norms, ...); methods that perturb
    whole segments themselves (``grouped``: leave-one-out, Shapley, ...) are not summed again."""
    groups = item_groups(target, batch)
    if groups is None:
        return values
    groups = groups.to(values.device)
    index = (groups + 1).clamp_min(0)  # -1 (no segment) goes to column 0, dropped below
    sums = values.new_zeros(len(values), int(index.max()) + 1 if index.numel() else 1).scatter_add(1, index, values[:, : index.shape[1]])
    out = sums.gather(1, index).masked_fill(groups < 0, 0.0)
    return torch.nn.functional.pad(out, (0, values.shape[1] - out.shape[1]))


def item_roles(batch: Batch, items: Tensor) -> list[list[str]]:
    """Each row's items' roles in a chat-rendered prompt (system, user, template, assistant: ``Batch.roles``),
    in the order of :func:`item_values`; ``""`` everywhere without roles."""
    from attnaudit.models.hf import role_names

    if batch.roles is None:
        return [[""] * int(row.sum()) for row in items]
    return [role_names([int(r) for r in row]) for row in item_values(batch.roles.float(), items)]


def item_names(target: AttentionModel | Run, batch: Batch) -> list[list[str]]:
    """Readable names of each row's explained items, in the order of :func:`item_values`: a causal LM's pieces
    decoded as its tokenizer writes them, an encoder's wordpieces, a word-level model's words, HAN's sentences;
    ``item i`` where items are no tokens of the row (an encoder-decoder's target positions); with segments, each
    segment's text as written."""
    from attnaudit.data.batching import split_sentences

    model = model_of(target)
    items = item_mask(model, batch)
    if batch.segments is not None and not hierarchical(model):
        return _segment_names(model, batch, items)
    if hierarchical(model):
        sentences = [[" ".join(s) for s in (ex.sentences or split_sentences(ex.tokens)) if s] for ex in batch.examples]
        return [_named_or_numbered(names, int(row.sum())) for names, row in zip(sentences, items)]
    real = batch.mask.bool()
    if items.shape != real.shape:
        return [[f"item {i}" for i in range(int(row.sum()))] for row in items]
    tokenizer = model.tokenizer
    pieces = model.wordpieces(batch)
    out = []
    for b, example in enumerate(batch.examples):
        if model.causal and tokenizer is not None:
            names = [tokenizer.decode([i]) for i in batch.tokens[b][real[b]].tolist()]
        elif pieces is not None:
            names = list(pieces[b])
        else:
            names = [str(t) for t in example.tokens][: int(real[b].sum())]
        keep = items[b][real[b]].tolist()
        chosen = [name for name, kept in zip(names, keep) if kept] if len(names) == len(keep) else []
        out.append(_named_or_numbered(chosen, int(items[b].sum())))
    return out


def _segment_names(model: AttentionModel, batch: Batch, items: Tensor) -> list[list[str]]:
    """Each row's segments named by their text (``segment i`` where the text is not known), in the order of
    :func:`item_values` with groups."""
    from attnaudit.explain.helpers.segments import segment_names

    groups = item_groups(model, batch)
    assert groups is not None and batch.segments is not None
    first = items.to(groups.device) & first_items(groups)
    out = []
    for b, example in enumerate(batch.examples):
        texts = segment_names(example) or []
        ids = batch.segments[b, : first.shape[1]][first[b].to(batch.segments.device)].tolist()
        out.append([texts[i] if 0 <= i < len(texts) else f"segment {i}" for i in ids])
    return out


def _named_or_numbered(names: list[str], count: int) -> list[str]:
    """``names`` when there is one per item, else ``item 0`` ... ``item count-1``."""
    return names if len(names) == count else [f"item {i}" for i in range(count)]


def layer_index(model: AttentionModel, layer: int | None) -> int:
    """Attention layer ``layer`` (default the explained one) as a non-negative index; checked."""
    n = model.num_attention_layers
    index = model.explained_layer if layer is None else layer
    if not -n <= index < n:
        raise AttnAuditError(f"attention layer {index} out of range for a model with {n} attention layer(s)")
    return index % n


def reduce_heads(weights: Tensor, query_mask: Tensor | None, head: int | None, query: int | Tensor | None = None) -> Tensor:
    """``(B,H,Q,K)`` -> ``(B,K)``: the explaining query row (``query``: [CLS], or a decoder's last
    token per example) or the mean over real queries, then the mean over heads (or one head)."""
    if query is not None:
        per_head = take_rows(weights, query, 2)
    elif query_mask is None:
        per_head = weights.mean(2)
    else:
        qm = query_mask[:, None, :, None].to(weights.dtype)
        per_head = (weights * qm).sum(2) / qm.sum(2).clamp_min(1.0)
    if head is None:
        return per_head.mean(1)
    if not -weights.shape[1] <= head < weights.shape[1]:
        raise AttnAuditError(f"head {head} out of range for a layer with {weights.shape[1]} head(s)")
    return per_head[:, head]


def query_row(model: AttentionModel, values: Tensor, query_mask: Tensor | None) -> Tensor:
    """``(B,Q,K)`` -> ``(B,K)``: the ``[CLS]`` row for Hugging Face encoders, a decoder's last real
    token, else the mean over real queries."""
    query = model.explanation_query if query_mask is None else model.explanation_rows(query_mask)
    if query is not None:
        return take_rows(values, query, 1)
    if query_mask is None:
        return values.mean(1)
    qm = query_mask[:, :, None].to(values.dtype)
    return (values * qm).sum(1) / qm.sum(1).clamp_min(1.0)


def to_items(values: Tensor, model: AttentionModel, batch: Batch, layer: int) -> Tensor:
    """Per-key values of attention layer ``layer`` as ``(B, K)`` over that layer's items, 0 at padding.

    HAN's word layer has one row per sentence; its words are flattened to ``(B, S*W)``.
    Pair Transformers attend over text then query; only the text (passage) keys are items.
    """
    b = batch.mask.shape[0]
    if hierarchical(model) and layer == 0:
        mask = batch.mask.bool().reshape(b, -1)
    else:
        mask = item_mask(model, batch)
    return values.reshape(b, -1)[:, : mask.shape[1]] * mask.to(values.dtype)


def on_items(model: AttentionModel, batch: Batch, values: Tensor) -> Tensor:
    """Key-axis values ``(B,K')`` restricted to the explained items (pair Transformers: the passage), 0 at padding."""
    mask = item_mask(model, batch)
    return values[:, : mask.shape[1]] * mask.to(values.dtype)


def token_scores(per_token: Tensor, model: AttentionModel, batch: Batch, absolute: bool) -> Tensor:
    """Per-token scores ``(B,T)`` (HAN ``(B,S,W)``) -> ``(B,K)`` over items, 0 at padding.

    ``absolute`` takes ``|·|`` per token first; HAN then sums a sentence's tokens.
    """
    scores = per_token.abs() if absolute else per_token
    if hierarchical(model):
        scores = (scores * batch.mask.to(scores.dtype)).sum(-1)
    mask = item_mask(model, batch)
    return scores[:, : mask.shape[1]] * mask.to(scores.dtype)


REDUCTIONS = ("abs_sum", "l2", "sum")
"""How the gradient family turns a token's per-dimension attribution ``a_{t,d}`` into its score
(option ``reduction``): ``abs_sum`` ``|Σ_d a|``, ``l2`` ``‖a‖₂`` (inseq's default), ``sum`` ``Σ_d a`` (signed)."""
SCORES = ("probability", "logit")
"""What the gradient family differentiates (option ``score``): the explained class's probability or its logit
(minus the contrast class's when the batch has one)."""
BASELINES = ("zero", "unk", "pad", "mask", "eos", "delete")
"""What stands in for an item (option ``baseline``), one meaning per name: Integrated Gradients integrates from zero
embeddings or, at every item, the embedding of the tokenizer's unknown, padding, mask or end-of-sequence token
(inseq's default is ``unk``); leave-one-out and the perturbation methods (``shapley``, ``kernel_shap``, ``lime``,
``occlusion``) remove the item or segment (``delete``, their default) or put that token in place of each of its
tokens; the perturbation methods also take ``zero`` (zero input embeddings). ``delete`` is no baseline IG can
integrate from."""
ATTENTION_PATHS = ("detached", "live")
"""Whether ``gradient`` treats the attention weights as constants (``detached``, Jain & Wallace's definition) or
differentiates through them too (``live``: the plain input × gradient, Madsen et al. 2022's; option ``attention``)."""
RULES = ("gausslegendre", "riemann_right", "riemann_left", "riemann_middle", "riemann_trapezoid")
"""Where Integrated Gradients places its ``steps`` on the path, and with what weights (option ``rule``): Captum's
quadrature rules, by Captum's names (``gausslegendre``, the default; ``riemann_right``: ``α = i/n``, Madsen et al.
2022's)."""
STEP_WEIGHTS = ("none", "scale")
"""What Integrated Gradients multiplies each step's gradient by beyond the rule's weight (option ``weight``):
``none`` (the integral) or ``scale``, the step's position ``α`` on the path, which is what Madsen et al. 2022's code
computes by taking the gradient with respect to the unscaled embedding (``α ∇f(α e)``)."""
CHOICES: dict[str, tuple[str, ...]] = {"reduction": REDUCTIONS, "score": SCORES, "baseline": BASELINES, "attention": ATTENTION_PATHS,
                                       "rule": RULES, "weight": STEP_WEIGHTS}
"""The options whose values are names, with the names each takes: checked once here for every method."""


def choice(option: str, value: str) -> str:
    """``value`` of ``option`` (a key of :data:`CHOICES`) as registered (``abs-sum`` is ``abs_sum``); a
    one-line error naming the choices otherwise."""
    return named(option, str(value), CHOICES[option])


def reduce_dimensions(per_dim: Tensor, model: AttentionModel, batch: Batch, reduction: str) -> Tensor:
    """Per-dimension attributions ``(B,T,d)`` (HAN ``(B,S,W,d)``) -> ``(B,K)`` over the items by
    ``reduction`` (:data:`REDUCTIONS`), 0 at padding; HAN then sums a sentence's token scores."""
    how = choice("reduction", reduction)
    if how == "l2":
        per_token = per_dim.norm(dim=-1)
    else:
        per_token = per_dim.sum(-1)
    return token_scores(per_token, model, batch, absolute=how == "abs_sum")


def decision_values(output: ModelOutput, score: str) -> Tensor:
    """``(B, C)`` the values a gradient method differentiates, read from a model output: its ``probs`` or
    its ``logits`` (``score``, :data:`SCORES`)."""
    return output.probs if choice("score", score) == "probability" else output.logits


def explained_class(batch: Batch, values: Tensor) -> Tensor:
    """``(B,)`` the class each row's explanation is of: ``batch.explained`` (a generated or forced
    token) when set, else the argmax of ``values`` (probabilities or logits: the prediction)."""
    if batch.explained is not None:
        return batch.explained.to(values.device)
    return values.argmax(-1)


def decision_score(batch: Batch, values: Tensor) -> Tensor:
    """``(B,)`` what an explanation explains, read from ``values`` (probabilities or logits ``(B, C)``):
    the explained class's value (:func:`explained_class`), minus the contrast class's when the batch
    has one (a contrastive explanation: why this token rather than that one)."""
    score = values.gather(1, explained_class(batch, values)[:, None]).squeeze(1)
    if batch.contrast is not None:
        score = score - values.gather(1, batch.contrast.to(values.device)[:, None]).squeeze(1)
    return score
