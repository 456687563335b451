"""What a Hugging Face model offers the methods that need its structure, read off its dry run.

:class:`HFCapabilities` is part of :class:`~attnaudit.models.hf.model.HFModel`: per-head value and
output maps (norms, identifiability, DecompX), the norms and feed-forward map around each attention
layer (GlobEnc, ALTI, Value Zeroing, norms with residual and LayerNorm), the LRP sites, the
classification head as dense layers (DecompX), and why any of them is missing (:meth:`lacks`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.hf.layouts import BlockLayout
from attnaudit.models.hf.structure import Structure
from attnaudit.models.interface import (
    AttentionLayer,
    HeadLayers,
    ModelConfig,
    ResidualNorms,
    dense,
)
from attnaudit.models.lrp import RelevanceSites, scan_sites

GATES = (("gate_proj", "act_fn", "down_proj"),)
"""Gated feed-forward maps ``down(act(gate(x)) · up(x))`` by the names of gate, activation and consumer (LRP)."""


class HFCapabilities:
    """The structural capabilities of an :class:`~attnaudit.models.hf.model.HFModel` (a mixin)."""

    structure: Structure
    config: ModelConfig
    kind: str
    hf: Any
    hf_type: str
    tokenizer: Any
    has_head: bool
    self_attention: bool
    supports_lrp: bool

    @property
    def num_attention_layers(self) -> int:
        raise NotImplementedError

    @property
    def offloaded(self) -> list[str]:
        raise NotImplementedError

    def lacks(self, need: str) -> str | None:
        """Why this model lacks a structural need (:data:`attnaudit.explain.registry.NEEDS`), or None."""
        offloaded = self.offloaded if need in ("value_output", "residual_norms", "lrp") else []
        if offloaded:
            return (f"{self.hf_type}: --device-map keeps {offloaded[0]} (and {len(offloaded) - 1} more) off the model between passes; "
                    "methods that read the weights need every layer in memory")
        if need == "value_output":
            if self.structure.route != "interface":
                inside = type(self.structure.sites[0].module).__name__
                return f"{self.hf_type}: attention is computed inside {inside}, not through the attention interface, so its values are not seen"
            missing = [i for i, s in enumerate(self.structure.sites) if s.projections is None]
            return f"{self.hf_type}: no linear map reproduces the values or takes the output of attention layer {missing[0]}" if missing else None
        if need == "residual_norms":
            reason = self.lacks("value_output") if self.self_attention else f"{self.hf_type} is an encoder-decoder"
            bad = [v for v in self.structure.layouts.values() if not isinstance(v, BlockLayout)]
            if reason is None and bad:
                reason = f"{self.hf_type}: {bad[0]}"
            return reason
        if need == "lrp":
            if not self.supports_lrp:
                return f"{self.hf_type}: relevance rules need the attention interface and a single stack"
            return None
        return super().lacks(need)  # type: ignore[misc]

    @property
    def has_value_output(self) -> bool:
        return self.lacks("value_output") is None

    @property
    def has_residual_norms(self) -> bool:
        return self.lacks("residual_norms") is None

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` per *query* head as right-multiplied maps: a key/value head's columns
        are repeated for every query head that reads it (grouped- and multi-query attention)."""
        reason = self.lacks("value_output")
        if reason:
            raise AttnAuditError(reason)
        site = self.structure.sites[layer % self.num_attention_layers]
        assert site.projections is not None
        w_v, b_v = site.projections.w_v, site.projections.b_v
        heads = self.config.heads
        kv = w_v.shape[1] // max(site.projections.w_o.shape[0] // heads, 1)
        if kv < heads:
            dh, groups = w_v.shape[1] // kv, heads // kv
            w_v = w_v.reshape(-1, kv, dh).repeat_interleave(groups, 1).reshape(w_v.shape[0], heads * dh)
            b_v = b_v.reshape(kv, dh).repeat_interleave(groups, 0).reshape(-1)
        return w_v, b_v, site.projections.w_o, heads

    def attention_projections(self, layer: int) -> tuple[nn.Module, nn.Module]:
        """The module computing attention layer ``layer``'s values (maybe a fused query/key/value map) and its
        output projection."""
        reason = self.lacks("value_output")
        if reason:
            raise AttnAuditError(reason)
        projections = self.structure.sites[layer % self.num_attention_layers].projections
        assert projections is not None
        return projections.modules

    def residual_norms(self, layer: int) -> ResidualNorms:
        """The norms, output bias and feed-forward map around attention layer ``layer`` (pre- or post-norm blocks)."""
        reason = self.lacks("residual_norms")
        if reason:
            raise AttnAuditError(reason)
        site = self.structure.sites[layer % self.num_attention_layers]
        layout = self.structure.layouts[site.block]
        assert isinstance(layout, BlockLayout) and site.projections is not None
        return ResidualNorms(
            placement=layout.kind,
            attention_norm=layout.attention_norm.params(), ffn_norm=layout.ffn_norm.params(),
            output_bias=site.projections.b_o, ffn=layout.ffn, ffn_layers=layout.ffn_layers,
            post_norms=None if layout.post_norms is None else (layout.post_norms[0].params(), layout.post_norms[1].params()),
        )

    def residual_stream(self, record: AttentionLayer) -> Tensor:
        residual = getattr(record, "residual", None)
        if residual is None:
            raise AttnAuditError("residual_stream needs a trace from HFModel.decode")
        return residual

    def relevance_sites(self) -> RelevanceSites:
        """Every norm and activation module of the model, and each gated feed-forward block (:data:`GATES`)."""
        sites = scan_sites(self.hf)
        for gate, act, consumer in GATES:
            for module in self.hf.modules():
                if all(hasattr(module, name) for name in (gate, act, consumer)):
                    sites.gates.append((getattr(module, act), getattr(module, consumer)))
        return sites

    def head_layers(self) -> HeadLayers | None:
        """The classification head as [CLS] pooling + dense layers (BERT's pooler, DistilBERT's pre-classifier,
        RoBERTa's dense + out_proj); None for other heads."""
        hf = self.hf
        if not self.has_head or self.kind != "encoder":
            return None
        classifier = getattr(hf, "classifier", None)
        if hasattr(hf, "pre_classifier"):
            assert classifier is not None  # DistilBERT: pre_classifier, then classifier
            return HeadLayers("first", (dense(hf.pre_classifier, nn.ReLU()), dense(classifier)))
        pooler = getattr(hf.base_model, "pooler", None)
        pooler = getattr(pooler, "dense", pooler)  # BERT's pooler module holds its Linear; ALBERT's is one
        if isinstance(pooler, nn.Linear) and isinstance(classifier, nn.Linear):
            return HeadLayers("first", (dense(pooler, nn.Tanh()), dense(classifier)))
        hidden, out = getattr(classifier, "dense", None), getattr(classifier, "out_proj", None)
        if isinstance(hidden, nn.Linear) and isinstance(out, nn.Linear):
            return HeadLayers("first", (dense(hidden, nn.Tanh()), dense(out)))
        return None

    @property
    def special_tokens(self) -> dict[str, str]:
        """Marker tokens the tokenizer adds: ``[CLS]``/``[SEP]`` (encoders), begin/end of sequence (decoders), end and pad."""
        names = {
            "encoder": ("cls_token", "sep_token"), "decoder": ("bos_token", "eos_token"), "encoder-decoder": ("eos_token", "pad_token")
        }[self.kind]
        tokens = {name.removesuffix("_token"): getattr(self.tokenizer, name, None) for name in names}
        return {name: str(token) for name, token in tokens.items() if token}

    def wordpieces(self, batch: Batch) -> list[list[str]]:
        """The subword strings on the key axis of each example (real positions only)."""
        return [self.tokenizer.convert_ids_to_tokens(row[m].tolist()) for row, m in zip(batch.tokens, batch.mask.bool())]
