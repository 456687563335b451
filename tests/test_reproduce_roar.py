"""benchmarks/reproduce_roar.py ``--so-far``: the RACU of the curves a reproduction has finished so far, read from
a hand-made folder of finished sub-runs (nothing trained), against a hand-computed RACU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` is a folder of the checkout

from benchmarks import reproduce_roar as rr  # noqa: E402


def _finished(folder: Path, macro_f1: float) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"test": {"macro_f1": macro_f1, "accuracy": macro_f1}}))


def test_so_far_reads_only_finished_curves_beside_their_random_baseline(tmp_path: Path) -> None:
    base = tmp_path / "roar-sst"
    _finished(base, 1.0)  # seed 0's 0 % model: the base run
    root = tmp_path / "roar-sst-roar" / "subruns" / "roar" / "seed-0"
    _finished(root / "all" / "ratio-100", 0.0)
    _finished(root / "random" / "ratio-50", 0.75)
    _finished(root / "attention-recursive" / "ratio-50", 0.25)
    (root / "gradient-recursive" / "ratio-50" / "checkpoint").mkdir(parents=True)  # under way: not finished
    args = argparse.Namespace(runs=tmp_path, limit=None, seeds=2, methods=["attention", "gradient"], ratios=[50])
    part = rr.so_far("sst", args)
    # x = 0, .5, 1; random − attention = 0, .5, 0 -> area .25; random − random(100 %) = 1, .75, 0 -> area .625; .25/.625
    by_method = {row["method"]: row for row in part["racu"]}
    assert by_method["attention"]["racu"] == pytest.approx(40.0)
    assert by_method["attention"]["seeds"] == 1 and by_method["attention"]["published"]["racu"] == 15.7
    assert by_method["gradient"]["seeds"] == 0  # its curve is not finished: no RACU yet
    assert part["partial"] and part["racu_per_seed"] == [{"method": "attention", "seed": 0, "racu": pytest.approx(40.0)}]
    assert sorted(part["missing_retrains"]) == sorted([
        "seed-0/gradient-recursive/ratio-50", "seed-1/random/ratio-50", "seed-1/attention-recursive/ratio-50",
        "seed-1/gradient-recursive/ratio-50", "seed-1/unmasked", "seed-1/all/ratio-100",
    ])
    assert {(r["method"], r["ratio"]): r["score"] for r in part["curves"]} == {
        ("random", 0): 1.0, ("random", 50): 0.75, ("random", 100): 0.0,
        ("attention", 0): 1.0, ("attention", 50): 0.25, ("attention", 100): 0.0,
    }
