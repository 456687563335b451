"""benchmarks/roar_patience.py: replaying a fixed-epoch run's history under early stopping gives what the training loop
itself does with those dev scores, and the result counts runs, epochs and lost dev scores as hand-worked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.io import atomic_write_json
from attnaudit.progress import set_quiet
from attnaudit.training.loop import Selection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` is a folder of the checkout

from benchmarks import roar_patience as rp  # noqa: E402
from tests.test_training_loop import scripted  # noqa: E402

set_quiet(True)


@settings(max_examples=150, deadline=None)
@given(scores=st.lists(st.sampled_from([0.2, 0.4, 0.6, 0.8, 1.0]), min_size=1, max_size=9),
       patience=st.one_of(st.none(), st.integers(1, 4)), min_epoch=st.integers(1, 3), ceiling=st.sampled_from([None, 1.0]))
def test_replay_is_what_the_loop_does(scores: list[float], patience: int | None, min_epoch: int, ceiling: float | None) -> None:
    min_epoch = min(min_epoch, len(scores))
    state, _ = scripted(scores, patience=patience, min_epoch=min_epoch, ceiling=ceiling)
    assert rp.replay(scores, Selection("dev.acc", "max", min_epoch, patience, ceiling=ceiling)) == (state["epoch"], state["selected"])


def _run(folder: Path, dev: list[float], patience: int | None = None) -> None:
    kept = max(range(len(dev)), key=lambda i: (dev[i], -i)) + 1
    atomic_write_json(folder / "metrics.json", {
        "dev": {"accuracy": dev[kept - 1]}, "test": {"accuracy": 0.5},
        "history": [{"epoch": e, "dev": {"accuracy": v}} for e, v in enumerate(dev, start=1)],
        "training": {"selected_epoch": kept, "selection": {"metric": "dev.accuracy", "mode": "max", "min_epoch": 1,
                                                           "patience": patience}}})


def test_counts_runs_epochs_and_lost_dev_scores(tmp_path: Path, monkeypatch) -> None:
    runs = tmp_path / "runs"
    _run(runs / "base", [0.5, 0.9, 0.8, 0.8, 0.8, 0.8])  # kept at 2; patience 2 stops at 4 and keeps 2
    _run(runs / "subruns" / "seed-0" / "random" / "ratio-10", [0.5, 0.6, 0.6, 0.6, 0.7, 0.6])  # kept at 5
    _run(runs / "early", [0.5, 0.6, 0.5], patience=1)  # stopped early itself: not counted
    _run(runs / ".partial", [0.1])  # not finished: skipped
    written: dict[str, dict] = {}
    monkeypatch.setattr(rp, "write_result", lambda name, payload: written.setdefault(name, payload))
    monkeypatch.setattr(sys, "argv", ["roar_patience.py", "--runs", str(runs), "--patience", "2,3", "--name", "t"])
    rp.main()
    result = written["t"]
    assert [r["run"] for r in result["runs"]] == ["base", "subruns/seed-0/random/ratio-10"]
    two, three = result["summary"]["2"], result["summary"]["3"]
    # patience 2: base stops at 4 (kept 2, same); ratio-10 stops at 4 (kept 2: 0.6 against 0.7)
    assert (two["runs"], two["same"], two["epochs"], two["epochs_full"]) == (2, 1, 8, 12)
    assert two["max_dev_lost"] == pytest.approx(0.1)
    # patience 3: base stops at 5; ratio-10 trains on (epochs 3, 4 bad; 5 improves) and keeps 5, stopping at 6
    assert (three["same"], three["epochs"], three["max_dev_lost"]) == (2, 11, 0.0)
    assert json.dumps(result)  # JSON-ready


def test_a_history_that_does_not_replay_to_the_kept_epoch_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, [0.5, 0.9])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    metrics["training"]["selected_epoch"] = 1
    atomic_write_json(tmp_path / "metrics.json", metrics)
    with pytest.raises(SystemExit, match="keeps epoch 2, the run kept 1"):
        rp.one_run(tmp_path / "metrics.json", tmp_path, [2])
