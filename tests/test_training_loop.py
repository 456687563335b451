"""The one training loop (attnaudit.training.loop): every kind of training goes through it, and
its knobs (early stopping, fixed epochs, selection from a minimum epoch, weight-decay groups,
no clipping, schedules, step budget) do what hand-worked cases say; a killed sub-run resumes
to the weights of an uninterrupted one, bit for bit."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from torch import Tensor, nn

from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.runner import run_test
from attnaudit.progress import set_quiet
from attnaudit.training import loop
from attnaudit.training.loop import Hooks, LoopConfig, Optimiser, Selection, fit
from attnaudit.training.trainer import TrainConfig, cross_entropy, train

set_quiet(True)
SRC = str(Path(__file__).resolve().parents[1] / "src")


# --------------------------------------------------------------------------- a hand-checkable set-up


class Rows:
    """Stands in for a run: ``batches`` of plain lists, shuffled with the loop's seed."""

    def batches(self, examples: list[Any], batch_size: int, shuffle: bool = False, seed: int = 0) -> Iterator[list[Any]]:
        order = list(range(len(examples)))
        if shuffle:
            random.Random(seed).shuffle(order)
        for start in range(0, len(order), batch_size):
            yield [examples[i] for i in order[start : start + batch_size]]


class Pair(nn.Module):
    """Two named parameter vectors, ``scorer.w`` and ``out.w``."""

    def __init__(self) -> None:
        super().__init__()
        self.scorer = nn.Module()
        self.scorer.w = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.out = nn.Module()
        self.out.w = nn.Parameter(torch.tensor([3.0, -4.0]))


def scripted(scores: list[float], key: str = "acc", **selection: Any) -> tuple[dict[str, Any], list[int]]:
    """Run the loop on a zero loss with the dev scores ``scores`` (one per epoch); the final state
    and the epochs whose model was saved as the best."""
    dev = iter(scores)
    epoch, saved = [0], []

    def epoch_start(number: int) -> None:
        epoch[0] = number

    hooks = Hooks(
        loss=lambda model, batch: (model.out.w * 0.0).sum(),
        evaluate=lambda: {"dev": {key: next(dev)}},
        epoch_start=epoch_start,
        save_best=lambda: saved.append(epoch[0]),
    )
    cfg = LoopConfig(len(scores), 2, optimiser=Optimiser("sgd", lr=0.1), selection=Selection(f"dev.{key}", **selection))
    return fit(Pair(), Rows(), list(range(4)), cfg, hooks), saved  # type: ignore[arg-type]


def test_early_stopping_stops_after_patience_epochs_without_improvement() -> None:
    state, saved = scripted([0.5, 0.7, 0.6, 0.65, 0.8], patience=2)
    assert state["epoch"] == 4 and state["selected"] == 2 and state["best"] == 0.7
    assert saved == [1, 2] and [r["dev"]["acc"] for r in state["history"]] == [0.5, 0.7, 0.6, 0.65]


def test_fixed_epochs_train_every_epoch_and_keep_the_best() -> None:
    state, saved = scripted([0.5, 0.7, 0.6, 0.65, 0.8], patience=None)
    assert state["epoch"] == 5 and state["selected"] == 5 and state["best"] == 0.8
    assert saved == [1, 2, 5]


def test_min_epoch_never_keeps_an_earlier_epoch_nor_counts_it_against_patience() -> None:
    state, saved = scripted([0.9, 0.5, 0.6, 0.55], min_epoch=2, patience=1)
    # epoch 1 (0.9) is ignored; 2 and 3 improve; 4 is the one bad epoch patience allows
    assert state["epoch"] == 4 and state["selected"] == 3 and state["best"] == 0.6 and saved == [2, 3]


def test_a_kept_score_at_its_ceiling_ends_training() -> None:
    state, saved = scripted([0.5, 1.0, 0.9, 1.0], patience=None, ceiling=1.0)
    assert state["epoch"] == 2 and state["selected"] == 2 and state["best"] == 1.0 and saved == [1, 2]
    cfg = LoopConfig(4, 2, selection=Selection("dev.acc", ceiling=1.0))
    assert loop.stopped(cfg, state) == "ceiling" and loop.stopped(cfg, {**state, "best": 0.9, "epoch": 4}) == "epochs"
    state, saved = scripted([3.0, 0.0, 1.0], key="loss", mode="min", ceiling=0.0)  # a lowest value's floor
    assert state["epoch"] == 2 and state["selected"] == 2 and saved == [1, 2]


@settings(max_examples=200, deadline=None)
@given(scores=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=1, max_size=8),
       patience=st.one_of(st.none(), st.integers(1, 3)), min_epoch=st.integers(1, 3))
def test_stopping_at_the_ceiling_keeps_what_training_on_keeps(scores: list[float], patience: int | None, min_epoch: int) -> None:
    """The same epoch, score and saves as without a ceiling; only the epochs after the kept one at 1.0 go."""
    min_epoch = min(min_epoch, len(scores))
    capped, capped_saved = scripted(scores, patience=patience, min_epoch=min_epoch, ceiling=1.0)
    full, full_saved = scripted(scores, patience=patience, min_epoch=min_epoch)
    assert (capped["selected"], capped["best"], capped_saved) == (full["selected"], full["best"], full_saved)
    at_ceiling = full["best"] == 1.0
    assert capped["epoch"] == (full["selected"] if at_ceiling else full["epoch"])
    assert capped["history"] == full["history"][: capped["epoch"]]


def test_lowest_value_selection() -> None:
    state, saved = scripted([3.0, 2.0, 2.5], key="loss", mode="min", patience=5)
    assert state["selected"] == 2 and state["best"] == 2.0 and saved == [1, 2]


def test_without_a_metric_the_last_epoch_is_kept() -> None:
    state = fit(Pair(), Rows(), [0, 1, 2], LoopConfig(3, 2), Hooks(loss=lambda m, b: m.out.w.sum()))  # type: ignore[arg-type]
    assert state["epoch"] == 3 and state["selected"] == 3 and state["step"] == 6
    assert [set(r) for r in state["history"]] == [{"epoch", "train_loss"}] * 3


def test_weight_decay_groups_exempt_and_frozen_parameters() -> None:
    model = Pair()
    opt = Optimiser("sgd", lr=0.5, weight_decay=0.1, no_decay=("scorer.*",))
    groups = opt.groups(model)
    assert [(g["weight_decay"], len(g["params"])) for g in groups] == [(0.1, 1), (0.0, 1)]
    assert groups[0]["params"][0] is model.out.w and groups[1]["params"][0] is model.scorer.w
    # a zero-gradient step: SGD decays p -> p - lr·wd·p, the exempt vector stays put
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    fit(model, Rows(), [0], LoopConfig(1, 1, optimiser=opt), Hooks(loss=lambda m, b: (m.out.w * 0 + m.scorer.w * 0).sum()))  # type: ignore[arg-type]
    torch.testing.assert_close(model.out.w.detach(), before["out.w"] - 0.5 * (0.1 * before["out.w"]), rtol=0, atol=1e-7)
    assert torch.equal(model.scorer.w.detach(), before["scorer.w"])
    assert [len(g["params"]) for g in Optimiser(frozen=("out.*",)).groups(model)] == [1]


def test_optimiser_names() -> None:
    model = Pair()
    amsgrad = Optimiser("amsgrad").build(model)
    assert type(amsgrad) is torch.optim.Adam and amsgrad.defaults["amsgrad"] is True
    assert type(Optimiser("adamw", weight_decay=0.01).build(model)) is torch.optim.AdamW
    assert Optimiser("adam").build(model).defaults["amsgrad"] is False
    with pytest.raises(AttnAuditError, match="unknown optimiser 'rmsprop'"):
        Optimiser("rmsprop")
    with pytest.raises(AttnAuditError, match="unknown learning-rate schedule"):
        Optimiser(schedule="cosine")


@pytest.mark.parametrize("clip, expected", [(None, [-3.0, -4.0]), (1.0, [-0.6, -0.8]), (10.0, [-3.0, -4.0])])
def test_clipping_is_optional(clip: float | None, expected: list[float]) -> None:
    """Gradient (3, 4) has norm 5: SGD with lr 1 steps by it whole, or by it scaled to norm 1."""
    model = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(model.weight)
    hooks = Hooks(loss=lambda m, b: (m.weight * torch.tensor([[3.0, 4.0]])).sum())
    fit(model, Rows(), [0], LoopConfig(1, 1, optimiser=Optimiser("sgd", lr=1.0, clip=clip)), hooks)  # type: ignore[arg-type]
    torch.testing.assert_close(model.weight.detach()[0], torch.tensor(expected), rtol=0, atol=1e-5)


def test_schedules_by_hand() -> None:
    linear = Optimiser(schedule="linear", warmup=4)
    assert [linear.factor(s, 12) for s in (0, 1, 2, 3, 8, 12)] == [0.25, 0.5, 0.75, 1.0, 0.5, 0.0]
    hf = Optimiser(schedule="linear-hf", warmup=4)  # transformers' schedule starts at 0
    assert [hf.factor(s, 12) for s in (0, 2, 4, 8, 12)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    vaswani = Optimiser(schedule="inverse-sqrt", warmup=4)
    assert [vaswani.factor(s, 100) for s in (0, 3, 15)] == [0.25, 1.0, 0.5]
    assert Optimiser().factor(7, 10) == 1.0 and Optimiser(schedule="linear").factor(7, 10) == 1.0


def test_step_budget_ends_the_epoch_it_is_reached_in() -> None:
    model = Pair()
    cfg = LoopConfig(5, 2, max_steps=7, optimiser=Optimiser("sgd", lr=0.1))
    state = fit(model, Rows(), list(range(10)), cfg, Hooks(loss=lambda m, b: m.out.w.sum() * len(b)))  # type: ignore[arg-type]
    assert state["step"] == 7 and state["epoch"] == 2  # 5 steps, then 2 of the second epoch


def test_epoch_mean_loss_and_logs_are_weighted_by_batch() -> None:
    """Batches of 2 and 1 examples with losses 1 and 4: weighted by size the mean is 2, by a
    custom weight (3 per example... 1 for the short batch) it is (1·6 + 4·1) / 7."""
    losses = {2: 1.0, 1: 4.0}

    def loss(model: nn.Module, batch: list[int]) -> tuple[Tensor, dict[str, Tensor]]:
        value = model.out.w.sum() * 0 + losses[len(batch)]
        return value, {"double": value * 2}

    state = fit(Pair(), Rows(), [0, 1, 2], LoopConfig(1, 2), Hooks(loss=loss))  # type: ignore[arg-type]
    assert state["history"][0]["train_loss"] == pytest.approx(2.0) and state["history"][0]["double"] == pytest.approx(4.0)
    weighted = Hooks(loss=loss, weight=lambda b: 6 if len(b) == 2 else 1, train_key="loss")
    state = fit(Pair(), Rows(), [0, 1, 2], LoopConfig(1, 2), weighted)  # type: ignore[arg-type]
    assert state["history"][0]["loss"] == pytest.approx((1.0 * 6 + 4.0) / 7)


def test_summed_loss_is_the_mean_times_the_count() -> None:
    logits, labels = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 2, 1, -100, 1])
    torch.testing.assert_close(cross_entropy("sum")(logits, labels), 4 * cross_entropy("mean")(logits, labels))


# --------------------------------------------------------------------------- the Jain & Wallace protocol as config

JAIN_WALLACE = {
    "optimizer": "amsgrad", "weight_decay": 1e-5, "no_decay": ["scorer.*"], "clip": 0, "loss": "sum",
    "select": "roc_auc", "min_epoch": 2, "early_stop": False,
}


def test_jain_wallace_protocol_is_a_training_config(tmp_path: Path) -> None:
    """Dropout, AMSGrad, weight decay on everything but the attention scorer, no clipping, summed
    loss, selection on dev ROC-AUC never keeping epoch 1, a fixed number of epochs."""
    cfg = TrainConfig(epochs=8, **JAIN_WALLACE)
    settings = cfg.loop("classification")
    assert settings.optimiser.name == "amsgrad" and settings.optimiser.clip is None
    assert settings.selection == Selection("dev.roc_auc", "max", 2, None, ceiling=1.0) and settings.epochs == 8
    data = synthetic_task("classification", seed=0, n_train=80, n_dev=30, n_test=20)
    run = train(data, "bilstm", tmp_path / "jw", epochs=3, embed_dim=8, hidden_dim=8, dropout=0.2, batch_size=16,
                quiet_eval=True, **JAIN_WALLACE)
    metrics = json.loads((tmp_path / "jw" / "metrics.json").read_text())
    notes = metrics["training"]
    assert metrics["epochs"] == 3 and notes["epochs_run"] == 3 and notes["selected_epoch"] >= 2
    assert metrics["selection"] == "best dev roc_auc from epoch 2 on"
    assert notes["optimiser"]["name"] == "amsgrad" and notes["optimiser"]["clip"] is None
    selected = metrics["history"][notes["selected_epoch"] - 1]["dev"]["roc_auc"]
    assert selected == metrics["best_dev"] == max(h["dev"]["roc_auc"] for h in metrics["history"][1:])
    exempt = settings.optimiser.groups(run.model)[1]["params"]
    assert {n for n, p in run.model.named_parameters() if any(p is q for q in exempt)} == {
        "scorer.key_proj.weight", "scorer.key_proj.bias", "scorer.v.weight"
    }
    assert json.loads((tmp_path / "jw" / "config.json").read_text())["train"]["loss"] == "sum"


def test_the_new_options_stay_out_of_default_configs(tmp_path: Path) -> None:
    data = synthetic_task("classification", seed=0, n_train=40, n_dev=10, n_test=10)
    train(data, "bilstm", tmp_path / "plain", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    saved = json.loads((tmp_path / "plain" / "config.json").read_text())["train"]
    assert not set(saved) & {"optimizer", "no_decay", "loss", "select", "min_epoch", "early_stop"}
    with pytest.raises(AttnAuditError, match="--min-epoch must be in 1..2"):
        train(data, "bilstm", tmp_path / "x", epochs=2, min_epoch=3)
    with pytest.raises(AttnAuditError, match="unknown optimiser"):
        train(data, "bilstm", tmp_path / "x", epochs=2, optimizer="lion")


# --------------------------------------------------------------------------- every kind of training


@pytest.fixture
def epochs_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(progress label, model class) of every epoch the one loop runs."""
    seen: list[tuple[str, str]] = []
    original = loop._epoch

    def spy(model: nn.Module, run: Any, examples: Any, optimizer: Any, cfg: Any, hooks: Hooks, *rest: Any) -> Any:
        seen.append((hooks.label.strip(), type(model).__name__))
        return original(model, run, examples, optimizer, cfg, hooks, *rest)

    monkeypatch.setattr(loop, "_epoch", spy)
    return seen


def test_every_family_trains_through_the_loop(epochs_seen: list[tuple[str, str]], tmp_path: Path, tiny_hf: SimpleNamespace) -> None:
    from attnaudit.data.word_alignments import synthetic_translation
    from attnaudit.training.finetune import finetune
    from attnaudit.training.nmt import train_nmt

    clf = synthetic_task("classification", seed=0, n_train=40, n_dev=10, n_test=10)
    tag = synthetic_task("tagging", seed=0, n_train=40, n_dev=10, n_test=10)
    tiny = {"epochs": 1, "embed_dim": 8, "hidden_dim": 8, "d_model": 8, "heads": 2, "layers": 1, "d_ff": 16, "quiet_eval": True}
    for family in ("bilstm", "cnn", "average", "han", "flat", "transformer"):
        train(clf, family, tmp_path / family, **tiny)
    train(tag, "transformer", tmp_path / "tagger", **tiny)
    train_nmt(synthetic_translation(1, n_train=30, n_dev=4, n_test=4), tmp_path / "nmt", layers=1, heads=2, d_model=8, d_ff=16,
              source_vocab=60, target_vocab=60, epochs=1, warmup=2, max_len=96, max_train_len=90, bleu_split=None)
    finetune(tiny_hf.task(), tmp_path / "hf", hf=str(tiny_hf.dir), epochs=1, batch_size=4, device="cpu")
    models = [model for _, model in epochs_seen]
    assert models == [*["AttentionClassifier"] * 3, "HierarchicalAttentionNetwork", "FlatAttentionClassifier", "TransformerClassifier",
                      "TransformerTagger", "Seq2SeqTransformer", "HFModel"], models
    for name in ("bilstm", "han", "tagger", "nmt", "hf"):
        notes = json.loads((tmp_path / name / "metrics.json").read_text())["training"]
        assert notes["epochs_run"] == 1 and notes["selected_epoch"] == 1


def test_every_subrun_kind_trains_through_the_loop(epochs_seen: list[tuple[str, str]], tmp_path: Path) -> None:
    data = synthetic_task("classification", seed=0, n_train=60, n_dev=12, n_test=12)
    clf = train(data, "bilstm", tmp_path / "clf", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    sizes = {"epochs": 1, "embed_dim": 8, "d_model": 8, "heads": 2, "d_ff": 16, "quiet_eval": True}
    transformer = train(data, "transformer", tmp_path / "transformer", layers=2, **sizes)
    tagger = train(synthetic_task("tagging", seed=0, n_train=40, n_dev=10, n_test=10), "transformer", tmp_path / "tag", layers=1, **sizes)
    epochs_seen.clear()
    out = tmp_path / "results"
    run_test("uniform", clf, epochs=1, seeds=[0], out=out, plot=False, limit=4)
    run_test("seeds", clf, epochs=1, seeds=[1], out=out, plot=False, limit=4)
    run_test("global-adversary", clf, epochs=1, lambdas=[1.0], out=out, plot=False, limit=4)
    run_test("diagnostic", clf, epochs=1, seeds=[0], adversary_lambda=1.0, out=out, plot=False, limit=4)
    run_test("probe", tagger, epochs=1, lambdas=[0.5], variants=["frozen"], out=out / "tagger", plot=False, limit=4)
    run_test("key-adversary", transformer, epochs=1, train_limit=16, batch_size=8, show=1, out=out / "keys", plot=False, limit=4)
    assert epochs_seen == [
        ("uniform seed 0", "AttentionClassifier"),
        ("", "AttentionClassifier"),  # an extra seed is a plain train()
        ("adversary λ=1 (scratch)", "AttentionClassifier"),
        *[(f"diagnostic {kind} seed 0", "AttentionClassifier") for kind in ("learned", "uniform", "base", "adversary")],
        ("adversary λ=0.5 (base)", "TransformerTagger"),
        ("probe original frozen seed 0", "TransformerTagger"),
        ("probe adversary λ=0.5 frozen seed 0", "TransformerTagger"),
        ("key-adversary", "KeyAdversary"),
    ]
    subruns = sorted(out.rglob("subruns/*/*/metrics.json"))
    assert {p.parent.parent.name for p in subruns} == {"uniform", "seeds", "global-adversary", "diagnostic", "probe"}
    for path in subruns:
        assert json.loads(path.read_text())["training"]["epochs_run"] == 1
        assert not (path.parent / "checkpoint").exists()


# --------------------------------------------------------------------------- kill -9, resume

SUBRUN = """
import sys, torch
torch.set_num_threads(1)
from attnaudit.experiments.uniform import UNIFORM
from attnaudit.run import load_run
from attnaudit.training.adversary import train_variant
train_variant(load_run(sys.argv[1], device="cpu"), sys.argv[2], UNIFORM, epochs=4)
"""


def test_killed_subrun_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    """A uniform sub-run is killed (SIGKILL) once its first epoch is checkpointed; the rerun
    resumes after that epoch (it says so) and ends with the uninterrupted run's weights and metrics."""
    train("synthetic", "bilstm", tmp_path / "base", epochs=1, embed_dim=16, hidden_dim=16, quiet_eval=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}
    command = [sys.executable, "-c", SUBRUN, str(tmp_path / "base")]
    subprocess.run([*command, str(tmp_path / "full")], check=True, env=env, capture_output=True)
    proc = subprocess.Popen([*command, str(tmp_path / "killed")], env=env, stderr=subprocess.DEVNULL)
    state = tmp_path / "killed" / "checkpoint" / "state.json"
    deadline = time.time() + 300
    while not (state.exists() and json.loads(state.read_text())["epoch"] >= 1):
        assert proc.poll() is None, "the sub-run ended before its first checkpoint"
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_after = json.loads(state.read_text())["epoch"]
    assert killed_after < 4 and not (tmp_path / "killed" / "metrics.json").exists()
    rerun = subprocess.run([*command, str(tmp_path / "killed")], check=True, env=env, capture_output=True, text=True)
    assert f"after epoch {killed_after}" in rerun.stderr
    full, resumed = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "killed" / "model.safetensors")
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)

    def metrics(name: str) -> dict[str, Any]:
        data = json.loads((tmp_path / name / "metrics.json").read_text())
        return {k: v for k, v in data.items() if k not in ("train_seconds", "training")}

    assert metrics("full") == metrics("killed") and not (tmp_path / "killed" / "checkpoint").exists()
    assert math.isfinite(metrics("full")["best_dev"])


def test_hooks_done_ends_the_loop() -> None:
    evaluations: list[int] = []
    hooks = Hooks(loss=lambda m, b: m.out.w.sum(), evaluate=lambda: evaluations.append(1) or {},
                  done=lambda: len(evaluations) >= 2)
    state = fit(Pair(), Rows(), [0, 1, 2], LoopConfig(5, 2), hooks)  # type: ignore[arg-type]
    assert state["epoch"] == 2 and len(state["history"]) == 2
