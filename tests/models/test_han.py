"""HAN (word + sentence attention) and the flat variant: interface, interventions, padding."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.han import FlatAttentionClassifier, HierarchicalAttentionNetwork, build_han_model
from attnaudit.models.interface import (
    AttentionModel,
    Intervention,
    ModelConfig,
    detach_weights,
    freeze_uniform,
    uniform_weights,
)
from attnaudit.models.rnn import SCORERS, AdditiveScorer

VOCAB, LABELS = 50, 3
NORMALISERS = ("softmax", "entmax15", "sparsemax")
# Document 0: 3 sentences; document 1: 1 sentence and 2 padding sentences; document 2: 2.
DOCS = [[4, 2, 6], [5], [1, 3]]


def make_config(model: str, scorer: str = "tanh", normaliser: str = "softmax") -> ModelConfig:
    return ModelConfig(
        model=model,
        task_type="classification",
        vocab_size=VOCAB,
        num_labels=LABELS,
        embed_dim=16,
        hidden_dim=8,
        scorer=scorer,  # type: ignore[arg-type]
        attention=normaliser,
    )


def fresh_han(scorer: str = "tanh", normaliser: str = "softmax") -> HierarchicalAttentionNetwork:
    torch.manual_seed(0)
    model = build_han_model(make_config("han", scorer, normaliser)).eval()
    assert isinstance(model, HierarchicalAttentionNetwork)
    return model


@cache
def shared_han(scorer: str = "tanh", normaliser: str = "softmax") -> HierarchicalAttentionNetwork:
    """Reused across hypothesis examples; tests must not modify it."""
    return fresh_han(scorer, normaliser)


def make_docs(docs: list[list[int]], seed: int = 0, sentences: int | None = None, words: int | None = None) -> Batch:
    """Documents given as sentence lengths, padded to ``sentences`` x ``words`` (at least the max)."""
    gen = torch.Generator().manual_seed(seed)
    s = max(sentences or 0, max(len(d) for d in docs))
    w = max(words or 0, max(n for d in docs for n in d))
    mask = torch.zeros(len(docs), s, w, dtype=torch.bool)
    for i, doc in enumerate(docs):
        for j, n in enumerate(doc):
            mask[i, j, :n] = True
    tokens = torch.randint(1, VOCAB, mask.shape, generator=gen).masked_fill(~mask, 0)
    return Batch(tokens=tokens, mask=mask)


def sentence_rows(batch: Batch) -> Tensor:
    """``(B*S,)`` True for real sentences."""
    return batch.mask.any(-1).reshape(-1)


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize("scorer", SCORERS)
def test_han_shapes_and_distributions(scorer: str, normaliser: str) -> None:
    model = shared_han(scorer, normaliser)
    batch = make_docs(DOCS)
    b, s, w = batch.tokens.shape
    out = model(batch)
    assert out.logits.shape == (b, LABELS)
    assert len(out.trace) == model.num_attention_layers == 2 and model.explained_layer == 1
    word, sentence = out.trace[0], out.trace[1]
    assert (word.name, sentence.name) == ("word", "sentence")
    assert word.weights.shape == (b * s, 1, 1, w) and word.mask.shape == (b * s, w)
    assert sentence.weights.shape == (b, 1, 1, s) and sentence.mask.shape == (b, s)
    assert sentence.inputs.shape == (b, s, 8) and sentence.keys.shape == sentence.values.shape == (b, 1, s, 8)
    real = sentence_rows(batch)
    word_sums = word.weights[:, 0, 0].sum(-1)
    torch.testing.assert_close(word_sums[real], torch.ones(int(real.sum())))
    assert torch.all(word.weights[~real] == 0)
    assert torch.all(word.weights[:, 0, 0][~word.mask] == 0)
    torch.testing.assert_close(sentence.weights[:, 0, 0].sum(-1), torch.ones(b))
    assert torch.all(sentence.weights[:, 0, 0][~batch.mask.any(-1)] == 0)
    assert all(torch.isfinite(t).all() for t in (out.logits, word.weights, sentence.weights))


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize("scorer", SCORERS)
def test_han_decode_cache_and_own_weights_reproduce_forward(scorer: str, normaliser: str) -> None:
    model = shared_han(scorer, normaliser)
    batch = make_docs(DOCS)
    out = model(batch)
    base = model.encode(batch)
    assert torch.equal(model.decode(base).logits, out.logits)
    assert torch.equal(model(batch, embeddings=model.embed(batch)).logits, out.logits)
    own = [Intervention(layer=0, weights=out.trace.weights[0]), Intervention(layer=1, weights=out.trace.weights[1])]
    for ivs in (own[:1], own[1:], own):
        assert torch.equal(model.decode(base, ivs).logits, out.logits)
    for layer in (0, 1, -1):
        restart = model.cache_at(out.trace, layer, base)
        rerun = model.decode(restart, start_layer=layer)
        assert torch.equal(rerun.logits, out.logits)
        assert len(rerun.trace) == 2 - layer % 2
    # Restarting at the sentence level with an intervention equals the full run with it.
    uniform = [freeze_uniform(1)]
    full = model(batch, uniform)
    from_sentences = model.decode(model.cache_at(out.trace, 1, base), uniform)
    assert torch.equal(from_sentences.logits, full.logits)
    # A trace that itself started at layer 1 can be restarted from again.
    again = model.cache_at(from_sentences.trace, 1, base)
    assert torch.equal(model.decode(again, uniform).logits, full.logits)


@pytest.mark.parametrize("normaliser", NORMALISERS)
def test_han_freeze_uniform_per_layer(normaliser: str) -> None:
    model = shared_han("tanh", normaliser)
    batch = make_docs(DOCS)
    out = model(batch, [freeze_uniform()])
    for layer, mask in ((0, batch.mask.reshape(-1, batch.mask.shape[-1])), (1, batch.mask.any(-1))):
        expected = uniform_weights(out.trace[layer].weights, mask)
        torch.testing.assert_close(out.trace[layer].weights, expected)
    only_words = model(batch, [freeze_uniform(0)])
    torch.testing.assert_close(only_words.trace[0].weights, out.trace[0].weights)
    assert not torch.allclose(only_words.trace[1].weights, out.trace[1].weights)


def test_han_uniform_attention_matches_hand_computation() -> None:
    """Uniform at both levels: mean word states -> sentence GRU -> mean -> Linear."""
    model = shared_han()
    batch = make_docs(DOCS)
    logits = model(batch, [freeze_uniform()]).logits
    for i, doc in enumerate(DOCS):
        sentences = []
        for j, n in enumerate(doc):
            emb = model.embedding(batch.tokens[i : i + 1, j, :n])
            sentences.append(model.word_encoder.rnn(emb)[0][0].mean(0))
        states = model.sentence_encoder.rnn(torch.stack(sentences)[None])[0][0]
        torch.testing.assert_close(logits[i], model.output(states.mean(0)))


def sharpen(scorer: torch.nn.Module, factor: float) -> None:
    with torch.no_grad():
        if isinstance(scorer, AdditiveScorer):
            scorer.v.weight.mul_(factor)
        else:
            scorer.query.mul_(factor)


@pytest.mark.parametrize("scorer", SCORERS)
def test_han_sparsemax_swap_and_keys_intervention(scorer: str) -> None:
    model = fresh_han(scorer)
    sharpen(model.word_scorer, 200.0)
    sharpen(model.sentence_scorer, 200.0)
    batch = make_docs([[9, 8, 9, 7, 8], [8, 9, 9, 6, 7]])
    base = model(batch)
    sparse = model(batch, [Intervention(normaliser="sparsemax")])
    for layer, mask in ((0, base.trace[0].mask), (1, base.trace[1].mask)):
        weights = sparse.trace[layer].weights[:, 0, 0]
        assert int((weights[mask] == 0).sum()) > 0
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0]))
    for layer in (0, 1):
        new_keys = torch.randn(base.trace[layer].keys.shape, generator=torch.Generator().manual_seed(layer))
        changed = model(batch, [Intervention(layer=layer, keys=new_keys)])
        assert torch.equal(changed.trace[layer].values, base.trace[layer].values)
        assert torch.equal(changed.trace[layer].keys, new_keys)
        assert not torch.allclose(changed.trace[layer].weights, base.trace[layer].weights)
    # A keys intervention at the sentence level leaves the word level untouched.
    only_sentences = model(batch, [Intervention(layer=1, keys=lambda k: -k)])
    assert torch.equal(only_sentences.trace[0].weights, base.trace[0].weights)


@pytest.mark.parametrize("scorer", SCORERS)
def test_han_detach_weights(scorer: str) -> None:
    model = fresh_han(scorer)
    batch = make_docs(DOCS)
    emb = model.embed(batch).detach().requires_grad_(True)
    model(batch, [detach_weights()], embeddings=emb).logits.sum().backward()
    assert emb.grad is not None and float(emb.grad.abs().sum()) > 0
    for p in [*model.word_scorer.parameters(), *model.sentence_scorer.parameters()]:
        assert p.grad is None or float(p.grad.abs().sum()) == 0
    model.zero_grad()
    model(batch).logits.sum().backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in model.sentence_scorer.parameters())


@pytest.mark.parametrize("normaliser", NORMALISERS)
def test_han_padding_sentence_gives_no_nan(normaliser: str) -> None:
    """A fully padded sentence row: zero word weights, finite logits and finite gradients."""
    model = fresh_han("tanh", normaliser)
    batch = make_docs([[3], [2, 4]], sentences=3)
    emb = model.embed(batch).detach().requires_grad_(True)
    out = model(batch, embeddings=emb)
    assert torch.isfinite(out.logits).all()
    assert all(torch.isfinite(t.weights).all() for t in out.trace.layers)
    out.logits.sum().backward()
    assert torch.isfinite(emb.grad).all()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize("scorer", SCORERS)
@settings(max_examples=8, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=4), min_size=2, max_size=3),
    extra=st.tuples(st.integers(0, 2), st.integers(0, 3)),
    seed=st.integers(0, 2**16),
)
def test_han_padding_invariance(
    scorer: str, normaliser: str, docs: list[list[int]], extra: tuple[int, int], seed: int
) -> None:
    """A document alone (no padding at all) gives the same logits as inside a padded batch."""
    model = shared_han(scorer, normaliser)
    s = max(len(d) for d in docs) + extra[0]
    w = max(n for d in docs for n in d) + extra[1]
    batch = make_docs(docs, seed, sentences=s, words=w)
    with torch.no_grad():
        out = model(batch)
        for i, doc in enumerate(docs):
            n_words = max(doc)
            alone = Batch(
                tokens=batch.tokens[i : i + 1, : len(doc), :n_words], mask=batch.mask[i : i + 1, : len(doc), :n_words]
            )
            single = model(alone)
            torch.testing.assert_close(single.logits[0], out.logits[i], atol=1e-5, rtol=0)
            torch.testing.assert_close(
                single.trace[1].weights[0, 0, 0], out.trace[1].weights[i, 0, 0, : len(doc)], atol=1e-5, rtol=0
            )


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize("scorer", SCORERS)
def test_flat_model(scorer: str, normaliser: str) -> None:
    """The flat variant: one biGRU (hidden//2 per direction) + attention; same interface guarantees."""
    torch.manual_seed(0)
    model = build_han_model(make_config("flat", scorer, normaliser)).eval()
    assert isinstance(model, FlatAttentionClassifier)
    gen = torch.Generator().manual_seed(0)
    lengths = [6, 2, 9]
    mask = torch.arange(9)[None, :] < torch.tensor(lengths)[:, None]
    batch = Batch(tokens=torch.randint(1, VOCAB, (3, 9), generator=gen).masked_fill(~mask, 0), mask=mask)
    out = model(batch)
    assert out.logits.shape == (3, LABELS) and out.trace[0].weights.shape == (3, 1, 1, 9)
    assert out.trace[0].inputs.shape == (3, 9, 8)
    torch.testing.assert_close(out.trace[0].weights.sum(-1).flatten(), torch.ones(3))
    assert torch.all(out.trace[0].weights[:, 0, 0][~mask] == 0)
    replaced = model.decode(model.encode(batch), [Intervention(weights=out.trace.weights[0])])
    assert torch.equal(replaced.logits, out.logits)
    for i, n in enumerate(lengths):
        alone = model(Batch(tokens=batch.tokens[i : i + 1, :n], mask=mask[i : i + 1, :n]))
        torch.testing.assert_close(alone.logits[0], out.logits[i], atol=1e-5, rtol=0)


def test_han_embedding_and_errors() -> None:
    model: AttentionModel = shared_han()
    assert model.embedding.padding_idx == 0
    flat_batch = Batch(tokens=torch.tensor([[1, 2, 3]]), mask=torch.tensor([[True, True, True]]))
    with pytest.raises(AttnAuditError, match=r"\(B,S,W\)"):
        model(flat_batch)
    batch = make_docs(DOCS)
    out = model(batch)
    base = model.encode(batch)
    with pytest.raises(AttnAuditError, match="cache_at"):
        model.decode(base, start_layer=1)
    with pytest.raises(AttnAuditError, match="does not contain attention layer 0"):
        model.cache_at(model.decode(model.cache_at(out.trace, 1, base)).trace, 0, base)
    with pytest.raises(AttnAuditError, match="document classifier"):
        build_han_model(make_config("han").with_(task_type="pair"))
    with pytest.raises(AttnAuditError, match="choose han or flat"):
        build_han_model(make_config("bilstm"))
