"""One pass of a Hugging Face model through :class:`~attnaudit.models.hf.model.HFModel`: its blocks wrapped.

``decode`` runs the model's own ``forward``; for that pass (:func:`wrapped`) each block's ``forward``
is replaced: before the restart block it returns its input (or, where the next block reads its
other outputs, as T5's position bias, what the recorded pass gave; without that record it runs),
the restart block receives the cached states, and after each block the records of its attention
layers are completed (block input, output, the outputs handed on) and handed over. Each attention
module is hooked to say which layer runs, with which inputs, and to arm the softmax
(:mod:`attnaudit.models.hf.attention`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnaudit.errors import AttnAuditError
from attnaudit.models.hf import attention as hf_attention
from attnaudit.models.hf.attention import LayerCall
from attnaudit.models.hf.memory import release_freed_memory
from attnaudit.models.hf.structure import (
    CROSS_INPUTS,
    HIDDEN_ARGS,
    Structure,
    first_tensor,
    hidden_argument,
)
from attnaudit.models.interface import (
    AttentionLayer,
    Cache,
    Intervention,
    interventions_for,
    own_forward,
    replaced_forwards,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Masks = Callable[[int], "tuple[Tensor, Tensor, Tensor | None]"]
"""``masks(layer) -> (key mask (B,K), query mask (B,Q), allowed (B,1,Q,K) or None)`` of a pass."""
Finished = Callable[[int, "HFLayer"], None]


@dataclass
class HFLayer(AttentionLayer):
    """A traced attention layer of a Hugging Face model: ``residual`` ``(B,T,d)`` the states that
    entered its block; ``allowed`` ``(B,1,Q,K)`` the pairs its queries may read; ``extras`` the block's
    other outputs that the next block reads (T5's position bias), on the block's first layer."""

    residual: Tensor | None = None
    allowed: Tensor | None = None
    extras: tuple[Any, ...] | None = None


class Pass(hf_attention.Capture):
    """One ``decode``: which block call comes next, the records made so far, what each layer gets.

    ``start``: the first attention layer run; ``first_block``: the block call it runs in;
    ``masks``: each layer's masks; ``label``: a layer's name in the trace; ``name``: the family."""

    def __init__(
        self, structure: Structure, cache: Cache, start: int, interventions: Sequence[Intervention],
        masks: Masks, label: Callable[[int], str], first_block_call: int, name: str,
    ) -> None:
        super().__init__(prefix=cache.extra.get("prefix"))
        self.structure, self.cache, self.start, self.masks, self.label, self.name = structure, cache, start, masks, label, name
        self.first_block = structure.sites[start].block
        self.next_block = self.first_call = first_block_call
        self.block, self.within = -1, 0
        n = len(structure.sites)
        self.interventions = {layer: interventions_for(interventions, layer, n) for layer in range(n)}
        self.calls: dict[int, LayerCall] = {}

    def layer_call(self, layer: int) -> LayerCall | None:
        """The call of attention layer ``layer`` in this pass; None for layers the pass does not run."""
        if layer < self.start:
            return None
        keys, queries, allowed = self.masks(layer)
        return LayerCall(layer=layer, interventions=self.interventions[layer], key_mask=keys, query_mask=queries, allowed=allowed)


@contextlib.contextmanager
def wrapped(state: Pass, finished: Finished) -> Iterator[None]:
    """Blocks and attention modules wrapped for one pass (see the module docstring); restored on exit."""
    structure = state.structure
    attention_hooks = []
    for module in {id(s.module): s.module for s in structure.sites}.values():
        attention_hooks.append(module.register_forward_pre_hook(_pre(state), with_kwargs=True))
        attention_hooks.append(module.register_forward_hook(_post(state), with_kwargs=True))
    blocks = {id(m): m for m in structure.blocks}.values()
    plain_dropout = torch.nn.functional.dropout

    def dropout(input: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        # Before the first block the pass recomputes embeddings it then discards (the cache holds them, dropped
        # out once by encode): drawing their dropout masks again would only move every later mask of training.
        return input if state.next_block == state.first_call else plain_dropout(input, *args, **kwargs)

    torch.nn.functional.dropout = dropout
    try:
        with replaced_forwards({m: _block_forward(state, own_forward(m), finished) for m in blocks}):
            yield
    finally:
        torch.nn.functional.dropout = plain_dropout
        for hook in attention_hooks:
            hook.remove()


def _pre(state: Pass) -> Callable[..., None]:
    """The pre-hook of an attention module in a pass: which layer runs, its inputs, the softmax armed."""

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        layers = state.structure.layers_of(state.block)
        layer = layers[state.within] if state.within < len(layers) else None
        state.within += 1
        call = None if layer is None or state.block < state.first_block else state.layer_call(layer)
        if call is None:
            return
        memory = next((kwargs[n] for n in CROSS_INPUTS if isinstance(kwargs.get(n), Tensor)), None)
        call.inputs = memory if memory is not None else hidden_argument(args, kwargs)
        state.calls[layer] = call  # type: ignore[index]
        state.running, state.armed = call, call

    return pre


def _post(state: Pass) -> Callable[..., None]:
    """The post-hook of an attention module in a pass: the softmax disarmed."""

    def post(_module: nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any], _out: Any) -> None:
        state.running, state.armed = None, None

    return post


def _block_forward(state: Pass, plain: Callable[..., Any], finished: Finished) -> Callable[..., Any]:
    """A block's ``forward`` within a pass: skipped before the restart, fed the cached states at it, recorded after."""
    structure = state.structure

    def forward(*args: Any, **kwargs: Any) -> Any:
        number = state.next_block
        state.next_block += 1
        hidden = hidden_argument(args, kwargs)
        if number < state.first_block:
            replay = _replay(structure, state, number, hidden)
            if replay is not None:
                return replay
        elif number == state.first_block:
            args, kwargs = _with_hidden(args, kwargs, state.cache.states)
            hidden = state.cache.states
        state.block, state.within = number, 0
        if number >= state.first_block and _long(hidden):  # what the previous block freed goes back before this one runs
            release_freed_memory()
        if number >= state.first_block and _recomputed(state, number, hidden):
            rerun = functools.partial(_rerun, state, number)
            out = checkpoint(plain, *args, use_reentrant=False, context_fn=lambda: (contextlib.nullcontext(), rerun()), **kwargs)
        else:
            out = plain(*args, **kwargs)
        if number >= state.first_block:
            _finish_block(state, number, hidden, out, finished)
        return out

    return forward


CHECKPOINT_TOKENS = 512
"""A lean pass under autograd (:attr:`~attnaudit.models.hf.attention.Capture.lean`) over sequences of at least this many
positions keeps each block's input alone and recomputes the block in the backward pass (activation
checkpointing): SmolLM2 would otherwise hold about 50 kB per position and layer for the backward pass (12 GB at 8,192
tokens), with it its 30 block inputs (2.3 kB per position each) and one block's activations at a time; the price is a
second forward through each block. Shorter sequences keep their activations, however many (Integrated Gradients'
interpolation batches, a generated sequence's steps): the time matters more there, and their passes are sized to memory."""


def _long(hidden: Tensor | None) -> bool:
    """Whether a block's states span :data:`CHECKPOINT_TOKENS` positions or more."""
    return hidden is not None and hidden.dim() >= 2 and hidden.shape[1] >= CHECKPOINT_TOKENS


def _recomputed(state: Pass, number: int, hidden: Tensor | None) -> bool:
    """Whether block call ``number`` of a lean pass runs under activation checkpointing (:data:`CHECKPOINT_TOKENS`): not
    the last block (a read-rows cut may hook into it) nor a block whose states need no gradient."""
    return (
        state.lean and state.recompute and torch.is_grad_enabled() and hidden is not None and hidden.requires_grad
        and hidden.dim() >= 2 and hidden.shape[1] >= CHECKPOINT_TOKENS and number < len(state.structure.blocks) - 1
    )


@contextlib.contextmanager
def _rerun(state: Pass, number: int) -> Iterator[None]:
    """Block call ``number`` recomputed in the backward pass as it ran in the forward: its attention modules hooked and
    the pass active, so each layer again gets its interventions and mask (:func:`~attnaudit.models.hf.attention._lean`)."""
    modules = {id(state.structure.sites[layer].module): state.structure.sites[layer].module for layer in state.structure.layers_of(number)}
    hooks = [h for m in modules.values() for h in (m.register_forward_pre_hook(_pre(state), with_kwargs=True),
                                                  m.register_forward_hook(_post(state), with_kwargs=True))]
    saved = state.block, state.within
    state.block, state.within = number, 0
    release_freed_memory()  # a recomputed block is a long one: the previous block's backward freed its activations
    try:
        with hf_attention.capturing(state):
            yield
    finally:
        state.block, state.within = saved
        for layer in state.structure.layers_of(number):
            state.calls.pop(layer, None)
        for hook in hooks:
            hook.remove()


def _replay(structure: Structure, state: Pass, number: int, hidden: Tensor | None) -> Any:
    """What a skipped block returns: its input (and the other outputs the next block reads, recorded); None: run it."""
    size = structure.tuple_outputs[number]
    if not size:
        return hidden
    extras = (state.cache.extra.get("extras") or {}).get(number)
    if structure.passes_state[number] and extras is None:
        return None
    return (hidden, *(extras if extras is not None else (None,) * (size - 1)))


def _with_hidden(args: tuple[Any, ...], kwargs: dict[str, Any], states: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A block call's arguments with its hidden states replaced."""
    if args and isinstance(args[0], Tensor):
        return (states, *args[1:]), kwargs
    for name in HIDDEN_ARGS:
        if name in kwargs:
            return args, {**kwargs, name: states}
    raise AttnAuditError("cannot find the hidden states among a block's arguments")


def _finish_block(state: Pass, number: int, hidden: Tensor | None, out: Any, finished: Finished) -> None:
    """Complete the records of a block's attention layers (input, output, extras) and hand them over."""
    structure = state.structure
    layers = structure.layers_of(number)
    if state.lean:  # nothing is recorded (the pass is read for its logits alone)
        for layer in layers:
            state.calls.pop(layer, None)
        return
    output = first_tensor(out)
    extras = tuple(out[1:]) if structure.passes_state[number] and isinstance(out, tuple) else None
    for position, layer in enumerate(layers):
        call = state.calls.pop(layer, None)
        if call is None or call.weights is None:
            raise AttnAuditError(f"{state.name}: attention layer {layer} did not reach the attention softmax")
        # a row-only layer's readers read its weights at those rows alone: its (B,T,d) states are not kept (at 8,192
        # tokens SmolLM2's inputs, outputs and residuals would hold 1.7 GB while the rest of an explanation runs)
        full = call.rows is None
        record = HFLayer(
            weights=call.weights, mask=call.key_mask if call.key_mask is not None else call.allowed.any(2).any(1),  # type: ignore[union-attr]
            inputs=call.inputs if call.inputs is not None and full else call.weights.new_empty(0), keys=call.keys, values=call.values,
            scores=call.scores, query_mask=call.query_mask if full else None, name=state.label(layer),
            rows=call.rows,
            outputs=output if position == len(layers) - 1 and full else None,
            residual=hidden if position == 0 and full else None, allowed=call.allowed,
            extras=extras if position == 0 else None,
        )
        finished(layer, record)


@contextlib.contextmanager
def given_output(embedding: nn.Module, ids: Tensor | None, value: Tensor | None) -> Iterator[None]:
    """Within the block, ``embedding`` called on ``ids`` returns ``value`` (an encoder-decoder's decoder input
    embeddings given by the caller, so that gradients reach them); nothing changes when ``value`` is None.

    Matched by the ids, not by the call: where the encoder shares the module, its call on the source is left
    alone (and a source equal to the target gets the same-shaped value, which the restart at the first
    block discards anyway)."""
    if value is None or ids is None:
        yield
        return

    def replace(_module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        given = args[0] if args else None
        if isinstance(given, Tensor) and given.shape == ids.shape and torch.equal(given, ids.to(given.device)):
            return value.to(output.device, output.dtype)
        return output

    handle = embedding.register_forward_hook(replace)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def decided(
    hf: PreTrainedModel, kind: str, has_head: bool, output: str, verbalizer_ids: Tensor | None, rows: int | Tensor | None
) -> Iterator[Callable[[Any], Tensor]]:
    """How the model's output becomes the decision's logits: a causal LM's head reads each example's row
    ``rows`` only (and the verbalizer's ids of it), a decoder's classification head that row whatever its
    padding id, a bare model its ``[CLS]`` or ``rows`` state; a classifier and an encoder-decoder their own logits."""
    handles = []
    forwards: dict[nn.Module, Callable[..., Any]] = {}
    head = hf.get_output_embeddings() if output in ("next_token", "verbalizer") else None
    narrowed = verbalizer_ids is not None and isinstance(head, nn.Linear)
    if head is not None and isinstance(rows, Tensor):
        def gather(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            hidden = args[0]
            examples = torch.arange(hidden.shape[0], device=hidden.device)  # rows (B, R): R rows of each example, flattened
            picked = hidden[examples[:, None] if rows.dim() == 2 else examples, rows.to(hidden.device)]
            return (picked.reshape(-1, hidden.shape[-1])[:, None], *args[1:])

        handles.append(head.register_forward_pre_hook(gather))
        if narrowed:  # only the verbalizer's rows of the LM head: the same logits without a (B, vocab) product
            assert isinstance(head, nn.Linear) and verbalizer_ids is not None
            ids = verbalizer_ids.to(head.weight.device)
            bias = None if head.bias is None else head.bias[ids]
            forwards[head] = lambda hidden: nn.functional.linear(hidden, head.weight[ids], bias)
    elif has_head and kind == "decoder" and isinstance(rows, Tensor):
        def spread(_module: nn.Module, _args: tuple[Any, ...], out: Tensor) -> Tensor:
            picked = out[torch.arange(out.shape[0], device=out.device), rows.to(out.device)]
            return picked[:, None].expand_as(out)  # whichever position the model pools, it reads our row

        handles.append(cast(nn.Module, hf.score).register_forward_hook(spread))  # a decoder classifier's head

    def decision(out: Any) -> Tensor:
        if kind == "encoder-decoder" and output == "next_token" and rows is not None:
            # a forced target's next token (:meth:`attnaudit.models.interface.LanguageModel.forced_decision`): its last
            # position, or each row's last real one, which the head alone was given (``gather``)
            return out.logits[:, rows] if isinstance(rows, int) else out.logits[:, 0]
        if kind == "encoder-decoder" or has_head:
            return out.logits
        if head is not None:
            logits = out.logits[:, 0]
            return logits if verbalizer_ids is None or narrowed else logits[:, verbalizer_ids.to(logits.device)]
        states = out.last_hidden_state
        if isinstance(rows, Tensor):
            return states[torch.arange(states.shape[0], device=states.device), rows.to(states.device)]
        return states[:, 0]

    try:
        with replaced_forwards(forwards):
            yield decision
    finally:
        for handle in handles:
            handle.remove()

# -- restarts -------------------------------------------------------------------------------------
