"""A Hugging Face attention layer's value and output projections, found by what they compute on the dry run.

The value projection is the linear map inside the attention module whose output columns *are* the
values the attention function received (a plain ``v_proj``, or the value columns of a fused
query/key/value map in whatever order a family interleaves them: GPT-2, GPT-NeoX, Phi-3, GPT-BigCode
multi-query); the output projection is the linear map in the block whose input *is* the attention
output. Only the interface route sees values, so only its layers get them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnaudit.models.hf import attention as hf_attention
from attnaudit.models.hf.structure import (
    CROSS_INPUTS,
    TOL,
    Call,
    DryRun,
    Structure,
    close,
    linear,
    linear_map,
    within,
)


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
        return linear(self.value)[0][:, self.columns.to(linear(self.value)[0].device)]

    @property
    def b_v(self) -> Tensor:
        w, b = linear(self.value)
        columns = self.columns.to(w.device)
        return b[columns] if b is not None else w.new_zeros(len(columns))

    @property
    def w_o(self) -> Tensor:
        return linear(self.output)[0]

    @property
    def b_o(self) -> Tensor | None:
        return linear(self.output)[1]


def read_projections(structure: Structure, run: DryRun) -> None:
    """Set each interface-route layer's :class:`Projections` where both maps are found."""
    _read_projections(structure, run.calls, run.layers, run.records)


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
    values = hf_attention.per_group(record.values, _kv_heads(calls, attention, record))  # the model's own value heads
    batch, kv, length, dh = values.shape
    target = values.detach().transpose(1, 2).reshape(batch * length, kv * dh).float()
    for index in range(attention + 1, len(calls)):
        if not within(calls, index, attention):
            break
        linear = linear_map(calls[index].module)
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
        if not within(calls, index, block):
            break
        linear = linear_map(calls[index].module)
        if linear is not None and close(calls[index].hidden, flat):
            return calls[index].module
    return None
