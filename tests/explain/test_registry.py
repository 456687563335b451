"""The registry: every method's shape and padding on every family, applicability, choosing, registering."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from attnaudit.data.batching import Collator
from attnaudit.data.types import Example
from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError
from attnaudit.explain import (
    EXPLANATIONS,
    Explanation,
    applying,
    choose,
    default_names,
    explanation,
    item_mask,
    list_explanations,
    unregister,
)
from attnaudit.explain.methods.random import random_importance
from attnaudit.explain.registry import memoised
from attnaudit.models import ModelConfig, build_model
from attnaudit.run import Run, TaskSpec

from .conftest import FAMILIES

CONTEXT_MIXING = ("norms_res_ln", "globenc", "alti", "value_zeroing", "chefer")
OPTIONS = {"steps": 4, "seed": 1}  # what a test offers every method: few IG steps, a seed


@pytest.fixture
def dummy() -> Iterator[str]:
    """A throw-away method registered for one test: the item's position, 0 at padding."""

    @explanation("position", "the item's position (a test method)", order=1)
    def position(model, batch):
        mask = item_mask(model, batch)
        return torch.arange(mask.shape[1], dtype=torch.float32)[None, :] * mask

    try:
        yield "position"
    finally:
        unregister("position")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_method_that_applies_has_item_shape_and_zero_padding(runs: dict, family: str) -> None:
    run, batch = runs[family]
    mask = item_mask(run, batch)
    if family == "han":
        assert mask.shape[1] == batch.tokens.shape[1]  # sentences
    single = mask.sum(1) < 2
    assert single[-1] and not single[:-1].any()
    applying = list_explanations(run)
    expected = {"attention", "gradient", "attention_gradient", "gradient_x_attention", "loo", "ig", "input_gradient", "random",
                "shapley", "kernel_shap", "lime", "occlusion"}
    if "transformer" in family:
        expected |= {"rollout", "flow", "norms", "decompx", "attnlrp", "cp_lrp", *CONTEXT_MIXING}
        expected -= {"input_gradient"}  # a LayerNorm reads its embeddings first: |Σ_d| refused (tests/explain/test_input_gradient.py)
    assert {m.name for m in applying} == expected
    for method in applying:
        scores = method(run, batch, **OPTIONS)
        assert scores.shape == mask.shape, method.name
        assert (scores[~mask] == 0).all(), method.name
        real = scores[mask & ~single[:, None]]
        assert torch.isfinite(real).all(), method.name
        if method.name in ("gradient", "ig", "attention", "loo", "input_gradient", "rollout", "flow", "norms", "random", *CONTEXT_MIXING):
            assert (real >= 0).all(), method.name
    assert scores.shape == batch.tokens.shape[:2]  # pair models: the passage tokens only


def test_methods_that_do_not_apply_say_why(runs: dict) -> None:
    run, batch = runs["bilstm"]
    assert "self-attention" in EXPLANATIONS["rollout"].applies(run)
    assert "value/output" in EXPLANATIONS["norms"].applies(run.model)
    assert "no residual connections and layer norms" in EXPLANATIONS["alti"].applies(run)
    assert "cannot zero a token's value vector" in EXPLANATIONS["value_zeroing"].applies(run)
    with pytest.raises(AttnAuditError, match="'flow' does not apply to this model"):
        EXPLANATIONS["flow"](run, batch)
    with pytest.raises(AttnAuditError, match="--methods: rollout does not apply"):
        choose(["gradient", "rollout"], model=run)


def test_a_model_without_a_trained_head_gets_no_explanation_of_a_prediction(runs: dict) -> None:
    run, _ = runs["transformer"]
    run.model.trained_head = False
    try:
        names = [m.name for m in list_explanations(run)]
        assert names == ["attention", "rollout", "norms", "norms_res_ln", "globenc", "alti", "value_zeroing", "flow", "random"]
        assert "no trained classification head" in EXPLANATIONS["gradient"].applies(run)
    finally:
        del run.model.trained_head  # back to the class default


def test_tagging_models_get_none() -> None:
    config = ModelConfig(model="transformer", task_type="tagging", vocab_size=10, num_labels=3, embed_dim=8, d_model=8, heads=2)
    collate = Collator(Vocab(["a", "b"]), ["O", "B-X", "I-X"], "tagging")
    run = Run(model=build_model(config), collate=collate, task=TaskSpec(spec="x", task_type="tagging", labels=["O", "B-X", "I-X"]))
    batch = collate([Example(tokens=["a", "b"], tags=["O", "B-X"])])
    assert list_explanations(run) == []
    for method in EXPLANATIONS.values():
        with pytest.raises(AttnAuditError, match="one decision per instance"):
            method(run, batch)


def test_choose_keeps_order_drops_repeats_and_names_the_option() -> None:
    assert list(choose(["loo", "gradient", "loo"])) == ["loo", "gradient"]
    with pytest.raises(AttnAuditError, match=r"^--rankings: unknown method 'integrated' \(choose from attention, "):
        choose(["integrated"], option="--rankings")
    with pytest.raises(AttnAuditError, match="no method given"):
        choose([])
    with pytest.raises(AttnAuditError, match=r"\(choose from gradient\)$"):
        choose(["loo"], allowed=["gradient"])


def test_listing_order_defaults_and_options() -> None:
    assert list(EXPLANATIONS)[:6] == ["attention", "gradient", "loo", "ig", "rollout", "norms"]
    assert default_names() == ["attention", "gradient", "loo", "ig", "rollout", "norms"]
    assert EXPLANATIONS["ig"].options == ("steps", "absolute", "reduction", "score", "baseline", "rule", "weight")
    assert EXPLANATIONS["random"].options == ("seed",)
    assert EXPLANATIONS["gradient"].options == ("reduction", "score", "attention")
    assert EXPLANATIONS["loo"].options == ("loo_tokens", "baseline", "replace")
    # the values a call uses: those offered, else the defaults (what explain_text records as meta["definitions"])
    assert EXPLANATIONS["input_gradient"].settings({"reduction": "l2", "steps": 3}) == {"reduction": "l2", "score": "logit"}


def test_registering_a_method_adds_it_in_order_and_unregistering_removes_it(runs: dict, dummy: str) -> None:
    run, batch = runs["bilstm"]
    assert list(EXPLANATIONS)[0] == dummy and dummy in default_names()
    assert isinstance(EXPLANATIONS[dummy], Explanation) and EXPLANATIONS[dummy] in list_explanations(run)
    scores = EXPLANATIONS[dummy](run, batch, **OPTIONS)  # offered options it does not take are not passed
    assert scores[0, 2] == 2 and scores[-1, 1:].eq(0).all()
    unregister(dummy)
    assert dummy not in EXPLANATIONS


def test_an_unknown_need_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="unknown need"):
        explanation("x", "x", needs=("telepathy",))


def test_memoised_scores_are_computed_once_per_example_and_options(runs: dict) -> None:
    """Within ``memoised``: examples whose scores were computed with the same options get them back
    without a call, also in another batch (assembled row by row, 0 at padding); other options or new
    examples are computed; outside, every call computes."""
    run, batch = runs[next(iter(FAMILIES))]
    calls: list[int] = []

    @explanation("counted", "a test method that counts its calls", order=1)
    def counted(model, batch, seed: int = 0):  # type: ignore[no-untyped-def]
        calls.append(seed)
        mask = item_mask(model, batch)
        return torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask

    try:
        with memoised(run.model) as memo:
            first = EXPLANATIONS["counted"](run.model, batch, seed=3, steps=7)  # steps: not an option it takes
            again = EXPLANATIONS["counted"](run, batch, seed=3)  # the run's model: the same memo
            again.add_(1.0)  # a caller changing its copy does not change what the next one gets
            assert torch.equal(EXPLANATIONS["counted"](run.model, batch, seed=3), first)
            EXPLANATIONS["counted"](run.model, batch, seed=4)
            order = [len(batch) - 1, 0]
            other = run.collate([batch.examples[i] for i in order])  # the same examples in a batch of their own
            part = EXPLANATIONS["counted"](run.model, other, seed=3)
            assert calls == [3, 4] and len(memo) == 2 * len(batch)
            assert part.shape == (2, other.tokens.shape[1])
            assert torch.equal(part, first[order, : other.tokens.shape[1]])
            fresh = [Example(tokens=list(e.tokens), label=e.label) for e in batch.examples[:2]]
            EXPLANATIONS["counted"](run.model, run.collate(fresh), seed=3)
            assert calls == [3, 4, 3]
        EXPLANATIONS["counted"](run.model, batch, seed=3)
        assert calls == [3, 4, 3, 3]
    finally:
        unregister("counted")


def test_batch_bound_scores_are_memoised_per_batch(runs: dict) -> None:
    """``random`` draws follow the batch's shape: it is shared only with the same batch, never row by row."""
    run, batch = runs[next(iter(FAMILIES))]
    assert not EXPLANATIONS["random"].per_example
    with memoised(run.model) as memo:
        whole = EXPLANATIONS["random"](run.model, batch, seed=1)
        assert torch.equal(EXPLANATIONS["random"](run.model, batch, seed=1), whole) and len(memo) == 1
        other = run.collate(list(batch.examples)[:2])
        assert torch.equal(EXPLANATIONS["random"](run.model, other, seed=1), random_importance(run.model, other, seed=1))
        assert len(memo) == 2


def test_memoised_scores_are_never_handed_to_new_examples_at_a_recycled_address(runs: dict) -> None:
    """Batches built from throw-away examples: the memo keeps its examples alive, so a later batch of new
    examples can never match an earlier key by a recycled ``id``."""
    run, batch = runs[next(iter(FAMILIES))]
    calls: list[int] = []

    @explanation("counted", "a test method that counts its calls", order=1)
    def counted(model, batch):  # type: ignore[no-untyped-def]
        calls.append(len(batch))
        return item_mask(model, batch).float()

    try:
        with memoised(run.model) as memo:
            for _ in range(20):
                copies = [Example(tokens=list(e.tokens), label=e.label) for e in batch.examples]
                EXPLANATIONS["counted"](run.model, run.collate(copies))
                del copies
            assert len(calls) == 20 and len(memo) == 20 * len(batch)
    finally:
        unregister("counted")


def test_applying_leaves_out_a_default_that_does_not_apply_and_refuses_a_named_one(runs: dict) -> None:
    """Our Transformer's embeddings enter a LayerNorm first: input_gradient's default |Σ_d| does not apply to it."""
    model = runs["transformer"][0].model
    defaults = ("gradient", "input_gradient")
    chosen, dropped = applying(list(defaults), model, "--methods", defaults)
    assert list(chosen) == ["gradient"] and list(dropped) == ["input_gradient"] and "LayerNorm" in dropped["input_gradient"]
    with pytest.raises(AttnAuditError, match=r"^--methods: input_gradient does not apply to this model: .*LayerNorm"):
        applying(["input_gradient"], model, "--methods", defaults)
    assert applying(["gradient"], model, "--methods", defaults) == ({"gradient": EXPLANATIONS["gradient"]}, {})
