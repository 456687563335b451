"""Counts that size the time are bounded before the work starts (issue #47 item 1: the fuzzer's UNBOUNDED_TIME list).

Each value below fits in memory but asked for days of work (the fuzzer stopped each at its CPU budget): now it is
refused in one line that gives the estimate, the limit and how to raise it (``ATTNAUDIT_MAX_HOURS``), before any model
is loaded, and a value under the limit is still accepted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from attnaudit import bounds
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.run import Run

from .helpers import cli, synthetic_rows, write_table

HUGE = "2147483648"

CASES = {
    "finetune --epochs": ["finetune", "--hf", "@missing", "--task", "csv:@train", "--out", "@out", "--epochs", HUGE],
    "train --epochs": ["train", "--task", "csv:@train", "--model", "bilstm", "--out", "@out", "--epochs", HUGE],
    "train-nmt --epochs": ["train-nmt", "--task", "synthetic-translation", "--out", "@out", "--epochs", HUGE],
    "train-nmt --max-steps": ["train-nmt", "--task", "synthetic-translation", "--out", "@out", "--max-steps", HUGE],
    "run adversarial --steps": ["run", "adversarial", "@missing", "--steps", HUGE],
    "run erasure --random-orders": ["run", "erasure", "@missing", "--random-orders", HUGE],
    "run faithfulness --curve-steps": ["run", "faithfulness", "@missing", "--curve-steps", HUGE],
    "run shuffle --repeats": ["run", "shuffle", "@missing", "--repeats", HUGE],
    "run seeds --epochs": ["run", "seeds", "@missing", "--epochs", HUGE],
    "run generation --adversary-steps": ["run", "generation", "@missing", "--adversary-steps", HUGE],
}
"""Every entry the fuzzer listed as unbounded in time, and their kin; ``@missing``: a run or model that does not exist,
so a refusal proves the check comes before anything is loaded."""


def _words(words: list[str], tmp_path: Path) -> list[str]:
    write_table(tmp_path / "train.csv", synthetic_rows(20))
    paths = {"@missing": str(tmp_path / "missing"), "@out": str(tmp_path / "out"), "csv:@train": f"csv:{tmp_path / 'train.csv'}"}
    return [paths.get(word, word) for word in words]


@pytest.mark.parametrize("case", sorted(CASES))
def test_days_of_work_are_refused_before_loading(case: str, tmp_path: Path) -> None:
    proc = cli(*_words(CASES[case], tmp_path), "--quiet")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    flag = case.split()[-1]
    assert lines[0].startswith(f"error: {flag} ") and "of work" in lines[0] and "is the limit (ATTNAUDIT_MAX_HOURS=HOURS raises it)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_limit_is_one_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ATTNAUDIT_MAX_HOURS`` raises (or lowers) the limit for every command; a bad value is one line too."""
    words = _words(CASES["run erasure --random-orders"], tmp_path)
    words[-1] = "100000000"  # 2.8 h at the pass floor: refused under a 1 h limit, past the time check under 3 h
    monkeypatch.setenv(bounds.MAX_HOURS_ENV, "1")
    lowered = cli(*words)
    assert lowered.returncode == 2 and "2.8 h of work" in lowered.stderr and "1.0 h is the limit" in lowered.stderr
    monkeypatch.setenv(bounds.MAX_HOURS_ENV, "3")
    raised = cli(*words)
    assert raised.returncode == 2 and "of work" not in raised.stderr and "missing" in raised.stderr  # the missing run, next
    monkeypatch.setenv(bounds.MAX_HOURS_ENV, "soon")
    bad = cli(*words)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: ATTNAUDIT_MAX_HOURS='soon': give the time limit in hours, a number above 0 (e.g. 72)")


def test_the_estimate_and_the_limit() -> None:
    """The arithmetic: passes x :data:`bounds.PASS_SECONDS` against the limit; the usual values pass."""
    limit_passes = bounds.MAX_HOURS * 3600 / bounds.PASS_SECONDS
    bounds.check_time("--x", 1, limit_passes, "w", "f")  # exactly at the limit: accepted
    with pytest.raises(AttnAuditError, match=r"--x 2: at least 1\.0 days of work \(864,000,001 model passes: w"):
        bounds.check_time("--x", 2, limit_passes + 1, "w", "f")
    for name, value in {"epochs": 1000, "steps": 500, "random_orders": 5, "curve_steps": 100, "repeats": 5,
                        "adversary_steps": 100, "permutations": 100}.items():
        bounds.check_test_options({name: value, "batch_size": 32})
    with pytest.MonkeyPatch.context() as patch:  # memory to spare: the permutations' time is what refuses them
        patch.setattr(bounds, "available_memory", lambda: 1 << 50)
        with pytest.raises(AttnAuditError, match=r"--permutations 1000000000: at least 1\.2 days of work"):
            bounds.permutations(1_000_000_000, 1)
    assert bounds.duration(2.5 * 86400) == "2.5 days" and bounds.duration(90) == "1.5 min" and bounds.duration(3) == "3 s"


def test_the_pass_floor_is_below_the_fastest_pass(trained: Run) -> None:
    """:data:`bounds.PASS_SECONDS` is a lower bound: the smallest model of the tests (a BiLSTM with widths of 8) on one
    example of three words takes longer for a forward pass, the cheapest pass any test makes (best of 200)."""
    batch = trained.collate([Example(tokens=["a", "b", "c"])]).to(trained.device)
    fastest = float("inf")
    with torch.no_grad():
        for _ in range(200):
            start = time.perf_counter()
            trained.model(batch)
            fastest = min(fastest, time.perf_counter() - start)
    assert fastest > bounds.PASS_SECONDS, fastest
