"""What a Hugging Face model's attention layers and blocks are, found by running it once.

No architecture is named here. A dry run on a few tokens (:func:`discover`) records every module
call. The calls that reach the attention softmax are the attention layers, in order; the block
of each is its outermost enclosing module that is an element of a ``ModuleList`` (a decoder
layer, a BERT layer, a T5 block, an ALBERT layer group called once per layer). Where an
attention layer crosses from a decoder to an encoder (its keys are not its queries), it is
cross-attention; a self-attention layer whose mask is lower-triangular is causal.

What only some methods need is then read off the same run and checked against it, never
assumed from a module's name:

* **value and output projections** (:class:`Projections`): the linear map inside the attention
  module whose output columns *are* the values the attention function received (a plain
  ``v_proj`` or the value columns of a fused query/key/value map, in whatever order a family
  interleaves them), and the linear map in the block whose input *is* the attention output;
* **the block layout** (:class:`BlockLayout`): which norms sit where — ``pre`` (Llama, GPT-2),
  ``post`` (BERT), ``sandwich`` (Gemma 2/3) or ``parallel`` (GPT-J, Phi) — and the feed-forward
  module, accepted only when norms, residuals and the feed-forward map re-add to the block's output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnaudit.errors import AttnAuditError
from attnaudit.models import hf_attention
from attnaudit.models.base import Dense, NormParams

HIDDEN_ARGS = ("hidden_states", "hidden_state", "x", "input", "hidden")
"""Names under which a block or an attention module may receive its hidden states by keyword."""
CROSS_INPUTS = ("key_value_states", "encoder_hidden_states")
"""Keyword names of the states a cross-attention module attends to."""
EPS_NAMES = ("variance_epsilon", "eps", "epsilon", "layer_norm_eps")
DEFAULT_EPS = (1e-5, 1e-6, 1e-12)
"""Epsilons tried for a norm that stores none (OLMo's parameter-free LayerNorm)."""
SPLIT_FFNS: tuple[tuple[str, str, str], ...] = (
    ("intermediate.dense", "intermediate.intermediate_act_fn", "output.dense"),  # BERT, RoBERTa, ELECTRA, DeBERTa, MPNet
    ("ffn.lin1", "ffn.activation", "ffn.lin2"),  # DistilBERT
    ("ffn", "activation", "ffn_output"),  # ALBERT
    ("fc1", "activation_fn", "fc2"),  # BART, Marian, OPT
)
"""Feed-forward maps that are no single module: ``(up, activation, down)`` paths inside a block. Found
by name, then accepted only if they reproduce the feed-forward output of the dry run."""
Layout = Literal["pre", "post", "sandwich", "parallel"]
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
class Projections:
    """Value and output projections of one attention layer: the value (or fused query/key/value)
    module and which of its output ``columns`` are the values, and the output projection module.
    The maps are read from the modules when asked, so they follow the model to any device or dtype:
    ``values = inputs @ w_v + b_v`` ``(…, kv_heads·dh)``, output ``concat_heads(…) @ w_o + b_o``."""

    value: nn.Module
    columns: Tensor
    output: nn.Module

    @property
    def modules(self) -> tuple[nn.Module, nn.Module]:
        return self.value, self.output

    @property
    def w_v(self) -> Tensor:
        return _map(self.value)[0][:, self.columns.to(_map(self.value)[0].device)]

    @property
    def b_v(self) -> Tensor:
        w, b = _map(self.value)
        columns = self.columns.to(w.device)
        return b[columns] if b is not None else w.new_zeros(len(columns))

    @property
    def w_o(self) -> Tensor:
        return _map(self.output)[0]

    @property
    def b_o(self) -> Tensor | None:
        return _map(self.output)[1]


@dataclass
class NormRecipe:
    """How a norm module computes (found by probing it, :func:`norm_recipe`): its scale is its ``weight``,
    ``1 + weight`` (Gemma) or one (OLMo), with its bias or none, centred (LayerNorm) or not (RMSNorm)."""

    module: nn.Module
    scale: Literal["weight", "one_plus", "one"]
    bias: bool
    centred: bool
    eps: float

    def params(self) -> NormParams:
        """The norm as :class:`NormParams`, with the module's current tensors (gradients reach them)."""
        weight = getattr(self.module, "weight", None)
        if self.scale == "one":
            gamma = torch.ones(_width(self.module) or 0)
        else:
            assert isinstance(weight, Tensor)
            gamma = weight if self.scale == "weight" else 1.0 + weight
        return NormParams(weight=gamma, bias=getattr(self.module, "bias", None) if self.bias else None, eps=self.eps, centred=self.centred)


@dataclass
class SplitFFN:
    """A feed-forward map of separate parts, ``down(act(up(h)))`` (:data:`SPLIT_FFNS`)."""

    up: nn.Module
    act: Callable[[Tensor], Tensor]
    down: nn.Module

    def layers(self) -> tuple[Dense, ...]:
        (w_up, b_up), (w_down, b_down) = _map(self.up), _map(self.down)
        return (w_up, b_up, self.act), (w_down, b_down, None)

    def __call__(self, h: Tensor) -> Tensor:
        for w, b, f in self.layers():
            h = h @ w + (b if b is not None else 0)
            h = f(h) if f is not None else h
        return h


def _map(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    found = _linear_map(module)
    assert found is not None
    return found


@dataclass
class BlockLayout:
    """Where one block's norms sit and what its feed-forward map is (checked on the dry run).

    ``pre``: ``h = x + attn(n₁(x))``, ``y = h + ffn(n₂(h))``; ``post``: ``h = n₁(x + attn(x))``,
    ``y = n₂(h + ffn(h))``; ``sandwich``: ``h = x + p₁(attn(n₁(x)))``, ``y = h + p₂(ffn(n₂(h)))``;
    ``parallel``: ``y = x + attn(n₁(x)) + ffn(n₂(x))``."""

    kind: Layout
    attention_norm: NormRecipe
    ffn_norm: NormRecipe
    ffn: Callable[[Tensor], Tensor]
    post_norms: tuple[NormRecipe, NormRecipe] | None = None

    @property
    def ffn_layers(self) -> tuple[Dense, ...]:
        """The feed-forward map as dense layers where it is split into them (BERT), else none."""
        return self.ffn.layers() if isinstance(self.ffn, SplitFFN) else ()


@dataclass
class Site:
    """One attention layer: its module, the block call it runs in, self or cross, and its stack
    (``encoder``/``decoder`` in an encoder-decoder, else ``""``)."""

    module: nn.Module
    block: int
    kind: Literal["self", "cross"]
    side: str
    projections: Projections | None = None


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
    layouts: dict[int, BlockLayout | str] = field(default_factory=dict)
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

    @property  # type: ignore[override]
    def running(self) -> hf_attention.LayerCall | None:
        return self._current()

    @running.setter
    def running(self, value: Any) -> None:
        pass

    @property  # type: ignore[override]
    def armed(self) -> hf_attention.LayerCall | None:
        call = self._current()
        return None if call is None or call.weights is not None else call

    @armed.setter
    def armed(self, value: Any) -> None:
        pass


def discover(model: nn.Module, inputs: dict[str, Any], encoder: nn.Module | None) -> Structure:
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
    _read_projections(structure, calls, layer_calls, [state.found[i] for i in layer_calls])
    if encoder is None:
        for number, block in enumerate(block_calls):
            structure.layouts[number] = _read_layout(structure, calls, block, number, layer_calls)
    return structure


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


# -- projections -----------------------------------------------------------------------------------


def _linear_map(module: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(W, b)`` with ``y = x @ W + b`` for an ``nn.Linear`` or transformers' ``Conv1D``; None otherwise."""
    if isinstance(module, nn.Linear):
        return module.weight.t(), module.bias
    if type(module).__name__ == "Conv1D" and isinstance(getattr(module, "weight", None), Tensor):
        return module.weight, getattr(module, "bias", None)
    return None


def _within(calls: list[Call], index: int, ancestor: int) -> bool:
    return ancestor in calls[index].parents


def _read_projections(structure: Structure, calls: list[Call], layer_calls: list[int], records: list[hf_attention.LayerCall]) -> None:
    """Find each interface-route layer's value and output projections (see the module docstring)."""
    if structure.route != "interface":
        return
    for site, index, record in zip(structure.sites, layer_calls, records):
        if record.values is None or record.output is None:
            continue
        attention = calls[index]
        source = next((attention.kwargs[n] for n in CROSS_INPUTS if isinstance(attention.kwargs.get(n), Tensor)), attention.hidden)
        block = next(p for p in attention.parents if calls[p].module is structure.blocks[site.block])
        value = _value_columns(calls, index, source, record)
        output = _output_projection(calls, block, record.output)
        if value is not None and output is not None:
            site.projections = Projections(value[0], value[1], output)


def _value_columns(calls: list[Call], attention: int, source: Tensor | None, record: hf_attention.LayerCall) -> tuple[nn.Module, Tensor] | None:
    """The linear map inside the attention module whose output columns ``(index)`` equal the recorded
    values (one per key/value head, not repeated)."""
    assert record.values is not None and record.weights is not None
    heads = record.weights.shape[1]
    values = record.values[:, :: max(heads // _kv_heads(calls, attention, record), 1)]  # the model's own value heads
    batch, kv, length, dh = values.shape
    target = values.detach().transpose(1, 2).reshape(batch * length, kv * dh).float()
    for index in range(attention + 1, len(calls)):
        if not _within(calls, index, attention):
            break
        linear = _linear_map(calls[index].module)
        out = calls[index].out
        if linear is None or out is None or not close(calls[index].hidden, source) or out.shape[:-1] != (batch, length):
            continue
        columns = out.detach().reshape(batch * length, -1).float()
        distance = torch.cdist(target.t(), columns.t(), compute_mode="donot_use_mm_for_euclid_dist")
        best, where = distance.min(1)
        if bool((best <= TOL * (1.0 + target.abs().max())).all()):
            return calls[index].module, where.cpu()
    return None


def _kv_heads(calls: list[Call], attention: int, record: hf_attention.LayerCall) -> int:
    """Key/value heads of an attention module: its ``num_key_value_heads`` where it says, else all heads."""
    module = calls[attention].module
    assert record.weights is not None
    heads = record.weights.shape[1]
    groups = getattr(module, "num_key_value_groups", None)
    return heads // int(groups) if isinstance(groups, int) and groups > 0 else heads


def _output_projection(calls: list[Call], block: int, output: Tensor) -> nn.Module | None:
    """The linear map in the block whose input is the attention output ``(B,Q,H,dh)``."""
    flat = output.reshape(*output.shape[:2], -1)
    for index in range(block + 1, len(calls)):
        if not _within(calls, index, block):
            break
        linear = _linear_map(calls[index].module)
        if linear is not None and close(calls[index].hidden, flat):
            return calls[index].module
    return None


# -- layouts ---------------------------------------------------------------------------------------


def norm_recipe(module: nn.Module) -> NormRecipe | None:
    """How a LayerNorm or RMSNorm module of any family computes, found by probing it with small inputs
    (where the epsilon matters): scale, bias, centring and epsilon; None if no recipe reproduces it."""
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    width = weight.shape[-1] if isinstance(weight, Tensor) and weight.dim() == 1 else _width(module)
    if width is None:
        return None
    eps = [float(getattr(module, n)) for n in EPS_NAMES if isinstance(getattr(module, n, None), (int, float))] or list(DEFAULT_EPS)
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(3, width, generator=generator) * 1e-3 + torch.randn(3, 1, generator=generator) * 1e-3
    reference = weight if isinstance(weight, Tensor) else probe
    with torch.no_grad():
        try:
            expected = module(probe.to(reference.device, reference.dtype)).float().cpu()
        except (RuntimeError, TypeError, ValueError):
            return None
        gammas = {"one": torch.ones(width)} if not isinstance(weight, Tensor) else {
            "weight": weight.detach().float().cpu(), "one_plus": 1.0 + weight.detach().float().cpu()}
        beta = bias.detach().float().cpu() if isinstance(bias, Tensor) else None
        for scale, gamma in gammas.items():
            for centred in (True, False):
                for e in eps:
                    if close(NormParams(weight=gamma, bias=beta, eps=e, centred=centred)(probe), expected):
                        return NormRecipe(module, scale, beta is not None, centred, e)  # type: ignore[arg-type]
    return None


def _width(module: nn.Module) -> int | None:
    shape = getattr(module, "normalized_shape", None)
    return int(shape[-1]) if isinstance(shape, (tuple, list)) and shape else None


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or "norm" in type(module).__name__.lower()


def _read_layout(structure: Structure, calls: list[Call], block: int, number: int, layer_calls: list[int]) -> BlockLayout | str:
    """The layout of block call ``block`` (one self-attention layer), or why none reproduces its output."""
    layers = structure.layers_of(number)
    if len(layers) != 1:
        return f"block {number} has {len(layers)} attention layers"
    site = structure.sites[layers[0]]
    if site.projections is None:
        return "its value and output projections were not found"
    x, y = calls[block].hidden, calls[block].out
    attention = calls[layer_calls[layers[0]]]
    inside = [i for i in range(block + 1, len(calls)) if _within(calls, i, block)]
    outside_attention = [i for i in inside if not _within(calls, i, layer_calls[layers[0]]) and i != layer_calls[layers[0]]]
    o = next((calls[i].out for i in inside if calls[i].module is not None and _is_output(calls[i], site.projections)), None)
    norms = [i for i in inside if _is_norm(calls[i].module)]  # ALBERT's sits inside its attention module
    if x is None or y is None or o is None:
        return "its block input, output or attention output could not be read"
    for kind in ("pre", "sandwich", "parallel", "post"):
        layout = _try_layout(kind, calls, norms, outside_attention, x, y, o, attention.hidden, calls[block].module)  # type: ignore[arg-type]
        if layout is not None:
            return layout
    return "no pre-norm, post-norm, sandwich or parallel layout re-adds to the block's output"


def _is_output(call: Call, projections: Projections) -> bool:
    """Whether the call is of the layer's output projection."""
    linear = _linear_map(call.module)
    return linear is not None and linear[0].shape == projections.w_o.shape and linear[0].data_ptr() == projections.w_o.data_ptr()


def _norm_with(calls: list[Call], norms: list[int], *, given: Tensor | None = None, gives: Tensor | None = None) -> int | None:
    """The first norm call whose input is ``given`` (if set) and output ``gives`` (if set)."""
    for index in norms:
        if (given is None or close(calls[index].hidden, given)) and (gives is None or close(calls[index].out, gives)):
            return index
    return None


def _try_layout(
    kind: Layout, calls: list[Call], norms: list[int], inside: list[int], x: Tensor, y: Tensor, o: Tensor, a_in: Tensor | None, block: nn.Module
) -> BlockLayout | None:
    """One layout's equations checked on the dry run; the layout with its norms and feed-forward map if they hold."""
    if kind == "post":
        first = _norm_with(calls, norms, given=x + o)
        if first is None or not close(a_in, x):
            return None
        h = calls[first].out
        second = _norm_with(calls, norms, gives=y)
        if h is None or second is None or second == first:
            return None
        ffn_in, ffn_out, wrap = h, calls[second].hidden - h, ()  # type: ignore[operator]
    else:
        first = _norm_with(calls, norms, given=x, gives=a_in)
        if first is None:
            return None
        if kind == "parallel":
            ffn_out = y - x - o
            second = next((i for i in norms if close(calls[i].hidden, x) and i != first), first)
            ffn_in, wrap = calls[second].out, ()
        else:
            post = _norm_with(calls, norms, given=o) if kind == "sandwich" else None
            if kind == "sandwich" and post is None:
                return None
            h = x + (calls[post].out if post is not None else o)  # type: ignore[operator]
            second = _norm_with(calls, norms, given=h)
            if second is None:
                return None
            ffn_in = calls[second].out
            last = _norm_with(calls, [i for i in norms if i > second], gives=y - h) if kind == "sandwich" else None
            if kind == "sandwich" and last is None:
                return None
            ffn_out = calls[last].hidden if last is not None else y - h
            wrap = (post, last) if kind == "sandwich" else ()
    return _with_ffn(kind, calls, inside, block, (first, second), ffn_in, ffn_out, wrap)


def _with_ffn(
    kind: Layout, calls: list[Call], inside: list[int], block: nn.Module, norms: tuple[int, int],
    ffn_in: Tensor | None, ffn_out: Tensor | None, wrap: tuple[Any, ...],
) -> BlockLayout | None:
    """The layout once its feed-forward map is found: a module mapping ``ffn_in`` to ``ffn_out``, or a split one."""
    if ffn_in is None or ffn_out is None:
        return None
    found = _ffn(calls, inside, block, ffn_in, ffn_out)
    if found is None:
        return None
    ffn = found
    norm1, norm2 = (norm_recipe(calls[i].module) for i in norms)
    if norm1 is None or norm2 is None:
        return None
    post = None
    if wrap:
        p1, p2 = (norm_recipe(calls[i].module) for i in wrap)
        if p1 is None or p2 is None:
            return None
        post = (p1, p2)
    return BlockLayout(kind, norm1, norm2, ffn, post)


def _ffn(calls: list[Call], inside: list[int], block: nn.Module, ffn_in: Tensor, ffn_out: Tensor) -> Callable[[Tensor], Tensor] | None:
    """The feed-forward map from ``ffn_in`` to ``ffn_out``: a split map of :data:`SPLIT_FFNS` whose parts are
    in the block (first: it also gives dense layers), else the outermost module call doing it."""
    for owner in block.modules():  # the block or a layer inside it (ALBERT's group holds its layer)
        for names in SPLIT_FFNS:
            up, act, down = (_path(owner, name) for name in names)
            if not (isinstance(up, nn.Module) and isinstance(down, nn.Module) and _linear_map(up) and _linear_map(down) and callable(act)):
                continue
            split = SplitFFN(up, act, down)
            with torch.no_grad():
                if close(split(ffn_in), ffn_out):
                    return split
    for index in inside:
        call = calls[index]
        if not _is_norm(call.module) and close(call.hidden, ffn_in) and close(call.out, ffn_out):
            return _Single(call.module)
    return None


@dataclass
class _Single:
    """A feed-forward module as a map of the hidden states (its first output, e.g. past an MoE's router logits)."""

    module: nn.Module

    def __call__(self, h: Tensor) -> Tensor:
        out = first_tensor(self.module(h))
        assert out is not None
        return out


def _path(module: nn.Module | None, dotted: str) -> Any:
    """``module.a.b`` for ``"a.b"``, or None where a part is missing."""
    for part in dotted.split("."):
        if module is None:
            return None
        module = getattr(module, part, None)
    return module
