"""Attention-only reruns that several tests share: the explained layer's prepared batch (:class:`Explained`), its base
pass within a memory budget, the decision's rows and the full rows, and rows of a cache. Registers no test."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain.helpers.attention import explained_attention
from attnaudit.explain.registry import remembered
from attnaudit.models.interface import (
    AttentionModel,
    Cache,
    ModelOutput,
    WeightsFn,
    evaluation,
)
from attnaudit.models.interface import (
    take_rows as take_query_rows,
)

# --------------------------------------------------------------------------- seeding




# --------------------------------------------------------------------------- applicability








# --------------------------------------------------------------------------- attention-only reruns




@dataclass
class Explained:
    """One batch ready for attention-only reruns of ``layers`` (absolute indices, ascending).

    ``cache`` restarts the model at ``layers[0]``; ``weights[j]`` (B,H,Q,K) are the original
    weights of ``layers[j]``; ``key_mask`` (B,K) marks real items, ``query_rows`` (B,Q) the query
    rows an intervention changes (see :func:`prepare`); ``probs`` (B,C) the original output.
    ``positions`` (B,): where ``weights`` hold one row per example, the position it is in the
    full layer (a decoder's predicting token, :func:`full_rows`); else None.
    """

    cache: Cache
    layers: list[int]
    weights: list[Tensor]
    key_mask: Tensor
    query_rows: Tensor
    probs: Tensor
    positions: Tensor | None = None
    attention: Tensor | None = None
    """``(B,K)`` the ``attention`` explanation read from the same pass, when ``layers`` is the explained layer alone."""

    @property
    def size(self) -> int:
        """Number of instances in the batch."""
        return self.key_mask.shape[0]

    @property
    def reported(self) -> Tensor:
        """The weights the per-instance statistics describe: the last intervened layer."""
        return self.weights[-1]


BASE_PASS_BUDGET = 1 << 30
"""Bytes of plain passes an audit keeps for its tests to share (:func:`base_pass`); past them, each
test makes its own (500 SST-2 prompts through SmolLM2 take ~0.6 GB)."""


def base_pass(model: AttentionModel, batch: Batch, cache: Cache | None = None) -> ModelOutput:
    """``model(batch)`` without interventions (no gradient), once per batch within an audit
    (:func:`~attnaudit.explain.registry.remembered`, up to :data:`BASE_PASS_BUDGET`): its output and every
    layer's weights and masks, with the explained layer's whole record (:meth:`AttentionTrace.thinned`).
    Importance, rollout, the normaliser swap, the shuffle and the prepared pass of the single-attention
    tests read it. ``cache``: the batch's ``model.encode`` made in evaluation mode, when the caller has it
    (``model(batch)`` is ``decode(encode(batch))``: the batch is not encoded twice). The result is shared:
    callers must not change it in place."""

    def compute() -> ModelOutput:
        with evaluation(model), torch.no_grad():
            out = model(batch) if cache is None else model.decode(cache)
        return ModelOutput(out.logits, out.trace.thinned({model.explained_layer % len(out.trace)}))

    def size(out: ModelOutput) -> int:
        return out.trace.nbytes + out.logits.numel() * out.logits.element_size()

    return remembered(model, ("base",), batch, compute, size, BASE_PASS_BUDGET)


def prepare(model: AttentionModel, batch: Batch, layers: Sequence[int]) -> Explained:
    """:func:`prepare_pass`, once per batch and layers within an audit
    (:func:`~attnaudit.explain.registry.memoised`: permutation, faithfulness, erasure and adversarial
    share it). The result is shared: callers must not change it in place."""
    return remembered(model, ("prepared", tuple(layers)), batch, lambda: prepare_pass(model, batch, layers))


def prepare_pass(model: AttentionModel, batch: Batch, layers: Sequence[int]) -> Explained:
    """One full forward pass (the shared :func:`base_pass` for the explained layer): original output
    and weights, and a cache at ``layers[0]``.

    Every intervened layer must attend over the instance's items (one row per instance);
    HAN's word level, which attends within each sentence, is rejected with a clear message.

    Which query rows an intervention changes: all real ones, except at the last layer of a model
    whose decision reads one row of it (:func:`decision_rows`: [CLS] of an encoder, a decoder's last
    real token), where no other row reaches the output: there only that row, the one the
    ``attention`` explanation reads. A decoder then keeps that row alone (``Q = 1``) and restarts
    at that token only (:meth:`~attnaudit.models.hf.model.HFModel.rerun_cache`).
    """
    with torch.no_grad():
        base = model.encode(batch)
        explained = list(layers) == [model.explained_layer % model.num_attention_layers]
        encoded = None if model.training else base  # base_pass encodes in evaluation mode
        out = base_pass(model, batch, encoded) if explained and base.layer == 0 else model.decode(base)
    size = out.logits.shape[0]
    weights = []
    for layer in layers:
        entry = out.trace[layer - base.layer]
        if entry.weights.shape[0] != size:
            raise AttnAuditError(
                f"attention layer {layer} of this {model.config.model} model has {entry.weights.shape[0]} rows for "
                f"{size} instances (it attends within parts of the input); use --layer explained"
            )
        weights.append(entry.weights)
    last = out.trace[layers[-1] - base.layer]
    key_mask = last.mask.bool()
    q = last.weights.shape[2]
    query_rows = last.query_mask.bool() if last.query_mask is not None else key_mask.new_ones(size, q)
    attention = explained_attention(model, batch, out.trace) if explained else None
    rows = decision_rows(model, layers, key_mask)
    rows = None if rows is None else rows % q  # an encoder-decoder's forced target names its row from the end (-1)
    rerun = model.rerun_cache(out.trace, layers[0], base, rows) if rows is not None and layers[0] != base.layer else None
    if rows is not None and rerun is not None:
        picked = [take_query_rows(w, rows, 2)[:, :, None] for w in weights]
        return Explained(rerun, list(layers), picked, key_mask, key_mask.new_ones(size, 1), out.probs, rows, attention)
    if rows is not None:
        query_rows = torch.nn.functional.one_hot(rows, q).bool() & query_rows
    cache = base if layers[0] == base.layer else model.cache_at(out.trace, layers[0], base)
    return Explained(cache, list(layers), weights, key_mask, query_rows, out.probs, attention=attention)


def decision_rows(model: AttentionModel, layers: Sequence[int], key_mask: Tensor) -> Tensor | None:
    """``(B,)`` the one query row per example whose output the decision reads, when ``layers`` is the
    model's last attention layer alone and the model names that row (:meth:`AttentionModel.explanation_rows`:
    [CLS], a decoder's last real token); None otherwise (every row reaches the output)."""
    if list(layers) != [model.num_attention_layers - 1]:
        return None
    rows = model.explanation_rows(key_mask)
    if rows is None:
        return None
    if isinstance(rows, int):
        return torch.full((key_mask.shape[0],), rows, dtype=torch.long, device=key_mask.device)
    return rows.to(key_mask.device)


def full_rows(explained: Explained, weights: Tensor | WeightsFn) -> Tensor | WeightsFn:
    """A weight intervention made for ``explained``'s reruns as one on the full model: itself, or, where
    ``explained`` keeps one row per example (``positions``; then ``weights`` is a ``(B,H,1,K)`` tensor), a
    function putting each row in its place and leaving the other rows as the layer computes them
    (the reference loops, which rerun the whole model)."""
    positions = explained.positions
    if positions is None:
        return weights
    assert isinstance(weights, Tensor)  # the reruns at one position replace weights by tensors

    def put(computed: Tensor, _mask: Tensor) -> Tensor:
        out = computed.clone()
        index = torch.arange(out.shape[0], device=out.device)
        out[index, :, positions.to(out.device)] = weights[:, :, 0, : out.shape[-1]].to(out.dtype)
        return out

    return put


def take_rows(cache: Cache, rows: Tensor, size: int) -> Cache:
    """The cache restricted/repeated to instance ``rows`` (:meth:`Cache.select`), checked to hold one row per instance."""
    if cache.states.shape[0] != size:
        raise AttnAuditError(f"cache has {cache.states.shape[0]} rows, expected one per instance ({size})")
    return cache.select(rows)


# --------------------------------------------------------------------------- means and statistics










# --------------------------------------------------------------------------- per-instance rows












# --------------------------------------------------------------------------- plots
















