"""The last block's tail at the read rows alone, for a pass whose logits are all that is read.

After a model's last attention layer nothing mixes positions any more: the rest of the last block
(a feed-forward network, norms, the residual adds) works position by position, and the head reads one
row, an encoder's ``[CLS]`` or a decoder's last real token (:meth:`HFModel.explanation_rows`). So a pass
read for its logits alone (:meth:`~attnaudit.models.interface.AttentionModel.logits_forward`: gradients,
Integrated Gradients, perturbed inputs) can run that tail on the read rows only: on a 6-layer MiniLM
about a ninth of the arithmetic of every such pass.

The cut is a module of the last block whose output keeps only the read rows ``(B, 1, d)`` (a forward
hook). Where the block then adds it to its full residual stream (pre-norm decoders), broadcasting makes
the read rows right and the block's output ``(B, T, d)`` again; where the residual add happens inside the
cut module (BERT's ``attention``), the block's output is ``(B, 1, d)`` and is spread back to every position.
No module is named: :func:`find_cut` tries each direct child of the last block that finishes after its
last attention module on the dry batch, and keeps the one that leaves the least work in the
block with the same logits; none where none saves any (OPT flattens positions; a head that pools every row).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit.errors import AttnAuditError
from attnaudit.models.hf.structure import close, first_tensor


@dataclass(frozen=True)
class Cut:
    """``module`` (a child of the last ``block``) hands on the read rows alone; ``block``'s output is spread back."""

    module: nn.Module
    block: nn.Module


def _with_first(value: Any, tensor: Tensor) -> Any:
    """``value`` with its first tensor (itself, or a tuple's first element) replaced by ``tensor``."""
    return tensor if isinstance(value, Tensor) else (tensor, *value[1:])


@contextlib.contextmanager
def read_rows_only(cut: Cut | None, rows: Tensor | None) -> Iterator[None]:
    """Within the block, ``cut.module`` returns only row ``rows[b]`` of each example ``(B, 1, ...)`` and the last block
    returns ``(B, T, ...)`` again (broadcast by its residual add, or the read row spread to every position)."""
    if cut is None or rows is None:
        yield
        return
    length: list[int] = []

    def keep(_module: nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
        states = first_tensor(out)
        if states is None or states.dim() < 3 or states.shape[0] != rows.shape[0]:
            raise AttnAuditError("the read-rows cut met states without a (batch, position) layout")
        length.append(states.shape[1])
        picked = states[torch.arange(states.shape[0], device=states.device), rows.to(states.device)]
        return _with_first(out, picked[:, None])

    def spread(_module: nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
        states = first_tensor(out)
        if states is None or not length or states.shape[1] == length[-1]:
            return out
        return _with_first(out, states.expand(states.shape[0], length[-1], *states.shape[2:]))

    handles = [cut.module.register_forward_hook(keep), cut.block.register_forward_hook(spread)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _work(block: nn.Module) -> Iterator[list[int]]:
    """Counts, while open, the elements the modules inside ``block`` are given (their first tensor), summed: the rows
    each runs on, whatever it is (a linear map, a mixture of experts' fused weights, a norm)."""
    work = [0]

    def count(_module: nn.Module, args: tuple[Any, ...]) -> None:
        given = first_tensor(args)
        work[0] += 0 if given is None else given.numel()

    handles = [m.register_forward_pre_hook(count) for m in block.modules() if m is not block]
    try:
        yield work
    finally:
        for handle in handles:
            handle.remove()


def _after_attention(block: nn.Module, attention: nn.Module, run: Callable[[Cut | None], Tensor]) -> tuple[list[nn.Module], Tensor]:
    """The direct children of ``block`` whose call finishes after ``attention``'s last one, in call order, and the
    plain pass's logits (the reference the candidates are checked against)."""
    finished: list[nn.Module] = []
    children = list(block.children())
    handles = [child.register_forward_hook(lambda m, _a, _o: finished.append(m)) for child in children]
    handles.append(attention.register_forward_hook(lambda m, _a, _o: finished.append(m)))
    try:
        reference = run(None)
    finally:
        for handle in handles:
            handle.remove()
    last = max((i for i, m in enumerate(finished) if m is attention), default=None)
    if last is None:
        return [], reference
    after = [m for m in finished[last:] if any(m is c for c in children)]
    return list({id(m): m for m in after}.values()), reference


def find_cut(blocks: list[nn.Module], attention: nn.Module, run: Callable[[Cut | None], Tensor]) -> Cut | None:
    """The cut that leaves the least work in the last block (:func:`_work`) with the same logits, or None.

    ``blocks``: the model's block calls (the last one is cut; not where its module also runs earlier, as
    ALBERT's shared layer); ``attention``: the last attention module; ``run(cut)``: the dry batch's logits
    with ``cut`` applied (None: the plain pass)."""
    block = blocks[-1]
    if any(b is block for b in blocks[:-1]):
        return None
    with _work(block) as work:
        candidates, reference = _after_attention(block, attention, run)
    best, least = None, work[0]
    for module in candidates:
        cut = Cut(module, block)
        with _work(block) as work:
            try:
                logits = run(cut)
            except (RuntimeError, IndexError, AttnAuditError):  # shapes the block cannot take at one row
                continue
        if work[0] < least and close(logits, reference):
            best, least = cut, work[0]
    return best
