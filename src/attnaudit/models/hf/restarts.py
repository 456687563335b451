"""Restarting a Hugging Face model part-way through :class:`~attnaudit.models.hf.model.HFModel`.

:class:`HFRestarts` is part of the adapter: a cache at any block from a recorded pass
(:meth:`HFRestarts.cache_at`), and for causal decoders on the attention interface the two fast
paths: rerunning one position per example over the other positions' keys and values
(:meth:`HFRestarts.rerun_cache`: the predicting token, when only its rows change) and continuing
after a key/value prefix (:meth:`HFRestarts.prefix_from`: leave-one-out reruns only the tokens after
a removed one).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.hf.attention import KeyValuePrefix, per_group
from attnaudit.models.hf.inputs import HFInputs, LayerTensors, real_positions, states_entering
from attnaudit.models.hf.passes import HFLayer
from attnaudit.models.hf.structure import Structure
from attnaudit.models.interface import AttentionTrace, Cache, ModelConfig


class HFRestarts:
    """Restarts of an :class:`~attnaudit.models.hf.model.HFModel` (a mixin)."""

    structure: Structure
    config: ModelConfig
    kind: str
    causal: bool
    kv_heads: int
    hf: Any

    @property
    def num_attention_layers(self) -> int:
        raise NotImplementedError

    def _takes(self, name: str) -> bool:
        raise NotImplementedError

    def _dry_batch(self) -> Batch:
        raise NotImplementedError

    def _inputs(self, batch: Batch) -> HFInputs:
        raise NotImplementedError

    def _embedding(self) -> Any:
        raise NotImplementedError

    def embed(self, batch: Batch) -> Tensor:
        raise NotImplementedError

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """Restart at attention layer ``layer`` of a full ``trace`` from the states that entered its block
        (an encoder-decoder's decoder layer: with the encoder output its cross-attention read)."""
        n = self.num_attention_layers
        layer %= n
        if len(trace) != n:
            raise AttnAuditError("cache_at needs the full trace of a forward pass")
        entry = trace[layer]
        residual = getattr(entry, "residual", None)
        if residual is None:
            first = self.structure.layers_of(self.structure.sites[layer].block)[0]
            raise AttnAuditError(
                f"cannot restart at attention layer {layer}: it is not the first attention layer of its block; restart at layer {first}"
            )
        extra = {**base.extra, "extras": self._extras(trace)}
        mask = entry.mask
        if self.structure.sites[layer].side == "decoder":
            cross = trace[layer + 1]
            extra["memory"] = cross.inputs
            mask = entry.query_mask if entry.query_mask is not None else entry.mask
        return Cache(states=residual, mask=mask, layer=layer, extra=extra)

    def _extras(self, trace: AttentionTrace) -> dict[int, tuple[Any, ...]]:
        """Per block call, the other outputs the next block reads, from the records of a full trace."""
        found = {}
        for index, record in enumerate(trace.layers):
            extras = getattr(record, "extras", None)
            if extras is not None:
                found[self.structure.sites[index].block] = extras
        return found

    @property
    def rerun_ready(self) -> bool:
        """Whether one position per example can be rerun over the others' keys and values."""
        return self.kind == "decoder" and self.causal and self.structure.route == "interface" and self._takes("position_ids")

    def rerun_cache(self, trace: AttentionTrace, layer: int, base: Cache, rows: Tensor) -> Cache | None:
        """Restart at trace layer ``layer`` at one position per example, ``rows`` ``(B,)``, reading the other
        positions' keys and values from the full ``trace``: a pass of one token per example. The output equals
        the full restart's when interventions change that position's rows only and no real token follows it."""
        if not self.rerun_ready:
            return None
        n = self.num_attention_layers
        if len(trace) != n:
            raise AttnAuditError("rerun_cache needs the trace of every layer")
        first = layer % n
        entry = trace[first]
        allowed_at = [r.allowed for r in trace.layers[first:] if isinstance(r, HFLayer) and r.allowed is not None]
        if not isinstance(entry, HFLayer) or entry.residual is None or len(allowed_at) < n - first:
            return None
        kv = self.kv_heads
        at = rows.to(entry.mask.device)[:, None]
        prefix = KeyValuePrefix(
            keys=[per_group(r.keys, kv) if i >= first and r.keys is not None else None for i, r in enumerate(trace)],
            values=[per_group(r.values, kv) if i >= first and r.values is not None else None for i, r in enumerate(trace)],
            mask=entry.mask.bool(), positions=at,
        )
        pick = torch.arange(len(at), device=at.device)
        allowed = LayerTensors({first + j: a[pick, :, rows][:, :, None] for j, a in enumerate(allowed_at)})
        inputs: HFInputs = base.extra["inputs"]
        ids = inputs["input_ids"].gather(1, at)
        states = entry.residual.gather(1, at[:, :, None].expand(-1, -1, entry.residual.shape[-1]))
        positions = real_positions(entry.mask).gather(1, at)
        rerun = HFInputs(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions)
        return Cache(states=states, mask=torch.ones_like(at, dtype=torch.bool), layer=first,
                     extra={**base.extra, "inputs": rerun, "prefix": prefix, "allowed": allowed})

    @property
    def continues_prefix(self) -> bool:
        """Whether :meth:`decode` can continue after a :class:`KeyValuePrefix`: a causal decoder on the
        interface route whose windows (if any) are longer than its inputs and whose first block's input
        does not depend on positions (rotary positions are applied in attention, so new tokens can follow)."""
        return self.rerun_ready and self._full_attention and self._position_free

    @property
    def _full_attention(self) -> bool:
        """Whether every layer attends to every earlier token: no sliding window shorter than the model's length, no chunks."""
        cfg = self.hf.config
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        if (kinds != {"full_attention"} or window is not None) and (window is None or window < self.config.max_len):
            return False
        return not getattr(cfg, "attention_chunk_size", None)

    @property
    def _position_free(self) -> bool:
        cached = self.__dict__.get("_position_free_value")
        if cached is None:
            batch = self._dry_batch()
            with torch.no_grad():
                inputs = self._inputs(batch)
                plain = states_entering(self.hf, self.structure.blocks[0], self._embedding(), inputs, self.embed(batch))
                inputs["position_ids"] = inputs["position_ids"] + 3
                moved = states_entering(self.hf, self.structure.blocks[0], self._embedding(), inputs, self.embed(batch))
            cached = bool(torch.equal(plain, moved))
            self.__dict__["_position_free_value"] = cached
        return cached

    def prefix_from(self, trace: AttentionTrace, rows: Tensor, lengths: Tensor) -> KeyValuePrefix:
        """The first ``lengths[r]`` tokens of example ``rows[r]`` of a full ``trace`` (all layers, no key/value
        intervention) as a :class:`KeyValuePrefix`, one key/value head per group."""
        if len(trace) != self.num_attention_layers:
            raise AttnAuditError("prefix_from needs the trace of every layer")
        width = int(lengths.max()) if len(lengths) else 0
        keys: list[Tensor | None] = []
        values: list[Tensor | None] = []
        for layer in trace:
            assert layer.keys is not None and layer.values is not None  # an interface-route pass records both
            keys.append(per_group(layer.keys, self.kv_heads)[rows, :, :width])
            values.append(per_group(layer.values, self.kv_heads)[rows, :, :width])
        mask = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
        return KeyValuePrefix(keys=keys, values=values, mask=mask)
