"""Importance methods on tiny trained runs of every family: shapes, padding, references."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.batching import Collator
from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError
from attnaudit.importance import (
    IMPORTANCE,
    _compact,
    attention_gradient,
    attention_importance,
    attention_per_head,
    gradient_importance,
    gradient_times_attention,
    integrated_gradients,
    item_mask,
    loo_importance,
    loo_importance_reference,
)
from attnaudit.models import ModelConfig, build_model, freeze_to
from attnaudit.progress import set_quiet
from attnaudit.run import Run, TaskSpec
from attnaudit.training.trainer import train

TINY = {"epochs": 1, "embed_dim": 16, "hidden_dim": 8, "quiet_eval": True}
FAMILIES = {
    "bilstm": ("classification", "bilstm", {}),
    "cnn": ("classification", "cnn", {"cnn_filters": 4, "cnn_kernels": (1, 3, 5)}),
    "average": ("classification", "average", {}),
    "flat": ("classification", "flat", {}),
    "transformer": ("classification", "transformer", {"d_model": 16, "heads": 2, "layers": 2}),
    "han": ("han", "han", {}),
    "pair-bilstm": ("pair", "bilstm", {}),
    "pair-average": ("pair", "average", {}),
    "pair-transformer": ("pair", "transformer", {"d_model": 16, "heads": 2, "layers": 2}),
}


def tiny_task(kind: str) -> TaskData:
    """Synthetic classification; ``han`` splits it into 4-token sentences; ``pair`` asks a question.

    The pair task asks "is it positive/negative" about the synthetic text and answers yes/no.
    """
    base = synthetic_task("classification", seed=0, n_train=150, n_dev=30, n_test=30)
    if kind == "classification":
        return base

    def convert(ex: Example, index: int) -> Example:
        if kind == "han":
            return replace(ex, sentences=[ex.tokens[i : i + 4] for i in range(0, len(ex.tokens), 4)])
        asked = "positive" if index % 2 else "negative"
        return replace(ex, query=["is", "it", asked], label="yes" if ex.label == asked else "no")

    splits = {name: [convert(ex, i) for i, ex in enumerate(base.split(name))] for name in ("train", "dev", "test")}
    if kind == "han":
        return replace(base, name="tiny-han", **splits)
    return replace(base, name="tiny-pair", task_type="pair", labels=["no", "yes"], **splits)


def short_example(kind: str) -> Example:
    """A one-item instance: one token (one sentence for HAN), so LOO is NaN and ranks are empty."""
    if kind == "han":
        return Example(tokens=["pos0", "w001"], label="positive", sentences=[["pos0", "w001"]])
    if kind == "pair":
        return Example(tokens=["pos0"], label="yes", query=["is", "it", "positive"])
    return Example(tokens=["pos0"], label="positive")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Run, Batch]]:
    """One tiny trained run per family and a test batch with one one-item instance."""
    set_quiet(True)
    root = tmp_path_factory.mktemp("importance-runs")
    out = {}
    for name, (kind, model, options) in FAMILIES.items():
        task = tiny_task(kind)
        run = train(task, model, root / name, **TINY, **options)
        examples = [*task.test[:6], short_example(kind)]
        out[name] = (run, run.collate(examples))
    return out


def real_items(run: Run, batch: Batch) -> torch.Tensor:
    return item_mask(run, batch)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_method_has_item_shape_and_zero_padding(runs: dict, family: str) -> None:
    run, batch = runs[family]
    mask = real_items(run, batch)
    assert mask.shape[0] == len(batch)
    if family == "han":
        assert mask.shape[1] == batch.tokens.shape[1]  # sentences
    single = mask.sum(1) < 2
    assert single[-1] and not single[:-1].any()
    for name, method in IMPORTANCE.items():
        kwargs = {"steps": 8} if name == "ig" else {}
        scores = method(run, batch, **kwargs)
        assert scores.shape == mask.shape, name
        assert (scores[~mask] == 0).all(), name
        real = scores[mask & ~single[:, None]]
        assert torch.isfinite(real).all(), name
        if name == "loo":
            assert scores[-1][mask[-1]].isnan().all()
            assert (real >= 0).all()
        if name in ("gradient", "ig", "attention"):
            assert (real >= 0).all(), name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fast_loo_equals_captum_feature_ablation(runs: dict, family: str) -> None:
    run, batch = runs[family]
    fast, reference = loo_importance(run, batch), loo_importance_reference(run, batch)
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=0, equal_nan=True)
    assert fast.nan_to_num(0).abs().max() > 0  # not vacuously equal


@settings(max_examples=12, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    encoder=st.sampled_from(["bilstm", "average", "cnn"]),
    seed=st.integers(0, 1000),
)
def test_fast_loo_equals_reference_on_random_models(lengths: list[int], encoder: str, seed: int) -> None:
    """Untrained models, arbitrary length mixes: the shortcuts must still be exact removals."""
    torch.manual_seed(seed)
    config = ModelConfig(
        model=encoder, task_type="classification", vocab_size=30, num_labels=3, embed_dim=6, hidden_dim=5,
        cnn_kernels=(1, 3, 4), cnn_filters=3, attention="sparsemax" if seed % 2 else "softmax",
    )
    model = build_model(config).eval()
    # Large random weights make the outputs move visibly when a token goes.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    run = Run(model=model, collate=None, task=TaskSpec(spec="x", task_type="classification", labels=["a", "b", "c"]))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    tokens = torch.randint(2, 30, (len(lengths), width), generator=g) * mask
    batch = Batch(tokens=tokens, mask=mask)
    torch.testing.assert_close(
        loo_importance(run, batch), loo_importance_reference(run, batch), atol=1e-5, rtol=0, equal_nan=True
    )


def test_gradient_matches_hand_written_autograd(runs: dict) -> None:
    """J&W's gradient written out by hand for the biLSTM classifier, one instance at a time."""
    run, batch = runs["bilstm"]
    model = run.model.eval()
    ours = gradient_importance(run, batch)
    for b in range(len(batch)):
        n = int(batch.mask[b].sum())
        tokens = batch.tokens[b : b + 1, :n]
        emb = model.embedding(tokens).detach().requires_grad_(True)
        states = model.encoder.rnn(emb)[0]
        scores = model.scorer(states[:, None])[:, 0, 0]
        alpha = scores.softmax(-1).detach()  # attention as a constant
        probs = model.output(alpha @ states[0]).softmax(-1)
        probs.max().backward()
        expected = (emb.grad * emb).sum(-1).abs()[0]
        torch.testing.assert_close(ours[b, :n], expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("family", ["transformer", "han", "pair-transformer"])
def test_gradient_is_per_instance(runs: dict, family: str) -> None:
    """Batched gradients equal gradients of each instance alone (no leakage through padding)."""
    run, batch = runs[family]
    ours = gradient_importance(run, batch)
    examples = batch.examples
    for b in (0, 3):
        alone = gradient_importance(run, run.collate([examples[b]]))
        k = alone.shape[1]
        torch.testing.assert_close(ours[b, :k], alone[0], atol=1e-6, rtol=1e-4)
        assert (ours[b, k:] == 0).all()


@pytest.mark.parametrize("family", ["bilstm", "cnn", "average", "transformer", "han", "pair-transformer"])
def test_integrated_gradients_completeness(runs: dict, family: str) -> None:
    """Signed IG attributions sum to f(x) − f(0) (zero passage embeddings)."""
    run, batch = runs[family]
    model = run.model.eval()
    signed = integrated_gradients(run, batch, steps=50, absolute=False)
    with torch.no_grad():
        probs = model(batch).probs
        pred = probs.argmax(-1, keepdim=True)
        emb = model.embed(batch)
        baseline = emb.clone()
        baseline[:, : batch.tokens.shape[1]] = 0  # the passage only: a pair Transformer's query stays
        f0 = model(batch, embeddings=baseline).probs.gather(1, pred)[:, 0]
    fx = probs.gather(1, pred)[:, 0]
    torch.testing.assert_close(signed.sum(1), fx - f0, atol=1e-3, rtol=0)
    absolute = integrated_gradients(run, batch, steps=50)
    if family == "han":  # |token| summed per sentence bounds |sentence sum|
        assert (absolute >= signed.abs() - 1e-7).all()
    else:
        torch.testing.assert_close(absolute, signed.abs())


@pytest.mark.parametrize("family", ["bilstm", "transformer", "han"])
def test_attention_importance_is_the_explained_attention(runs: dict, family: str) -> None:
    run, batch = runs[family]
    mask = real_items(run, batch)
    attention = attention_importance(run, batch)
    torch.testing.assert_close(attention.sum(1), torch.ones(len(batch)))
    heads = attention_per_head(run, batch)
    torch.testing.assert_close(heads[:, -1].mean(1), attention)
    assert (heads.permute(0, 3, 1, 2)[~mask] == 0).all()
    if family == "transformer":
        assert heads.shape[1:3] == (2, 2)
        torch.testing.assert_close(attention_importance(run, batch, layer=0, head=1), heads[:, 0, 1])
        with pytest.raises(AttnAuditError, match="head 5 out of range"):
            attention_importance(run, batch, head=5)
        with pytest.raises(AttnAuditError, match="out of range"):
            attention_importance(run, batch, layer=2)
    if family == "han":
        words = attention_importance(run, batch, layer=0)
        assert words.shape == (len(batch), batch.tokens.shape[1] * batch.tokens.shape[2])


def test_pair_transformer_items_are_passage_tokens(runs: dict) -> None:
    run, batch = runs["pair-transformer"]
    for name, method in IMPORTANCE.items():
        assert method(run, batch, **({"steps": 4} if name == "ig" else {})).shape == batch.tokens.shape, name


@pytest.mark.parametrize("family", ["bilstm", "han"])
def test_attention_gradient_matches_finite_differences(runs: dict, family: str) -> None:
    """∂ŷ/∂α on the explained layer against central differences of ŷ under frozen attention."""
    run, batch = runs[family]
    model = run.model.eval()
    layer = model.explained_layer
    grad = attention_gradient(run, batch)
    with torch.no_grad():
        out = model(batch)
        alpha = out.trace[layer].weights.double()
        pred = out.probs.argmax(-1, keepdim=True)
    model.double()
    try:
        eps = 1e-4
        for item in (0, 1):
            bump = torch.zeros_like(alpha)
            bump[..., item] = eps
            with torch.no_grad():
                up = model(batch, [freeze_to(alpha + bump, layer)]).probs.gather(1, pred)[:, 0]
                down = model(batch, [freeze_to(alpha - bump, layer)]).probs.gather(1, pred)[:, 0]
            torch.testing.assert_close(grad[:-1, item].double(), ((up - down) / (2 * eps))[:-1], atol=1e-5, rtol=1e-3)
    finally:
        model.float()
    torch.testing.assert_close(gradient_times_attention(run, batch), attention_importance(run, batch) * grad)


def test_tagging_models_are_refused() -> None:
    config = ModelConfig(model="transformer", task_type="tagging", vocab_size=10, num_labels=3, embed_dim=8, d_model=8, heads=2)
    collate = Collator(Vocab(["a", "b"]), ["O", "B-X", "I-X"], "tagging")
    run = Run(model=build_model(config), collate=collate, task=TaskSpec(spec="x", task_type="tagging", labels=["O", "B-X", "I-X"]))
    batch = collate([Example(tokens=["a", "b"], tags=["O", "B-X"])])
    for method in IMPORTANCE.values():
        with pytest.raises(AttnAuditError, match="one decision per instance"):
            method(run, batch)


def test_registry_names_are_stable() -> None:
    assert set(IMPORTANCE) == {"attention", "gradient", "attention_gradient", "gradient_x_attention", "loo", "ig"}


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(st.booleans(), min_size=1, max_size=7), min_size=1, max_size=4))
def test_compact_removes_exactly_the_dropped_items(rows: list[list[bool]]) -> None:
    width = max(len(r) for r in rows)
    mask = torch.tensor([[i < len(r) for i in range(width)] for r in rows])
    tokens = (torch.arange(width)[None, :] + 10 * torch.arange(len(rows))[:, None] + 1) * mask
    keep = torch.tensor([r + [False] * (width - len(r)) for r in rows]) & mask
    out = _compact(Batch(tokens=tokens, mask=mask), torch.arange(len(rows)), keep, pad_id=0)
    for b in range(len(rows)):
        expected = tokens[b][keep[b]].tolist()
        assert out.tokens[b][out.mask[b]].tolist() == expected
        assert out.mask[b].tolist()[: len(expected)] == [True] * len(expected)
        assert not out.mask[b, len(expected) :].any()


@pytest.mark.parametrize("family", ["bilstm", "cnn", "transformer", "han", "pair-average"])
def test_loo_does_not_depend_on_the_batch(runs: dict, family: str) -> None:
    """An instance's leave-one-out is the same alone as padded inside a batch."""
    run, batch = runs[family]
    together = loo_importance(run, batch)
    for b in (0, 2):
        alone = loo_importance(run, run.collate([batch.examples[b]]))
        k = alone.shape[1]
        torch.testing.assert_close(together[b, :k], alone[0], atol=1e-6, rtol=0)
