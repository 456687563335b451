"""The one model interface every experiment talks to.

Every model family (additive/dot attention classifiers, the pair/QA variant, HAN,
Transformers, Hugging Face encoders, the NMT model) is an :class:`AttentionModel`:

* ``forward(batch, interventions)`` returns :class:`ModelOutput` — logits plus an
  :class:`AttentionTrace` with, per attention layer, the weights as
  ``(batch, heads, query, key)`` (the Hugging Face convention), the keys, values,
  the states that entered attention and the key padding mask.
* ``encode(batch)`` runs everything *before* the first attention layer and returns a
  :class:`Cache`; ``decode(cache, interventions, start_layer)`` runs attention layer
  ``start_layer`` and everything after it.  ``forward == decode(encode(...))``.
  Experiments that only change attention (permutation, adversarial search, erasure)
  encode once and decode many times.
* Interventions (:class:`Intervention`) replace weights (a tensor or a function of
  the computed weights), replace keys, swap the normaliser, or freeze attention to
  uniform / supplied distributions, per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

import torch
from torch import Tensor, nn

from attnaudit.errors import AttnAuditError

TaskType = Literal["classification", "pair", "tagging", "seq2seq"]
WeightsFn = Callable[[Tensor, Tensor], Tensor]
"""``fn(weights (B,H,Q,K), key_mask (B,K) bool) -> new weights (B,H,Q,K)``."""
KeysFn = Callable[[Tensor], Tensor]
ValuesFn = Callable[[Tensor], Tensor]
"""``fn(values (B,H,K,dh)) -> new values``, e.g. one token's value vector zeroed (Value Zeroing)."""


@dataclass
class Intervention:
    """A change to one attention layer (``layer=None``: every layer).

    ``weights``: a ``(B,H,Q,K)`` tensor (broadcastable) or a :data:`WeightsFn`, applied
    after the normaliser. ``keys``: a tensor shaped like the layer's keys, or a function
    of them, applied before scoring. ``normaliser``: evaluate with another normaliser
    (``softmax``, ``entmax15``, ``sparsemax``, ``entmax:<alpha>``). ``values``: a tensor
    shaped like the layer's per-head values ``(B,H,K,dh)`` or a function of them, applied
    before they are weighted; only models with :attr:`AttentionModel.value_interventions`.
    """

    layer: int | None = None
    weights: Tensor | WeightsFn | None = None
    keys: Tensor | KeysFn | None = None
    normaliser: str | None = None
    values: Tensor | ValuesFn | None = None


def uniform_weights(weights: Tensor, mask: Tensor) -> Tensor:
    """Uniform distribution over the real (unmasked) keys, shaped like ``weights``."""
    m = mask[:, None, None, :].to(weights.dtype).expand_as(weights)
    return m / m.sum(-1, keepdim=True).clamp_min(1.0)


def freeze_uniform(layer: int | None = None) -> Intervention:
    """Attention frozen to uniform over real tokens (Wiegreffe & Pinter's baseline)."""
    return Intervention(layer=layer, weights=uniform_weights)


def freeze_to(distributions: Tensor, layer: int | None = None) -> Intervention:
    """Attention frozen to supplied distributions ``(B,H,Q,K)`` (no gradient flows to them)."""
    return Intervention(layer=layer, weights=distributions.detach())


def detached(weights: Tensor, _mask: Tensor) -> Tensor:
    """The weights as a constant (:func:`detach_weights`); a fused attention kernel reaches the same by detaching
    the queries and keys it scores (:func:`only_detaches`)."""
    return weights.detach()


def detach_weights(layer: int | None = None) -> Intervention:
    """Treat attention as a constant: gradients flow only through values (J&W's gradient)."""
    return Intervention(layer=layer, weights=detached)


def only_detaches(interventions: Sequence[Intervention]) -> bool:
    """Every intervention is :func:`detach_weights`: the weights' values stay the model's own (none at all: True)."""
    return all(
        iv.weights is detached and iv.keys is None and iv.values is None and iv.normaliser is None for iv in interventions
    )


@dataclass
class AttentionLayer:
    """What one attention computation saw and produced.

    ``weights`` (B,H,Q,K); ``scores`` the pre-normaliser logits (same shape, -inf at
    padding) or None; ``keys``/``values`` (B,H,K,d) (additive attention: H=1; a Hugging Face
    grouped-query layer records one per key/value head, :func:`~attnaudit.models.hf.attention.per_group`);
    ``inputs`` (B,K,d) the states that entered the layer; ``mask`` (B,K) True at real
    keys; ``query_mask`` (B,Q) True at real queries; ``outputs`` (B,Q,d) the states that
    left the whole layer (after its feed-forward block), where the family records them
    (:attr:`AttentionModel.has_residual_norms`).
    """

    weights: Tensor
    mask: Tensor
    inputs: Tensor
    keys: Tensor | None = None
    values: Tensor | None = None
    scores: Tensor | None = None
    query_mask: Tensor | None = None
    name: str = ""
    outputs: Tensor | None = None
    rows: Tensor | None = None
    """``(B,)`` where ``weights`` hold one query row per instance (``Q = 1``): its position in the layer
    (a pass that computed only the rows explanations read, :meth:`AttentionModel.rows_forward`); None: every row."""


@dataclass
class NormParams:
    """One normalisation as it acts on a vector ``z``: ``γ ⊙ (z − mean z) / sqrt(var z + eps) + β``
    (LayerNorm, ``centred``) or ``γ ⊙ z / sqrt(mean z² + eps)`` (RMSNorm, not centred, no β)."""

    weight: Tensor
    bias: Tensor | None
    eps: float
    centred: bool = True

    def scale(self, z: Tensor) -> Tensor:
        """``sqrt(var z + eps)`` (RMSNorm: ``sqrt(mean z² + eps)``) over the last axis, keeping it."""
        spread = z.var(-1, unbiased=False, keepdim=True) if self.centred else z.pow(2).mean(-1, keepdim=True)
        return (spread + self.eps).sqrt()

    def linear(self, part: Tensor, scale: Tensor) -> Tensor:
        """The linear part of the norm applied to one summand ``part`` of ``z`` with ``z``'s ``scale``:
        ``γ ⊙ (part − mean part) / scale`` (no β), so the parts of ``z`` add up to ``norm(z) − β``."""
        centred = part - part.mean(-1, keepdim=True) if self.centred else part
        return self.weight * centred / scale

    def __call__(self, z: Tensor) -> Tensor:
        out = self.linear(z, self.scale(z))
        return out if self.bias is None else out + self.bias


Dense = tuple[Tensor, "Tensor | None", "Callable[[Tensor], Tensor] | None"]
"""One dense layer as ``(W, b, act)``: ``act(z @ W + b)`` (``W`` right-multiplied; ``act`` None: linear)."""


def dense(linear: nn.Linear, act: Callable[[Tensor], Tensor] | None = None) -> Dense:
    """A Linear (and the activation after it) as ``(W, b, act)`` with ``W`` right-multiplied."""
    return linear.weight.t(), linear.bias, act


@dataclass
class HeadLayers:
    """A classification head as pooling then dense layers (DecompX decomposes it): ``pool`` ``"first"``
    (the ``[CLS]`` state) or ``"mean"`` (over real tokens), then ``layers`` in order; the last gives logits."""

    pool: Literal["first", "mean"]
    layers: tuple[Dense, ...]


@dataclass
class ResidualNorms:
    """What surrounds the attention of one layer (Kobayashi et al. 2021), for context-mixing analyses.

    ``placement`` ``"post"`` (BERT, our Transformer): ``h = LN₁(x + attn(x) + b_O)``, then
    ``out = LN₂(h + ffn(h))``. ``"pre"`` (Llama, GPT-2): ``h = x + attn(LN₁(x)) + b_O``, then
    ``out = h + ffn(LN₂(h))``; the trace's ``inputs`` are then ``LN₁(x)`` and ``residual`` is ``x``.
    ``"sandwich"`` (Gemma 2/3): ``h = x + P₁(attn(LN₁(x)) + b_O)``, ``out = h + P₂(ffn(LN₂(h)))`` with
    ``post_norms = (P₁, P₂)``. ``"parallel"`` (GPT-J, Phi, GPT-NeoX): ``out = x + attn(LN₁(x)) + b_O +
    ffn(LN₂(x))``. ``output_bias`` is ``b_O`` (None: no bias); ``ffn`` the feed-forward map alone (no
    residual, no norm, no dropout); ``ffn_layers`` the same map as dense layers where it is one (empty
    otherwise, e.g. Llama's gated MLP).
    """

    placement: Literal["post", "pre", "sandwich", "parallel"]
    attention_norm: NormParams
    ffn_norm: NormParams
    output_bias: Tensor | None
    ffn: Callable[[Tensor], Tensor]
    ffn_layers: tuple[Dense, ...] = ()
    post_norms: tuple[NormParams, NormParams] | None = None

    # The placement's equations, written once here: the context-mixing methods read them, so a new block
    # layout is a new ``placement`` (found by :mod:`attnaudit.models.hf.layouts`) and its case below.

    def output(self, summed: Tensor, x: Tensor) -> Tensor:
        """The layer's output from the attention block's summed input to its first residual ``summed`` ``(..., d)``
        (``x + o``, ``x`` the residual stream): post-LN ``LN₂(h + ffn(h))`` with ``h = LN₁(summed)``; pre-LN
        ``summed + ffn(LN₂(summed))``; sandwich ``h + P₂(ffn(LN₂(h)))`` with ``h = x + P₁(summed − x)``;
        parallel ``summed + ffn(LN₂(x))``."""
        if self.placement == "pre":
            return summed + self.ffn(self.ffn_norm(summed))
        if self.placement == "parallel":
            return summed + self.ffn(self.ffn_norm(x))
        if self.placement == "sandwich":
            assert self.post_norms is not None
            h = x + self.post_norms[0](summed - x)
            return h + self.post_norms[1](self.ffn(self.ffn_norm(h)))
        h = self.attention_norm(summed)
        return self.ffn_norm(h + self.ffn(h))

    def attention_shares(self, parts: Tensor, whole: Tensor, x: Callable[[], Tensor], pairs: Callable[[], Tensor]) -> Tensor:
        """``T_i(x_j)`` ``(B,Q,K,d)``: token ``j``'s share of token ``i``'s output of the attention block, from its
        shares ``parts`` of the summed input to the first residual and that sum ``whole`` ``(B,Q,d)``: pre-LN and
        parallel (whose feed-forward branch reads ``x_i`` alone) the parts themselves; post-LN the first norm's linear
        part of them; sandwich ``x_i`` plus ``P₁``'s linear part of each share of ``o_i``. ``x`` and ``pairs`` (the
        residual stream ``(B,T,d)`` and the real pairs ``(B,Q,K)``) are asked for only where the layout reads them."""
        if self.placement in ("pre", "parallel"):
            return parts
        if self.placement == "sandwich":
            assert self.post_norms is not None
            stream = x()
            eye = torch.eye(stream.shape[1], dtype=stream.dtype, device=stream.device)[None, :, :, None] * stream[:, :, None, :] * pairs()[..., None]
            first = self.post_norms[0]
            return first.linear(parts - eye, first.scale(whole - stream)[:, :, None]) + eye
        return self.attention_norm.linear(parts, self.attention_norm.scale(whole)[:, :, None])


@dataclass
class AttentionTrace:
    """All attention layers of one forward pass, in order."""

    layers: list[AttentionLayer] = field(default_factory=list)

    @property
    def weights(self) -> tuple[Tensor, ...]:
        """Attention per layer as a tuple of ``(batch, heads, query, key)``, like HF."""
        return tuple(layer.weights for layer in self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> AttentionLayer:
        return self.layers[i]

    def __iter__(self) -> Iterator[AttentionLayer]:
        return iter(self.layers)

    def thinned(self, keep: Collection[int]) -> AttentionTrace:
        """This trace with only the weights and masks of the layers not in ``keep`` (indices): what
        tests reading attention distributions need, in a fraction of the memory (their states, keys,
        values and scores are dropped; ``inputs`` becomes an empty ``(…, 0)`` tensor)."""
        layers = []
        for index, layer in enumerate(self.layers):
            if index in keep:
                layers.append(layer)
                continue
            dropped: dict[str, Any] = {f.name: None for f in fields(layer) if f.name in _THINNED}
            layers.append(replace(layer, inputs=layer.inputs.new_empty((*layer.inputs.shape[:-1], 0)), **dropped))
        return AttentionTrace(layers)

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors of every layer's record."""
        return sum(
            value.numel() * value.element_size()
            for layer in self.layers
            for value in (getattr(layer, f.name) for f in fields(layer))
            if isinstance(value, Tensor)
        )


_THINNED = ("keys", "values", "scores", "outputs", "residual")
"""Record fields :meth:`AttentionTrace.thinned` drops (a decoder's records add ``residual``)."""


@dataclass
class Cache:
    """States entering attention layer ``layer``; enough to rerun the rest of the model.

    ``states`` (B,K,d); ``mask`` (B,K); ``extra`` carries family-specific tensors
    (the question encoding of the pair/QA model, HAN's sentence structure, ...).
    """

    states: Tensor
    mask: Tensor
    layer: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def select(self, rows: Tensor) -> Cache:
        """The cache of instances ``rows`` (repeats allowed): per-instance tensors of ``extra`` and
        extras with a ``select_rows`` method (a decoder's key/value prefix) are indexed too."""
        size = self.states.shape[0]

        def pick(value: Any) -> Any:
            if isinstance(value, Tensor):
                return value.index_select(0, rows) if value.dim() and value.shape[0] == size else value
            return value.select_rows(rows) if hasattr(value, "select_rows") else value

        extra = {key: pick(value) for key, value in self.extra.items()}
        return Cache(self.states.index_select(0, rows), self.mask.index_select(0, rows), self.layer, extra)


@dataclass
class ModelOutput:
    """Logits ``(B,C)`` (classification) or ``(B,T,C)`` (tagging) and the attention trace."""

    logits: Tensor
    trace: AttentionTrace

    @property
    def probs(self) -> Tensor:
        return self.logits.softmax(-1)


@dataclass
class ModelConfig:
    """Everything needed to rebuild a model; saved as ``config.json`` next to the weights."""

    model: str
    task_type: TaskType
    vocab_size: int
    num_labels: int
    embed_dim: int = 300
    hidden_dim: int = 128
    scorer: Literal["tanh", "dot"] = "tanh"
    attention: str = "softmax"
    layers: int = 1
    heads: int = 4
    d_model: int = 128
    d_ff: int = 256
    dropout: float = 0.1
    max_len: int = 512
    pad_id: int = 0
    cnn_kernels: tuple[int, ...] = (1, 3, 5, 7)
    cnn_filters: int = 32
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "cnn_kernels" in kwargs:
            kwargs["cnn_kernels"] = tuple(kwargs["cnn_kernels"])
        return cls(**kwargs)

    def with_(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)


class AttentionModel(nn.Module):
    """Base class: subclasses implement ``embed``, ``encode`` and ``decode``.

    ``explained_layer`` names the attention layer the single-attention tests
    (importance, permutation, adversarial, erasure) examine: the only one for the
    additive models, the sentence level for HAN, the last layer for Transformers.
    ``explanation_query`` says which query row of that layer explains the decision.
    """

    config: ModelConfig
    explained_layer: int = -1
    explanation_query: int | None = None
    """The query row whose attention explains a classification ([CLS]: 0); None = mean over real queries.
    Where the row differs per example (a decoder's last real token), see :meth:`explanation_rows`."""
    causal: bool = False
    self_attention: bool = False
    """Whether the attention layers are stacked token-to-token self-attention over the input
    (Transformers, Hugging Face encoders and decoders): what rollout and flow compose."""
    """Whether each query reads only itself and earlier keys (decoder-only language models)."""
    trained_head: bool = True
    """Whether the output head was trained; an untrained head (a bare Hugging Face encoder) makes
    no prediction to explain, so gradient, leave-one-out and prediction tests do not apply."""
    streams_layers: bool = False
    """Whether ``decode`` takes ``keep_layers`` and ``on_layer`` (see :meth:`~attnaudit.models.hf.model.HFModel.decode`): each
    layer's record is handed over as it finishes and only the named layers stay in the trace."""
    # The two capability flags below are read-only properties so that a family may compute them
    # (HFModel does); the others override them with a plain class attribute (``= True``).

    @property
    def has_value_output(self) -> bool:
        """Whether :meth:`value_output_maps` exists: multi-head attention with per-head value and output
        projections (the norm analysis and identifiability need them)."""
        return False

    @property
    def has_residual_norms(self) -> bool:
        """Whether :meth:`residual_norms` exists and the trace records each layer's ``outputs``: what
        the attention + residual + layer-norm decompositions (Kobayashi et al. 2021, GlobEnc, ALTI) need."""
        return False
    value_interventions: bool = False
    """Whether ``Intervention(values=...)`` reaches every self-attention layer (Value Zeroing)."""
    supports_lrp: bool = False
    """Whether :meth:`relevance_sites` exists and the attention calls
    :func:`attnaudit.models.lrp.attention_operands`: what AttnLRP and CP-LRP need."""
    target_items: bool = False
    """Whether the explained items include an encoder-decoder's earlier target tokens after its source
    (within :meth:`LanguageModel.target_side`)."""
    tokenizer: Any = None
    """The subword tokenizer of a model that reads text through one (a :class:`LanguageModel`); None for the
    word-level families, whose items are the words."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config

    @property
    def num_attention_layers(self) -> int:
        raise NotImplementedError

    def embed(self, batch: Any) -> Tensor:
        """Input embeddings ``(B,T,E)`` (or ``(B,S,W,E)`` for HAN): the gradient target."""
        raise NotImplementedError

    def encode(self, batch: Any, embeddings: Tensor | None = None) -> Cache:
        """Everything before attention layer 0, optionally from given embeddings."""
        raise NotImplementedError

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
    ) -> ModelOutput:
        """Attention layer ``start_layer`` (default ``cache.layer``) and all after it.

        The returned trace holds only the layers that were run.
        """
        raise NotImplementedError

    def explanation_rows(self, query_mask: Tensor) -> int | Tensor | None:
        """The query row explaining each example of a batch with query mask ``(B,Q)``:
        :attr:`explanation_query` for all (an int, or None: the mean over real queries), or one
        index per example ``(B,)`` (decoders: the last real token). Read it with :func:`take_rows`."""
        return self.explanation_query

    def embeddings_shift_invariant(self) -> bool:
        """Whether the decision ignores a constant added to every dimension of every input embedding, as when every
        path from the embeddings passes a LayerNorm (it subtracts their mean): a gradient w.r.t. them then sums to 0
        over the dimensions. Families without such norms keep this default."""
        return False

    def lacks(self, need: str) -> str | None:
        """Why this model lacks a structural ``need`` (``value_output``, ``residual_norms``, ``lrp``), or None.
        Families that find their structure (Hugging Face models) say precisely what was not found."""
        name = type(self).__name__
        if need == "value_output":
            return None if self.has_value_output else f"{name} attention has no per-head value/output projections"
        if need == "residual_norms":
            found = self.self_attention and self.has_value_output and self.has_residual_norms
            return None if found else f"{name} exposes no residual connections and layer norms around stacked self-attention"
        if need == "lrp":
            return None if self.supports_lrp else f"{name} has no layer-wise relevance propagation rules"
        raise AttnAuditError(f"unknown model need {need!r}")

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` of attention layer ``layer`` as right-multiplied maps
        (``v = x @ W_V + b_V``; output ``concat_heads(sum_j a_ij v_j) @ W_O``), for families with
        :attr:`has_value_output`."""
        raise AttnAuditError(f"{type(self).__name__} attention has no per-head value/output projections")

    def residual_norms(self, layer: int) -> ResidualNorms:
        """The residual connections, norms, output bias and feed-forward map around attention layer
        ``layer``, for families with :attr:`has_residual_norms`."""
        raise AttnAuditError(f"{type(self).__name__} exposes no residual connections and layer norms around attention")

    def relevance_sites(self) -> Any:
        """The norms, activations and gated products whose backward pass LRP changes
        (:class:`attnaudit.models.lrp.RelevanceSites`), for families with :attr:`supports_lrp`."""
        raise AttnAuditError(f"{type(self).__name__} has no layer-wise relevance propagation rules")

    def head_layers(self) -> HeadLayers | None:
        """The classification head as pooling + dense layers, or None where it is not one (or absent)."""
        return None

    def residual_stream(self, record: AttentionLayer) -> Tensor:
        """The states ``x`` the residual connection of a traced layer carries ``(B,T,d)``: the layer's
        ``inputs`` (post-LN); pre-LN families override it (their ``inputs`` are normalised)."""
        return record.inputs

    @property
    def cross_layers(self) -> list[int]:
        """Trace indices of encoder-decoder cross-attention layers (none outside seq2seq)."""
        return []

    @property
    def special_tokens(self) -> dict[str, str]:
        """Marker tokens the tokenizer adds (``{"cls": "[CLS]", "sep": "[SEP]"}``); none for word models."""
        return {}

    def wordpieces(self, batch: Any) -> list[list[str]] | None:
        """The subword strings on the key axis of each example, or None when items are the words."""
        return None

    def block_first_layer(self, layer: int) -> int:
        """The first attention layer of trace layer ``layer``'s block (an encoder-decoder's cross-attention layer:
        the decoder self-attention before it); ``layer`` itself where a block holds one attention layer."""
        return layer

    def rerun_cache(self, trace: AttentionTrace, layer: int, base: Cache, rows: Tensor) -> Cache | None:
        """A cache restarting at trace layer ``layer`` at one position per example, ``rows`` ``(B,)``, the
        other positions read from ``trace`` (a decoder's predicting token:
        :meth:`~attnaudit.models.hf.model.HFModel.rerun_cache`); None where the family cannot."""
        return None

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """A cache that restarts the model at attention layer ``layer`` of ``trace``.

        The default takes the states that entered that layer; families whose later
        layers need more (HAN's sentence structure) override it.
        """
        layer = layer % max(len(trace), 1)
        entry = trace[layer]
        return Cache(states=entry.inputs, mask=entry.mask, layer=layer, extra=dict(base.extra))

    def forward(
        self,
        batch: Any,
        interventions: Sequence[Intervention] = (),
        embeddings: Tensor | None = None,
    ) -> ModelOutput:
        return self.decode(self.encode(batch, embeddings), interventions)

    def logits_forward(
        self, batch: Any, interventions: Sequence[Intervention] = (), embeddings: Tensor | None = None
    ) -> ModelOutput:
        """``self(batch, interventions, embeddings)`` for a caller that reads the logits alone (gradients, perturbed
        inputs): a family may skip what no logit needs (Hugging Face models: the trace, and the last block's
        position-wise tail beyond the read rows); the others run the whole pass."""
        return self(batch, interventions, embeddings)

    def rows_forward(self, batch: Any) -> ModelOutput:
        """``self(batch)`` for a caller that reads each layer's weights at the explanation rows alone
        (:meth:`explanation_rows`). Families that can compute just those rows return them (``Q = 1``,
        :attr:`AttentionLayer.rows`); the others every row."""
        return self(batch)

    def prefix_gradient_forward(self, batch: Any, embeddings: Tensor | None = None) -> tuple[Tensor, Tensor, ModelOutput] | None:
        """For a batch whose rows are prefixes of one sequence (a causal decoder's generated steps): that sequence's
        embeddings ``(1,T,d)`` (requiring grad; ``embeddings``: these instead of its own, e.g. a point of Integrated
        Gradients' path), the rows' read positions ``(B,)`` and the logits ``(B, C)`` of every row from one lean pass over
        the sequence, so that each row's gradient is a batched backward of that pass; None where the family or the batch
        does not allow it (the default)."""
        return None



class LanguageModel(AttentionModel):
    """An :class:`AttentionModel` that reads text through a subword ``tokenizer`` and predicts tokens: an encoder
    (``kind`` ``"encoder"``), a causal LM (``"decoder"``) or an encoder-decoder (``"encoder-decoder"``). What generic
    code (explanations of next tokens and generated sequences, the generation test) needs of such a model beyond
    :class:`AttentionModel`; the Hugging Face adapter implements it. Reach it with :func:`language_model`."""

    kind: str = "encoder"
    streams_layers = True
    verbalizer_ids: Tensor | None = None
    """A decoder classifying zero-shot: the verbalizer's first token per class (its outputs are those logits)."""

    @property
    def input_device(self) -> Any:
        """Where a batch goes (a model spread over devices: its input embeddings')."""
        raise NotImplementedError

    @property
    def decoder_start(self) -> int:
        """An encoder-decoder's decoder start token."""
        raise NotImplementedError

    @property
    def generates(self) -> bool:
        """Whether it makes tokens: an encoder-decoder, or a causal LM whose output is the next token
        (not one classifying zero-shot)."""
        return self.kind == "encoder-decoder" or self.config.extra.get("output") == "next_token"

    def next_token_decision(self) -> AbstractContextManager[Any]:
        """Within: the output is the next-token distribution over the whole vocabulary (a causal LM)."""
        raise NotImplementedError

    def unverbalized(self) -> AbstractContextManager[Any]:
        """Within: a decoder classifying zero-shot (prompt and verbalizer) is its causal LM again; others unchanged."""
        raise NotImplementedError

    def forced_decision(self) -> AbstractContextManager[Any]:
        """Within: an encoder-decoder's output is the next-token distribution after its (forced) target."""
        raise NotImplementedError

    def target_side(self) -> AbstractContextManager[Any]:
        """Within: an encoder-decoder's explained items are its source and earlier target tokens."""
        raise NotImplementedError

    def continuation(
        self, source: Sequence[int], count: int, sample: bool = False, seed: int = 0, keep_rows: bool = False
    ) -> tuple[list[int], Tensor]:
        """Up to ``count`` tokens after ``source`` and the distribution each came from (``keep_rows``: the attention rows
        the generation made are kept for :meth:`AttentionModel.rows_forward` of its steps, where the family can)."""
        raise NotImplementedError

    def forced_distributions(self, source: Sequence[int], target: Sequence[int]) -> Tensor:
        """The next-token distribution before each token of a forced ``target``."""
        raise NotImplementedError

    def rows_logits(self, cache: Cache, rows: Tensor) -> Tensor:
        """The output ``(R, C)`` at positions ``rows`` ``(R,)`` of the one sequence of ``cache`` (a causal decoder's
        :meth:`encode`, a :meth:`prefix_from` prefix in ``cache.extra["prefix"]`` allowed), or ``(B·R, C)`` at ``rows``
        ``(B, R)`` of a batch's right-padded sequences: a logits-only pass, each row read as if its sequence ended there
        (teacher forcing several tokens at once)."""
        raise NotImplementedError

    def prefix_from(self, trace: AttentionTrace, rows: Tensor, lengths: Tensor) -> Any:
        """The first ``lengths[r]`` tokens of example ``rows[r]`` of a full ``trace``, for :meth:`decode` to continue from."""
        raise NotImplementedError

    @property
    def continues_prefix(self) -> bool:
        """Whether :meth:`decode` can continue after :meth:`prefix_from`'s prefix."""
        return False

    def decode(
        self,
        cache: Cache,
        interventions: Sequence[Intervention] = (),
        start_layer: int | None = None,
        keep_layers: Collection[int] | None = None,
        on_layer: Callable[[int, AttentionLayer], None] | None = None,
    ) -> ModelOutput:
        """As :meth:`AttentionModel.decode`; ``on_layer(index, record)`` sees each layer's record as it finishes and
        the trace keeps only ``keep_layers`` (None: all)."""
        raise NotImplementedError


def language_model(model: AttentionModel, purpose: str = "this") -> LanguageModel:
    """``model`` as a :class:`LanguageModel`; a one-line error naming ``purpose`` when it reads no text through a tokenizer."""
    if not isinstance(model, LanguageModel):
        raise AttnAuditError(f"{purpose} needs a model that reads text through a tokenizer (a Hugging Face model)")
    return model

@contextmanager
def replaced_forwards(forwards: dict[nn.Module, Callable[..., Any]]) -> Iterator[None]:
    """Within the block each module's ``forward`` is the one given (an instance attribute); on exit each
    gets back exactly what it had, an instance-level ``forward`` of its own (accelerate's hooks) included."""
    previous = {module: module.__dict__.get("forward") for module in forwards}
    try:
        for module, forward in forwards.items():
            module.forward = forward
        yield
    finally:
        for module, old in previous.items():
            if old is None:
                del module.forward
            else:
                module.forward = old


def own_forward(module: nn.Module) -> Callable[..., Any]:
    """The ``forward`` a module runs now: an instance-level one if set (accelerate's hooks), else its class's."""
    return module.__dict__.get("forward") or type(module).forward.__get__(module)


@contextmanager
def evaluation(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the duration, then the model's previous mode again. A model already in eval mode
    throughout is left alone (``train()`` walks every module: a few milliseconds per call on a 30-layer model)."""
    if not any(module.training for module in model.modules()):
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def layer_range(cache: Cache, start_layer: int | None, n: int) -> range:
    """The layers a stacked model's ``decode`` runs: ``start_layer`` (default ``cache.layer``;
    negative counts from the end) up to the last of ``n``."""
    start = cache.layer if start_layer is None else start_layer
    if not -n <= start < n:
        raise AttnAuditError(f"start_layer {start} out of range for a {n}-layer model")
    return range(start % n, n)


def take_rows(values: Tensor, rows: int | Tensor, dim: int) -> Tensor:
    """``values`` (batch first) at query row ``rows`` along axis ``dim``, which is dropped: the same
    row for every example (an int) or one per example (a ``(B,)`` index, :meth:`AttentionModel.explanation_rows`)."""
    if isinstance(rows, int):
        return values.select(dim, rows)
    shape = [-1] + [1] * (values.dim() - 1)
    index = rows.to(values.device).view(shape).expand(*values.shape[:dim], 1, *values.shape[dim + 1 :])
    return values.gather(dim, index).squeeze(dim)


def interventions_for(interventions: Sequence[Intervention], layer: int, num_layers: int) -> list[Intervention]:
    """The interventions that apply to attention layer ``layer`` of ``num_layers``, in order.

    Negative layer numbers count from the end, as in ``Intervention(layer=model.explained_layer)``.
    """
    return [
        iv
        for iv in interventions
        if iv.layer is None or iv.layer == layer or (iv.layer < 0 and iv.layer % num_layers == layer)
    ]
