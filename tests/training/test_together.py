"""Sub-runs trained together as one stacked model (:mod:`attnaudit.training.together`) are the sub-runs trained one at
a time: the step-by-step recurrence equals the packed ``nn.LSTM`` / ``nn.GRU``, and three retrains (each with its own
seed and masked data) end with the same weights, history, selected epoch and scores as :func:`train_variant` gives
each alone."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Example, TaskData
from attnaudit.io import read_json
from attnaudit.models.rnn import RecurrentEncoder, stacked_copies
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.adversary import Variant, train_variant, variant_config
from attnaudit.training.together import Job, together_reason, train_together
from attnaudit.training.trainer import train
from attnaudit.weights import load_tensors

set_quiet(True)


@settings(max_examples=15, deadline=None)
@given(cell=st.sampled_from(["lstm", "gru"]), lengths=st.lists(st.integers(0, 7), min_size=1, max_size=4), seed=st.integers(0, 99))
def test_stepwise_recurrence_is_the_packed_one(cell: str, lengths: list[int], seed: int) -> None:
    torch.manual_seed(seed)
    encoder = RecurrentEncoder(cell, 5, 3)  # type: ignore[arg-type]
    x = torch.randn(len(lengths), 8, 5)
    mask = torch.arange(8)[None, :] < torch.tensor(lengths)[:, None]
    packed = encoder(x, mask)
    with stacked_copies():
        stepwise = encoder(x, mask)
    assert torch.allclose(stepwise, packed, atol=1e-6)
    assert (stepwise[~mask] == 0).all()


def _masked(data: TaskData, seed: int, token: str) -> TaskData:
    """``data`` with a random fifth of each example's words replaced by ``token`` (a ROAR retrain's data)."""
    rng = random.Random(seed)

    def split(examples: list[Example]) -> list[Example]:
        return [replace(ex, tokens=[token if rng.random() < 0.2 else w for w in ex.tokens]) for ex in examples]

    return replace(data, train=split(data.train), dev=split(data.dev), test=split(data.test))


@pytest.fixture(scope="module", params=["bilstm", "cnn", "average", "pair"])
def base(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A small run of each family that trains stacked; ``pair`` is the BiLSTM of a passage-and-question task (bAbI's
    kind), with the bAbI preset."""
    from tests.conftest import tiny_task

    if request.param == "pair":
        data = tiny_task("pair")
        return train(data, "bilstm", tmp_path_factory.mktemp("together") / "base", preset="madsen2022-babi", epochs=3,
                     batch_size=16, embed_dim=12, hidden_dim=6, lr=1e-2, quiet_eval=True)
    data = synthetic_task("classification", seed=0, n_train=100, n_dev=24, n_test=24)
    early = {"early_stop": True, "patience": 1} if request.param == "cnn" else {}  # a model stopping on its own
    return train(data, request.param, tmp_path_factory.mktemp("together") / "base", preset="madsen2022-sst", epochs=3,
                 batch_size=16, embed_dim=12, hidden_dim=6, lr=1e-2, min_length=0, quiet_eval=True, **early)


def test_stacked_training_is_training_one_at_a_time(base: Run, tmp_path: Path) -> None:
    token = "[MASK]"  # 100 sentences in batches of 16: the short batch comes at another step for each seed
    jobs = [Job(tmp_path / "together" / f"job{k}", Variant({"kind": "test", "k": k}), seed, _masked(base.data(), k, token), f"job{k}")
            for k, seed in enumerate([0, 3, 3])]
    assert all(together_reason(base, *variant_config(base, job.variant, None, job.seed)[:2], job.variant) is None for job in jobs)
    together = train_together(base, jobs)
    for job, sub in zip(jobs, together, strict=True):
        alone = train_variant(base, tmp_path / "alone" / job.out.name, job.variant, seed=job.seed, data=job.data)
        assert sub.run.info["hash"] == alone.run.info["hash"]
        mine, theirs = load_tensors(job.out / "model.safetensors"), load_tensors(alone.run.path / "model.safetensors")
        assert mine.keys() == theirs.keys()
        for name in mine:
            assert torch.allclose(mine[name], theirs[name], atol=1e-4), (name, float((mine[name] - theirs[name]).abs().max()))
        a, b = read_json(job.out / "metrics.json"), read_json(alone.run.path / "metrics.json")
        assert a["training"]["selected_epoch"] == b["training"]["selected_epoch"]
        assert a["training"]["epochs_run"] == b["training"]["epochs_run"]
        assert a["training"]["selection"] == b["training"]["selection"] and a["training"]["stopped"] == b["training"]["stopped"]
        assert a["epochs"] == b["epochs"]
        for split in ("dev", "test"):
            assert a[split] == pytest.approx(b[split], abs=1e-6)
        assert [h["epoch"] for h in a["history"]] == [h["epoch"] for h in b["history"]]
        for mine_h, theirs_h in zip(a["history"], b["history"], strict=True):
            assert mine_h["train_loss"] == pytest.approx(theirs_h["train_loss"], abs=1e-5)
            assert mine_h["dev"] == pytest.approx(theirs_h["dev"], abs=1e-6)
        assert a["together"]["models"] == 3
    again = train_together(base, jobs)  # finished: loaded, not retrained
    assert not any(sub.trained for sub in again)


def test_what_cannot_be_stacked_trains_alone(base: Run, tmp_path: Path) -> None:
    cfg, config, _ = variant_config(base, Variant({"kind": "test"}), None, 0)
    assert "clipping" in str(together_reason(base, replace(cfg, clip=1.0), config, Variant({})))
    assert "dropout" in str(together_reason(base, replace(cfg, word_dropout=0.1), config, Variant({})))
    assert "dropout" in str(together_reason(base, cfg, config.with_(dropout=0.2), Variant({})))
    assert "loss" in str(together_reason(base, cfg, config, Variant({}, loss=lambda batch, out: out.logits.sum())))
    jobs = [Job(tmp_path / f"job{k}", Variant({"kind": "test", "k": k}, model={"dropout": 0.1}), 0, base.data()) for k in range(2)]
    subs = train_together(base, jobs)  # dropout: one at a time, each as train_variant trains it
    assert all("together" not in read_json(job.out / "metrics.json") for job in jobs)
    assert [sub.trained for sub in subs] == [True, True]


def test_a_stacked_model_keeps_its_parameter_names() -> None:
    from attnaudit.training.together import stack_models

    nets = [nn.Sequential(nn.Linear(3, 2)) for _ in range(4)]
    stacked = stack_models(nets)
    assert [n for n, _ in stacked.named_parameters()] == [n for n, _ in nets[0].named_parameters()]
    assert stacked.get_parameter("0.weight").shape == (4, 2, 3)
    assert torch.equal(stacked.get_parameter("0.weight")[2], nets[2][0].weight)


@pytest.mark.parametrize("kill", ["after the selection's commit", "after the loop's checkpoint"])
def test_a_killed_round_resumes_to_the_sub_runs_of_an_unbroken_one(base: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill: str) -> None:
    """Killed in epoch 2 (the per-model selection written, the loop's checkpoint still at epoch 1; or both at epoch 2),
    the round resumes from its folder and writes the sub-runs an unbroken round writes; the folder goes afterwards."""
    import attnaudit.training.checkpoint as checkpoint
    from attnaudit.training.together import Keeper

    def jobs(folder: Path) -> list[Job]:
        return [Job(folder / f"job{k}", Variant({"kind": "test", "k": k}), seed, _masked(base.data(), k, "[MASK]"))
                for k, seed in enumerate([0, 3, 3])]

    unbroken = train_together(base, jobs(tmp_path / "unbroken"))
    calls = [0]
    commit, save_epoch = Keeper.commit, checkpoint.save_epoch

    def dying_commit(self: Keeper) -> None:
        commit(self)
        calls[0] += 1
        if kill == "after the selection's commit" and calls[0] == 2:
            raise KeyboardInterrupt

    def dying_save(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        save_epoch(*args, **kwargs)
        if kill == "after the loop's checkpoint" and calls[0] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(Keeper, "commit", dying_commit)
    monkeypatch.setattr(checkpoint, "save_epoch", dying_save)
    broken = jobs(tmp_path / "broken")
    with pytest.raises(KeyboardInterrupt):
        train_together(base, broken)
    assert [p.name for p in (tmp_path / "broken").iterdir() if p.name.startswith(".together")]
    monkeypatch.undo()
    seen: list[int] = []
    record = Keeper.record
    monkeypatch.setattr(Keeper, "record", lambda self, k, rec, weights: (seen.append(rec["epoch"]), record(self, k, rec, weights)))
    resumed = train_together(base, broken)
    assert min(seen) == (2 if kill == "after the selection's commit" else 3)  # resumed, not started again
    for mine, theirs in zip(resumed, unbroken, strict=True):
        a, b = load_tensors(mine.run.path / "model.safetensors"), load_tensors(theirs.run.path / "model.safetensors")
        assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)
        x, y = read_json(mine.run.path / "metrics.json"), read_json(theirs.run.path / "metrics.json")
        assert [h["epoch"] for h in x["history"]] == [h["epoch"] for h in y["history"]]
        for h, g in zip(x["history"], y["history"], strict=True):
            assert h["train_loss"] == pytest.approx(g["train_loss"]) and h["dev"] == pytest.approx(g["dev"])
        assert x["test"] == pytest.approx(y["test"]) and x["training"]["selected_epoch"] == y["training"]["selected_epoch"]
    assert not [p for p in (tmp_path / "broken").iterdir() if p.name.startswith(".together")]


def test_jobs_with_training_splits_of_other_sizes_train_in_groups_of_their_own(base: Run, tmp_path: Path) -> None:
    data = base.data()
    short = replace(data, train=data.train[:-5])
    jobs = [Job(tmp_path / f"job{k}", Variant({"kind": "test", "k": k}), k, d) for k, d in enumerate([data, short, data])]
    train_together(base, jobs)
    assert [read_json(job.out / "metrics.json").get("together", {}).get("models", 1) for job in jobs] == [2, 1, 2]


def test_the_stacked_loop_ends_when_every_model_has_stopped(tmp_path: Path) -> None:
    from attnaudit.training.loop import Selection
    from attnaudit.training.together import Keeper

    keep = Keeper(Selection("dev.accuracy", ceiling=1.0, patience=2), 2, tmp_path)
    weights = lambda: {"w": torch.zeros(1)}  # noqa: E731
    keep.record(0, {"epoch": 1, "dev": {"accuracy": 1.0}}, weights)  # at the ceiling: stopped alone
    keep.record(1, {"epoch": 1, "dev": {"accuracy": 0.5}}, weights)
    assert keep.stopped(0) and not keep.stopped(1) and not keep.all_stopped()
    keep.record(0, {"epoch": 2, "dev": {"accuracy": 1.0}}, weights)  # a later epoch no longer counts for it
    assert len(keep.history[0]) == 1 and keep.selected[0] == 1
    for epoch in (2, 3):  # two epochs without improvement: patience
        keep.record(1, {"epoch": epoch, "dev": {"accuracy": 0.5}}, weights)
    assert keep.stopped(1) and keep.all_stopped()
