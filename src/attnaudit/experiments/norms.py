"""Norm-based analysis of multi-head attention (Kobayashi et al. 2020, "Attention is Not Only a Weight").

An attention head's output is ``Σ_j α_ij f(x_j)`` with ``f(x) = (x W_V + b_V) W_O`` restricted
to the head (the output bias is shared by every token and left out). A token can receive
a large weight α yet contribute little when ``‖f(x_j)‖`` is small. Per layer and head we
measure α_ij, ``‖f(x_j)‖`` and ``‖α_ij f(x_j)‖``, and per layer the head-summed contribution
``‖Σ_h α^h_ij f_h(x_j)‖``; we then compare the weight and the norm each token category
([CLS], [SEP], punctuation, other) receives, and correlate α with ``‖f(x)‖`` (Spearman).

Memory stays ``O(B·H·Q·K) + O(B·K·d·H)``: ``f_h(x_j)`` is computed once per key
``(B,H,K,d)``; ``‖α f‖ = α ‖f‖``; and the head-summed norm uses the per-key Gram matrix
``G_j[h,g] = ⟨f_h(x_j), f_g(x_j)⟩``, ``‖Σ_h α^h f_h‖² = α^T G_j α``, so no ``(B,Q,K,d)`` or
``(B,H,Q,K,d)`` tensor is ever built.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import Tensor

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.measures import spearman_rho
from attnaudit.experiments.common.rows import key_tokens
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.explain import item_mask
from attnaudit.explain.helpers.norms import LayerNorms, layer_norms
from attnaudit.models.interface import AttentionLayer, AttentionModel, take_rows
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run

CATEGORIES = ("[CLS]", "[SEP]", "punct", "other")
PUBLISHED: dict[str, str] = {
    "paper": "Kobayashi et al. 2020, Attention is Not Only a Weight (EMNLP), Section 4",
    "setting": "pre-trained BERT-base, 992 Wikipedia sequences (Clark et al. 2019 data)",
    "finding": "[CLS], [SEP], periods and commas receive large weights α but small ‖α f(x)‖; "
    "α and ‖f(x)‖ are negatively correlated for them, so BERT pays little attention to special tokens",
}


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and math.isfinite(value)


def is_punctuation(token: str) -> bool:
    """True for tokens made only of Unicode punctuation (``.``, ``,``, ``!``, ``--``...)."""
    return bool(token) and all(unicodedata.category(c).startswith("P") for c in token)


def categorise(tokens: list[str], special: dict[str, str]) -> list[int]:
    """Index into :data:`CATEGORIES` for each token (padding counts as "other"; it is masked anyway)."""
    codes = []
    for tok in tokens:
        if special and tok == special.get("cls"):
            codes.append(0)
        elif special and tok == special.get("sep"):
            codes.append(1)
        elif is_punctuation(tok):
            codes.append(2)
        else:
            codes.append(3)
    return codes


POSITION_GROUPS = ("first", "template", "text")
"""Key groups at a decoder's explaining query: the first token (the attention sink), the other
prompt-template tokens (real tokens that are not items) and the text tokens (the items)."""


def position_shares(model: AttentionModel, norms: LayerNorms, record: AttentionLayer, items: Tensor) -> dict[str, Tensor]:
    """Per instance ``(B,)``: shares of head-averaged weight and of head-summed norm ``‖Σ_h α f(x)‖``.

    ``sink_*``: on the first token, averaged over real query rows after the first (row 0 can only
    read itself); ``{group}_*`` (:data:`POSITION_GROUPS`): on each group at the explaining query,
    the last real token. Items ``(B,K)`` are the ranked tokens (a zero-shot prompt's text span)."""
    real = record.mask.bool()
    queries = record.query_mask.bool() if record.query_mask is not None else real
    weight = norms.weights.mean(1)  # (B,Q,K)
    norm = norms.summed_norm / norms.summed_norm.sum(-1, keepdim=True).clamp_min(torch.finfo(weight.dtype).tiny)
    later = queries.clone()
    later[:, 0] = False
    count = later.sum(1).clamp_min(1).to(weight.dtype)
    out = {
        "sink_weight_share": (weight[:, :, 0] * later).sum(1) / count,
        "sink_norm_share": (norm[:, :, 0] * later).sum(1) / count,
    }
    first = torch.zeros_like(real)
    first[:, 0] = True
    groups = {"first": first & real, "template": real & ~items.bool() & ~first, "text": items.bool() & ~first}
    row = model.explanation_rows(queries)
    if row is None:
        raise AttnAuditError(f"{type(model).__name__} has no explaining query row")
    for measure, values in (("weight", weight), ("norm", norm)):
        at_query = take_rows(values, row, 1)
        for group, keys in groups.items():
            out[f"{group}_{measure}_share"] = (at_query * keys).sum(-1)
    return {name: value.double().cpu() for name, value in out.items()}


def add_positions(result: Result, positions: dict[tuple[int, str], list[float]], n_layers: int) -> None:
    """Table ``positions`` (per layer: mean shares of :func:`position_shares`), its layer means in the
    summary and ``sink_finding_holds``: the first token gets a smaller share of the norm than of the weight."""
    names = sorted({name for _, name in positions})
    table = [{"layer": layer, **{name: float(np.mean(positions[(layer, name)])) for name in names}} for layer in range(n_layers)]
    result.tables["positions"] = table
    for name in names:
        result.summary[name] = float(np.mean([row[name] for row in table]))
    result.summary["sink_finding_holds"] = bool(result.summary["sink_norm_share"] < result.summary["sink_weight_share"])
    result.meta["notes"].append(
        "decoder positions (table positions, per layer): sink_* = share of the head-averaged weight and of the head-summed "
        "norm ‖Σ_h α f(x)‖ on the first token, mean over real query rows after the first; first/template/text_* = the "
        "same shares at the explaining query (the last real token) on the first token, the other prompt-template tokens "
        "and the input text's tokens (the ranked items); sink_finding_holds: the first token's norm share is below its "
        "weight share (layer means), Kobayashi et al.'s finding for an attention sink"
    )


@dataclass
class _Totals:
    """Running sums per (layer, category)."""

    layers: int
    sums: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, name: str, layer: int, values: np.ndarray) -> None:
        self.sums.setdefault(name, np.zeros((self.layers, len(CATEGORIES))))[layer] += values

    def get(self, name: str) -> np.ndarray:
        return self.sums.get(name, np.zeros((self.layers, len(CATEGORIES))))


@register
class Norms(Experiment):
    """The test of this module (its docstring gives the method, options and outputs)."""

    name = "norms"
    settings = AuditSettings(
        rank=4,
        decoder_options={"batch_size": 8},
        demo={"quick": {"max_pairs": 2000}},
    )
    needs_prediction = False  # reads attention and weights only
    description = "attention weight vs norm of the weighted transformed vector, per token category (Kobayashi et al.)"
    paper = "Kobayashi et al. 2020"
    examples = (
        "runs/sst2-transformer --limit 200 --data-dir ../shared/data",
        "--hf minilm --task sst2 --out results/minilm-norms --data-dir ../shared/data",
    )

    @dataclass
    class Options:
        batch_size: int = field(default=16, metadata={"help": "Instances per forward pass."})
        max_pairs: int = field(
            default=200_000, metadata={"help": "Per layer, at most this many (head, query, key) pairs kept for Spearman."}
        )
        heatmap_index: int = field(default=0, metadata={"help": "Instance shown in the heatmap figure."})
        heatmap_layer: int = field(default=-1, metadata={"help": "Layer shown in the heatmap figure."})

    def applies(self, run: Run) -> str | None:
        reason = run.model.lacks("value_output")
        if reason is not None:
            return f"the norm analysis needs multi-head self-attention with value/output projections: {reason}"
        if run.task.task_type == "seq2seq":
            return "the norm analysis covers encoder self-attention, not seq2seq cross-attention"
        return None

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        model = run.model
        n_layers = model.num_attention_layers
        if not -n_layers <= options.heatmap_layer < n_layers:
            raise AttnAuditError(f"--heatmap-layer {options.heatmap_layer} out of range for {n_layers} layers")
        if not 0 <= options.heatmap_index < len(examples):
            raise AttnAuditError(f"--heatmap-index {options.heatmap_index} out of range for {len(examples)} instances")
        special = model.special_tokens
        totals = _Totals(n_layers)
        pairs: list[dict[str, list[np.ndarray]]] = [{"alpha": [], "fx": [], "cat": []} for _ in range(n_layers)]
        generator = torch.Generator().manual_seed(seed)
        instances: list[dict[str, Any]] = []
        heatmap: list[dict[str, Any]] = []
        heat_layer = options.heatmap_layer % n_layers
        positions: dict[tuple[int, str], list[float]] = {}
        model.eval()
        batches = run.sorted_batches(examples, options.batch_size)
        with torch.no_grad():
            for indices, batch in track(batches, "norms", total=math.ceil(len(examples) / options.batch_size)):
                trace = model(batch).trace
                tokens = key_tokens(run, batch)
                category = torch.tensor([categorise(row, special) for row in tokens], device=batch.mask.device)
                quota = math.ceil(options.max_pairs * len(batch) / len(examples))
                rows = [{"index": index, "n_tokens": int(trace[0].mask[i].sum())} for i, index in enumerate(indices)]
                items = item_mask(model, batch) if model.causal else None
                for layer in range(n_layers):
                    record = trace[layer]
                    norms = layer_norms(model, record, layer)
                    self._accumulate(totals, layer, norms, record, category, rows)
                    if items is not None:
                        for name, values in position_shares(model, norms, record, items).items():
                            positions.setdefault((layer, name), []).extend(values.tolist())
                    self._sample_pairs(pairs[layer], norms, record, category, quota, generator)
                    if options.heatmap_index in indices and layer == heat_layer:
                        heatmap = self._heatmap(norms, record, tokens, indices.index(options.heatmap_index))
                instances.extend(rows)
        instances.sort(key=lambda row: row["index"])
        result = self._result(totals, pairs, instances, heatmap, heat_layer, options.heatmap_index, special)
        if positions:
            add_positions(result, positions, n_layers)
        return result

    @staticmethod
    def _accumulate(
        totals: _Totals, layer: int, norms: LayerNorms, record: AttentionLayer, category: Tensor, rows: list[dict[str, Any]]
    ) -> None:
        """Add this batch's sums per category (all over real queries and real keys)."""
        key = record.mask.to(norms.weights.dtype)  # (B,K)
        query_mask = record.query_mask if record.query_mask is not None else record.mask
        query = query_mask.to(norms.weights.dtype)
        pair_mask = query[:, None, :, None] * key[:, None, None, :]  # (B,1,Q,K)
        counts = pair_mask.expand_as(norms.weights)
        cat = category.cpu()  # (B,K); sums are kept on the CPU in float64

        def per_category(values: Tensor) -> np.ndarray:
            """``values`` (B,...,K): sum per category over everything."""
            per_key = values.reshape(values.shape[0], -1, values.shape[-1]).sum(1)  # (B,K)
            out = torch.zeros(len(CATEGORIES), dtype=torch.float64)
            out.index_add_(0, cat.reshape(-1), per_key.reshape(-1).to("cpu", torch.float64))
            return out.numpy()

        totals.add("weight", layer, per_category(norms.weights * pair_mask))
        totals.add("weighted_norm", layer, per_category(norms.weighted_norm * pair_mask))
        totals.add("pairs", layer, per_category(counts))
        totals.add("fx", layer, per_category(norms.fx_norm * key[:, None, :]))
        totals.add("keys", layer, per_category(key[:, None, :].expand_as(norms.fx_norm)))
        # head-averaged weight and head-summed norm per (query, key), and their shares per query row
        mean_weight = norms.weights.mean(1) * pair_mask[:, 0]  # (B,Q,K)
        summed = norms.summed_norm * pair_mask[:, 0]
        totals.add("summed_norm", layer, per_category(summed))
        totals.add("layer_pairs", layer, per_category(pair_mask[:, 0].expand_as(summed)))
        norm_share = summed / summed.sum(-1, keepdim=True).clamp_min(torch.finfo(summed.dtype).tiny)
        for name, share in (("weight_share", mean_weight), ("norm_share", norm_share)):
            per_instance = torch.zeros(len(rows), len(CATEGORIES), dtype=torch.float64)
            per_instance.scatter_add_(1, cat, share.sum(1).to("cpu", torch.float64))  # summed over query rows
            n_queries = query.sum(1, keepdim=True).to("cpu", torch.float64).clamp_min(1.0)
            totals.add(name, layer, per_instance.sum(0).numpy())
            for i, row in enumerate(rows):
                for c, cname in enumerate(CATEGORIES):
                    row[f"L{layer}_{cname}_{name}"] = float(per_instance[i, c] / n_queries[i, 0])
        totals.add("rows", layer, np.full(len(CATEGORIES), float(query.sum())))

    @staticmethod
    def _sample_pairs(
        store: dict[str, list[np.ndarray]],
        norms: LayerNorms,
        record: AttentionLayer,
        category: Tensor,
        quota: int,
        generator: torch.Generator,
    ) -> None:
        """Keep up to ``quota`` random real (head, query, key) pairs of (α, ‖f(x_j)‖, category)."""
        query_mask = record.query_mask if record.query_mask is not None else record.mask
        real = (query_mask[:, None, :, None] & record.mask[:, None, None, :]).expand_as(norms.weights)
        alpha = norms.weights[real]
        fx = norms.fx_norm[:, :, None, :].expand_as(norms.weights)[real]
        cat = category[:, None, None, :].expand_as(norms.weights)[real]
        if alpha.numel() > quota:
            keep = torch.randperm(alpha.numel(), generator=generator)[:quota].to(alpha.device)
            alpha, fx, cat = alpha[keep], fx[keep], cat[keep]
        store["alpha"].append(alpha.float().cpu().numpy())
        store["fx"].append(fx.float().cpu().numpy())
        store["cat"].append(cat.to(torch.int8).cpu().numpy())

    @staticmethod
    def _heatmap(norms: LayerNorms, record: AttentionLayer, tokens: list[list[str]], i: int) -> list[dict[str, Any]]:
        """Rows (query, key, tokens, head-averaged α, head-summed norm) for one instance."""
        real = record.mask[i].nonzero().flatten().tolist()
        weight = norms.weights[i].mean(0)
        summed = norms.summed_norm[i]
        return [
            {
                "query": q,
                "key": k,
                "query_token": tokens[i][q],
                "key_token": tokens[i][k],
                "weight": float(weight[q, k]),
                "norm": float(summed[q, k]),
            }
            for q in real
            for k in real
        ]

    def _result(
        self,
        totals: _Totals,
        pairs: list[dict[str, list[np.ndarray]]],
        instances: list[dict[str, Any]],
        heatmap: list[dict[str, Any]],
        heat_layer: int,
        heat_index: int,
        special: dict[str, str],
    ) -> Result:
        def ratio(num: str, den: str) -> np.ndarray:
            d = totals.get(den)
            return np.divide(totals.get(num), d, out=np.full_like(d, np.nan), where=d > 0)

        mean_weight, mean_weighted = ratio("weight", "pairs"), ratio("weighted_norm", "pairs")
        mean_fx, mean_summed = ratio("fx", "keys"), ratio("summed_norm", "layer_pairs")
        weight_share, norm_share = ratio("weight_share", "rows"), ratio("norm_share", "rows")
        present = totals.get("keys").sum(0) > 0
        columns = {"mean_weight": mean_weight, "mean_weighted_norm": mean_weighted, "mean_fx_norm": mean_fx,
                   "mean_summed_norm": mean_summed, "weight_share": weight_share, "norm_share": norm_share}
        layer_rows, corr_rows = [], []
        for layer, store in enumerate(pairs):
            corr, rows = _layer_tables(layer, store, present, columns, totals.get("keys"))
            layer_rows += rows
            corr_rows.append(corr)
        summary: dict[str, Any] = {"spearman_alpha_fx": float(np.nanmean([r["all"] for r in corr_rows]))}
        for c, cname in enumerate(CATEGORIES):
            if present[c]:
                summary[f"{cname}_weight_share"] = float(np.nanmean(weight_share[:, c]))
                summary[f"{cname}_norm_share"] = float(np.nanmean(norm_share[:, c]))
                summary[f"{cname}_spearman"] = float(np.nanmean([r.get(cname, np.nan) for r in corr_rows]))
        notes = [
            "weights α are per head; 'summed norm' is ‖Σ_h α^h_ij f_h(x_j)‖ per layer (Kobayashi's layer-level view); "
            "shares are per query row: the fraction of head-averaged weight, and of summed norm, landing on a category",
            "punct = tokens made only of Unicode punctuation (Kobayashi used periods and commas)",
            f"Spearman over at most {sum(r['n_pairs'] for r in corr_rows)} sampled (head, query, key) pairs",
        ]
        if present[0] or present[1]:
            summary["special_weight_share"] = float(np.nanmean(weight_share[:, :2].sum(1)))
            summary["special_norm_share"] = float(np.nanmean(norm_share[:, :2].sum(1)))
            summary["special_spearman"] = float(np.nanmean([r["special"] for r in corr_rows]))
            summary["finding_holds"] = bool(
                summary["special_norm_share"] < summary["special_weight_share"] and summary["special_spearman"] < 0
            )
            notes.append(
                "finding_holds: the special tokens ([CLS] and [SEP] together) get a smaller share of the norm than of "
                "the weight (layer average) and α is anti-correlated with ‖f(x)‖ on them (Spearman, layer average); "
                "the per-category columns show which special token the model uses as its attention sink"
            )
        else:
            notes.append("this model has no [CLS]/[SEP] tokens; the special-token finding cannot be checked")
        return Result(
            test=self.name,
            summary=summary,
            instances=instances,
            tables={"layers": layer_rows, "spearman": corr_rows, "heatmap": heatmap},
            meta={
                "notes": notes,
                "heatmap_layer": heat_layer,
                "heatmap_index": heat_index,
                "special_tokens": special,
                "published": dict(PUBLISHED),
            },
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Weight share vs norm share per token category, and ρ(α, ‖f(x)‖) (Kobayashi et al. 2020, §4)."""
        s = result.summary
        rows = []
        rho = s.get("spearman_alpha_fx")
        if isinstance(rho, (int, float)) and math.isfinite(rho):
            rows.append(
                {
                    "statistic": "spearman_alpha_fx",
                    "value": rho,
                    "published": "negative for [CLS], [SEP] and punctuation in BERT (Kobayashi et al. 2020)",
                    "interpretation": f"Spearman ρ(α, ‖f(x)‖) = {rho:.2f}: "
                    + (
                        "tokens that receive large weights tend to have small transformed vectors, so the weights "
                        "overstate their contribution"
                        if rho < -0.1
                        else "weights and vector norms do not cancel out; weights roughly track contributions"
                        if rho > 0.1
                        else "weights and vector norms are unrelated; the weight alone does not give a token's contribution"
                    ),
                }
            )
        for category in CATEGORIES:
            weight, norm = s.get(f"{category}_weight_share"), s.get(f"{category}_norm_share")
            if not (_finite(weight) and _finite(norm)) or category == "other":
                continue
            if weight > 1.5 * norm and weight >= 0.05:
                meaning = f"{category} gets {weight:.0%} of the attention weight but {norm:.0%} of ‖αf(x)‖: weights overstate its role"
            else:
                meaning = f"{category} gets {weight:.0%} of the weight and {norm:.0%} of ‖αf(x)‖"
            rows.append({"statistic": f"{category}_weight_share", "value": weight, "published": "", "interpretation": meaning})
        weight, norm = s.get("sink_weight_share"), s.get("sink_norm_share")
        if isinstance(weight, (int, float)) and isinstance(norm, (int, float)):
            rows.append(
                {
                    "statistic": "sink_weight_share",
                    "value": weight,
                    "published": "the sink gets much weight, little norm (Kobayashi et al. 2020, for BERT's [SEP]/[CLS])",
                    "interpretation": f"the first token (attention sink) gets {weight:.0%} of the attention weight and "
                    f"{norm:.0%} of ‖Σ_h αf(x)‖ (layer means, query rows after the first): "
                    + ("its weight overstates its contribution" if norm < weight else "its weight does not overstate its contribution"),
                }
            )
        return rows or super().verdict(result)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot

        plt = pyplot()

        paths: list[Path] = []
        rows = result.tables.get("layers", [])
        if rows:
            layers = sorted({r["layer"] for r in rows})
            cats = [c for c in CATEGORIES if any(r["category"] == c for r in rows)]
            fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
            width = 0.8 / len(cats)
            for ax, key, title in zip(axes, ("weight_share", "norm_share"), ("attention weight α", "norm ‖Σ_h α f(x)‖")):
                for n, cname in enumerate(cats):
                    values = [next((r[key] for r in rows if r["layer"] == l and r["category"] == cname), np.nan) for l in layers]
                    ax.bar(np.array(layers) + (n - (len(cats) - 1) / 2) * width, values, width, label=cname)
                ax.set_title(f"share of {title}")
                ax.set_xlabel("layer")
                ax.set_xticks(layers)
            axes[0].set_ylabel("mean share per query")
            axes[1].legend(fontsize=8)
            fig.suptitle("Weight vs norm received per token category (Kobayashi et al. 2020, Fig. 2/3 style)", y=1.04)
            paths += save_figure(fig, directory, "norms_by_category")
        heat = result.tables.get("heatmap", [])
        if heat:
            queries = sorted({r["query"] for r in heat})
            labels = {r["query"]: r["query_token"] for r in heat}
            index = {q: i for i, q in enumerate(queries)}
            weight = np.zeros((len(queries), len(queries)))
            norm = np.zeros_like(weight)
            for r in heat:
                weight[index[r["query"]], index[r["key"]]] = r["weight"]
                norm[index[r["query"]], index[r["key"]]] = r["norm"]
            size = max(4.0, 0.32 * len(queries) + 2)
            fig, axes = plt.subplots(1, 2, figsize=(2 * size, size))
            for ax, matrix, title in zip(axes, (weight, norm), ("α (mean over heads)", "‖Σ_h α f(x)‖")):
                ax.imshow(matrix, cmap="Reds")
                ax.set_title(title)
                ax.set_xticks(range(len(queries)), [labels[q] for q in queries], rotation=90, fontsize=7)
                ax.set_yticks(range(len(queries)), [labels[q] for q in queries], fontsize=7)
            where = f"instance {result.meta.get('heatmap_index')}, layer {result.meta.get('heatmap_layer')} (0-based)"
            fig.suptitle(where, y=1.02)
            paths += save_figure(fig, directory, "norms_heatmap")
        return paths


def _layer_tables(
    layer: int, store: dict[str, list[np.ndarray]], present: np.ndarray, columns: dict[str, np.ndarray], keys: np.ndarray
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One layer: Spearman ρ(α, ‖f(x)‖) over its sampled pairs (all, per category present, the special tokens together)
    and its rows of the ``layers`` table (each of ``columns`` at this layer and category)."""
    alpha = np.concatenate(store["alpha"]) if store["alpha"] else np.zeros(0)
    fx = np.concatenate(store["fx"]) if store["fx"] else np.zeros(0)
    cat = np.concatenate(store["cat"]) if store["cat"] else np.zeros(0, dtype=np.int8)
    corr: dict[str, Any] = {"layer": layer, "all": spearman_rho(alpha, fx), "n_pairs": int(alpha.size)}
    rows = []
    for c, cname in enumerate(CATEGORIES):
        if not present[c]:
            continue
        sel = cat == c
        corr[cname] = spearman_rho(alpha[sel], fx[sel])
        rows.append({"layer": layer, "category": cname, **{name: values[layer, c] for name, values in columns.items()},
                     "spearman_alpha_fx": corr[cname], "n_keys": int(keys[layer, c])})
    if present[0] or present[1]:
        specials = cat <= 1
        corr["special"] = spearman_rho(alpha[specials], fx[specials])
    return corr, rows
