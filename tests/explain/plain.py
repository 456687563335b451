"""A plain-PyTorch forward of one unpadded example through our post-LN Transformer or a BERT encoder,
written from the modules' weights with explicit per-head loops, for the context-mixing references.

Nothing here calls the model's own forward: the layers are recomputed from their parameters, so a
test comparing a method against quantities computed here checks the method against the definition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

from attnaudit.data.types import Batch
from attnaudit.hf import HFCollator
from attnaudit.models.hf import HFModel
from attnaudit.models.transformer import TransformerEncoderModel

Linear = tuple[Tensor, Tensor]
Norm = tuple[Tensor, Tensor, float]


@dataclass
class PlainLayer:
    """One post-LN layer's parameters: ``out = LN₂(h + ff₂(gelu(ff₁(h))))``, ``h = LN₁(x + o(attn))``."""

    q: Linear
    k: Linear
    v: Linear
    o: Linear
    ln1: Norm
    ff1: Linear
    ff2: Linear
    ln2: Norm
    heads: int


@dataclass
class LayerRun:
    """What a plain layer computed for one example of ``n`` tokens."""

    weights: Tensor  # (H, n, n)
    pre: Tensor  # LN₁ input x + attention output + b_O, (n, d)
    h: Tensor  # LN₁ output, (n, d)
    out: Tensor  # layer output, (n, d)


def _lin(m: nn.Linear) -> Linear:
    return m.weight.detach(), m.bias.detach()


def _norm(m: nn.LayerNorm) -> Norm:
    return m.weight.detach(), m.bias.detach(), float(m.eps)


def plain_layers(model: TransformerEncoderModel | HFModel) -> list[PlainLayer]:
    """The parameters of every layer of our Transformer or a BERT encoder."""
    if isinstance(model, TransformerEncoderModel):
        return [
            PlainLayer(_lin(b.q_proj), _lin(b.k_proj), _lin(b.v_proj), _lin(b.out_proj), _norm(b.attention_norm),
                       _lin(b.ffn[0]), _lin(b.ffn[2]), _norm(b.ffn_norm), b.heads)
            for b in model.layers
        ]
    return [
        PlainLayer(_lin(b.attention.self.query), _lin(b.attention.self.key), _lin(b.attention.self.value),
                   _lin(b.attention.output.dense), _norm(b.attention.output.LayerNorm), _lin(b.intermediate.dense),
                   _lin(b.output.dense), _norm(b.output.LayerNorm), model.config.heads)
        for b in model.layers
    ]


def linear(x: Tensor, wb: Linear) -> Tensor:
    return x @ wb[0].T + wb[1]


def layer_norm(z: Tensor, norm: Norm) -> Tensor:
    gamma, beta, eps = norm
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    return gamma * (z - mean) / torch.sqrt(var + eps) + beta


def gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def run_layer(layer: PlainLayer, x: Tensor, zero: int | None = None) -> LayerRun:
    """One layer on ``x`` ``(n, d)``; ``zero``: that token's value vector set to 0 in every head."""
    n, d = x.shape
    dh = d // layer.heads
    q, k, v = linear(x, layer.q), linear(x, layer.k), linear(x, layer.v)
    if zero is not None:
        v = torch.cat([v[:zero], torch.zeros_like(v[zero : zero + 1]), v[zero + 1 :]])
    weights, mixed = [], []
    for h in range(layer.heads):
        cols = slice(h * dh, (h + 1) * dh)
        a = torch.softmax(q[:, cols] @ k[:, cols].T / math.sqrt(dh), -1)
        weights.append(a)
        mixed.append(a @ v[:, cols])
    pre = x + linear(torch.cat(mixed, -1), layer.o)
    h = layer_norm(pre, layer.ln1)
    out = layer_norm(h + linear(gelu(linear(h, layer.ff1)), layer.ff2), layer.ln2)
    return LayerRun(torch.stack(weights), pre, h, out)


def head_logits(model: TransformerEncoderModel | HFModel, states: Tensor) -> Tensor:
    """The classifier on final states ``(n, d)``: mean pooling (ours) or BERT's tanh pooler on [CLS]."""
    if isinstance(model, TransformerEncoderModel):
        return linear(states.mean(0), _lin(model.classifier))
    pooled = torch.tanh(linear(states[0], _lin(model.hf.bert.pooler.dense)))
    return linear(pooled, _lin(model.hf.classifier))


def explanation_row(model: TransformerEncoderModel | HFModel, matrix: Tensor) -> Tensor:
    """Row ``[CLS]`` of a ``(n, n)`` map for BERT, the mean of its rows for our mean-pooled Transformer."""
    return matrix[0] if isinstance(model, HFModel) else matrix.mean(0)


def value_transform(layer: PlainLayer, x: Tensor, weights: Tensor, i: int, j: int) -> Tensor:
    """``Σ_h α^h_ij (x_j W_V^h + b_V^h) W_O^h``, one head's slices at a time, ``(d,)``."""
    d = x.shape[1]
    dh = d // layer.heads
    total = torch.zeros(d, dtype=x.dtype)
    for h in range(layer.heads):
        cols = slice(h * dh, (h + 1) * dh)
        value = x[j] @ layer.v[0][cols].T + layer.v[1][cols]
        total = total + weights[h, i, j] * (value @ layer.o[0][:, cols].T)
    return total


def shares(layer: PlainLayer, x: Tensor, run: LayerRun) -> Tensor:
    """``T_i(x_j)`` literally (Kobayashi et al. 2021): ``g_i(Σ_h α f_h(x_j) + δ_ij x_i)``, ``(n, n, d)``."""
    n = x.shape[0]
    gamma, _, eps = layer.ln1
    out = torch.zeros(n, n, x.shape[1], dtype=x.dtype)
    for i in range(n):
        scale = torch.sqrt(run.pre[i].var(unbiased=False) + eps)
        for j in range(n):
            part = value_transform(layer, x, run.weights, i, j) + (x[i] if i == j else 0.0)
            out[i, j] = gamma * (part - part.mean()) / scale
    return out


def rolled(maps: list[Tensor]) -> Tensor:
    """Rows of each ``(n, n)`` map divided by their sum, then ``R = C_L ⋯ C_1`` by explicit loops."""
    n = maps[0].shape[0]
    r = torch.eye(n, dtype=maps[0].dtype)
    for c in maps:
        normed = torch.stack([c[i] / c[i].sum() for i in range(n)])
        r = torch.stack([sum(normed[i, k] * r[k] for k in range(n)) for i in range(n)])
    return r


def tiny_llama(tiny_hf, dtype: torch.dtype = torch.float32) -> tuple[HFModel, nn.Module, Batch]:
    """A tiny random pre-RMSNorm Llama classifier (2 layers, 4 query heads on 2 key/value heads): our
    wrapper, the same weights as a plain HF model with eager attention, and a right-padded batch."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_hf.vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, num_labels=2)
    hf = LlamaForSequenceClassification(config).to(dtype).eval()
    reference = LlamaForSequenceClassification(config).to(dtype).eval()
    reference.load_state_dict(hf.state_dict())
    reference.set_attn_implementation("eager")
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(tiny_hf.vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]")
    model = HFModel(hf, tok, "classification", "llama", trained_head=True).eval()
    batch = HFCollator(tok, ["neg", "pos"], "classification", 64, token_types=False)(tiny_hf.task().test[:4])
    return model, reference, batch
