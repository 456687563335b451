"""What a Hugging Face model's attention layers and blocks are, found by running it once.

No architecture is named here. A dry run on a few tokens (:func:`discover`) records every module
call. The calls that reach the attention softmax are the attention layers, in order; the block
of each is its outermost enclosing module that is an element of a ``ModuleList`` (a decoder
layer, a BERT layer, a T5 block, an ALBERT layer group called once per layer). Where an
attention layer crosses from a decoder to an encoder (its keys are not its queries), it is
cross-attention; a self-attention layer whose mask is lower-triangular is causal.

What only some methods need is then read off the same run and checked against it, never
assumed from a module's name:

* **value and output projections** (:mod:`attnaudit.models.hf.projections`): the linear map inside the attention
  module whose output columns *are* the values the attention function received (a plain
  ``v_proj`` or the value columns of a fused query/key/value map, in whatever order a family
  interleaves them), and the linear map in the block whose input *is* the attention output;
* **the block layout** (:mod:`attnaudit.models.hf.layouts`), read off the same run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnaudit.errors import AttnAuditError
from attnaudit.models.hf import attention as hf_attention

HIDDEN_ARGS = ("hidden_states", "hidden_state", "x", "input", "hidden")
"""Names under which a block or an attention module may receive its hidden states by keyword."""
CROSS_INPUTS = ("key_value_states", "encoder_hidden_states")
"""Keyword names of the states a cross-attention module attends to."""
TOL = 1e-4


@dataclass
class Call:
    """One module call of the dry run."""

    module: nn.Module
    parents: tuple[int, ...]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    output: Any = None

    @property
    def hidden(self) -> Tensor | None:
        """The hidden states it was called with (first positional argument or a hidden-state keyword)."""
        return hidden_argument(self.args, self.kwargs)

    @property
    def out(self) -> Tensor | None:
        """Its output tensor (the first element of a tuple)."""
        return first_tensor(self.output)



@dataclass
class Site:
    """One attention layer: its module, the block call it runs in, self or cross, and its stack
    (``encoder``/``decoder`` in an encoder-decoder, else ``""``)."""

    module: nn.Module
    block: int
    kind: Literal["self", "cross"]
    side: str
    projections: Any = None
    """The layer's value and output projections where found (:mod:`attnaudit.models.hf.projections`)."""


@dataclass
class Structure:
    """Attention layers and blocks of a model, in the order its forward pass runs them."""

    route: Literal["interface", "softmax"]
    sites: list[Site]
    blocks: list[nn.Module]
    """Per block call, the module (ALBERT calls one module once per layer)."""
    tuple_outputs: list[int]
    """Per block call, the length of the tuple it returns (0: a tensor)."""
    passes_state: list[bool]
    """Per block call, whether the next block reads one of its other outputs (T5's position bias)."""
    causal: bool
    layouts: dict[int, Any] = field(default_factory=dict)
    """Per block call of a self-attention stack: its layout, or why none was found."""

    def layers_of(self, block: int) -> list[int]:
        """The attention layers of block call ``block``, in order."""
        return [i for i, site in enumerate(self.sites) if site.block == block]


def hidden_argument(args: Sequence[Any], kwargs: dict[str, Any]) -> Tensor | None:
    """The hidden states of a module call: its first positional argument, or a hidden-state keyword."""
    if args and isinstance(args[0], Tensor):
        return args[0]
    for name in HIDDEN_ARGS:
        if isinstance(kwargs.get(name), Tensor):
            return kwargs[name]
    return None


def first_tensor(value: Any) -> Tensor | None:
    """``value`` if a tensor, else the first element of a tuple/list or the first field of a model output."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


def close(a: Tensor | None, b: Tensor | None) -> bool:
    """Same shape and values up to :data:`TOL` relative to ``b``'s scale."""
    if a is None or b is None or a.numel() != b.numel() or a.shape[-1:] != b.shape[-1:]:
        return False
    a, b = a.detach().float().reshape(b.shape), b.detach().float()  # (B·T, d) is (B, T, d) flattened (OPT)
    return bool((a - b).abs().max() <= TOL * (1.0 + b.abs().max()))


# -- the dry run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _recorded(model: nn.Module, calls: list[Call]) -> Iterator[list[int]]:
    """Record every module call of ``model`` (arguments, output, enclosing calls); yields the stack."""
    stack: list[int] = []

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append(Call(module, tuple(stack), args, kwargs))
        stack.append(len(calls) - 1)

    def after(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        index = stack.pop()
        calls[index].output = output

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


class _Discovery(hf_attention.Capture):
    """A pass in which every attention softmax is intercepted and logged against the module running it."""

    def __init__(self, calls: list[Call], stack: list[int]) -> None:
        super().__init__()
        self.calls, self.stack = calls, stack
        self.found: dict[int, hf_attention.LayerCall] = {}

    def _current(self) -> hf_attention.LayerCall | None:
        for index in reversed(self.stack):
            if not isinstance(self.calls[index].module, nn.Softmax):
                if index not in self.found:
                    self.found[index] = hf_attention.LayerCall(layer=len(self.found))
                return self.found[index]
        return None

    @property
    def running(self) -> hf_attention.LayerCall | None:
        return self._current()

    @running.setter
    def running(self, value: Any) -> None:
        pass

    @property
    def armed(self) -> hf_attention.LayerCall | None:
        call = self._current()
        return None if call is None or call.weights is not None else call

    @armed.setter
    def armed(self, value: Any) -> None:
        pass


@dataclass
class DryRun:
    """What the dry run recorded: every module call, and which of them are the block and attention-layer calls."""

    calls: list[Call]
    blocks: list[int]
    layers: list[int]
    records: list[hf_attention.LayerCall]
    """Per attention layer, what the attention function saw (values, output) and the softmax made."""


def discover(model: nn.Module, inputs: dict[str, Any], encoder: nn.Module | None) -> tuple[Structure, DryRun]:
    """Run ``model(**inputs)`` once and read off its attention layers and blocks (see the module docstring).

    ``encoder``: an encoder-decoder's encoder (its layers are the ``encoder`` side). The route is
    ``interface`` when every attention layer called the registered function (it left its output)."""
    calls: list[Call] = []
    with torch.no_grad(), _recorded(model, calls) as stack:
        state = _Discovery(calls, stack)
        with hf_attention.capturing(state):
            model(**inputs)
    if not state.found:
        raise AttnAuditError(f"{type(model).__name__}: no attention softmax was reached in a forward pass")
    members = {id(child) for module in model.modules() if isinstance(module, nn.ModuleList) for child in module}
    encoder_modules = {id(m) for m in encoder.modules()} if encoder is not None else set()
    block_calls: list[int] = []
    sites: list[Site] = []
    layer_calls = sorted(state.found)
    for index in layer_calls:
        call = calls[index]
        outer = [p for p in (*call.parents, index) if id(calls[p].module) in members]
        if not outer:
            raise AttnAuditError(f"{type(call.module).__name__} runs outside any layer list: no block to restart from")
        if outer[0] not in block_calls:
            block_calls.append(outer[0])
        record = state.found[index]
        assert record.weights is not None
        cross = any(call.kwargs.get(name) is not None for name in CROSS_INPUTS) or record.weights.shape[-1] != record.weights.shape[-2]
        side = "" if encoder is None else ("encoder" if id(call.module) in encoder_modules else "decoder")
        sites.append(Site(call.module, block_calls.index(outer[0]), "cross" if cross else "self", side))
    interface = all(state.found[i].output is not None for i in layer_calls)
    structure = Structure(
        route="interface" if interface else "softmax",
        sites=sites,
        blocks=[calls[b].module for b in block_calls],
        tuple_outputs=[len(calls[b].output) if isinstance(calls[b].output, tuple) else 0 for b in block_calls],
        passes_state=[_passes_state(calls, b, block_calls[i + 1] if i + 1 < len(block_calls) else None) for i, b in enumerate(block_calls)],
        causal=_causal(state.found[layer_calls[0]], sites[0]),
    )
    return structure, DryRun(calls, block_calls, layer_calls, [state.found[i] for i in layer_calls])


def _passes_state(calls: list[Call], block: int, following: int | None) -> bool:
    """Whether a block's extra outputs are arguments of the next block call (state handed on)."""
    output = calls[block].output
    if following is None or not isinstance(output, tuple):
        return False
    extras = [id(value) for value in output[1:] if isinstance(value, Tensor)]
    given = [id(v) for v in (*calls[following].args, *calls[following].kwargs.values()) if isinstance(v, Tensor)]
    return any(e in given for e in extras)


def _causal(record: hf_attention.LayerCall, site: Site) -> bool:
    """Whether the first self-attention layer's allowed pairs are lower-triangular and not all pairs."""
    if site.kind != "self" or record.allowed is None:
        return False
    allowed = record.allowed[0, 0]
    upper = torch.ones_like(allowed).triu(1)
    return bool(not allowed[upper].any()) and bool(allowed.shape[-1] > 1)


def linear_map(module: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(W, b)`` with ``y = x @ W + b`` for an ``nn.Linear`` or transformers' ``Conv1D``; None otherwise."""
    if isinstance(module, nn.Linear):
        return module.weight.t(), module.bias
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, Tensor):
        return weight, getattr(module, "bias", None)
    return None


def within(calls: list[Call], index: int, ancestor: int) -> bool:
    """Whether call ``index`` ran inside call ``ancestor``."""
    return ancestor in calls[index].parents


def linear(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(W, b)`` of a module known to be linear (:func:`linear_map`)."""
    found = linear_map(module)
    assert found is not None
    return found
