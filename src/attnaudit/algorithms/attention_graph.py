"""Attention rollout and attention flow (Abnar & Zuidema 2020) on attention tensors.

Both read the per-layer attention ``(B, H, T, T)`` (query × key, the Hugging Face
layout of :attr:`AttentionTrace.weights`) as a layered graph: node ``(l, i)`` is
position ``i`` after layer ``l`` (``l = 0``: the input tokens) and the edge
``(l-1, j) → (l, i)`` carries the residual-adjusted attention
``Â_l = r·I + (1 − r)·fuse_heads(A_l)``, rows renormalised (:func:`adjusted_attention`).

* Rollout multiplies the matrices: ``R_l = Â_l ⋯ Â_1`` — the mixing proportions of the
  inputs when attention is the only mixing.
* Flow treats ``Â`` as edge capacities and reports, for each node ``(l, i)`` and input
  ``j``, the value of a maximum flow from ``(0, j)`` to ``(l, i)``.

Results are ``(B, L, T, T)`` with ``[b, l, i, j]`` the contribution of input ``j`` to
position ``i`` after layer ``l + 1``.  Padding (``mask`` False) is removed from the graph:
padded rows and columns are 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import networkx as nx
import numpy as np
import torch
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow
from torch import Tensor

from attnaudit.errors import AttnAuditError

HeadFusion = Literal["mean", "max", "min"]

_SCALE = 2**29
"""Capacities become integers in units of 2**-29 for scipy's max-flow (see :func:`flow`).
Below 2**30 so that an edge plus its reverse residual never overflow scipy's int32."""
_EDGE_BUDGET = 1_000_000
"""Edges per scipy call: bounds memory (scipy adds reverse edges and copies)."""


def adjusted_attention(
    attentions: Sequence[Tensor],
    head_fusion: HeadFusion = "mean",
    residual: float = 0.5,
    mask: Tensor | None = None,
) -> Tensor:
    """Per-layer ``Â = residual·I + (1 − residual)·fused(A)``, masked, rows renormalised.

    ``attentions``: one ``(B, H, T, T)`` tensor per layer.  ``mask`` ``(B, T)``, True at
    real tokens: padded rows and columns are zeroed before renormalising, so real rows
    sum to 1 over real tokens only.  A real row left with no weight at all (min fusion
    of sparse heads with disjoint supports and ``residual=0``) stays 0.  Returns
    ``(B, L, T, T)``.
    """
    stacked = _stack(attentions, head_fusion, residual, mask)
    if head_fusion == "mean":
        fused = stacked.mean(2)
    elif head_fusion == "max":
        fused = stacked.amax(2)
    else:
        fused = stacked.amin(2)
    T = fused.shape[-1]
    eye = torch.eye(T, dtype=fused.dtype, device=fused.device)
    adj = residual * eye + (1.0 - residual) * fused
    if mask is not None:
        m = mask.to(device=adj.device, dtype=adj.dtype)
        adj = adj * m[:, None, :, None] * m[:, None, None, :]
    rows = adj.sum(-1, keepdim=True)
    return torch.where(rows > 0, adj / rows.clamp_min(torch.finfo(adj.dtype).tiny), 0.0)


def _stack(
    attentions: Sequence[Tensor], head_fusion: str, residual: float, mask: Tensor | None
) -> Tensor:
    """Validate the arguments and stack the layers to ``(B, L, H, T, T)``."""
    if len(attentions) == 0:
        raise AttnAuditError("attention rollout/flow: no attention layers given")
    shape = tuple(attentions[0].shape)
    if len(shape) != 4 or shape[-1] != shape[-2]:
        raise AttnAuditError(
            f"attention rollout/flow: expected (batch, heads, T, T) self-attention, got {shape}"
        )
    for n, layer in enumerate(attentions):
        if tuple(layer.shape) != shape:
            raise AttnAuditError(
                f"attention rollout/flow: layer {n} has shape {tuple(layer.shape)}, layer 0 {shape}"
            )
    if head_fusion not in ("mean", "max", "min"):
        raise AttnAuditError(f"unknown head fusion {head_fusion!r} (use mean, max or min)")
    if not 0.0 <= residual <= 1.0:
        raise AttnAuditError(f"residual weight must be in [0, 1], got {residual}")
    if mask is not None and tuple(mask.shape) != (shape[0], shape[-1]):
        raise AttnAuditError(
            f"attention rollout/flow: mask shape {tuple(mask.shape)} "
            f"!= (batch, T) {(shape[0], shape[-1])}"
        )
    stacked = torch.stack(tuple(attentions), 1)
    return stacked if stacked.is_floating_point() else stacked.to(torch.get_default_dtype())


def rollout(
    attentions: Sequence[Tensor],
    head_fusion: HeadFusion = "mean",
    residual: float = 0.5,
    mask: Tensor | None = None,
) -> Tensor:
    """Attention rollout ``R_l = Â_l ⋯ Â_1`` for every layer, ``(B, L, T, T)``.

    Real rows of every ``R_l`` sum to 1; differentiable in the attention weights.
    """
    adj = adjusted_attention(attentions, head_fusion, residual, mask)
    out = [adj[:, 0]]
    for layer in range(1, adj.shape[1]):
        out.append(adj[:, layer] @ out[-1])
    return torch.stack(out, 1)


class StreamingRollout:
    """Attention rollout folded in one layer at a time: the last layer of :func:`rollout`, ``(B, T, T)``.

    Holds only the running product ``R_l``, so a model that hands over each layer's weights as
    it computes them and then drops them (``HFModel.decode(on_layer=...)``) needs memory
    for one layer's ``(B, H, T, T)`` weights instead of all L layers'. Same arithmetic as
    :func:`rollout` (:func:`adjusted_attention` per layer, then ``Â_l @ R_{l-1}``).
    """

    def __init__(self, head_fusion: HeadFusion = "mean", residual: float = 0.5) -> None:
        self.head_fusion: HeadFusion = head_fusion
        self.residual = residual
        self.layers = 0
        self._product: Tensor | None = None

    def add(self, weights: Tensor, mask: Tensor | None = None) -> None:
        """Fold in the next layer's weights ``(B, H, T, T)`` (``mask`` ``(B, T)`` as in :func:`rollout`)."""
        adj = adjusted_attention([weights], self.head_fusion, self.residual, mask)[:, 0]
        if self._product is not None and adj.shape != self._product.shape:
            raise AttnAuditError(f"attention rollout: layer {self.layers} gives a {tuple(adj.shape)} rollout step, "
                                 f"the layers before it {tuple(self._product.shape)}")
        self._product = adj if self._product is None else adj @ self._product
        self.layers += 1

    @property
    def result(self) -> Tensor:
        """``R_L`` of the layers added so far, ``(B, T, T)``."""
        if self._product is None:
            raise AttnAuditError("attention rollout: no attention layers given")
        return self._product


def flow(
    attentions: Sequence[Tensor],
    head_fusion: HeadFusion = "mean",
    residual: float = 0.5,
    mask: Tensor | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Attention flow: max-flow value from input ``j`` to node ``(l, i)``, ``(B, L, T, T)``.

    ``sinks`` ``(B, T)`` bool: compute only the last layer's rows ``i`` marked True (an explanation
    reads one query's row, or the real ones, of one layer); every other entry of the result is 0.
    The deep problems are most of the cost, so this skips the other ``L − 1`` layers and rows.

    Values are the raw max-flow values (at most 1, the in-capacity of any node);
    Abnar & Zuidema's released code additionally divides each row by its sum, which
    leaves rank correlations unchanged.

    Why this is fast yet exact.  A flow from ``(0, j)`` can only climb the layered DAG,
    and only layers ``1 … l-1`` can carry it to ``(l, i)``, so each (layer, sink, source)
    is its own small problem:

    * ``l = 1``: the single edge, ``Â_1[i, j]``.
    * ``l = 2``: the paths ``j → k → i`` share no edge, so the value is
      ``Σ_k min(Â_1[k, j], Â_2[i, k])`` — closed form, one tensor expression.
    * ``l ≥ 3``: the middle layers are complete bipartite graphs, a genuine max-flow
      problem with no closed form.  All ``T²`` problems of one depth, over the whole
      batch, are solved at once: disjoint copies of the network (source edges and sink
      edges attached to a shared super-source and super-sink) form one graph, whose
      maximum flow restricted to each copy is that copy's maximum flow.  The union is
      built with numpy and solved by scipy's compiled Dinic
      (:func:`scipy.sparse.csgraph.maximum_flow`) instead of one Python-level networkx
      call per pair (:func:`flow_networkx`); measured 125–170x faster at 12 tokens × 6
      layers (``benchmarks/bench_flow.py``).

    scipy needs integer capacities, so they are rounded down to multiples of
    ``2**-29``: the result is the exact max flow of that network, never above the
    real-valued one and at most ``(#edges of a minimum cut) × 2**-29`` below it
    (≤ 1.2e-6 at 12 tokens × 6 layers, ≤ 2e-5 at 30 tokens × 12 layers, worst case).
    Not differentiable.
    """
    adj = adjusted_attention(attentions, head_fusion, residual, mask)
    a = adj.detach().to("cpu", torch.float64).numpy()
    B, L, T, _ = a.shape
    if sinks is not None and tuple(sinks.shape) != (B, T):
        raise AttnAuditError(f"attention flow: sinks shape {tuple(sinks.shape)} != (batch, T) {(B, T)}")
    out = np.zeros_like(a)
    out[:, 0] = a[:, 0]
    if L > 1:
        out[:, 1] = np.minimum(a[:, 0][:, None, :, :], a[:, 1][:, :, :, None]).sum(2)
    caps = np.floor(a * _SCALE).astype(np.int32)
    real = [
        np.arange(T) if mask is None else np.flatnonzero(mask[b].detach().cpu().numpy())
        for b in range(B)
    ]
    rows = None
    if sinks is not None:
        chosen = sinks.detach().cpu().numpy().astype(bool)
        out[:, :-1] = 0.0
        out[:, -1] *= chosen[:, :, None]
        rows = [np.flatnonzero(chosen[b][real[b]]) for b in range(B)]  # positions among the real tokens
    pending: list[_Copies] = []
    edges = 0
    for block in _deep_problems(caps, real, rows):
        # one scipy call per depth: Dinic's phases are global, so pooling shallow copies
        # with deep ones re-scans the finished shallow ones (measured ~1.5x slower)
        if pending and (pending[-1].layer != block.layer or edges + block.edges > _EDGE_BUDGET):
            _solve_into(out, pending)
            pending, edges = [], 0
        pending.append(block)
        edges += block.edges
    if pending:
        _solve_into(out, pending)
    return torch.from_numpy(out).to(dtype=adj.dtype, device=adj.device)


@dataclass
class _Copies:
    """``c`` copies of one depth-``l`` network: super-source → layer 1 → … → layer l-1 → sink.

    ``src[q, k]``: capacity super-source → layer-1 node ``k`` of copy ``q``;
    ``inner[m][k2, k]``: layer ``m+1`` node ``k`` → layer ``m+2`` node ``k2`` (shared by
    all copies); ``snk[q, k]``: layer ``l-1`` node ``k`` → super-sink.  The values go
    to ``out[batch, layer, rows[q], cols[q]]``.
    """

    src: np.ndarray
    inner: list[np.ndarray]
    snk: np.ndarray
    batch: int
    layer: int
    rows: np.ndarray
    cols: np.ndarray

    @property
    def copies(self) -> int:
        return self.src.shape[0]

    @property
    def width(self) -> int:
        return self.src.shape[1]

    @property
    def nodes_per_copy(self) -> int:
        return (len(self.inner) + 1) * self.width

    @property
    def edges(self) -> int:
        return self.copies * (2 * self.width + len(self.inner) * self.width**2)


def _deep_problems(caps: np.ndarray, real: list[np.ndarray], rows: list[np.ndarray] | None = None) -> Iterator[_Copies]:
    """All (sink, source) problems of depth ≥ 3 on the real tokens, in edge-bounded blocks; with
    ``rows`` (per batch element, sink positions among its real tokens) only the last layer's, to those sinks.

    Ordered by depth, then batch element, so that blocks of equal depth are adjacent.
    """
    B, L = caps.shape[:2]
    for depth in range(3 if rows is None else max(3, L), L + 1):
        for b in range(B):
            idx = real[b]
            n = idx.size
            sinks = np.arange(n) if rows is None else rows[b]
            if n == 0 or sinks.size == 0:
                continue
            c = caps[b][:, idx][:, :, idx]  # (L, n, n) on real tokens only
            per_copy = 2 * n + (depth - 2) * n * n
            chunk = max(1, _EDGE_BUDGET // per_copy)
            for start in range(0, sinks.size * n, chunk):
                pick, source = np.divmod(np.arange(start, min(sinks.size * n, start + chunk)), n)
                sink = sinks[pick]
                yield _Copies(
                    src=c[0][:, source].T,
                    inner=[c[m] for m in range(1, depth - 1)],
                    snk=c[depth - 1][sink],
                    batch=b,
                    layer=depth - 1,
                    rows=idx[sink],
                    cols=idx[source],
                )


def _solve_into(out: np.ndarray, blocks: list[_Copies]) -> None:
    """Solve the disjoint union of ``blocks`` in one scipy call; write values into ``out``."""
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    data: list[np.ndarray] = []
    owner: list[np.ndarray] = []  # node id → copy index over all blocks
    offset, copy_offset = 2, 0  # node 0: super-source, node 1: super-sink
    for blk in blocks:
        n, c = blk.width, blk.copies
        base = offset + np.arange(c)[:, None] * blk.nodes_per_copy  # (c, 1)
        k = np.arange(n)
        first = base + k  # layer-1 nodes, (c, n)
        rows.append(np.zeros(c * n, dtype=np.int64))
        cols.append(first.ravel())
        data.append(blk.src.ravel())
        for m, cap in enumerate(blk.inner):
            tail = (base + m * n + k)[:, None, :]  # node k of layer m+1
            head = (base + (m + 1) * n + k)[:, :, None]  # node k2 of layer m+2
            rows.append(np.broadcast_to(tail, (c, n, n)).ravel())
            cols.append(np.broadcast_to(head, (c, n, n)).ravel())
            data.append(np.broadcast_to(cap, (c, n, n)).ravel())
        rows.append((base + len(blk.inner) * n + k).ravel())
        cols.append(np.ones(c * n, dtype=np.int64))
        data.append(blk.snk.ravel())
        owner.append(np.repeat(copy_offset + np.arange(c), blk.nodes_per_copy))
        offset += c * blk.nodes_per_copy
        copy_offset += c
    r, col, d = np.concatenate(rows), np.concatenate(cols), np.concatenate(data)
    keep = d > 0
    graph = csr_array(
        (d[keep], (r[keep].astype(np.int32), col[keep].astype(np.int32))), shape=(offset, offset)
    )
    result = maximum_flow(graph, 0, 1).flow
    start, end = result.indptr[0], result.indptr[1]
    node_owner = np.concatenate([np.zeros(2, dtype=np.int64), *owner])
    values = np.bincount(
        node_owner[result.indices[start:end]],
        weights=result.data[start:end].astype(np.float64),
        minlength=copy_offset,
    )
    first_copy = 0
    for blk in blocks:
        out[blk.batch, blk.layer, blk.rows, blk.cols] = (
            values[first_copy : first_copy + blk.copies] / _SCALE
        )
        first_copy += blk.copies


def flow_networkx(
    attentions: Sequence[Tensor],
    head_fusion: HeadFusion = "mean",
    residual: float = 0.5,
    mask: Tensor | None = None,
) -> Tensor:
    """Reference attention flow: one :func:`networkx.maximum_flow_value` per (source, sink).

    The straightforward construction of Abnar & Zuidema: the whole layered graph with
    real-valued capacities, every input node against every later node.  Slow; used to
    test and benchmark :func:`flow`.
    """
    adj = adjusted_attention(attentions, head_fusion, residual, mask)
    a = adj.detach().to("cpu", torch.float64).numpy()
    B, L, T, _ = a.shape
    out = np.zeros_like(a)
    for b in range(B):
        graph = nx.DiGraph()
        graph.add_nodes_from((layer, i) for layer in range(L + 1) for i in range(T))
        for layer in range(1, L + 1):
            for i in range(T):
                for j in range(T):
                    if a[b, layer - 1, i, j] > 0:
                        graph.add_edge((layer - 1, j), (layer, i), capacity=a[b, layer - 1, i, j])
        for layer in range(1, L + 1):
            for i in range(T):
                for j in range(T):
                    out[b, layer - 1, i, j] = nx.maximum_flow_value(graph, (0, j), (layer, i))
    return torch.from_numpy(out).to(dtype=adj.dtype, device=adj.device)
