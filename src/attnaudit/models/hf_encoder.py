"""Hugging Face BERT-family encoders (BERT, RoBERTa, DistilBERT, MiniLM) behind the one model interface.

No modeling file is forked. transformers 5 routes every self-attention module through the
function registered under ``config._attn_implementation`` in its
:class:`~transformers.AttentionInterface`; this module registers one more, ``"attnaudit"``,
and switches loaded models to it. The function receives the module, its per-head
queries, keys and values (``(B,H,T,dh)``) and the scaling, so it can

* apply key interventions, score, normalise with
  :func:`attnaudit.models.attention.attention_weights` (normaliser swaps and weight
  replacements behave exactly as in our own models), and
* record an :class:`AttentionLayer` for the trace.

It only does so while :meth:`HFAttentionModel.decode` is running (a context variable tells
it which module is which layer); any other call — e.g. HF's own ``model(...)`` with
``output_attentions=True`` — falls through to HF's eager attention unchanged, so the
model stays a normal HF model. ``decode`` runs the model's own layer modules one by one
(which is what makes restarting at any layer possible) and then the model's own head.

Items are wordpieces: the attention key axis is the tokenizer's output, ``[CLS]`` and
``[SEP]`` included. A classification explanation is the attention *from* ``[CLS]``
(:attr:`HFAttentionModel.explanation_query`). Token type ids travel in ``Batch.features``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.bert.modeling_bert import eager_attention_forward

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError, InputError, warn
from attnaudit.models.attention import apply_key_interventions, apply_value_interventions, attention_weights
from attnaudit.models.base import (
    AttentionLayer,
    AttentionModel,
    AttentionTrace,
    Cache,
    Intervention,
    ModelConfig,
    HeadLayers,
    ModelOutput,
    NormParams,
    ResidualNorms,
    dense,
    interventions_for,
    layer_range,
)
from attnaudit.models.lrp import RelevanceSites, attention_operands, scan_sites
from attnaudit.weights import checked_weight

ATTN_IMPLEMENTATION = "attnaudit"
HF_DIR = "hf"
"""Sub-directory of a run directory holding ``save_pretrained`` output (its own config.json)."""


@dataclass
class _Active:
    """What the registered attention function needs while ``decode`` runs."""

    layer_of: dict[int, int]
    mask: Tensor
    interventions: dict[int, list[Intervention]]
    inputs: Tensor | None = None
    records: dict[int, AttentionLayer] = field(default_factory=dict)
    allowed: Tensor | None = None
    """``(B,Q,K)`` which query may read which key (decoders: causal and padding); None: ``mask`` alone."""
    query_mask: Tensor | None = None
    """``(B,Q)`` the real queries where they are not the keys (a decoder rerunning some positions); None: ``mask``."""
    layer_masks: dict[int, tuple[Tensor, Tensor | None, Tensor]] = field(default_factory=dict)
    """Per layer ``(key mask, allowed, query mask)`` where they are not ``(mask, allowed, mask)``:
    an encoder-decoder's decoder self-attention and cross-attention (:mod:`attnaudit.models.hf_seq2seq`)."""


_ACTIVE: ContextVar[_Active | None] = ContextVar("attnaudit_hf_active", default=None)


def _attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """HF's eager attention with interventions and recording (see the module docstring).

    Grouped-query attention (fewer key/value heads than query heads) is expanded first, as
    HF's ``repeat_kv`` does, so keys, values and weights are per query head. T5's relative
    ``position_bias`` (an additive ``(1|B,H,Q,K)`` term) is added to the scores before masking."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    state = _ACTIVE.get()
    layer = None if state is None else state.layer_of.get(id(module))
    bias = kwargs.pop("position_bias", None)
    if state is None or layer is None:
        if bias is not None:  # BERT's eager code takes no position bias: it is one more additive mask term
            attention_mask = bias if attention_mask is None else attention_mask + bias
        return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    ivs = state.interventions.get(layer, [])
    query, key, value = attention_operands(query, key, value)
    queries = state.mask if state.query_mask is None else state.query_mask
    mask, allowed, query_mask = state.layer_masks.get(layer, (state.mask, state.allowed, queries))
    allowed = None if allowed is None else allowed[:, None]
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    keys = apply_key_interventions(key, ivs)
    value = apply_value_interventions(value, ivs)
    scores = (query @ keys.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~(mask[:, None, None, :] if allowed is None else allowed), float("-inf"))
    weights = attention_weights(scores, mask, "softmax", ivs, allowed)
    # HF applies dropout to the attention probabilities while training; the trace keeps
    # the weights before dropout (the distribution the model computed).
    applied = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = (applied @ value).transpose(1, 2).contiguous()
    state.records[layer] = AttentionLayer(
        weights=weights,
        mask=mask,
        inputs=state.inputs if state.inputs is not None else query,
        keys=keys,
        values=value,
        scores=scores,
        query_mask=query_mask,
        name=f"layer{layer}",
    )
    return output, weights


AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
# Without a registered mask function HF would build no padding mask for an unknown name.
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports and progress bars (we print our own status)."""
    import logging

    from transformers.utils import logging as hf_logging

    hub = logging.getLogger("huggingface_hub")  # its download retries log one warning each
    level, bars, hub_level = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), hub.level
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        hub.setLevel(hub_level)
        if bars:
            hf_logging.enable_progress_bar()


class HFAttentionModel(AttentionModel):
    """A BERT-family encoder (optionally with a sequence-classification head) as an AttentionModel.

    ``hf`` is the loaded transformers model (``AutoModel`` or
    ``AutoModelForSequenceClassification``). Without a head, ``logits`` are the final
    ``[CLS]`` states ``(B, d)`` and :attr:`has_head` is False; :attr:`trained_head` says
    whether the head's weights were trained (a fresh head before fine-tuning is not).
    """

    explained_layer = -1
    self_attention = True
    explanation_query = 0
    """Classification explanations read the attention row of ``[CLS]`` (query 0)."""

    def __init__(self, hf: nn.Module, tokenizer: Any, task_type: str, source: str, trained_head: bool) -> None:
        cfg = hf.config
        hf_type = str(cfg.model_type)
        has_head = hf.base_model is not hf
        layers = self._find_layers(hf.base_model)
        heads = int(getattr(cfg, "num_attention_heads", getattr(cfg, "n_heads", 0)))
        width = int(getattr(cfg, "hidden_size", getattr(cfg, "dim", 0)))
        offset = 2 if hf_type in ("roberta", "xlm-roberta", "camembert") else 0  # positions start after padding_idx
        max_len = min(int(cfg.max_position_embeddings) - offset, int(getattr(tokenizer, "model_max_length", 512) or 512))
        config = ModelConfig(
            model="hf",
            task_type=task_type,  # type: ignore[arg-type]
            vocab_size=int(cfg.vocab_size),
            num_labels=int(cfg.num_labels) if has_head else 0,
            embed_dim=width,
            hidden_dim=width,
            attention="softmax",
            layers=len(layers),
            heads=heads,
            d_model=width,
            d_ff=int(getattr(cfg, "intermediate_size", getattr(cfg, "hidden_dim", 0))),
            dropout=float(getattr(cfg, "hidden_dropout_prob", getattr(cfg, "dropout", 0.0))),
            max_len=max_len,
            pad_id=int(tokenizer.pad_token_id or 0),
            extra={"hf_type": hf_type, "source": source, "head": has_head, "trained_head": trained_head},
        )
        super().__init__(config)
        self.hf_type = hf_type
        self.has_head = has_head
        self.hf = hf
        self.tokenizer = tokenizer
        self.trained_head = trained_head
        self._attention_modules = [self._self_attention(layer) for layer in layers]
        self._layer_of = {id(m): i for i, m in enumerate(self._attention_modules)}
        hf.set_attn_implementation(ATTN_IMPLEMENTATION)
        self.uses_token_types = (
            "token_type_ids" in getattr(tokenizer, "model_input_names", ()) and int(getattr(cfg, "type_vocab_size", 0)) > 1
        )

    # -- structure -------------------------------------------------------------------------

    @staticmethod
    def _find_layers(base: nn.Module) -> nn.ModuleList:
        """The encoder's layer list: ``encoder.layer`` (BERT, RoBERTa, ...) or ``transformer.layer`` (DistilBERT)."""
        for owner in ("encoder", "transformer"):
            layers = getattr(getattr(base, owner, None), "layer", None)
            if isinstance(layers, nn.ModuleList):
                return layers
        raise AttnAuditError(
            f"unsupported Hugging Face model {type(base).__name__}: expected a BERT-family encoder "
            "(BERT, RoBERTa, DistilBERT, MiniLM)"
        )

    @staticmethod
    def _self_attention(layer: nn.Module) -> nn.Module:
        """The module that calls the attention function (BERT: ``attention.self``; DistilBERT: ``attention``)."""
        attention = layer.attention
        return attention.self if hasattr(attention, "self") else attention

    @property
    def layers(self) -> nn.ModuleList:
        return self._find_layers(self.hf.base_model)

    @property
    def num_attention_layers(self) -> int:
        return len(self._attention_modules)

    def attention_projections(self, layer: int) -> tuple[nn.Linear, nn.Linear]:
        """The value projection and the attention output projection (``W_O``) of ``layer``."""
        block = self.layers[layer]
        attention = block.attention
        if hasattr(attention, "self"):
            return attention.self.value, attention.output.dense
        return attention.v_lin, attention.out_lin

    has_value_output = True

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` as right-multiplied maps, like the Transformer's.

        ``v = x @ W_V + b_V``; the attention output is ``concat_heads(sum_j a_ij v_j) @ W_O + b_O``;
        head ``h`` owns columns ``h*dh:(h+1)*dh`` of ``W_V`` and the same rows of ``W_O``.
        """
        value, output = self.attention_projections(layer)
        return value.weight.t(), value.bias, output.weight.t(), self.config.heads

    has_residual_norms = True
    value_interventions = True
    supports_lrp = True

    def relevance_sites(self) -> RelevanceSites:
        """Every norm and activation module of the HF model (embedding and layer norms, feed-forward
        activations, the pooler's tanh); decoders add their gated feed-forward blocks."""
        return scan_sites(self.hf)

    def residual_norms(self, layer: int) -> ResidualNorms:
        """Post-LN, as BERT computes it: ``h = LN(x + dense(attn))``, ``out = LN(h + ffn(h))``
        (BERT/RoBERTa: ``attention.output``, ``intermediate``, ``output``; DistilBERT: ``sa_layer_norm``,
        ``ffn``, ``output_layer_norm``)."""
        block = self.layers[layer]
        _, output = self.attention_projections(layer)
        if hasattr(block, "intermediate"):
            first, second = block.attention.output.LayerNorm, block.output.LayerNorm
            layers = (dense(block.intermediate.dense, block.intermediate.intermediate_act_fn), dense(block.output.dense))
        else:
            first, second, lin = block.sa_layer_norm, block.output_layer_norm, block.ffn
            layers = (dense(lin.lin1, lin.activation), dense(lin.lin2))

        def ffn(h: Tensor) -> Tensor:
            up, act, down = layers[0][0], layers[0][2], layers[1]
            return act(h @ up + layers[0][1]) @ down[0] + down[1]

        return ResidualNorms(
            placement="post",
            attention_norm=NormParams(first.weight, first.bias, first.eps),
            ffn_norm=NormParams(second.weight, second.bias, second.eps),
            output_bias=output.bias,
            ffn=ffn,
            ffn_layers=layers,
        )

    def head_layers(self) -> HeadLayers | None:
        """[CLS], then BERT's tanh pooler and classifier, DistilBERT's ReLU pre-classifier and classifier, or
        RoBERTa's tanh dense and out_proj; None without a head."""
        hf = self.hf
        if not self.has_head:
            return None
        if hasattr(hf, "pre_classifier"):
            return HeadLayers("first", (dense(hf.pre_classifier, nn.ReLU()), dense(hf.classifier)))
        pooler = getattr(hf.base_model, "pooler", None)
        if pooler is not None and isinstance(hf.classifier, nn.Linear):
            return HeadLayers("first", (dense(pooler.dense, nn.Tanh()), dense(hf.classifier)))
        if hasattr(hf.classifier, "out_proj"):
            return HeadLayers("first", (dense(hf.classifier.dense, nn.Tanh()), dense(hf.classifier.out_proj)))
        return None

    def wordpieces(self, batch: Batch) -> list[list[str]]:
        """The wordpiece strings on the key axis of each example (real positions only)."""
        mask = batch.mask.bool()
        return [self.tokenizer.convert_ids_to_tokens(row[m].tolist()) for row, m in zip(batch.tokens, mask)]

    @property
    def special_tokens(self) -> dict[str, str]:
        """The classification and separator token strings (``[CLS]``/``[SEP]``, RoBERTa ``<s>``/``</s>``)."""
        return {"cls": str(self.tokenizer.cls_token), "sep": str(self.tokenizer.sep_token)}

    # -- the interface -----------------------------------------------------------------------

    def embed(self, batch: Batch) -> Tensor:
        """Wordpiece embeddings ``(B,T,d)`` (before positions, token types and LayerNorm)."""
        ids = batch.tokens
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise AttnAuditError(f"token ids must lie in [0, {self.config.vocab_size}); got {int(ids.min())}..{int(ids.max())}")
        return self.hf.base_model.get_input_embeddings()(ids)

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        """The model's own embedding module (positions, token types, LayerNorm, dropout)."""
        if batch.tokens.shape[1] > self.config.max_len:
            raise AttnAuditError(f"sequence of length {batch.tokens.shape[1]} exceeds max_len={self.config.max_len}")
        emb = self.embed(batch) if embeddings is None else embeddings
        kwargs: dict[str, Tensor] = {"inputs_embeds": emb}
        if self.uses_token_types and batch.features is not None:
            if batch.features.shape != batch.tokens.shape:
                raise AttnAuditError(
                    f"token type ids (batch.features) shape {tuple(batch.features.shape)} differs from tokens "
                    f"{tuple(batch.tokens.shape)}; drop positions from both"
                )
            kwargs["token_type_ids"] = batch.features
        if self.hf_type in ("roberta", "xlm-roberta", "camembert"):
            # RoBERTa numbers positions from padding_idx + 1, skipping padding; computed here
            # from the mask because only ids (not embeddings) let HF infer it.
            mask = batch.mask.long()
            kwargs["position_ids"] = torch.cumsum(mask, 1) * mask + self.hf.base_model.embeddings.padding_idx
        states = self.hf.base_model.embeddings(input_ids=None, **kwargs)
        return Cache(states=states, mask=batch.mask.bool(), layer=0)

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
    ) -> ModelOutput:
        """Run layers ``start_layer``..L-1 (default ``cache.layer``) with the model's own modules, then the head."""
        n = self.num_attention_layers
        indices = layer_range(cache, start_layer, n)
        x, mask = cache.states, cache.mask.bool()
        # HF's additive padding mask, used only if a layer's attention is not ours (it always is).
        additive = (~mask)[:, None, None, :].to(x.dtype) * torch.finfo(x.dtype).min
        state = _Active(layer_of=self._layer_of, mask=mask, interventions={l: interventions_for(interventions, l, self.num_attention_layers) for l in range(self.num_attention_layers)})
        token = _ACTIVE.set(state)
        trace = AttentionTrace()
        try:
            layers = self.layers
            for index in indices:
                state.inputs = x
                out = layers[index](x, additive)
                x = out[0] if isinstance(out, tuple) else out
                record = state.records.pop(index)
                record.outputs = x
                trace.layers.append(record)
        finally:
            _ACTIVE.reset(token)
        return ModelOutput(logits=self.head(x), trace=trace)

    def head(self, states: Tensor) -> Tensor:
        """The model's own classification head on the final states (headless: the ``[CLS]`` state)."""
        hf = self.hf
        if not self.has_head:
            return states[:, 0]
        if hasattr(hf, "pre_classifier"):  # DistilBERT: [CLS] -> Linear -> ReLU -> dropout -> Linear
            return hf.classifier(hf.dropout(torch.relu(hf.pre_classifier(states[:, 0]))))
        pooler = getattr(hf.base_model, "pooler", None)
        if pooler is not None and isinstance(hf.classifier, nn.Linear):  # BERT: pooler(tanh) -> dropout -> Linear
            return hf.classifier(hf.dropout(pooler(states)))
        return hf.classifier(states)  # RoBERTa's head reads [CLS] from the sequence itself


class HFCollator:
    """Tokenise examples with the model's tokenizer: text, or (text, query) as a text pair.

    ``Example.tokens`` (and ``query``) are joined with spaces and re-tokenised into
    wordpieces; sequences longer than ``max_len`` are truncated with one warning per call.
    ``max_text`` (``--max-length``) keeps at most that many tokens of the text itself
    (:meth:`cut_text`); special tokens, a pair's second text and a prompt's template stay.
    """

    max_text: int | None = None
    warned_cut = False

    def __init__(self, tokenizer: Any, labels: Sequence[str], task_type: str, max_len: int, token_types: bool) -> None:
        if task_type not in ("classification", "pair"):
            raise AttnAuditError(f"Hugging Face encoders here handle classification and pair tasks, not {task_type}")
        self.tokenizer = tokenizer
        self.labels = list(labels)
        self.label_ids = {label: i for i, label in enumerate(self.labels)}
        self.task_type = task_type
        self.max_len = max_len
        self.token_types = token_types

    def texts(self, examples: Sequence[Example]) -> list[str]:
        """The text tokenised for each example: its tokens joined with spaces."""
        return [" ".join(ex.tokens) for ex in examples]

    def __call__(self, examples: Sequence[Example]) -> Batch:
        batch = self.tokenise(examples)
        return batch if self.max_text is None else self.cut_text(batch, self.text_tokens(batch))

    def tokenise(self, examples: Sequence[Example]) -> Batch:
        """The padded batch of ``examples`` (before any ``--max-length`` cut)."""
        if not examples:
            raise AttnAuditError("cannot build a batch from no examples")
        for ex in examples:
            if not ex.tokens:
                raise InputError(str(ex.meta.get("source", "<example>")), "example has no tokens")
        texts = self.texts(examples)
        pairs = None
        if self.task_type == "pair":
            for ex in examples:
                if not ex.query:
                    raise InputError(str(ex.meta.get("source", "<example>")), "pair example without a query / second sentence")
            pairs = [" ".join(ex.query or []) for ex in examples]
        lengths = [len(ids) for ids in self.tokenizer(texts, pairs)["input_ids"]]
        truncated = sum(n > self.max_len for n in lengths)
        if truncated:
            warn(f"{truncated} of {len(examples)} examples are longer than {self.max_len} wordpieces; truncated")
        cut: dict[str, Any] = {"truncation": True, "max_length": self.max_len} if truncated else {}
        enc = self.tokenizer(texts, pairs, padding=True, return_tensors="pt", **cut)
        batch = Batch(tokens=enc["input_ids"], mask=enc["attention_mask"].bool(), examples=list(examples))
        if self.token_types and "token_type_ids" in enc:
            batch.features = enc["token_type_ids"]
        if self.labels and any(ex.label is not None for ex in examples):  # no label set (no task): unlabelled
            ids = []
            for ex in examples:
                if ex.label is None or ex.label not in self.label_ids:
                    where = str(ex.meta.get("source", "<example>"))
                    raise InputError(where, f"unknown or missing label {ex.label!r}; known: {', '.join(self.labels[:20])}")
                ids.append(self.label_ids[ex.label])
            batch.labels = torch.tensor(ids, dtype=torch.long)
        return batch

    def text_tokens(self, batch: Batch) -> Tensor:
        """``(B,T)`` the tokens of the (first) text: real, not special, and in a pair the first segment."""
        special = torch.tensor(sorted(self.tokenizer.all_special_ids), dtype=batch.tokens.dtype)
        text = batch.mask.bool() & ~torch.isin(batch.tokens, special)
        if self.task_type == "pair":
            if batch.features is None:
                raise AttnAuditError("--max-length: this tokenizer marks no segments, so a pair's text cannot be cut apart from its query")
            text &= batch.features == 0
        return text

    def cut_text(self, batch: Batch, text: Tensor) -> Batch:
        """``batch`` with each row's text tokens (``text`` ``(B,T)``) after the first :attr:`max_text` removed
        (later tokens move up, as when the text had ended there); the first cut warns once."""
        assert self.max_text is not None
        drop = text & (text.long().cumsum(1) > self.max_text)
        if not drop.any():
            return batch
        if not self.warned_cut:  # once per collator, not once per batch of a long audit
            warn(f"texts longer than {self.max_text} tokens are truncated (--max-length; {int(drop.any(1).sum())} of the first batch's {len(batch)})")
            self.warned_cut = True
        keep = batch.mask.bool() & ~drop
        width = int(keep.sum(1).max())
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]  # kept positions first, in order
        mask = keep.gather(1, order)

        def take(values: Tensor | None, fill: int | bool) -> Tensor | None:
            return None if values is None else values.gather(1, order).masked_fill(~mask, fill)

        batch.tokens = take(batch.tokens, int(self.tokenizer.pad_token_id or 0))  # type: ignore[assignment]
        batch.features, batch.items = take(batch.features, 0), take(batch.items, False)
        batch.mask = mask
        return batch


# -- loading -----------------------------------------------------------------------------------


def _hub_reachable() -> bool:
    """Whether the Hugging Face endpoint's host resolves; offline, a hub load would only retry for ~30 s."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # HF_HUB_OFFLINE=1: the user says the hub is not to be reached
        return False
    host = urlparse(constants.ENDPOINT).hostname
    try:
        socket.getaddrinfo(host or "huggingface.co", 443)
    except OSError:
        return False
    return True


def _pretrained(loader: Any, source: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` with one-line errors (offline hub, missing files, pickles only).

    A hub name is looked up in the local cache first; only when it is missing there and the
    hub's host resolves is it downloaded."""
    try:
        with _quiet_transformers():
            if Path(source).is_dir():
                return loader.from_pretrained(source, **kwargs)
            try:
                return loader.from_pretrained(source, local_files_only=True, **kwargs)
            except OSError:
                if not _hub_reachable():
                    raise AttnAuditError(
                        f"could not load Hugging Face model {source!r}: not in the local cache, and the hub "
                        "cannot be reached (offline?); give a local model folder (a translation model: one from "
                        "attnaudit train-nmt --arch marian), --hf minilm or --hf smollm2"
                    ) from None
            return loader.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        message = str(exc).strip().splitlines()
        raise AttnAuditError(f"could not load Hugging Face model {source!r}: {message[0] if message else type(exc).__name__}") from None


def _architectures(source: str) -> tuple[Any, bool]:
    from transformers import AutoConfig

    config = _pretrained(AutoConfig, source)
    head = any(str(a).endswith("ForSequenceClassification") for a in (config.architectures or []))
    return config, head


def _weights_folder(source: str) -> Path | None:
    """The local folder holding ``source``'s safetensors files (a hub name: its cached snapshot)."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except (OSError, ValueError):
        return None


def _check_weights(source: str, hf: nn.Module) -> None:
    """Refuse checkpoint tensors that the load cast silently: int/bool values for a floating
    parameter, or NaN/Inf (:func:`~attnaudit.weights.checked_weight`).

    A file key is matched to the model's key with or without the model prefix (``bert.``)."""
    from safetensors import safe_open

    folder = _weights_folder(source)
    dtypes: dict[str, torch.dtype] = {}
    for key, value in hf.state_dict().items():
        parts = key.split(".")
        for start in range(len(parts)):
            dtypes.setdefault(".".join(parts[start:]), value.dtype)
    for file in sorted(folder.glob("*.safetensors")) if folder else []:
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():
                dtype = dtypes.get(key) or dtypes.get(key.split(".", 1)[-1])
                if dtype is not None:
                    checked_weight(file, key, fh.get_tensor(key), dtype)
