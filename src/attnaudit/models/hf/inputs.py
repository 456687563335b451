"""What one pass of a Hugging Face model through :class:`~attnaudit.models.hf.model.HFModel` is given: the
forward's arguments (a batch's, a restart's, a continuation's after a key/value prefix), each attention
layer's key and query masks, and the states entering the first block (by the model's own code)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit.errors import AttnAuditError
from attnaudit.models.hf.attention import KeyValuePrefix
from attnaudit.models.hf.structure import Structure, hidden_argument
from attnaudit.models.interface import Cache


class HFInputs(dict):
    """The keyword arguments of the model's forward for a batch; rows selectable like a cache's extras."""

    def select_rows(self, rows: Tensor) -> HFInputs:
        return HFInputs({k: v.index_select(0, rows) if isinstance(v, Tensor) and v.dim() else v for k, v in self.items()})


class LayerTensors(dict):
    """Per attention layer, a tensor of the batch (which keys each rerun query reads); rows selectable."""

    def select_rows(self, rows: Tensor) -> LayerTensors:
        return LayerTensors({k: v.index_select(0, rows) for k, v in self.items()})


def real_positions(mask: Tensor) -> Tensor:
    """Position ids ``(B,T)`` counting real tokens only (0 for leading pads)."""
    return (mask.long().cumsum(1) - 1).clamp_min(0)


def causal_allowed(mask: Tensor, window: int | None = None, queries: Tensor | None = None) -> Tensor:
    """``(B,Q,K)``: query ``i`` may read key ``j`` when ``j <= i`` (and ``i - j < window``) and ``j`` is real;
    ``queries`` ``(B,Q)``: the key positions of the queries (default: every position)."""
    index = torch.arange(mask.shape[1], device=mask.device)
    at = index[None, :, None] if queries is None else queries[:, :, None]
    distance = at - index[None, None, :]
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    return allowed & mask[:, None, :].bool()


def pass_inputs(structure: Structure, cache: Cache, start: int, continues: Callable[[], bool], name: str) -> dict[str, Any]:
    """The forward's arguments for a pass from ``cache``: an encoder-decoder restarting in its decoder
    skips the encoder (its output given); a continuation's tokens take the positions after its prefix.
    ``continues()`` (whether the model can continue a key/value prefix: a probing pass) is asked only then."""
    prefix: KeyValuePrefix | None = cache.extra.get("prefix")
    if prefix is not None and prefix.positions is None and not continues():
        raise AttnAuditError(
            f"{name} decoder cannot continue from a key/value prefix (positions added before its first block, "
            "sliding windows, or attention outside the interface)"
        )
    inputs = dict(cache.extra.get("inputs") or {})
    if not inputs:
        raise AttnAuditError("this cache was not made by HFModel.encode")
    if structure.sites[start].side == "decoder":
        inputs["encoder_outputs"] = (cache.extra["memory"],)
    if prefix is not None and prefix.positions is None:
        inputs["position_ids"] = real_positions(cache.mask) + prefix.mask.sum(1, keepdim=True)
        inputs["attention_mask"] = cache.mask.long()
    return inputs


def pass_masks(structure: Structure, cache: Cache) -> Callable[[int], tuple[Tensor, Tensor, Tensor | None]]:
    """``masks(layer) -> (key mask (B,K), query mask (B,Q), allowed (B,1,Q,K) or None)`` for a pass from ``cache``."""
    inputs = cache.extra.get("inputs") or {}
    prefix: KeyValuePrefix | None = cache.extra.get("prefix")
    given: dict[int, Tensor] = cache.extra.get("allowed") or {}
    source = inputs["attention_mask"].bool() if "attention_mask" in inputs else cache.mask.bool()
    target = inputs["decoder_attention_mask"].bool() if "decoder_attention_mask" in inputs else None
    mask = cache.mask.bool()
    if prefix is not None and prefix.positions is None:
        keys = torch.cat([prefix.mask, mask], 1)
        joined = torch.cat([prefix.mask[:, None, :].expand(-1, mask.shape[1], -1), causal_allowed(mask)], 2)[:, None]
    sites = structure.sites

    def masks(layer: int) -> tuple[Tensor, Tensor, Tensor | None]:
        site = sites[layer]
        if prefix is not None and prefix.positions is not None:
            return prefix.mask, mask, given[layer]
        if prefix is not None:
            return keys, mask, joined
        if site.side == "decoder":
            assert target is not None
            return (source if site.kind == "cross" else target), target, None
        return source, source, None

    return masks


def states_entering(hf: nn.Module, first_block: nn.Module, embedding: nn.Module, inputs: dict[str, Any], embeddings: Tensor) -> Tensor:
    """Run ``hf`` until ``first_block`` is called, with ``embeddings`` as ``embedding``'s output: the states entering it."""
    reached: list[Tensor] = []

    def stop(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = hidden_argument(args, kwargs)
        assert hidden is not None
        reached.append(hidden)
        raise _Reached

    used = [False]

    def replace(_module: nn.Module, _args: tuple[Any, ...], output: Tensor) -> Tensor:
        if used[0]:
            return output
        used[0] = True
        return embeddings

    handles = [first_block.register_forward_pre_hook(stop, with_kwargs=True), embedding.register_forward_hook(replace)]
    try:
        hf(**inputs, use_cache=False)
    except _Reached:
        return reached[0]
    finally:
        for handle in handles:
            handle.remove()
    raise AttnAuditError(f"{type(hf).__name__}: the first block was never called")


class _Reached(Exception):
    """Raised by a pre-hook on the first block: the states entering it were read."""
