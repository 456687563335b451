"""Where a Hugging Face block's norms sit and what its feed-forward map is, read off the dry run.

A block's layout is ``pre`` (Llama, GPT-2), ``post`` (BERT), ``sandwich`` (Gemma 2/3) or ``parallel``
(GPT-J, Phi, GPT-NeoX), with its feed-forward module; each is accepted only when its equations —
norms, residuals and feed-forward re-adding to the block's output — hold on the recorded run
(:func:`read_layouts`). Norm modules of any family are probed (:func:`norm_recipe`); nothing is
taken from a module's name except the split feed-forward maps of :data:`SPLIT_FFNS`, and those are
checked too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnaudit.models.hf.projections import Projections
from attnaudit.models.hf.structure import (
    Call,
    DryRun,
    Structure,
    close,
    first_tensor,
    linear,
    linear_map,
    within,
)
from attnaudit.models.interface import Dense, NormParams

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
        (w_up, b_up), (w_down, b_down) = linear(self.up), linear(self.down)
        return (w_up, b_up, self.act), (w_down, b_down, None)

    def __call__(self, h: Tensor) -> Tensor:
        for w, b, f in self.layers():
            h = h @ w + (b if b is not None else 0)
            h = f(h) if f is not None else h
        return h


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


def read_layouts(structure: Structure, run: DryRun) -> None:
    """Fill ``structure.layouts``: each block call's layout, or why none holds (blocks of one self-attention layer)."""
    for number, block in enumerate(run.blocks):
        structure.layouts[number] = _read_layout(structure, run.calls, block, number, run.layers)


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
    inside = [i for i in range(block + 1, len(calls)) if within(calls, i, block)]
    outside_attention = [i for i in inside if not within(calls, i, layer_calls[layers[0]]) and i != layer_calls[layers[0]]]
    o = next((calls[i].out for i in inside if calls[i].module is not None and _is_output(calls[i], site.projections)), None)
    norms = [i for i in inside if _is_norm(calls[i].module)]  # ALBERT's sits inside its attention module
    if x is None or y is None or o is None:
        return "its block input, output or attention output could not be read"
    for kind in ("pre", "sandwich", "parallel", "post"):
        layout = _try_layout(kind, calls, norms, outside_attention, x, y, o, attention.hidden, calls[block].module)
        if layout is not None:
            return layout
    return "no pre-norm, post-norm, sandwich or parallel layout re-adds to the block's output"


def _is_output(call: Call, projections: Projections) -> bool:
    """Whether the call is of the layer's output projection."""
    linear = linear_map(call.module)
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
    ffn_in: Tensor | None
    ffn_out: Tensor | None
    wrap: tuple[int | None, ...]
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
            if not (isinstance(up, nn.Module) and isinstance(down, nn.Module) and linear_map(up) and linear_map(down) and callable(act)):
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
