"""Transformer encoder classifier/tagger: trace, encode/decode, interventions, padding, maps."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import Intervention, ModelConfig, detach_weights, freeze_uniform, uniform_weights
from attnaudit.models.normalisers import normalise
from attnaudit.models.transformer import (
    CONTENT_GAIN,
    TransformerClassifier,
    TransformerTagger,
    build_transformer_model,
    merge_heads,
    sinusoidal_positions,
    split_heads,
)

NORMALISERS = ["softmax", "entmax15", "sparsemax", "entmax:1.3"]
VOCAB, D, LAYERS = 50, 16, 2


def config(task_type: str = "classification", attention: str = "softmax", heads: int = 2, **kw) -> ModelConfig:
    base = dict(
        model="transformer",
        task_type=task_type,
        vocab_size=VOCAB,
        num_labels=3,
        embed_dim=D,
        d_model=D,
        d_ff=32,
        layers=LAYERS,
        heads=heads,
        dropout=0.1,
        max_len=64,
        attention=attention,
    )
    base.update(kw)
    return ModelConfig(**base)


def model_for(task_type: str = "classification", attention: str = "softmax", seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_transformer_model(config(task_type, attention, **kw)).eval()


def pad(rows: list[list[int]], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    width = width or max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return ids, ids != 0


def random_rows(lengths: list[int], seed: int = 1, high: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, high, (n,), generator=g).tolist() for n in lengths]


def batch_of(rows: list[list[int]], width: int | None = None, query: list[list[int]] | None = None) -> Batch:
    tokens, mask = pad(rows, width)
    b = Batch(tokens=tokens, mask=mask)
    if query is not None:
        b.query, b.query_mask = pad(query)
    return b


LENGTHS = [7, 4, 6]


@pytest.mark.parametrize("attention", NORMALISERS)
def test_trace_shapes_and_distributions(attention: str) -> None:
    model = model_for(attention=attention, heads=4)
    b = batch_of(random_rows(LENGTHS))
    out = model(b)
    B, T, H = 3, 7, 4
    assert out.logits.shape == (B, 3)
    assert model.num_attention_layers == LAYERS == len(out.trace)
    assert [w.shape for w in out.trace.weights] == [(B, H, T, T)] * LAYERS
    for index, layer in enumerate(out.trace.layers):
        assert layer.name == f"layer{index}"
        assert layer.keys.shape == layer.values.shape == (B, H, T, D // H)
        assert layer.inputs.shape == (B, T, D)
        assert torch.equal(layer.mask, b.mask) and torch.equal(layer.query_mask, b.mask)
        pad_keys = ~b.mask[:, None, None, :].expand_as(layer.weights)
        assert torch.all(layer.weights[pad_keys] == 0)
        assert torch.all(layer.scores[pad_keys] == float("-inf"))
        assert torch.allclose(layer.weights.sum(-1), torch.ones(B, H, T), atol=1e-5)
        assert torch.all(layer.weights >= 0)
    # Layer 0's inputs are the encoder's output; layer 1's differ from them.
    assert torch.equal(out.trace[0].inputs, model.encode(b).states)
    assert not torch.allclose(out.trace[1].inputs, out.trace[0].inputs)


@pytest.mark.parametrize("attention", NORMALISERS)
def test_decode_of_encode_is_forward(attention: str) -> None:
    model = model_for(attention=attention)
    b = batch_of(random_rows(LENGTHS))
    assert torch.equal(model.decode(model.encode(b)).logits, model(b).logits)


@pytest.mark.parametrize("attention", NORMALISERS)
def test_replacing_weights_with_own_reproduces_logits(attention: str) -> None:
    model = model_for(attention=attention)
    b = batch_of(random_rows(LENGTHS))
    out = model(b)
    same = [Intervention(layer=i, weights=w) for i, w in enumerate(out.trace.weights)]
    again = model(b, same)
    assert torch.equal(again.logits, out.logits)
    for a, c in zip(again.trace.weights, out.trace.weights, strict=True):
        assert torch.equal(a, c)


@pytest.mark.parametrize("attention", NORMALISERS)
def test_restart_from_every_layer(attention: str) -> None:
    model = model_for(attention=attention)
    b = batch_of(random_rows(LENGTHS))
    base = model.encode(b)
    full = model.decode(base)
    for layer in range(LAYERS):
        cache = model.cache_at(full.trace, layer, base)
        rest = model.decode(cache)
        assert torch.equal(rest.logits, full.logits)
        assert [x.name for x in rest.trace.layers] == [f"layer{i}" for i in range(layer, LAYERS)]
        assert torch.equal(rest.trace.weights[0], full.trace.weights[layer])
    # an explicit start_layer overrides cache.layer; out of range is a user error
    assert torch.equal(model.decode(model.cache_at(full.trace, 1, base), start_layer=-1).logits, full.logits)
    with pytest.raises(AttnAuditError, match="start_layer"):
        model.decode(base, start_layer=LAYERS)


def test_freeze_uniform_matches_zeroed_keys() -> None:
    model = model_for()
    b = batch_of(random_rows(LENGTHS))
    frozen = model(b, [freeze_uniform()])
    for layer in frozen.trace.layers:
        assert torch.allclose(layer.weights, uniform_weights(layer.weights, b.mask))
    # all-zero keys give equal scores, so softmax is uniform over real keys as well
    zero_keys = model(b, [Intervention(keys=lambda k: torch.zeros_like(k))])
    assert torch.allclose(zero_keys.logits, frozen.logits, atol=1e-6)
    assert not torch.allclose(frozen.logits, model(b).logits, atol=1e-4)
    # freezing only the last layer leaves the first one alone
    last = model(b, [freeze_uniform(layer=LAYERS - 1)])
    assert torch.equal(last.trace[0].weights, model(b).trace[0].weights)


def test_negative_layer_intervention_targets_last_layer() -> None:
    model = model_for()
    b = batch_of(random_rows(LENGTHS))
    by_negative = model(b, [freeze_uniform(layer=model.explained_layer)])
    by_index = model(b, [freeze_uniform(layer=LAYERS - 1)])
    assert torch.equal(by_negative.logits, by_index.logits)


def test_normaliser_swap() -> None:
    model = model_for(heads=2)
    with torch.no_grad():  # sharpen the scores so sparsemax must cut some real keys
        for layer in model.layers:
            layer.q_proj.weight.mul_(8.0)
    b = batch_of(random_rows(LENGTHS))
    soft = model(b)
    sparse = model(b, [Intervention(normaliser="sparsemax")])
    assert not torch.allclose(soft.logits, sparse.logits, atol=1e-4)
    for layer in sparse.trace.layers:
        real = b.mask[:, None, None, :].expand_as(layer.weights)
        assert (layer.weights[real] == 0).any()
        assert torch.allclose(layer.weights.sum(-1), torch.ones_like(layer.weights[..., 0]), atol=1e-5)
    assert (soft.trace[0].weights[b.mask[:, None, None, :].expand_as(soft.trace[0].weights)] > 0).all()
    # the swap equals a model built with that normaliser and the same parameters
    entmax_model = build_transformer_model(config(attention="entmax15")).eval()
    entmax_model.load_state_dict(model.state_dict())
    assert torch.allclose(entmax_model(b).logits, model(b, [Intervention(normaliser="entmax15")]).logits)
    with pytest.raises(AttnAuditError, match="normaliser"):
        model(b, [Intervention(normaliser="tanh")])


def test_keys_interventions() -> None:
    model = model_for(heads=4)
    b = batch_of(random_rows(LENGTHS))
    out = model(b)
    assert torch.equal(model(b, [Intervention(keys=lambda k: k)]).logits, out.logits)

    # a key adversary working on (B,T,d_model) plugs in through merge/split
    def adversary(keys: torch.Tensor) -> torch.Tensor:
        flat = model.merge_heads(keys)
        assert flat.shape == (3, 7, D)
        return model.split_heads(flat.flip(1))

    changed = model(b, [Intervention(layer=1, keys=adversary)])
    assert torch.equal(changed.trace[1].keys, out.trace[1].keys.flip(2))  # trace holds the new keys
    assert torch.equal(changed.trace[0].keys, out.trace[0].keys)
    assert not torch.allclose(changed.logits, out.logits, atol=1e-5)
    # a tensor replacement broadcasts to the layer's key shape
    fixed = torch.randn(1, 4, 7, D // 4)
    replaced = model(b, [Intervention(layer=0, keys=fixed)])
    assert torch.equal(replaced.trace[0].keys, fixed.expand(3, -1, -1, -1))


def test_split_and_merge_heads_are_inverse() -> None:
    x = torch.randn(2, 5, 12)
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])
    assert torch.equal(merge_heads(heads), x)


def test_detach_weights_blocks_gradient_through_attention() -> None:
    model = model_for()
    b = batch_of(random_rows(LENGTHS))

    def grads(interventions: list[Intervention]) -> dict[str, torch.Tensor | None]:
        model.zero_grad(set_to_none=True)
        model(b, interventions).logits.sum().backward()
        return {name: p.grad for name, p in model.named_parameters()}

    live = grads([])
    assert live["layers.1.q_proj.weight"].abs().sum() > 0
    detached = grads([detach_weights()])
    for i in range(LAYERS):
        assert detached[f"layers.{i}.q_proj.weight"] is None
        assert detached[f"layers.{i}.k_proj.weight"] is None
        assert detached[f"layers.{i}.v_proj.weight"].abs().sum() > 0
    assert detached["embedding.weight"].abs().sum() > 0
    last_only = grads([detach_weights(layer=1)])
    assert last_only["layers.1.q_proj.weight"] is None
    assert last_only["layers.0.q_proj.weight"].abs().sum() > 0


@settings(max_examples=15, deadline=None)
@given(
    length=st.integers(1, 9),
    others=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    attention=st.sampled_from(NORMALISERS),
    task_type=st.sampled_from(["classification", "tagging"]),
)
def test_padding_invariance(length: int, others: list[int], attention: str, task_type: str) -> None:
    model = model_for(task_type, attention)
    rows = random_rows([length] + others, seed=length + 10 * len(others))
    alone = model(batch_of(rows[:1]))
    together = model(batch_of(rows, width=max(length, *others) + 2))
    if task_type == "tagging":
        assert torch.allclose(together.logits[0, :length], alone.logits[0], atol=1e-5)
    else:
        assert torch.allclose(together.logits[0], alone.logits[0], atol=1e-5)
    for a, t in zip(alone.trace.weights, together.trace.weights, strict=True):
        assert torch.allclose(t[0, :, :length, :length], a[0], atol=1e-5)


def test_tagger_ignores_padding_positions() -> None:
    model = model_for("tagging", num_labels=5, extra={"feature_vocab_size": 7})
    rows = random_rows(LENGTHS)
    b = batch_of(rows, width=9)
    b.features = torch.randint(1, 7, b.tokens.shape) * b.mask
    out = model(b)
    assert out.logits.shape == (3, 9, 5)
    noisy = batch_of(rows, width=9)
    noisy.tokens = torch.where(b.mask, b.tokens, torch.randint(1, VOCAB, b.tokens.shape))
    noisy.features = torch.where(b.mask, b.features, torch.randint(1, 7, b.tokens.shape))
    changed = model(noisy)  # padded positions now carry junk ids, but the mask still hides them
    assert torch.allclose(changed.logits[b.mask], out.logits[b.mask], atol=1e-6)
    labels = torch.full(b.tokens.shape, -100)
    labels[b.mask] = 1
    loss = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), labels, ignore_index=-100)
    loss_junk = torch.nn.functional.cross_entropy(changed.logits.transpose(1, 2), labels, ignore_index=-100)
    assert torch.allclose(loss, loss_junk, atol=1e-6)


def test_feature_embedding_path() -> None:
    b = batch_of(random_rows(LENGTHS))
    features = torch.randint(1, 7, b.tokens.shape) * b.mask
    model = model_for("tagging", extra={"feature_vocab_size": 7})
    plain = model(b).logits
    b.features = features
    with_features = model(b).logits
    assert not torch.allclose(plain, with_features, atol=1e-4)
    expected_delta = model.feature_embedding(features)
    assert torch.allclose(
        model.encode(b).states, model.embed_norm(model.embedding(b.tokens) + expected_delta) + model.positions[:7]
    )
    # a model built without features ignores them
    no_features = model_for("tagging")
    assert no_features.feature_embedding is None
    assert torch.equal(no_features(b).logits, no_features(batch_of(random_rows(LENGTHS))).logits)
    b.features = features[:, :3]
    with pytest.raises(AttnAuditError, match="features shape"):
        model(b)
    b.features = features + 7
    with pytest.raises(AttnAuditError, match="feature ids"):
        model(b)


def test_value_output_maps_rebuild_attention_output() -> None:
    model = model_for(heads=4)
    b = batch_of(random_rows(LENGTHS))
    out = model(b)
    for index in range(LAYERS):
        record = out.trace[index]
        w_v, b_v, w_o, heads = model.value_output_maps(index)
        assert heads == 4 and w_v.shape == w_o.shape == (D, D) and b_v.shape == (D,)
        values = record.inputs @ w_v + b_v
        assert torch.allclose(split_heads(values, heads), record.values, atol=1e-6)
        b_o = model.layers[index].out_proj.bias
        rebuilt = merge_heads(record.weights @ split_heads(values, heads)) @ w_o + b_o
        own, _ = model.layers[index].attend(record.inputs, record.mask)
        assert torch.allclose(rebuilt, own, atol=1e-5)
        # Kobayashi's per-head decomposition: sum_h sum_j a_hij f_h(x_j) + b_O is the same output
        dh = D // heads
        per_head = sum(
            record.weights[:, h] @ (values[..., h * dh : (h + 1) * dh] @ w_o[h * dh : (h + 1) * dh])
            for h in range(heads)
        )
        assert torch.allclose(per_head + b_o, own, atol=1e-5)


def test_pair_classifier_concatenates_query() -> None:
    model = model_for("pair", attention="entmax15")
    rows, query = random_rows([5, 3]), random_rows([4, 2], seed=5)
    b = batch_of(rows, query=query)
    out = model(b)
    assert out.logits.shape == (2, 3)
    assert out.trace.weights[0].shape == (2, 2, 9, 9)
    assert torch.equal(out.trace[0].mask, torch.cat([b.mask, b.query_mask], 1))
    assert model.embed(b).shape == (2, 9, D)
    assert model.encode(b).extra == {"text_len": 5}
    # extra padding in text or query leaves the prediction unchanged (positions restart per segment)
    alone = model(batch_of(rows[1:], query=query[1:]))
    assert torch.allclose(alone.logits[0], out.logits[1], atol=1e-5)
    # segment embedding matters: swapping text and query changes the output
    swapped = model(batch_of(query, query=rows))
    assert not torch.allclose(swapped.logits, out.logits, atol=1e-4)
    with pytest.raises(AttnAuditError, match="query"):
        model(batch_of(rows))


def test_projection_and_embedding_gradients() -> None:
    model = model_for(embed_dim=8)
    b = batch_of(random_rows(LENGTHS))
    emb = model.embed(b).detach().requires_grad_()
    assert emb.shape == (3, 7, 8)
    out = model(b, embeddings=emb)
    assert torch.allclose(out.logits, model(b).logits)
    out.logits[:, 0].sum().backward()
    assert emb.grad is not None and emb.grad[b.mask].abs().sum() > 0
    assert torch.all(emb.grad[~b.mask] == 0)  # padded positions cannot influence real ones


def test_content_scale_does_not_depend_on_loaded_vectors() -> None:
    model = model_for()
    b = batch_of(random_rows(LENGTHS))
    states = model.encode(b).states
    content = states - model.positions[:7]
    rms = content[b.mask].pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.full_like(rms, CONTENT_GAIN), atol=1e-3)
    # pretrained vectors of any norm give the same states (the tiny LayerNorm eps aside)
    with torch.no_grad():
        model.embedding.weight.mul_(10.0)
    ten = model.encode(b).states
    with torch.no_grad():
        model.embedding.weight.mul_(100.0)
    assert torch.allclose(model.encode(b).states, ten, atol=1e-5)
    assert torch.allclose(ten, states, atol=1e-3)


def test_sinusoidal_positions_match_formula() -> None:
    table = sinusoidal_positions(10, 6)
    pos, i = 7, 2
    angle = pos / 10000 ** (2 * i / 6)
    assert torch.isclose(table[pos, 2 * i], torch.tensor(angle).sin())
    assert torch.isclose(table[pos, 2 * i + 1], torch.tensor(angle).cos())
    assert sinusoidal_positions(4, 5).shape == (4, 5)


def test_builder_and_config_errors() -> None:
    assert isinstance(build_transformer_model(config("tagging")), TransformerTagger)
    assert isinstance(build_transformer_model(config("pair")), TransformerClassifier)
    assert isinstance(build_transformer_model(config("classification")), TransformerClassifier)
    with pytest.raises(AttnAuditError, match="seq2seq"):
        build_transformer_model(config("seq2seq"))
    with pytest.raises(AttnAuditError, match="divisible"):
        build_transformer_model(config(heads=3))
    with pytest.raises(AttnAuditError, match="normaliser"):
        build_transformer_model(config(attention="softermax"))
    with pytest.raises(AttnAuditError, match="TransformerTagger"):
        TransformerTagger(config("classification"))
    with pytest.raises(AttnAuditError, match="TransformerClassifier"):
        TransformerClassifier(config("tagging"))
    model = model_for()
    with pytest.raises(AttnAuditError, match="token ids"):
        model(batch_of([[1, 2, VOCAB]]))
    with pytest.raises(AttnAuditError, match="max_len"):
        model(batch_of(random_rows([65])))


def test_entmax_agrees_with_normalise_on_trace_scores() -> None:
    model = model_for(attention="entmax15")
    b = batch_of(random_rows(LENGTHS))
    layer = model(b).trace[1]
    assert torch.allclose(layer.weights, normalise(layer.scores, b.mask[:, None, None, :], "entmax15"))
