"""The in-distribution test: MaSF p-values of masked inputs, ordinary against masked fine-tuning (Madsen et al. 2024)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.experiments.in_distribution import masked_by_order
from attnaudit.progress import set_quiet
from attnaudit.training.finetune import finetune

set_quiet(True)


@pytest.fixture(scope="module")
def fine_tuned(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> dict[bool, object]:
    """The tiny BERT fine-tuned on 200 random sentences of its words, with and without masking."""
    rng = random.Random(0)
    words = tiny_hf.vocab[5:]
    data = [Example(tokens=[rng.choice(words) for _ in range(rng.randint(6, 12))], label=rng.choice(["neg", "pos"]),
                    meta={"source": f"tiny:{i}"}) for i in range(380)]
    task = TaskData(name="t", task_type="classification", train=data[:200], dev=data[200:350], test=data[350:], labels=["neg", "pos"])
    folder = tmp_path_factory.mktemp("in-distribution")
    return {masking: finetune(task, folder / str(masking), hf=str(tiny_hf.dir), epochs=3, batch_size=8, lr=1e-3, masking=masking,
                              device="cpu") for masking in (False, True)}


def test_masked_inputs_leave_the_distribution_unless_the_model_was_fine_tuned_masked(fine_tuned, tmp_path: Path) -> None:
    options = {"methods": ["random", "gradient"], "ratios": [0, 100], "reference": 150}
    plain = run_test("in-distribution", fine_tuned[False], out=tmp_path / "plain", plot=False, **options).summary
    masked = run_test("in-distribution", fine_tuned[True], out=tmp_path / "masked", plot=False, **options).summary
    assert not plain["masked_training"] and masked["masked_training"]
    assert plain["ood_share_random_0"] <= 0.1 and masked["ood_share_random_0"] <= 0.1  # as written: in distribution
    assert plain["ood_share_random_100"] >= 0.9 and plain["ood_share_gradient_100"] >= 0.9
    assert masked["ood_share_random_100"] <= 0.1 and masked["ood_share_gradient_100"] <= 0.1


def test_masking_follows_the_order_and_skips_specials() -> None:
    batch = Batch(tokens=torch.tensor([[2, 10, 11, 12, 13, 3]]), mask=torch.ones(1, 6, dtype=torch.bool))
    maskable = torch.tensor([[False, True, True, True, True, False]])
    order = torch.tensor([[0, 3, 5, 1, 2, 4]])  # positions by importance; 0 and 5 are specials
    assert masked_by_order(batch, order, maskable, 0.5, 4).tokens[0].tolist() == [2, 4, 11, 4, 13, 3]  # round(0.5 * 4) = 2
    assert masked_by_order(batch, order, maskable, 1.0, 4).tokens[0].tolist() == [2, 4, 4, 4, 4, 3]
    assert torch.equal(batch.tokens, torch.tensor([[2, 10, 11, 12, 13, 3]]))  # the batch itself unchanged


@pytest.mark.parametrize(("option", "value", "message"), [("ratios", [0, 120], "--ratios are percentages from 0 to 100"),
                                                          ("level", 1.5, "--level must be in"), ("reference", 3, "--reference must be")])
def test_bad_options_are_one_line(fine_tuned, option: str, value: object, message: str, tmp_path: Path) -> None:
    with pytest.raises(AttnAuditError, match=message):
        run_test("in-distribution", fine_tuned[False], out=tmp_path / "x", plot=False, **{option: value})
    assert not (tmp_path / "x" / "in-distribution.json").exists()


def test_a_model_without_a_mask_token_is_told_why(tiny_attention_run) -> None:
    from attnaudit.experiments.experiment import get_experiment

    assert "mask token" in (get_experiment("in-distribution").why_not(tiny_attention_run("bilstm")) or "")
