"""The perturbation explainers (``shapley``, ``kernel_shap``, ``lime``, ``occlusion``): hand-computed Shapley values
of a toy model, efficiency, seeds, groups, the batched/prefix route against plain one-at-a-time recomputation, and
Captum's ``ShapleyValueSampling``, ``ShapleyValues``, ``KernelShap``, ``Lime`` and ``Occlusion`` on the same model,
features, baselines and seeds (≤ 1e-5; skipped without Captum).

The reference forward (:func:`plain_values`) builds each perturbed input by hand (tokens deleted or replaced in the
id sequence) and runs it alone through the model, so it shares nothing with the batched route but the model.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain import get_explanation, item_mask
from attnaudit.explain.helpers import perturbation
from attnaudit.explain.helpers.features import feature_groups
from attnaudit.explain.methods.kernel_shap import kernel_shap
from attnaudit.explain.methods.lime import lime
from attnaudit.explain.methods.occlusion import occlusion
from attnaudit.explain.methods.shapley import shapley
from tests.explain.test_loo_decoder import zero_shot

METHODS = {"shapley": shapley, "kernel_shap": kernel_shap, "lime": lime, "occlusion": occlusion}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def decoder(tiny_hf: SimpleNamespace) -> SimpleNamespace:
    """A tiny random Llama classifying zero-shot ("a dog runs , {text} was" → bad/good) and a padded batch of 3."""
    model, collate = zero_shot("llama", tiny_hf.vocab, "a dog runs , {text} was")
    batch = collate(tiny_hf.task().test[:3])
    assert getattr(model, "continues_prefix", False) and not batch.mask.all()
    return SimpleNamespace(model=model, batch=batch)


@pytest.fixture(scope="module")
def classifier(tiny_transformer_run) -> SimpleNamespace:
    from attnaudit.data.synthetic import synthetic_task

    examples = synthetic_task("classification", seed=0, n_train=600, n_dev=60, n_test=60).test[:3]
    return SimpleNamespace(model=tiny_transformer_run.model, batch=tiny_transformer_run.collate(examples))


def one(batch: Batch, b: int) -> Batch:
    """Instance ``b`` alone, its padding cut."""
    return batch.select(torch.tensor([b]))


def plain_values(model, batch: Batch, keep: torch.Tensor, baseline: str) -> torch.Tensor:
    """``ŷ`` of each perturbed input, built by hand and run alone: ``batch`` one instance, ``keep`` ``(N, K)``
    over its items (1 kept, 0 perturbed)."""
    items = item_mask(model, batch)[0]
    ids = batch.tokens[0][batch.mask[0].bool()]
    positions = items[: len(ids)].nonzero()[:, 0]
    with torch.no_grad():
        full = model.logits_forward(batch).probs
        cls = full.argmax(-1) if batch.explained is None else batch.explained
        out = []
        for row in keep:
            removed = positions[row < 0.5]
            if baseline == "delete":
                left = torch.ones(len(ids), dtype=torch.bool)
                left[removed] = False
                new = ids[left] if left.any() else torch.tensor([model.config.pad_id])
            else:
                new = ids.clone()
                new[removed] = perturbation.token_baseline(model, baseline)
            probs = model.logits_forward(dataclasses.replace(batch, tokens=new[None], mask=torch.ones(1, len(new), dtype=torch.bool),
                                                             items=None, segments=None)).probs
            out.append(probs[0, cls[0]])
    return torch.stack(out)


def test_additive_toy_is_exact_for_every_order() -> None:
    """v(S) = Σ_{i∈S} w_i: every order credits each feature its own weight, so even one sample is exact."""
    weights = torch.tensor([0.5, -2.0, 3.0, 0.25], dtype=torch.float64)

    class Toy:
        def values(self, rows: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
            return present.double() @ weights

    from attnaudit.explain.methods.shapley import _instance

    assert torch.equal(_instance(Toy(), 0, 4, 1, seed=3), weights)  # type: ignore[arg-type]


def test_exact_shapley_of_an_additive_and_interaction_toy() -> None:
    """v(S) = 1·[0∈S] + 2·[1∈S] + 3·[1∈S][2∈S]: φ = (1, 3.5, 1.5), with enough permutations of 3 features."""
    class Toy:
        counts = [3]
        full = torch.tensor([6.0], dtype=torch.float64)

        def values(self, rows: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
            p = present.double()
            return p[:, 0] + 2 * p[:, 1] + 3 * p[:, 1] * p[:, 2]

    from attnaudit.explain.methods.shapley import _instance

    phi = _instance(Toy(), 0, 3, 2000, seed=0)  # type: ignore[arg-type]
    torch.testing.assert_close(phi, torch.tensor([1.0, 3.5, 1.5], dtype=torch.float64), atol=0.1, rtol=0)
    assert phi.sum().item() == pytest.approx(6.0, abs=1e-9)  # efficiency holds for every sample, not only the mean


@pytest.mark.parametrize("baseline", ["delete", "unk"])
def test_shapley_efficiency_and_seeds(decoder: SimpleNamespace, baseline: str) -> None:
    model, batch = decoder.model, decoder.batch
    scores = shapley(model, batch, samples=3, seed=1, baseline=baseline)
    items = item_mask(model, batch)
    assert torch.all(scores[~items] == 0)
    for b in range(len(batch)):
        alone = one(batch, b)
        k = int(item_mask(model, alone).sum())
        ends = plain_values(model, alone, torch.stack([torch.ones(k), torch.zeros(k)]), baseline)
        assert scores[b].sum().item() == pytest.approx((ends[0] - ends[1]).item(), abs=1e-5)
    assert torch.equal(scores, shapley(model, batch, samples=3, seed=1, baseline=baseline))
    assert not torch.equal(scores, shapley(model, batch, samples=3, seed=2, baseline=baseline))


@pytest.mark.parametrize("name", list(METHODS))
def test_groups_share_one_score(decoder: SimpleNamespace, name: str) -> None:
    model, batch = decoder.model, decoder.batch
    items = item_mask(model, batch)
    segments = (items.long().cumsum(1) - 1) // 2  # pairs of items
    grouped = dataclasses.replace(batch, segments=segments.masked_fill(~items, -1))
    scores = METHODS[name](model, grouped, **({"samples": 8} if name != "occlusion" else {}))
    groups = feature_groups(model, grouped)
    for b in range(len(batch)):
        for g in range(int(groups[b].max()) + 1):
            values = scores[b][groups[b] == g]
            assert torch.all(values == values[0])
    assert scores.abs().sum() > 0


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("baseline", ["delete", "unk", "zero"])
def test_batched_route_equals_one_instance_at_a_time(decoder: SimpleNamespace, name: str, baseline: str) -> None:
    """The batch (decoder: continuing from kept prefixes) gives each instance what it gets alone and whole."""
    model, batch = decoder.model, decoder.batch
    options = {"baseline": baseline, **({"samples": 6, "seed": 3} if name != "occlusion" else {"window": 2})}
    together = METHODS[name](model, batch, **options)
    for b in range(len(batch)):
        alone = one(batch, b)
        single = METHODS[name](model, alone, **options)
        width = single.shape[1]
        torch.testing.assert_close(together[b, :width], single[0], atol=TOLERANCE, rtol=0)


def test_bad_settings_are_one_line(decoder: SimpleNamespace) -> None:
    model, batch = decoder.model, decoder.batch
    with pytest.raises(AttnAuditError, match="--stride 3 is larger than --window 2"):
        occlusion(model, batch, window=2, stride=3)
    with pytest.raises(AttnAuditError, match="--samples must be"):
        shapley(model, batch, samples=0)
    with pytest.raises(AttnAuditError, match="model evaluations"):
        shapley(model, batch, samples=10**8)
    with pytest.raises(AttnAuditError, match="baseline"):
        lime(model, batch, baseline="nothing")
    assert model.tokenizer.mask_token_id is None  # the tiny tokenizer has unk, pad and eos only
    for name in METHODS:
        assert "has no mask token" in (get_explanation(name).applies(model, {"baseline": "mask"}) or "")
        assert get_explanation(name).applies(model, {"baseline": "eos"}) is None


# --------------------------------------------------------------------------- Captum on the same forward

def captum_forward(model, batch: Batch, baseline: str):
    def forward(keep: torch.Tensor) -> torch.Tensor:
        return plain_values(model, batch, keep, baseline).to(torch.float32)

    return forward


@pytest.fixture(scope="module")
def captum():
    return pytest.importorskip("captum.attr")


def _setup(decoder: SimpleNamespace, b: int, grouped: bool) -> tuple:
    model = decoder.model
    alone = one(decoder.batch, b)
    items = item_mask(model, alone)
    k = int(items.sum())
    if grouped:
        segments = ((items.long().cumsum(1) - 1) // 2).masked_fill(~items, -1)
        alone = dataclasses.replace(alone, segments=segments)
    mask = feature_groups(model, alone)[0][items[0]][None]
    return model, alone, items, k, mask


@pytest.mark.parametrize("baseline", ["delete", "eos"])
@pytest.mark.parametrize("grouped", [False, True])
def test_shapley_sampling_equals_captum(captum, decoder: SimpleNamespace, baseline: str, grouped: bool) -> None:
    model, alone, items, k, mask = _setup(decoder, 0, grouped)
    ours = shapley(model, alone, samples=4, seed=5, baseline=baseline)[0][items[0]]
    torch.manual_seed(5)
    theirs = captum.ShapleyValueSampling(captum_forward(model, alone, baseline)).attribute(
        torch.ones(1, k), baselines=0.0, feature_mask=mask, n_samples=4)[0]
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0)
    assert theirs.abs().max() > 1e-4


def test_many_samples_approach_captums_exact_shapley_values(captum, decoder: SimpleNamespace) -> None:
    """On 3 features (pairs of items), the sampled values with many orders near Captum's exact enumeration."""
    model, alone, items, k, mask = _setup(decoder, 2, True)
    mask = mask.clamp_max(2)
    alone = dataclasses.replace(alone, segments=torch.full_like(alone.tokens, -1).masked_scatter(items, mask[0]))
    exact = captum.ShapleyValues(captum_forward(model, alone, "delete")).attribute(torch.ones(1, k), baselines=0.0, feature_mask=mask)[0]
    ours = shapley(model, alone, samples=600, seed=0)[0][items[0]]
    torch.testing.assert_close(ours, exact, atol=0.2 * float(exact.abs().max()), rtol=0)


@pytest.mark.parametrize("grouped", [False, True])
def test_kernel_shap_equals_captum(captum, decoder: SimpleNamespace, grouped: bool) -> None:
    """Fewer samples than coalitions: both draw the same random coalitions."""
    model, alone, items, k, mask = _setup(decoder, 0, grouped)
    assert int(mask.max()) >= 1  # Captum's KernelShap needs two features at least
    samples = (1 << (int(mask.max()) + 1)) - 1
    ours = kernel_shap(model, alone, samples=samples, seed=7)[0][items[0]]
    torch.manual_seed(7)
    theirs = captum.KernelShap(captum_forward(model, alone, "delete")).attribute(
        torch.ones(1, k), baselines=0.0, feature_mask=mask, n_samples=samples)[0]
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(("grouped", "baseline"), [(False, "delete"), (True, "unk")])
def test_kernel_shap_enumerates_to_captums_exact_shapley_values(captum, decoder: SimpleNamespace, grouped: bool, baseline: str) -> None:
    """Samples covering every coalition (≥ 2^M): every coalition once, the exact Shapley values (as shap's
    KernelExplainer enumerates), equal to Captum's ``ShapleyValues`` enumeration."""
    model, alone, items, k, mask = _setup(decoder, 1, grouped)
    ours = kernel_shap(model, alone, samples=1 << (int(mask.max()) + 1), seed=3, baseline=baseline)[0][items[0]]
    exact = captum.ShapleyValues(captum_forward(model, alone, baseline)).attribute(torch.ones(1, k), baselines=0.0, feature_mask=mask)[0]
    torch.testing.assert_close(ours, exact, atol=TOLERANCE, rtol=0)
    assert exact.abs().max() > 1e-4


@pytest.mark.parametrize("grouped", [False, True])
def test_lime_equals_captum_least_squares(captum, decoder: SimpleNamespace, grouped: bool) -> None:
    from captum._utils.models.linear_model import SkLearnLinearRegression

    model, alone, items, k, mask = _setup(decoder, 1, grouped)
    ours = lime(model, alone, samples=40, seed=11, baseline="unk")[0][items[0]]
    torch.manual_seed(11)
    theirs = captum.Lime(captum_forward(model, alone, "unk"), interpretable_model=SkLearnLinearRegression()).attribute(
        torch.ones(1, k), baselines=0.0, feature_mask=mask, n_samples=40)[0]
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(("window", "stride"), [(1, 1), (3, 1), (3, 2), (2, 2)])
def test_occlusion_equals_captum(captum, decoder: SimpleNamespace, window: int, stride: int) -> None:
    model, alone, items, k, _ = _setup(decoder, 0, False)
    ours = occlusion(model, alone, window=window, stride=stride)[0][items[0]]
    theirs = captum.Occlusion(captum_forward(model, alone, "delete")).attribute(
        torch.ones(1, k), sliding_window_shapes=(window,), strides=(stride,), baselines=0.0)[0]
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0)


def test_classifier_route(captum, classifier: SimpleNamespace) -> None:
    """A trained Transformer classifier (whole recomputation, no prefix): Shapley sampling equals Captum's."""
    model, alone = classifier.model, one(classifier.batch, 0)
    items = item_mask(model, alone)
    k = int(items.sum())
    ours = shapley(model, alone, samples=3, seed=0)[0][items[0]]
    torch.manual_seed(0)
    theirs = captum.ShapleyValueSampling(captum_forward(model, alone, "delete")).attribute(
        torch.ones(1, k), baselines=0.0, n_samples=3)[0]
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("family", ["han", "pair-transformer", "cnn"])
@pytest.mark.parametrize("baseline", ["delete", "unk", "zero"])
def test_other_families(runs, family: str, baseline: str) -> None:
    """Sentences (HAN), a pair model's passage, a CNN: efficiency against the perturber's own ends, zero at padding,
    each instance as it is alone (the one-item instance included)."""
    run, batch = runs[family]
    scores = shapley(run, batch, samples=2, seed=0, baseline=baseline)
    items = item_mask(run.model, batch)
    assert torch.isfinite(scores).all() and torch.all(scores[~items] == 0)
    with perturbation.perturbing(run.model, batch, baseline) as perturber:
        for b, count in enumerate(perturber.counts):
            empty = perturber.values(torch.tensor([b]), torch.zeros(1, max(count, 1), dtype=torch.bool))
            assert scores[b].sum().item() == pytest.approx((perturber.full[b] - empty[0]).item(), abs=1e-5)
    for b in (0, len(batch) - 1):
        alone = shapley(run, one(batch, b), samples=2, seed=0, baseline=baseline)
        torch.testing.assert_close(scores[b, : alone.shape[1]], alone[0], atol=TOLERANCE, rtol=0)


def test_explained_and_contrast_classes(decoder: SimpleNamespace) -> None:
    """``batch.explained``/``contrast`` (a generated token, --contrast): v = p(explained) − p(contrast), by efficiency."""
    model, batch = decoder.model, one(decoder.batch, 0)
    with torch.no_grad():
        predicted = model.logits_forward(batch).probs.argmax(-1)
    explained = dataclasses.replace(batch, explained=1 - predicted, contrast=predicted)
    scores = shapley(model, explained, samples=3, seed=0)
    k = int(item_mask(model, batch).sum())
    ends = torch.stack([torch.ones(k), torch.zeros(k)])
    p_explained = plain_values(model, dataclasses.replace(batch, explained=1 - predicted), ends, "delete")
    p_contrast = plain_values(model, dataclasses.replace(batch, explained=predicted), ends, "delete")
    v = p_explained - p_contrast
    assert scores.sum().item() == pytest.approx((v[0] - v[1]).item(), abs=1e-5)
    assert torch.allclose(scores, -shapley(model, dataclasses.replace(batch, explained=predicted, contrast=1 - predicted), samples=3),
                          atol=1e-6)


def test_small_chunks_and_passes_give_the_same_scores(decoder: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Coalitions two at a time, continuations of 8 tokens a pass: the same scores as the defaults."""
    model, batch = decoder.model, decoder.batch
    expected = {name: METHODS[name](model, batch, **({"samples": 6} if name != "occlusion" else {})) for name in METHODS}
    monkeypatch.setattr(perturbation, "_CHUNK_ROWS", 2)
    monkeypatch.setattr(perturbation, "_PASS_TOKENS", 8)
    for name, scores in expected.items():
        again = METHODS[name](model, batch, **({"samples": 6} if name != "occlusion" else {}))
        torch.testing.assert_close(again, scores, atol=TOLERANCE, rtol=0)
