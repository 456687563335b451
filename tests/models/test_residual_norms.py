"""``residual_norms``, the traced layer ``outputs`` and ``Intervention(values=...)`` on every family that
has them: each layer's output recomputed from the trace (weights, values), ``value_output_maps`` and the
residual/norm/feed-forward pieces equals the output the model's own modules produced, for post-LN
(our Transformer, BERT, DistilBERT) and pre-norm (Llama and Qwen2 with RMSNorm, GPT-2 with LayerNorm)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForSequenceClassification,
)

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.hf import HFCollator
from attnaudit.models import ModelConfig, build_model
from attnaudit.models.hf import HFModel
from attnaudit.models.interface import AttentionModel, Intervention

FAMILIES = ("transformer", "bert", "distilbert", "llama", "qwen2", "gpt2")


def build(family: str, tiny_hf: SimpleNamespace) -> tuple[AttentionModel, Batch]:
    """A tiny random model of ``family`` (eval mode) and a padded batch of the tiny sentences."""
    torch.manual_seed(0)
    vocab = len(tiny_hf.vocab)
    if family == "transformer":
        config = ModelConfig(model="transformer", task_type="classification", vocab_size=vocab, num_labels=2,
                             embed_dim=16, d_model=16, heads=2, layers=2, d_ff=32, dropout=0.0)
        model = build_model(config).eval()
        ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]])
        return model, Batch(tokens=ids, mask=ids > 0)
    if family in ("bert", "distilbert"):
        hf = (BertForSequenceClassification(tiny_hf.config(num_labels=2)) if family == "bert" else
              DistilBertForSequenceClassification(DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64)))
        model = HFModel(hf.eval(), tiny_hf.tokenizer(), "classification", family, trained_head=False).eval()
        return model, HFCollator(tiny_hf.tokenizer(), ["neg", "pos"], "classification", 32, token_types=False)(tiny_hf.task().test)
    common = {"vocab_size": vocab, "pad_token_id": 0, "num_labels": 2}
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    hf = {
        "llama": lambda: LlamaForSequenceClassification(LlamaConfig(num_key_value_heads=2, **sizes, **common)),
        "qwen2": lambda: Qwen2ForSequenceClassification(Qwen2Config(num_key_value_heads=1, **sizes, **common)),
        "gpt2": lambda: GPT2ForSequenceClassification(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common)),
    }[family]()
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(tiny_hf.vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]")
    model = HFModel(hf.eval(), tok, "classification", family, trained_head=False).eval()
    return model, HFCollator(tok, ["neg", "pos"], "classification", 64, token_types=False)(tiny_hf.task().test)


def recomputed_output(model: AttentionModel, layer: int, record, values: torch.Tensor | None = None) -> torch.Tensor:  # noqa: ANN001
    """The layer's output from the trace and the interface's pieces alone."""
    pieces = model.residual_norms(layer)
    _, _, w_o, _ = model.value_output_maps(layer)
    values = record.values if values is None else values
    values = values.repeat_interleave(record.weights.shape[1] // values.shape[1], 1)  # a key/value head per query head
    b, h, t, dh = values.shape
    attended = (record.weights @ values).transpose(1, 2).reshape(b, t, h * dh) @ w_o
    if pieces.output_bias is not None:
        attended = attended + pieces.output_bias
    x = model.residual_stream(record)
    if pieces.placement == "post":
        mid = pieces.attention_norm(x + attended)
        return pieces.ffn_norm(mid + pieces.ffn(mid))
    torch.testing.assert_close(pieces.attention_norm(x), record.inputs, atol=1e-5, rtol=1e-4)  # the pre-norm
    mid = x + attended
    return mid + pieces.ffn(pieces.ffn_norm(mid))


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_outputs_recompose_from_residual_norms(family: str, tiny_hf: SimpleNamespace) -> None:
    model, batch = build(family, tiny_hf)
    assert model.has_residual_norms and model.value_interventions
    assert model.residual_norms(0).placement == ("post" if family in ("transformer", "bert", "distilbert") else "pre")
    with torch.no_grad():
        trace = model(batch).trace
        real = batch.mask.bool()
        for layer, record in enumerate(trace.layers):
            torch.testing.assert_close(recomputed_output(model, layer, record)[real], record.outputs[real], atol=1e-5, rtol=1e-4)
            if layer + 1 < len(trace):
                torch.testing.assert_close(model.residual_stream(trace[layer + 1]), record.outputs)


@pytest.mark.parametrize("family", FAMILIES)
def test_zeroing_a_tokens_values_acts_on_that_layer_only(family: str, tiny_hf: SimpleNamespace) -> None:
    """Token 1's value vectors zeroed in layer 1: layer 0 is unchanged, layer 1's output is the recomputation
    with those values zeroed, and a tensor replacement does the same as the function."""
    model, batch = build(family, tiny_hf)
    keep = torch.ones(batch.tokens.shape[1])
    keep[1] = 0.0
    with torch.no_grad():
        trace = model(batch).trace
        changed = model(batch, [Intervention(layer=1, values=lambda v: v * keep[:, None])]).trace
        again = model(batch, [Intervention(layer=-1, values=trace[1].values * keep[:, None])]).trace
    real = batch.mask.bool()
    torch.testing.assert_close(changed[0].outputs, trace[0].outputs)
    expected = recomputed_output(model, 1, changed[1], values=trace[1].values * keep[:, None])
    torch.testing.assert_close(changed[1].outputs[real], expected[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(again[1].outputs, changed[1].outputs)
    assert not torch.allclose(changed[1].outputs[real], trace[1].outputs[real])


def test_families_without_them_say_so(tiny_hf: SimpleNamespace) -> None:
    config = ModelConfig(model="bilstm", task_type="classification", vocab_size=10, num_labels=2, embed_dim=8, hidden_dim=4)
    model = build_model(config)
    assert not model.has_residual_norms and not model.value_interventions
    with pytest.raises(AttnAuditError, match="no residual connections and layer norms"):
        model.residual_norms(0)


@pytest.mark.parametrize("family", ["transformer", "bert", "distilbert"])
def test_head_layers_recompute_the_logits(family: str, tiny_hf: SimpleNamespace) -> None:
    """Pooling then the dense layers of ``head_layers`` on the last layer's outputs give the model's logits."""
    model, batch = build(family, tiny_hf)
    head = model.head_layers()
    with torch.no_grad():
        out = model(batch)
        states = out.trace[-1].outputs
        if head.pool == "first":
            x = states[:, 0]
        else:
            real = batch.mask[..., None].to(states.dtype)
            x = (states * real).sum(1) / real.sum(1)
        for weight, bias, act in head.layers:
            x = x @ weight + bias
            x = x if act is None else act(x)
    torch.testing.assert_close(x, out.logits, atol=1e-5, rtol=1e-4)
