"""Additive/dot attention classifiers and the pair/QA model: interface, interventions, padding."""

from __future__ import annotations

from functools import cache

import pytest
import torch
import torch.nn.functional as F
from entmax import entmax15, sparsemax
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import (
    AttentionModel,
    Intervention,
    ModelConfig,
    detach_weights,
    freeze_uniform,
)
from attnaudit.models.rnn import (
    ENCODERS,
    SCORERS,
    AdditiveScorer,
    AttentionClassifier,
    PairAttentionClassifier,
    build_rnn_model,
)

VOCAB, LABELS = 50, 3
NORMALISERS = ("softmax", "entmax15", "sparsemax")
CASES = [(task, enc, scorer) for task in ("classification", "pair") for enc in ENCODERS for scorer in SCORERS]
CASE_IDS = [f"{t}-{e}-{s}" for t, e, s in CASES]


def make_config(task: str, encoder: str, scorer: str, normaliser: str = "softmax") -> ModelConfig:
    return ModelConfig(
        model=encoder,
        task_type=task,  # type: ignore[arg-type]
        vocab_size=VOCAB,
        num_labels=LABELS,
        embed_dim=16,
        hidden_dim=8,
        scorer=scorer,  # type: ignore[arg-type]
        attention=normaliser,
        cnn_kernels=(1, 3, 5),
        cnn_filters=4,
    )


def fresh_model(task: str, encoder: str, scorer: str, normaliser: str = "softmax") -> AttentionModel:
    torch.manual_seed(0)
    return build_rnn_model(make_config(task, encoder, scorer, normaliser)).eval()


@cache
def shared_model(task: str, encoder: str, scorer: str, normaliser: str = "softmax") -> AttentionModel:
    """A model reused across hypothesis examples; tests must not modify it."""
    return fresh_model(task, encoder, scorer, normaliser)


def padded(lengths: list[int], gen: torch.Generator) -> tuple[Tensor, Tensor]:
    ids = torch.randint(1, VOCAB, (len(lengths), max(lengths)), generator=gen)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, 0), mask


def make_batch(lengths: list[int], query_lengths: list[int] | None = None, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    tokens, mask = padded(lengths, gen)
    query, query_mask = padded(query_lengths or [3, 1, 4, 2, 5][: len(lengths)], gen)
    return Batch(tokens=tokens, mask=mask, query=query, query_mask=query_mask)


def row(batch: Batch, i: int) -> Batch:
    """Example ``i`` alone, without any padding."""
    n, q = int(batch.mask[i].sum()), int(batch.query_mask[i].sum())
    return Batch(
        tokens=batch.tokens[i : i + 1, :n],
        mask=batch.mask[i : i + 1, :n],
        query=batch.query[i : i + 1, :q],
        query_mask=batch.query_mask[i : i + 1, :q],
    )


BATCH_LENGTHS = [5, 9, 2, 7]


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_shapes_and_distributions(task: str, encoder: str, scorer: str, normaliser: str) -> None:
    model = shared_model(task, encoder, scorer, normaliser)
    batch = make_batch(BATCH_LENGTHS)
    out = model(batch)
    b, t = batch.tokens.shape
    assert out.logits.shape == (b, LABELS)
    assert len(out.trace) == model.num_attention_layers == 1
    layer = out.trace[0]
    d = layer.inputs.shape[-1]
    assert layer.name == "attention" and layer.query_mask is None
    assert layer.weights.shape == layer.scores.shape == (b, 1, 1, t)
    assert layer.keys.shape == layer.values.shape == (b, 1, t, d)
    assert layer.inputs.shape == (b, t, d)
    assert torch.equal(layer.mask, batch.mask)
    weights = layer.weights[:, 0, 0]
    torch.testing.assert_close(weights.sum(-1), torch.ones(b))
    assert torch.all(weights[~batch.mask] == 0)
    assert torch.all(layer.scores[:, 0, 0][~batch.mask] == float("-inf"))
    assert torch.all(layer.inputs[~batch.mask] == 0)


@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_encoder_widths(task: str, encoder: str, scorer: str) -> None:
    """bilstm: hidden per direction; bigru: hidden//2 per direction; cnn: kernels x filters."""
    expected = {"bilstm": 16, "bigru": 8, "average": 8, "cnn": 12}[encoder]
    out = shared_model(task, encoder, scorer)(make_batch([4, 2]))
    assert out.trace[0].inputs.shape[-1] == expected


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_decode_encode_and_own_weights_reproduce_forward(task: str, encoder: str, scorer: str, normaliser: str) -> None:
    model = shared_model(task, encoder, scorer, normaliser)
    batch = make_batch(BATCH_LENGTHS)
    out = model(batch)
    cache_ = model.encode(batch)
    assert torch.equal(model.decode(cache_).logits, out.logits)
    replaced = model.decode(cache_, [Intervention(weights=out.trace.weights[0])])
    assert torch.equal(replaced.logits, out.logits)
    assert replaced.trace[0].scores is None and out.trace[0].scores is not None  # given weights: no scoring
    restarted = model.decode(model.cache_at(out.trace, 0, cache_), start_layer=0)
    assert torch.equal(restarted.logits, out.logits)
    # Embeddings passed in explicitly take the place of the lookup.
    assert torch.equal(model(batch, embeddings=model.embed(batch)).logits, out.logits)


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_freeze_uniform(task: str, encoder: str, scorer: str, normaliser: str) -> None:
    model = shared_model(task, encoder, scorer, normaliser)
    batch = make_batch(BATCH_LENGTHS)
    weights = model(batch, [freeze_uniform()]).trace[0].weights[:, 0, 0]
    expected = batch.mask.float() / batch.mask.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected)
    # A negative layer index means the same single layer.
    assert torch.equal(model(batch, [freeze_uniform(-1)]).trace[0].weights[:, 0, 0], weights)
    # An intervention aimed at a layer the model does not have changes nothing.
    assert torch.equal(model(batch, [freeze_uniform(1)]).logits, model(batch).logits)


def sharpen(model: AttentionModel, factor: float = 200.0) -> None:
    """Scale the scorer's output so scores are far apart (peaked attention)."""
    scorer = model.scorer
    with torch.no_grad():
        if isinstance(scorer, AdditiveScorer):
            scorer.v.weight.mul_(factor)
        elif scorer.query is not None:
            scorer.query.mul_(factor)
        else:
            scorer.query_proj.weight.mul_(factor)


@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_normaliser_swap_to_sparsemax_gives_exact_zeros(task: str, encoder: str, scorer: str) -> None:
    model = fresh_model(task, encoder, scorer)
    sharpen(model)
    batch = make_batch([9, 8, 9, 7])
    dense = model(batch).trace[0].weights[:, 0, 0]
    sparse = model(batch, [Intervention(normaliser="sparsemax")]).trace[0].weights[:, 0, 0]
    assert not torch.equal(dense, sparse)
    assert int((sparse[batch.mask] == 0).sum()) > 0
    torch.testing.assert_close(sparse.sum(-1), torch.ones(4))


@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_keys_intervention_changes_weights_not_values(task: str, encoder: str, scorer: str) -> None:
    model = fresh_model(task, encoder, scorer)
    sharpen(model, 5.0)
    batch = make_batch(BATCH_LENGTHS)
    base = model(batch).trace[0]
    new_keys = torch.randn(base.keys.shape, generator=torch.Generator().manual_seed(1))
    for keys in (new_keys, lambda k: k.flip(-1)):
        changed = model(batch, [Intervention(keys=keys)]).trace[0]
        assert torch.equal(changed.values, base.values)
        assert torch.equal(changed.inputs, base.inputs)
        assert not torch.allclose(changed.weights, base.weights)
        assert torch.all(changed.weights[:, 0, 0][~batch.mask] == 0)
    assert torch.equal(model(batch, [Intervention(keys=new_keys)]).trace[0].keys, new_keys)


@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_detach_weights_blocks_gradient_through_attention(task: str, encoder: str, scorer: str) -> None:
    model = fresh_model(task, encoder, scorer)
    batch = make_batch(BATCH_LENGTHS)
    for detach in (False, True):
        model.zero_grad()
        seen: dict[str, Tensor] = {}

        def record(w: Tensor, _mask: Tensor, seen: dict[str, Tensor] = seen) -> Tensor:
            w.retain_grad()
            seen["w"] = w
            return w

        emb = model.embed(batch).detach().requires_grad_(True)
        ivs = [Intervention(weights=record)] + ([detach_weights()] if detach else [])
        model(batch, ivs, embeddings=emb).logits.sum().backward()
        assert emb.grad is not None and float(emb.grad.abs().sum()) > 0
        weight_grad = seen["w"].grad
        scorer_grads = [p.grad for p in model.scorer.parameters()]
        if detach:
            assert weight_grad is None
            assert all(g is None or float(g.abs().sum()) == 0 for g in scorer_grads)
        else:
            assert weight_grad is not None and float(weight_grad.abs().sum()) > 0
            assert any(g is not None and float(g.abs().sum()) > 0 for g in scorer_grads)


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
@settings(max_examples=8, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 10), st.integers(1, 5)), min_size=2, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_padding_invariance(
    task: str, encoder: str, scorer: str, normaliser: str, sizes: list[tuple[int, int]], seed: int
) -> None:
    """An example alone gives the same logits and weights as inside a padded batch."""
    model = shared_model(task, encoder, scorer, normaliser)
    batch = make_batch([s for s, _ in sizes], [q for _, q in sizes], seed=seed)
    with torch.no_grad():
        out = model(batch)
        for i, (n, _) in enumerate(sizes):
            alone = model(row(batch, i))
            torch.testing.assert_close(alone.logits[0], out.logits[i], atol=1e-5, rtol=0)
            torch.testing.assert_close(
                alone.trace[0].weights[0, 0, 0], out.trace[0].weights[i, 0, 0, :n], atol=1e-5, rtol=0
            )


@pytest.mark.parametrize(("task", "encoder", "scorer"), CASES, ids=CASE_IDS)
def test_embeddings_at_padding_never_leak(task: str, encoder: str, scorer: str) -> None:
    """Passed-in embeddings (e.g. an Integrated Gradients path) may be non-zero at padding."""
    model = shared_model(task, encoder, scorer)
    batch = make_batch(BATCH_LENGTHS)
    emb = model.embed(batch)
    noise = torch.randn(emb.shape, generator=torch.Generator().manual_seed(2)) * (~batch.mask)[..., None]
    with torch.no_grad():
        torch.testing.assert_close(model(batch, embeddings=emb + noise).logits, model(batch).logits)


@pytest.mark.parametrize("normaliser", NORMALISERS)
@pytest.mark.parametrize("scorer", SCORERS)
def test_classifier_matches_hand_computation(scorer: str, normaliser: str) -> None:
    """Scores, weights (reference normaliser on the unpadded row) and logits recomputed by hand."""
    model = shared_model("classification", "bilstm", scorer, normaliser)
    assert isinstance(model, AttentionClassifier)
    batch = make_batch(BATCH_LENGTHS)
    out = model(batch)
    h = model.encode(batch).states
    s = model.scorer
    if scorer == "tanh":
        scores = torch.tanh(h @ s.key_proj.weight.T + s.key_proj.bias) @ s.v.weight[0]
    else:
        scores = h @ s.query / h.shape[-1] ** 0.5
    reference = {"softmax": lambda x: torch.softmax(x, -1), "entmax15": entmax15, "sparsemax": sparsemax}[normaliser]
    for i, n in enumerate(BATCH_LENGTHS):
        torch.testing.assert_close(out.trace[0].scores[i, 0, 0, :n], scores[i, :n])
        alpha = reference(scores[i, :n])
        torch.testing.assert_close(out.trace[0].weights[i, 0, 0, :n], alpha)
        torch.testing.assert_close(out.logits[i], model.output(alpha @ h[i, :n]))


@pytest.mark.parametrize("scorer", SCORERS)
def test_pair_model_matches_hand_computation(scorer: str) -> None:
    """Question vector = mean of question states; output = MLP([c; q; c*q; |c-q|])."""
    model = shared_model("pair", "bilstm", scorer)
    assert isinstance(model, PairAttentionClassifier)
    batch = make_batch(BATCH_LENGTHS, [3, 1, 4, 2])
    out = model(batch)
    h = model.encode(batch).states
    s = model.scorer
    for i, (n, k) in enumerate(zip(BATCH_LENGTHS, [3, 1, 4, 2], strict=True)):
        q_states = model.query_encoder.rnn(model.embedding(batch.query[i : i + 1, :k]))[0][0]
        q = q_states.mean(0)
        if scorer == "tanh":
            hidden = h[i, :n] @ s.key_proj.weight.T + s.key_proj.bias + s.query_proj.weight @ q
            scores = torch.tanh(hidden) @ s.v.weight[0]
        else:
            scores = h[i, :n] @ (s.query_proj.weight @ q) / h.shape[-1] ** 0.5
        alpha = torch.softmax(scores, -1)
        torch.testing.assert_close(out.trace[0].weights[i, 0, 0, :n], alpha)
        c = alpha @ h[i, :n]
        features = torch.cat([c, q, c * q, (c - q).abs()])
        torch.testing.assert_close(out.logits[i], model.output(torch.tanh(model.combine(features))))


@pytest.mark.parametrize("encoder", ["bilstm", "bigru", "cnn"])
def test_encoder_states_match_unpadded_reference(encoder: str) -> None:
    """Packed RNN / masked CNN states equal the plain module run on the unpadded sequence."""
    model = shared_model("classification", encoder, "tanh")
    batch = make_batch([3, 8])
    states = model.encode(batch).states
    x = model.embedding(batch.tokens[:1, :3])
    if encoder == "cnn":
        ref = torch.cat(
            [
                torch.relu(F.conv1d(x.transpose(1, 2), c.weight, c.bias, padding=c.kernel_size[0] // 2))
                for c in model.encoder.convs
            ],
            dim=1,
        ).transpose(1, 2)
    else:
        ref = model.encoder.rnn(x)[0]
    torch.testing.assert_close(states[:1, :3], ref, atol=1e-6, rtol=0)


def test_embedding_has_padding_idx() -> None:
    config = make_config("classification", "bilstm", "tanh").with_(pad_id=3)
    model = build_rnn_model(config)
    assert model.embedding.padding_idx == 3
    assert model.embedding.num_embeddings == VOCAB and model.embedding.embedding_dim == 16


def test_build_rnn_model_dispatch_and_errors() -> None:
    assert type(build_rnn_model(make_config("classification", "cnn", "dot"))) is AttentionClassifier
    assert type(build_rnn_model(make_config("pair", "average", "tanh"))) is PairAttentionClassifier
    with pytest.raises(AttnAuditError, match="unknown encoder"):
        build_rnn_model(make_config("classification", "gru", "tanh"))
    with pytest.raises(AttnAuditError, match="unknown attention scorer"):
        build_rnn_model(make_config("classification", "bilstm", "general"))
    with pytest.raises(AttnAuditError, match="normaliser"):
        build_rnn_model(make_config("classification", "bilstm", "tanh", "softermax"))
    with pytest.raises(AttnAuditError, match="task_type 'tagging'"):
        build_rnn_model(make_config("tagging", "bilstm", "tanh"))


def test_bad_inputs_raise_one_line_errors() -> None:
    model = shared_model("pair", "bilstm", "tanh")
    batch = make_batch([3, 2])
    with pytest.raises(AttnAuditError, match="query"):
        model(Batch(tokens=batch.tokens, mask=batch.mask))
    with pytest.raises(AttnAuditError, match=r"ids must lie in \[0, 50\)"):
        model(Batch(tokens=batch.tokens + 60, mask=batch.mask, query=batch.query, query_mask=batch.query_mask))
    with pytest.raises(AttnAuditError, match="out of range"):
        model.decode(model.encode(batch), start_layer=1)
    classifier = shared_model("classification", "bilstm", "tanh")
    with pytest.raises(AttnAuditError, match=r"expects tokens \(B,T\)"):
        classifier(Batch(tokens=batch.tokens[:, None], mask=batch.mask[:, None]))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_encoder_avoids_cudnn_only_for_backward_in_eval(cell: str) -> None:
    """cuDNN's RNN refuses backward in eval mode (found running importance with --device cuda):
    the encoder turns cuDNN off exactly for passes that build a graph in eval mode."""
    from attnaudit.models.rnn import RecurrentEncoder

    encoder = RecurrentEncoder(cell, 4, 3)
    seen: list[bool] = []
    encoder.rnn.register_forward_pre_hook(lambda module, args: seen.append(torch.backends.cudnn.enabled))
    x, mask = torch.randn(2, 5, 4), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    expected = []
    for training, grad in [(False, True), (False, False), (True, True)]:
        encoder.train(training)
        with torch.set_grad_enabled(grad):
            encoder(x, mask)
        expected.append(torch.backends.cudnn.enabled and not (grad and not training))
    assert seen == expected and seen[0] is False


# --------------------------------------------------------------------------- Madsen et al. (2022)'s pair head


def madsen_model(encoder: str = "bilstm") -> PairAttentionClassifier:
    torch.manual_seed(0)
    config = make_config("pair", encoder, "tanh")
    model = build_rnn_model(ModelConfig(**{**config.__dict__, "extra": {"pair_head": "madsen2022"}})).eval()
    assert isinstance(model, PairAttentionClassifier)
    return model


def test_madsen_head_is_their_forward_written_as_their_code_does() -> None:
    """nlproar's RNNMultipleSequenceToClass, restated with this model's weights: each sequence through its own
    embedding and packed BiLSTM, the question as ``cat(h_n[0], h_n[1])``, ``W2(tanh(W1p h + W1h q))`` masked and
    softmaxed over the passage, and ``final(tanh(Wp c + Wh q))``."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    model = madsen_model()
    batch = make_batch(BATCH_LENGTHS, [3, 1, 4, 2])

    def run(embedding: torch.nn.Embedding, rnn: torch.nn.LSTM, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        packed = pack_padded_sequence(embedding(ids), mask.sum(1), batch_first=True, enforce_sorted=False)
        out, (h, _) = rnn(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])[0], torch.cat([h[0], h[1]], dim=-1)

    with torch.no_grad():
        passage, _ = run(model.embedding, model.encoder.rnn, batch.tokens, batch.mask)
        _, question = run(model.query_embedding, model.query_encoder.rnn, batch.query, batch.query_mask)
        scorer = model.scorer
        assert isinstance(scorer, AdditiveScorer) and scorer.query_proj is not None
        scores = scorer.v(torch.tanh(scorer.key_proj(passage) + scorer.query_proj(question)[:, None])).squeeze(-1)
        alpha = torch.softmax(scores.masked_fill(~batch.mask, float("-inf")), dim=-1)
        context = (alpha[..., None] * passage).sum(1)
        theirs = model.output(torch.tanh(model.combine_context(context) + model.combine_query(question)))
        ours = model(batch)
    torch.testing.assert_close(ours.logits, theirs, atol=1e-6, rtol=0)
    torch.testing.assert_close(ours.trace[0].weights[:, 0, 0], alpha, atol=1e-6, rtol=0)


def test_madsen_heads_question_table_starts_as_a_copy_and_trains_apart() -> None:
    model = madsen_model()
    assert torch.equal(model.query_embedding.weight, model.embedding.weight)
    assert model.query_embedding.weight.data_ptr() != model.embedding.weight.data_ptr()
    names = {n for n, _ in model.named_parameters()}
    assert {"query_embedding.weight", "combine_context.weight", "combine_query.weight"} <= names and "combine.weight" not in names


def test_the_default_head_takes_the_same_random_draws_as_before() -> None:
    """``pair_head`` absent or ``jain-wallace`` builds the same model from the same seed (runs trained before keep their
    weights and hashes)."""
    torch.manual_seed(0)
    default = build_rnn_model(make_config("pair", "bilstm", "tanh"))
    torch.manual_seed(0)
    named = build_rnn_model(ModelConfig(**{**make_config("pair", "bilstm", "tanh").__dict__, "extra": {"pair_head": "jain-wallace"}}))
    for (name, a), (_, b) in zip(default.state_dict().items(), named.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("extra", "message"), [({"pair_head": "nope"}, "unknown pair head 'nope'"),
                                                ({"pair_head": "madsen2022"}, "final recurrent states: use bilstm or bigru, not cnn")])
def test_a_pair_head_that_cannot_be_built_is_refused_in_one_line(extra: dict, message: str) -> None:
    with pytest.raises(AttnAuditError, match=message):
        build_rnn_model(ModelConfig(**{**make_config("pair", "cnn", "tanh").__dict__, "extra": extra}))
