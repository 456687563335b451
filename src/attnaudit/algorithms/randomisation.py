"""Model-parameter randomisation (Adebayo et al. 2018) for any ``nn.Module``, and the similarity and
complexity measures the sanity checks compare explanations with.

**Layers.** A *layer* is a unit of parameters that is randomised at once, found the same way for
every family, through generic ``nn.Module`` access only:

* the modules that hold parameters directly (``parameters(recurse=False)``: an ``Embedding``, a
  ``Linear``, an ``LSTM``, a ``LayerNorm``, a module with an ``nn.Parameter`` of its own);
* grouped into *blocks*: a module inside a ``ModuleList``/``Sequential`` element of a stack belongs to
  the block named by the path up to that element's index (``layers.1``, ``bert.encoder.layer.0``), every
  other one is a block by itself (``embedding``, ``classifier``, ``encoder.rnn``);
* ordered by when the block first runs in one forward pass (a forward pre-hook on every such module
  records the first call), so the order is that of the computation, not of registration; **top-down**
  (output first, embeddings last) is the reverse. Modules never called in that pass (an unused pooler)
  are left out and reported: they cannot change any explanation.

**Randomisation.** A block is re-drawn module by module, each from a CPU generator seeded with
``(seed, draw, module name)``, so a draw does not depend on the device or on which other blocks are
re-drawn: a module without parameterised children that has its own ``reset_parameters()`` (``Linear``,
``Embedding``, ``LSTM``, ``LayerNorm``...) is reset by it (on a CPU copy, under the seeded global
generator, then copied back); any other parameter is drawn from ``N(0, σ²)`` with ``σ`` the standard
deviation of the original values (their mean absolute value where that is 0, or 1 where both are).
Tied parameters (a decoder's output head and input embeddings) are one tensor: it is re-drawn with
whichever of its modules is randomised (the later one in top-down order when both are). ``draw`` numbers
independent randomisations: the sanity test's "random" model is draw 1, its second random model (the floor) draw 2.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import Tensor, nn


@dataclass(frozen=True)
class Block:
    """One randomised layer: its ``name`` and the names of the modules holding its parameters."""

    name: str
    modules: tuple[str, ...]


def parameter_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every module of ``model`` that holds parameters directly, by name, in registration order."""
    return {name: module for name, module in model.named_modules() if next(module.parameters(recurse=False), None) is not None}


def block_name(model: nn.Module, name: str) -> str:
    """The block a parameterised module belongs to: the path up to the innermost element of a stack
    (``ModuleList`` / ``Sequential``) that is a direct child of a non-stack module, else its own name."""
    parts = name.split(".") if name else []
    cut = None
    module = model
    for i, part in enumerate(parts):
        parent = module
        module = getattr(module, part)
        if isinstance(parent, (nn.ModuleList, nn.Sequential)) and cut is None:
            cut = i + 1  # the outermost stack element: a transformer block, not a sub-layer of its feed-forward map
    return ".".join(parts[:cut]) if cut is not None else name


def layers_top_down(model: nn.Module, run_forward: Callable[[], object]) -> tuple[list[Block], list[str]]:
    """The blocks of ``model`` from the output down to the embeddings (module docstring), and the
    parameterised modules a forward pass (``run_forward()``) never calls."""
    modules = parameter_modules(model)
    first: dict[str, int] = {}
    handles = []
    for name, module in modules.items():

        def seen(_module: nn.Module, _args: object, name: str = name) -> None:
            first.setdefault(name, len(first))

        handles.append(module.register_forward_pre_hook(seen))
    try:
        with torch.no_grad():
            run_forward()
    finally:
        for handle in handles:
            handle.remove()
    groups: dict[str, list[str]] = {}
    for name in sorted(first, key=first.__getitem__):
        groups.setdefault(block_name(model, name), []).append(name)
    blocks = [Block(name, tuple(members)) for name, members in groups.items()]
    return blocks[::-1], [name for name in modules if name not in first]


def grouped(blocks: Sequence[Block], size: int) -> list[Block]:
    """Consecutive runs of ``size`` blocks (in the given order) merged into one block each, named by its first and last
    (``layers.29 … layers.26``): fewer randomisation steps for a deep model. The draws stay per module."""
    chunks = [list(blocks[i : i + size]) for i in range(0, len(blocks), size)]
    return [
        Block(chunk[0].name if len(chunk) == 1 else f"{chunk[0].name} … {chunk[-1].name}", tuple(m for b in chunk for m in b.modules))
        for chunk in chunks
    ]


def _seed(seed: int, draw: int, name: str) -> int:
    """A 63-bit seed from ``(seed, draw, module name)``."""
    text = f"{seed}:{draw}:{name}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def redraw_module(module: nn.Module, name: str, seed: int, draw: int) -> tuple[dict[str, Tensor], str]:
    """New values for ``module``'s own parameters (by their local names, on the CPU, float32) and how
    they were drawn (``reset_parameters`` or ``normal``); ``module`` itself is not changed."""
    own = dict(module.named_parameters(recurse=False))
    has_children = any(next(child.parameters(), None) is not None for child in module.children())
    reset = getattr(module, "reset_parameters", None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(seed, draw, name))
        if callable(reset) and not has_children:
            clone = copy.deepcopy(module).to(device="cpu", dtype=torch.float32)
            clone.reset_parameters()  # type: ignore[operator]
            fresh = dict(clone.named_parameters(recurse=False))
            return {key: fresh[key].detach().clone() for key in own}, "reset_parameters"
        values = {}
        for key, param in own.items():
            original = param.detach().float().cpu()
            scale = float(original.std()) if original.numel() > 1 else 0.0
            if not math.isfinite(scale) or scale == 0.0:
                scale = float(original.abs().mean()) or 1.0
            values[key] = torch.randn(original.shape) * scale
        return values, "normal"


def block_values(model: nn.Module, block: Block, seed: int, draw: int) -> tuple[dict[str, Tensor], dict[str, str]]:
    """New values for every parameter of ``block`` (full parameter names -> CPU tensors) and, per
    module, how they were drawn."""
    values: dict[str, Tensor] = {}
    how: dict[str, str] = {}
    for name in block.modules:
        module = model.get_submodule(name)
        fresh, how[name] = redraw_module(module, name, seed, draw)
        values.update({f"{name}.{key}" if name else key: value for key, value in fresh.items()})
    return values, how


class Randomiser:
    """A private deep copy of a model whose blocks can be set to random draws and back.

    The caller's model is never changed: every state is set on the copy (``model``), which starts
    as the original. :meth:`state` sets exactly the named blocks to their draw and every other
    parameter back to its original value.
    """

    def __init__(self, model: nn.Module, blocks: Sequence[Block], seed: int) -> None:
        self.model = copy.deepcopy(model)
        self.blocks = list(blocks)
        self.seed = seed
        self.params = dict(self.model.named_parameters())
        canonical = {id(param): name for name, param in self.params.items()}
        self.alias = {name: canonical[id(param)] for name, param in self.model.named_parameters(remove_duplicate=False)}
        """Every parameter name -> the name its tensor has in ``params``: tied weights (a decoder's output head
        and embeddings) are one tensor, so randomising either module randomises both."""
        self.original = {name: param.detach().clone() for name, param in self.params.items()}
        self._draws: dict[tuple[str, int], dict[str, Tensor]] = {}
        self.how: dict[str, str] = {}

    def values(self, block: Block, draw: int) -> dict[str, Tensor]:
        """The draw ``draw`` of ``block`` (computed once)."""
        key = (block.name, draw)
        if key not in self._draws:
            self._draws[key], how = block_values(self.model, block, self.seed, draw)
            self.how.update(how)
        return self._draws[key]

    @torch.no_grad()
    def state(self, randomised: Mapping[str, int]) -> set[str]:
        """Set block name -> draw for the named blocks, the original values elsewhere; returns the
        parameter names that now hold drawn values."""
        chosen: dict[str, Tensor] = {}
        for block in self.blocks:
            if block.name in randomised:
                chosen.update({self.alias[name]: value for name, value in self.values(block, randomised[block.name]).items()})
        for name, param in self.params.items():
            source = chosen.get(name, self.original[name])
            param.copy_(source.to(device=param.device, dtype=param.dtype))
        return set(chosen)

    def cascading(self, draw: int = 1) -> Iterator[tuple[int, Block, set[str]]]:
        """Blocks randomised cumulatively from the top (step 1: the top block; last: all); yields
        ``(step, the block added, the parameters randomised now)`` with the copy in that state."""
        done: dict[str, int] = {}
        for step, block in enumerate(self.blocks, 1):
            done[block.name] = draw
            yield step, block, self.state(done)

    def independent(self, draw: int = 1) -> Iterator[tuple[int, Block, set[str]]]:
        """One block randomised at a time, every other at its original values."""
        for step, block in enumerate(self.blocks, 1):
            yield step, block, self.state({block.name: draw})

    def full(self, draw: int) -> set[str]:
        """Every block at draw ``draw``."""
        return self.state({block.name: draw for block in self.blocks})

    def release(self) -> None:
        """Free the copy's original values and draws (the copy itself goes with the last reference)."""
        self.original.clear()
        self._draws.clear()


# --------------------------------------------------------------------------- similarity and complexity


def spearman_abs(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman ρ of ``|a|`` and ``|b|`` (:func:`scipy.stats.spearmanr`); NaN with fewer than 2 items
    or a constant side (no ranking to compare)."""
    x, y = np.abs(np.asarray(a, dtype=float)), np.abs(np.asarray(b, dtype=float))
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return float(stats.spearmanr(x, y)[0])


def top_k(a: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``min(k, n)`` items of largest ``|a|``, ties broken by position (earlier first)."""
    x = np.abs(np.asarray(a, dtype=float))
    return np.argsort(-x, kind="stable")[: min(k, x.size)]


def topk_intersection(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """``|top-k(|a|) ∩ top-k(|b|)| / min(k, n)``; NaN for an empty instance."""
    n = min(k, np.asarray(a).size)
    if n < 1:
        return math.nan
    return len(set(top_k(a, k).tolist()) & set(top_k(b, k).tolist())) / n


def discrete_entropy(a: np.ndarray, bins: int) -> float:
    """Entropy (nats) of the histogram of ``|a|`` over ``bins`` equal-width bins spanning its range
    (:func:`numpy.histogram`, :func:`scipy.stats.entropy` of the counts): Quantus' ``discrete_entropy``
    applied to absolute scores, eMPRT's complexity (Hedström et al. 2023). NaN for an empty ``a``; 0 where the
    values are too close for numpy to split their range into ``bins`` bins (where Quantus raises)."""
    x = np.abs(np.asarray(a, dtype=float))
    if x.size == 0:
        return math.nan
    try:
        counts, _ = np.histogram(x, bins=bins)
    except ValueError:  # a range too narrow for `bins` finite-width bins (values a few ulps apart): one bin
        return 0.0
    return float(stats.entropy(counts))


def relative_rise(before: float, after: float) -> float:
    """``(after − before) / before``, eMPRT's per-instance score; NaN where ``before`` is 0 or NaN."""
    if not math.isfinite(before) or before == 0.0 or not math.isfinite(after):
        return math.nan
    return (after - before) / before
