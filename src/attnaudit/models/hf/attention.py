"""Capture and change attention inside any Hugging Face model's own attention code.

No modeling file is forked. Two routes reach the same place:

* transformers 5 sends most attention modules through the function registered under
  ``config._attn_implementation`` (its ``AttentionInterface``). We register ``"attnaudit"``
  (:func:`_attention`): it calls the modeling file's *own* ``eager_attention_forward``, after
  applying what needs per-head queries, keys and values (the LRP rules, key and value
  interventions, a key/value prefix) and recording keys and values.
* A few architectures compute attention inside the module itself (Falcon, Bloom, GPT-J,
  CodeGen, DeBERTa, MPNet); they stay on their eager code.

In both routes the one place that acts on the weights is the attention **softmax**. While an
attention layer runs (the adapter arms it: :meth:`Capture.arm`), ``torch.nn.functional.softmax``
is :func:`_softmax`: the first four-dimensional softmax over keys receives the scores exactly as
the model computed them (scaling, RoPE, ALiBi, relative or position bias, soft-capping, and the
model's own causal, sliding-window or padding mask), so every position scheme comes for free.
They are normalised by :func:`attnaudit.models.normalisers.attention_weights` (normaliser swaps and
weight replacements mean what they mean in our own models) and recorded. Which keys a query may
read is what the model's mask left above :func:`masked_below`.

A pass that reads one query row per instance (:attr:`Capture.rows`: the ``attention`` explanation
reads a decoder's predicting token or an encoder's ``[CLS]``) runs transformers' SDPA function for
every query's output and the model's eager code for those rows alone: the weights of ``(B,H,1,K)``,
not ``(B,H,Q,K)`` (:func:`_rows_only`).

Outside an active pass nothing changes: the registered function is the model's eager code.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.bert.modeling_bert import (
    eager_attention_forward as _bert_eager,
)

from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import Intervention, only_detaches
from attnaudit.models.lrp import active_rule, attention_operands
from attnaudit.models.normalisers import (
    apply_key_interventions,
    apply_value_interventions,
    attention_weights,
)

ATTN_IMPLEMENTATION = "attnaudit"


@dataclass
class KeyValuePrefix:
    """Keys and values of tokens already run, which a continuation attends to.

    ``keys[l]``/``values[l]`` ``(B, kv_heads, P, dh)``: layer ``l``'s keys (positions applied)
    and values; ``mask`` ``(B,P)`` marks the real ones. Given as ``cache.extra["prefix"]``, our
    attention function hands it each layer's new keys and values (:meth:`update`) and attends
    over what comes back.

    Two uses. ``positions`` None: the new tokens *follow* the prefix and their keys and values
    are appended (leave-one-out reruns the tokens after a removed one). ``positions`` ``(B,Q)``:
    the prefix holds every position of a pass and the new tokens rerun the tokens at
    ``positions``, their keys and values in place of the pass's (an intervention at the
    predicting token alone).
    """

    keys: list[Tensor | None]
    values: list[Tensor | None]
    mask: Tensor
    positions: Tensor | None = None

    def update(self, key: Tensor, value: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s keys and values: the prefix's, then ``key``/``value``; or, rerunning
        ``positions``, the prefix's with those positions' entries replaced."""
        keys, values = self.keys[layer], self.values[layer]
        if keys is None or values is None:
            raise AttnAuditError(f"this key/value prefix holds nothing for layer {layer}")
        if self.positions is not None:
            index = self.positions[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[-1])
            return keys.scatter(2, index, key), values.scatter(2, index, value)
        return torch.cat([keys, key], 2), torch.cat([values, value], 2)

    def select_rows(self, rows: Tensor) -> KeyValuePrefix:
        """The prefix of instances ``rows`` (repeats allowed), as :meth:`Cache.select` asks of extras."""
        return KeyValuePrefix(
            keys=[None if k is None else k.index_select(0, rows) for k in self.keys],
            values=[None if v is None else v.index_select(0, rows) for v in self.values],
            mask=self.mask.index_select(0, rows),
            positions=None if self.positions is None else self.positions.index_select(0, rows),
        )


@dataclass
class LayerCall:
    """One attention layer of an active pass: what it is given, and what it leaves behind.

    Given: ``interventions``; ``key_mask`` ``(B,K)`` and ``query_mask`` ``(B,Q)`` (the real
    tokens); ``allowed`` ``(B,1,Q,K)`` where the pass, not the model's mask, says which key each
    query reads (a key/value prefix). Left: ``weights`` and ``scores`` ``(B,H,Q,K)`` and the
    ``allowed`` pairs from the softmax; ``keys``/``values`` ``(B,H_kv,K,dh)`` per key/value head
    (per query head, ``H``, where an intervention changed them per query head: :func:`per_group`) and
    ``output`` ``(B,Q,H,dh)`` from the interface route; ``inputs`` from the adapter."""

    layer: int
    interventions: list[Intervention] = field(default_factory=list)
    key_mask: Tensor | None = None
    query_mask: Tensor | None = None
    allowed: Tensor | None = None
    weights: Tensor | None = None
    scores: Tensor | None = None
    keys: Tensor | None = None
    values: Tensor | None = None
    output: Tensor | None = None
    inputs: Tensor | None = None
    rows: Tensor | None = None
    """``(B,)`` the query positions whose weights alone were computed (:func:`_rows_only`), or None: all."""


@dataclass
class Capture:
    """The state of one active pass: the layer running now, and the prefix its layers read."""

    prefix: KeyValuePrefix | None = None
    keep_scores: bool = False
    """Record each layer's pre-softmax scores too (a second ``(B,H,Q,K)`` per layer; nothing in attnaudit reads them)."""
    rows: Tensor | None = None
    """``(B,)`` the one query row per instance whose weights the pass needs; None: every row (:func:`_rows_only`)."""
    lean: bool = False
    """Nothing reads this pass's weights, keys or values (a pass read for its logits or their gradient alone): a layer
    whose interventions at most detach the weights runs transformers' SDPA function and records nothing (:func:`_lean`)."""
    recompute: bool = False
    """A lean pass may recompute its blocks in the backward pass (:func:`attnaudit.models.hf.passes._recomputed`)."""
    running: LayerCall | None = None
    armed: LayerCall | None = None
    mask_cache: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    """The allowed pairs of each distinct mask tensor the model passed (layers share one): ``id -> (mask, allowed)``."""

    def allowed_by(self, mask: Tensor) -> Tensor:
        """``(B,1,Q,K)`` the pairs a model's boolean or additive attention mask leaves readable (computed once per mask)."""
        known = self.mask_cache.get(id(mask))
        if known is None or known[0] is not mask:
            allowed = mask if mask.dtype == torch.bool else mask > masked_below(mask.dtype)
            known = self.mask_cache[id(mask)] = (mask, allowed)
        return known[1]

    @contextlib.contextmanager
    def arm(self, call: LayerCall) -> Iterator[None]:
        """``call`` is the attention layer running within the block; its softmax is intercepted."""
        self.running, self.armed = call, call
        try:
            yield
        finally:
            self.running, self.armed = None, None


_ACTIVE: ContextVar[Capture | None] = ContextVar("attnaudit_capture", default=None)
_PLAIN_SOFTMAX = torch.nn.functional.softmax
_INSTALLED = 0


def masked_below(dtype: torch.dtype) -> float:
    """Scores at or below this are masked keys: models add their dtype's minimum (or divide it by
    a small scale afterwards, as CodeGen does); no real attention logit comes near."""
    return -1e9 if torch.finfo(dtype).max > 1e10 else torch.finfo(dtype).min / 8


def _softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> Tensor:
    """``torch.nn.functional.softmax`` while a pass is active: the armed layer's attention softmax is ours."""
    state = _ACTIVE.get()
    call = None if state is None or input.dim() != 4 or dim not in (-1, 3) else state.armed  # armed: read for 4-d softmaxes only
    if state is None or call is None:
        return _PLAIN_SOFTMAX(input, dim, _stacklevel, dtype)
    state.armed = None
    scores = input if dtype is None else input.to(dtype)
    allowed = call.allowed
    if allowed is None:
        allowed = (scores > masked_below(scores.dtype)).any(1, keepdim=True)
    allowed = allowed.expand(scores.shape[0], 1, *scores.shape[2:])
    key_mask = call.key_mask if call.key_mask is not None else allowed.any(2).any(1)
    weights = attention_weights(scores, key_mask, "softmax", call.interventions, allowed, masked=True)  # the model added its mask
    if weights.dtype != input.dtype:
        weights = weights.to(input.dtype)  # eager code computes in float32, then casts back: the weights it uses
    call.weights, call.allowed = weights, allowed
    if state.keep_scores:
        call.scores = scores.masked_fill(~allowed, float("-inf"))
    return weights


@contextlib.contextmanager
def capturing(state: Capture) -> Iterator[Capture]:
    """Within the block ``state`` is the active pass and torch's softmax is :func:`_softmax`."""
    global _INSTALLED
    token = _ACTIVE.set(state)
    if _INSTALLED == 0:
        torch.nn.functional.softmax = _softmax
    _INSTALLED += 1
    try:
        yield state
    finally:
        _INSTALLED -= 1
        if _INSTALLED == 0:
            torch.nn.functional.softmax = _PLAIN_SOFTMAX
        _ACTIVE.reset(token)


def active() -> Capture | None:
    """The active pass, if any."""
    return _ACTIVE.get()


_EAGER: dict[type, Callable[..., tuple[Tensor, Tensor]]] = {}


def own_eager(module: nn.Module) -> Callable[..., tuple[Tensor, Tensor]]:
    """The eager attention function of ``module``'s own modeling file (BERT's where it has none),
    resolved once per class: what the model computes does not change with later patches of that file."""
    kind = type(module)
    if kind not in _EAGER:
        own = getattr(sys.modules.get(kind.__module__), "eager_attention_forward", None)
        _EAGER[kind] = own if callable(own) else _bert_eager
    return _EAGER[kind]


@contextlib.contextmanager
def _groups_of_one(module: nn.Module, expanded: bool) -> Iterator[None]:
    """Keys and values already repeated per query head: the eager code must not repeat them again."""
    saved = getattr(module, "num_key_value_groups", None)
    if expanded and saved is not None:
        module.num_key_value_groups = 1  # type: ignore[assignment]  # torch types module attributes as Tensor | Module
    try:
        yield
    finally:
        if expanded and saved is not None:
            module.num_key_value_groups = saved


def additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """``allowed`` ``(B,1,Q,K)`` as the additive float mask eager code adds to its scores."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The registered attention function: the model's own eager code, given what a pass changes."""
    eager = own_eager(module)
    state = _ACTIVE.get()
    call = None if state is None else state.running
    if state is None or call is None:
        return eager(module, query, key, value, attention_mask, *args, **kwargs)
    query, key, value = attention_operands(query, key, value)
    if call.allowed is None and isinstance(attention_mask, Tensor) and attention_mask.dim() == 4:
        # the model's mask says which pairs are readable: cheaper than reading it off every head's scores
        call.allowed = state.allowed_by(attention_mask)[..., : key.shape[-2]]
    fused = state.prefix is None and not any(kwargs.get(name) is not None for name in EAGER_ONLY)
    if fused and state.lean and active_rule() is None and only_detaches(call.interventions):
        return _lean(module, call, (query, key, value), attention_mask, *args, **kwargs)
    if fused and state.rows is not None and not call.interventions:
        return _rows_only(module, eager, state.rows, call, (query, key, value), attention_mask, *args, **kwargs)
    if state.prefix is not None:
        key, value = state.prefix.update(key, value, call.layer)
        if call.allowed is None:
            raise AttnAuditError("a key/value prefix needs the pass to say which keys each query reads")
        attention_mask = additive(call.allowed, query.dtype)
    groups = query.shape[1] // key.shape[1]
    heads = (key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)) if groups > 1 else (key, value)
    changed = apply_key_interventions(heads[0], call.interventions), apply_value_interventions(heads[1], call.interventions)
    # recorded once per key/value head (a third of a trace's keys and values for SmolLM2's 9 query heads on 3) unless an
    # intervention changed them per query head
    call.keys = key if changed[0] is heads[0] else changed[0]
    call.values = value if changed[1] is heads[1] else changed[1]
    key, value = changed
    with _groups_of_one(module, groups > 1):
        output, weights = eager(module, query, key, value, attention_mask, *args, **kwargs)
    call.output = output
    return output, weights


def per_group(tensor: Tensor, kv_heads: int) -> Tensor:
    """Recorded keys or values ``(B,H|H_kv,K,dh)`` as one head per key/value group ``(B,H_kv,K,dh)``."""
    return tensor[:, :: max(tensor.shape[1] // kv_heads, 1)]


EAGER_ONLY = ("softcap", "s_aux", "sinks")
"""Arguments of a model's eager attention that transformers' SDPA function does not apply (Gemma's logit
soft-capping, GPT-OSS's attention sinks): a layer given one runs eager for every row."""


def _at_rows(tensor: Tensor, rows: Tensor) -> Tensor:
    """``(B|1, h, Q, n)`` -> ``(B, h, 1, n)``: each instance's query row ``rows[b]``."""
    tensor = tensor.expand(rows.shape[0], *tensor.shape[1:])
    return tensor.gather(2, rows.to(tensor.device)[:, None, None, None].expand(-1, tensor.shape[1], 1, tensor.shape[-1]))


def _rows_only(
    module: nn.Module, eager: Callable[..., tuple[Tensor, Tensor]], rows: Tensor, call: LayerCall,
    operands: tuple[Tensor, Tensor, Tensor], attention_mask: Tensor | None, *args: Any, **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """Every query's output by transformers' SDPA function; the weights of query row ``rows[b]`` of each instance
    by the model's own eager code on that row alone (its softmax is :func:`_softmax`): ``(B,H,1,K)``.

    Why both: SDPA returns no weights, and eager's cost is the ``(B,H,Q,K)`` weights nobody reads here.
    Keys and values are not recorded (what reads them needs every row)."""
    query, key, value = operands
    output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    if call.allowed is not None:
        call.allowed = _at_rows(call.allowed, rows)
    mask = _at_rows(attention_mask, rows) if isinstance(attention_mask, Tensor) and attention_mask.dim() == 4 else attention_mask
    call.rows = rows
    eager(module, _at_rows(query, rows), key, value, mask, *args, **kwargs)
    call.output = output
    return output, None


def _lean(
    module: nn.Module, call: LayerCall, operands: tuple[Tensor, Tensor, Tensor], attention_mask: Tensor | None, *args: Any, **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """A layer of a lean pass (:attr:`Capture.lean`): transformers' SDPA function, no weights made or kept, so neither the
    forward nor the backward holds a ``(B,H,Q,K)`` tensor. Detached weights (J&W's gradient) are those of detached
    queries and keys: the same values, and gradients reach the values alone."""
    query, key, value = operands
    if call.interventions:  # only_detaches: the weights are a constant
        query, key = query.detach(), key.detach()
    output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    call.output = output
    return output, None


AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
# Without a registered mask function transformers would build no mask for an unknown name.
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
