"""Identifiability of self-attention (Brunner et al. 2020, "On Identifiability in Transformers").

A head's contribution to its layer's output is ``α T`` with ``T = (X W_V^h + b_V^h) W_O^h``
(``n × d_model``; ``X`` the ``n`` states entering the layer). ``T`` factors through the
head dimension, so ``rank T ≤ min(n, d_head)``: once the sequence is longer than
``d_head`` the left null space of ``T`` (``{v : v T = 0}``, dimension ``n − rank``) is
non-trivial and any component of an attention row in it changes nothing downstream. The
*effective attention* removes it: ``α_eff = α P`` with ``P`` the orthogonal projector onto
the column space of ``T``, so ``α_eff T = α T`` exactly, and ``α_eff = α`` whenever ``T``
has full row rank (``n ≤ d_head`` for generic inputs).

The value bias is included in ``T`` so that ``α T`` is exactly the head's share of the
attention output (the output bias ``b_O`` is added once, independent of ``α``).

``α_eff`` need not be a distribution (entries can be negative, rows need not sum to 1), so
the headline distance is ``½‖α − α_eff‖₁`` (the TVD formula applied to the raw vectors);
the JSD to ``α_eff`` clipped at 0 and renormalised is reported alongside (NaN when the
clipped row is all zero), as is the negative mass of ``α_eff``.

Works on any model exposing ``value_output_maps(layer) -> (W_V, b_V, W_O, heads)`` with
right-multiplied maps and recording each layer's input states in the trace (the attnaudit
Transformer; the Hugging Face adapter exposes the same method).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.algorithms.metrics import jsd
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

EXACT = 1e-6
"""Below this ``½‖α − α_eff‖₁`` counts as "no difference" (float64 round-off is ~1e-15)."""
OUTPUT_TOLERANCE = 1e-5


def value_output_products(x: Tensor, w_v: Tensor, b_v: Tensor | None, w_o: Tensor, heads: int) -> Tensor:
    """``T`` per head, ``(H, n, d_out)``, for layer input ``x`` ``(n, d)``.

    ``w_v`` ``(d, H·dh)`` and ``w_o`` ``(H·dh, d_out)`` are right-multiplied; head ``h`` owns
    columns ``h·dh:(h+1)·dh`` of ``w_v`` (and of ``b_v``) and the same rows of ``w_o``.
    """
    n = x.shape[0]
    v = x @ w_v if b_v is None else x @ w_v + b_v
    dh = v.shape[-1] // heads
    per_head = v.view(n, heads, dh).transpose(0, 1)  # (H, n, dh)
    return per_head @ w_o.reshape(heads, dh, w_o.shape[-1])


def effective_attention(attention: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """``(α_eff, rank)``: ``attention`` ``(H, Q, n)`` projected onto the column space of ``t`` ``(H, n, d)``.

    The column space comes from ``torch.linalg.svd``; singular values above
    ``max(n, d) · eps · σ_max`` count towards the rank (the default tolerance of
    ``torch.linalg.matrix_rank``). ``α_eff = α U_r U_rᵀ`` removes exactly the component in
    the left null space of ``t``.
    """
    n, d = t.shape[-2], t.shape[-1]
    u, s, _ = torch.linalg.svd(t, full_matrices=True)
    tol = s.amax(-1, keepdim=True) * max(n, d) * torch.finfo(t.dtype).eps
    keep = torch.zeros(t.shape[:-2] + (n,), dtype=torch.bool, device=t.device)
    keep[..., : s.shape[-1]] = s > tol
    basis = u * keep[..., None, :].to(u.dtype)
    projector = basis @ basis.transpose(-1, -2)
    return attention @ projector, keep.sum(-1)


def clipped_distribution(rows: Tensor) -> Tensor:
    """Rows clipped at 0 and renormalised; all-zero rows become NaN."""
    clipped = rows.clamp_min(0.0)
    total = clipped.sum(-1, keepdim=True)
    return torch.where(total > 0, clipped / total.clamp_min(torch.finfo(rows.dtype).tiny), torch.nan)


def _reason(run: Run) -> str | None:
    reason = run.model.lacks("value_output")
    return None if reason is None else f"identifiability needs per-head value and output projections: {reason}"


@register
class Identifiability(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "identifiability"
    settings = AuditSettings(
        rank=1,
        decoder_options={"max_instances": 5},
    )
    needs_prediction = False  # reads attention and weights only
    description = "Rank / null space of each head's value-output map and raw vs effective attention"
    paper = "Brunner et al. 2020, On Identifiability in Transformers (ICLR)"
    examples = (
        "runs/sst2-transformer --limit 200 --data-dir ../shared/data",
        "--hf minilm --task sst2 --out results/minilm-identifiability --data-dir ../shared/data",
    )

    @dataclass
    class Options:
        batch_size: int = field(default=32, metadata={"help": "Instances per forward pass."})
        max_instances: int | None = field(
            default=None, metadata={"help": "Analyse only the first N instances (one SVD per instance, layer and head)."}
        )

    def applies(self, run: Run) -> str | None:
        return _reason(run)

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        model = run.model
        model.eval()
        n_layers = model.num_attention_layers
        maps = []
        for layer in range(n_layers):
            w_v, b_v, w_o, heads = model.value_output_maps(layer)
            maps.append((w_v.detach().double(), None if b_v is None else b_v.detach().double(), w_o.detach().double(), heads))
        d_head = maps[0][0].shape[-1] // maps[0][3]
        instances: list[dict[str, Any]] = []
        max_output_error = 0.0
        offset = 0
        if options.max_instances is not None:
            if options.max_instances < 1:
                raise AttnAuditError(f"--max-instances must be at least 1, got {options.max_instances}")
            examples = examples[: options.max_instances]
        total = -(-len(examples) // options.batch_size)
        with torch.no_grad():
            for batch in track(run.batches(examples, options.batch_size), "identifiability", total=total):
                trace = model(batch).trace
                for layer, record in enumerate(trace.layers):
                    w_v, b_v, w_o, heads = maps[layer]
                    qmask = record.query_mask if record.query_mask is not None else record.mask
                    for i in range(len(batch)):
                        keys, queries = record.mask[i], qmask[i]
                        x = record.inputs[i, keys].double()
                        alpha = record.weights[i][:, queries][:, :, keys].double()
                        t = value_output_products(x, w_v, b_v, w_o, heads)
                        effective, rank = effective_attention(alpha, t)
                        reference = alpha @ t
                        scale = float(reference.abs().max().clamp_min(1.0))
                        max_output_error = max(max_output_error, float((effective @ t - reference).abs().max()) / scale)
                        l1 = 0.5 * (alpha - effective).abs().sum(-1).mean(-1)
                        js = jsd(alpha, clipped_distribution(effective)).nanmean(-1)
                        negative = effective.clamp_max(0.0).sum(-1).neg().mean(-1)
                        n = int(x.shape[0])
                        for h in range(heads):
                            instances.append(
                                {
                                    "index": offset + i,
                                    "layer": layer,
                                    "head": h,
                                    "seq_len": n,
                                    "d_head": w_v.shape[-1] // heads,
                                    "rank": int(rank[h]),
                                    "null_dim": n - int(rank[h]),
                                    "l1": float(l1[h]),
                                    "jsd_clipped": float(js[h]),
                                    "negative_mass": float(negative[h]),
                                }
                            )
                offset += len(batch)
        return self._result(instances, d_head, max_output_error)

    def _result(self, instances: list[dict[str, Any]], d_head: int, max_output_error: float) -> Result:
        full = [r for r in instances if r["null_dim"] == 0]
        short = [r for r in instances if r["seq_len"] <= r["d_head"]]
        long = [r for r in instances if r["seq_len"] > r["d_head"]]
        bound_ok = all(r["rank"] <= min(r["seq_len"], r["d_head"]) for r in instances)
        max_l1_full = max((r["l1"] for r in full), default=0.0)

        def mean(rows: list[dict[str, Any]], key: str) -> float:
            return float(np.nanmean([r[key] for r in rows])) if rows else float("nan")

        summary = {
            "d_head": d_head,
            "heads_x_instances": len(instances),
            "short_n": len(short),
            "short_full_row_rank_share": float(np.mean([r["null_dim"] == 0 for r in short])) if short else float("nan"),
            "short_max_l1": max((r["l1"] for r in short), default=float("nan")),
            "long_n": len(long),
            "long_null_dim_positive_share": float(np.mean([r["null_dim"] > 0 for r in long])) if long else float("nan"),
            "long_l1_mean": mean(long, "l1"),
            "long_jsd_clipped_mean": mean(long, "jsd_clipped"),
            "long_negative_mass_mean": mean(long, "negative_mass"),
            "max_l1_full_row_rank": max_l1_full,
            "max_output_error": max_output_error,
            "rank_bound_holds": bound_ok,
            "theory_holds": bool(
                bound_ok
                and max_l1_full < EXACT
                and all(r["null_dim"] > 0 for r in long)
                and max_output_error <= OUTPUT_TOLERANCE
            ),
        }
        groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
        for r in instances:
            groups[(r["layer"], r["seq_len"])].append(r)
        by_length = [
            {
                "layer": layer,
                "seq_len": n,
                "seq_len_over_d_head": n / d_head,
                "count": len(rows),
                "rank_mean": mean(rows, "rank"),
                "null_dim_mean": mean(rows, "null_dim"),
                "l1_mean": mean(rows, "l1"),
                "jsd_clipped_mean": mean(rows, "jsd_clipped"),
                "negative_mass_mean": mean(rows, "negative_mass"),
            }
            for (layer, n), rows in sorted(groups.items())
        ]
        notes = [
            "T = (X W_V^h + b_V^h) W_O^h per head, X the states entering the layer (real tokens only); "
            "effective attention = alpha projected onto the column space of T (torch.linalg.svd, "
            "matrix_rank's default tolerance), so alpha_eff T = alpha T",
            "l1 = 0.5*||alpha - alpha_eff||_1 (effective attention can be negative and need not sum to 1, so "
            "this is the TVD formula on raw vectors); jsd_clipped = JSD(alpha, alpha_eff clipped at 0 and "
            "renormalised); negative_mass = total negative weight of alpha_eff; all means over real queries",
            f"theory: rank <= min(n, d_head); full row rank => l1 < {EXACT:g}; n > d_head => null space > 0; "
            f"max |alpha_eff T - alpha T| / max(1, max|alpha T|) <= {OUTPUT_TOLERANCE:g}",
        ]
        return Result(
            test=self.name,
            summary=summary,
            instances=instances,
            tables={"by_length": by_length},
            meta={
                "notes": notes,
                "published": {
                    "claim": "effective attention equals raw attention iff the sequence is no longer than d_head "
                    "(for full-rank inputs); beyond it the null space has dimension n - d_head and raw attention "
                    "is not identifiable (Brunner et al. 2020, Sec. 4)"
                },
            },
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Whether raw attention is identifiable at these lengths (Brunner et al. 2020, §4)."""
        s = result.summary
        d_head, long_n, share, l1 = s.get("d_head"), s.get("long_n"), s.get("long_null_dim_positive_share"), s.get("long_l1_mean")
        if long_n == 0:
            meaning = f"every sequence is at most d_head = {d_head} tokens long: raw attention is identifiable here"
            return [{"statistic": "long_n", "value": long_n, "published": "", "interpretation": meaning}]
        if not isinstance(share, (int, float)) or np.isnan(share):
            return super().verdict(result)
        l1_text = f"; mean L1 distance between raw and effective attention {l1:.3f}" if isinstance(l1, (int, float)) else ""
        return [
            {
                "statistic": "long_null_dim_positive_share",
                "value": share,
                "published": "null space of dimension n − d_head beyond d_head tokens (Brunner et al. 2020)",
                "interpretation": f"for {share:.0%} of (head, instance) pairs longer than d_head = {d_head} tokens other "
                f"attention weights give exactly the same output{l1_text}: the raw weights are not identifiable, "
                "so reading them as the explanation over-interprets them",
            }
        ]

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        rows = result.tables.get("by_length", [])
        if not rows:
            return []
        d_head = result.summary["d_head"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
        layers = sorted({r["layer"] for r in rows})
        many = len(layers) > 4  # an LLM's 30 layers: colour by layer (a colour bar), not 90 legend entries
        cmap = plt.get_cmap("viridis")
        for k, layer in enumerate(layers):
            part = [r for r in rows if r["layer"] == layer]
            xs = [r["seq_len"] for r in part]
            colour = cmap(k / (len(layers) - 1)) if many else None
            left.plot(xs, [r["l1_mean"] for r in part], "o-", ms=3, color=colour, label=f"layer {layer}: ½‖α−α_eff‖₁")
            left.plot(xs, [r["jsd_clipped_mean"] for r in part], "x--", ms=3, color=colour, label=f"layer {layer}: JSD (clipped)")
            right.plot(xs, [r["null_dim_mean"] for r in part], "o-", ms=3, color=colour, label=f"layer {layer}")
        xs = sorted({r["seq_len"] for r in rows})
        (bound,) = right.plot(xs, [max(0, n - d_head) for n in xs], "k:", label="n − d_head")
        for ax in (left, right):
            ax.axvline(d_head, color="grey", ls="--", lw=1)
            ax.set_xlabel(f"sequence length n (d_head = {d_head})")
        if many:
            styles = [plt.Line2D([], [], color="k", marker=m, ls=ls, ms=3) for m, ls in (("o", "-"), ("x", "--"))]
            left.legend(styles, ["½‖α−α_eff‖₁", "JSD (clipped)"], fontsize=7)
            right.legend([bound], ["n − d_head"], fontsize=7)
            scale = plt.cm.ScalarMappable(norm=plt.Normalize(layers[0], layers[-1]), cmap=cmap)
            fig.colorbar(scale, ax=[left, right], label="layer", shrink=0.9)
        else:
            left.legend(fontsize=7)
            right.legend(fontsize=7)
        left.set_ylabel("raw vs effective attention")
        right.set_ylabel("left null space dim of T")
        fig.suptitle("identifiability: mean over heads, instances and queries", fontsize=10)
        return save_figure(fig, directory, "identifiability")
