"""The encoder-decoder Transformer: trace layout, masking, restarts, W_V/W_O maps, training and loading."""

from __future__ import annotations

import json

import pytest
import torch

from attnaudit.data.word_alignments import EOS_ID, Seq2SeqCollator, SubwordTokenizer, synthetic_translation
from attnaudit.errors import AttnAuditError
from attnaudit.explain.helpers.norms import transformed_inputs
from attnaudit.models.interface import ModelConfig, freeze_uniform
from attnaudit.models.seq2seq import Seq2SeqTransformer
from attnaudit.models.transformer import merge_heads
from attnaudit.progress import set_quiet
from attnaudit.run import load_run
from attnaudit.training.nmt import train_nmt, translate


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    data = synthetic_translation(0, n_train=60, n_dev=4, n_test=4)
    source = SubwordTokenizer.train((ex.tokens for ex in data.train), 80)
    target = SubwordTokenizer.train((ex.target or [] for ex in data.train), 80)
    config = ModelConfig(
        model="nmt", task_type="seq2seq", vocab_size=len(source), num_labels=len(target), embed_dim=16,
        layers=2, heads=2, d_model=16, d_ff=32, dropout=0.0, max_len=128,
    )
    model = Seq2SeqTransformer(config).eval()
    collate = Seq2SeqCollator(source, target)
    return model, collate, data.train[:3]


def test_trace_layout_and_shapes(setup):
    model, collate, examples = setup
    batch = collate(examples)
    out = model(batch)
    b, s = batch.tokens.shape
    t = batch.target.shape[1]
    assert out.logits.shape == (b, t, model.config.num_labels)
    assert [layer.name for layer in out.trace.layers] == ["enc0", "enc1", "self0", "cross0", "self1", "cross1"]
    assert model.cross_layers == [3, 5] and model.explained_layer == 5 and model.num_attention_layers == 6
    cross = out.trace[3]
    assert cross.weights.shape == (b, 2, t, s) and cross.inputs.shape == (b, s, 16)
    assert torch.equal(cross.mask, batch.mask) and torch.equal(cross.query_mask, batch.target_mask)
    sums = cross.weights.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums))
    assert cross.weights.masked_select(~batch.mask[:, None, None, :]).abs().max() == 0


def test_decoder_self_attention_is_causal(setup):
    model, collate, examples = setup
    batch = collate(examples)
    weights = model(batch).trace[2].weights
    future = torch.ones(weights.shape[-2:], dtype=torch.bool).triu(1)
    assert weights[..., future].abs().max() == 0
    changed = collate(examples)
    changed.target[:, -1] = (changed.target[:, -1] + 5) % model.config.num_labels
    t = batch.target.shape[1]
    assert torch.allclose(model(batch).logits[:, : t - 1], model(changed).logits[:, : t - 1], atol=1e-5)


def test_padding_does_not_change_a_sentence(setup):
    model, collate, examples = setup
    alone = model(collate(examples[:1])).logits[0]
    padded = model(collate(examples)).logits[0, : alone.shape[0]]
    assert torch.allclose(alone, padded, atol=1e-5)


def test_restart_from_any_encoder_or_decoder_self_layer(setup):
    model, collate, examples = setup
    batch = collate(examples)
    cache = model.encode(batch)
    full = model.decode(cache)
    for layer in (0, 1, 2, 4, -2):
        part = model.decode(model.cache_at(full.trace, layer, cache))
        assert torch.allclose(part.logits, full.logits, atol=1e-5)
    with pytest.raises(AttnAuditError, match="cannot restart at cross-attention"):
        model.cache_at(full.trace, 3, cache)
    with pytest.raises(AttnAuditError, match="teacher-forced"):
        model(collate([type(examples[0])(tokens=examples[0].tokens)]))


def test_value_output_maps_rebuild_the_cross_attention_output(setup):
    model, collate, examples = setup
    batch = collate(examples)
    record = model(batch).trace[5]
    block = model.decoder[1].cross
    direct = block.out_proj(merge_heads(record.weights @ record.values))
    f = transformed_inputs(model, record, 5)  # (B,H,S,d) through value_output_maps
    rebuilt = torch.einsum("bhts,bhsd->btd", record.weights, f) + block.out_proj.bias
    assert torch.allclose(direct, rebuilt, atol=1e-5)


def test_interventions_reach_cross_attention(setup):
    model, collate, examples = setup
    batch = collate(examples)
    out = model(batch, [freeze_uniform(-1)])
    weights = out.trace[5].weights
    expected = batch.mask[:, None, None, :].float() / batch.mask.sum(1)[:, None, None, None]
    assert torch.allclose(weights, expected.expand_as(weights))
    assert not torch.allclose(out.trace[3].weights, weights)


def test_greedy_stops_and_is_bounded(setup):
    model, collate, examples = setup
    batch = collate([type(ex)(tokens=ex.tokens) for ex in examples])
    outputs = model.greedy(batch, max_len_a=1.0, max_len_b=3)
    assert len(outputs) == 3
    assert all(len(ids) <= batch.tokens.shape[1] + 3 and EOS_ID not in ids for ids in outputs)


def test_config_checks():
    base = dict(model="nmt", vocab_size=10, num_labels=10, layers=1, heads=3, d_model=16)
    with pytest.raises(AttnAuditError, match="divisible"):
        Seq2SeqTransformer(ModelConfig(task_type="seq2seq", **base))
    with pytest.raises(AttnAuditError, match="seq2seq"):
        Seq2SeqTransformer(ModelConfig(task_type="tagging", **{**base, "heads": 2}))


def test_train_nmt_saves_loads_and_is_idempotent(tmp_path):
    set_quiet(True)
    data = synthetic_translation(1, n_train=80, n_dev=8, n_test=8)
    options = dict(layers=1, heads=2, d_model=16, d_ff=32, source_vocab=80, target_vocab=80, epochs=2, lr=5e-3,
                   batch_size=16, warmup=5, max_len=96, max_train_len=90)
    run = train_nmt(data, tmp_path / "run", **options)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and len(metrics["history"]) == 2 and "dev_bleu" in metrics
    assert metrics["history"][1]["train_loss"] < metrics["history"][0]["train_loss"]
    loaded = load_run(tmp_path / "run")
    batch = run.collate(data.test)
    assert torch.allclose(run.model.eval()(batch).logits, loaded.model(batch).logits, atol=1e-6)
    assert translate(loaded, data.test[:2]) == translate(run, data.test[:2])
    stamp = (tmp_path / "run" / "model.safetensors").stat().st_mtime_ns
    train_nmt(data, tmp_path / "run", **options)
    assert (tmp_path / "run" / "model.safetensors").stat().st_mtime_ns == stamp
    capped = train_nmt(data, tmp_path / "capped", **{**options, "max_steps": 3}, bleu_split=None)
    assert json.loads((tmp_path / "capped" / "metrics.json").read_text())["steps"] == 3 and capped.model is not None
    with pytest.raises(AttnAuditError, match="unknown NMT training option"):
        train_nmt(data, tmp_path / "x", hidden_dim=3)
