"""One audit in shards (attnaudit.shards): the same summary as one process, resuming a killed audit
without recomputing finished shards, Ray workers, and the one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from attnaudit.audit import audit
from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import EXPERIMENTS, Result, discover
from attnaudit.progress import set_quiet
from attnaudit.shards import spans
from attnaudit.training.trainer import train

set_quiet(True)
TESTS = ["rationale", "permutation", "erasure", "importance"]  # three in shards, importance whole
SMALL = {
    "permutation": {"permutations": 4},
    "rationale": {"ig_steps": 2, "methods": ["attention", "gradient"]},
    "erasure": {"random_orders": 2},
    "importance": {"methods": ["gradient"]},
}
ONE_BY_ONE = {name: {**values, "batch_size": 1} for name, values in SMALL.items()}
QUICK = {"figures": False, "explore": 0, "heatmap_instances": 0, "only": TESTS}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    data = synthetic_task("classification", seed=0, n_train=160, n_dev=20, n_test=20)
    return train(data, "bilstm", tmp_path_factory.mktemp("run"), epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)


def _identical(one: Path, other: Path) -> None:
    """The same summary.csv, and the same instance rows in every result."""
    assert (one / "summary.csv").read_text() == (other / "summary.csv").read_text()
    for name in TESTS:
        a, b = (Result.load(folder / "results" / f"{name}.json") for folder in (one, other))
        assert a.instances == b.instances and a.summary == b.summary, name


def test_which_tests_are_shardable() -> None:
    shardable = {name for name, cls in discover().items() if cls.shardable}
    assert {"permutation", "erasure", "rationale"} <= shardable
    assert not {"seeds", "uniform", "importance"} & shardable  # training-based, and per-head lists kept across instances
    assert spans(7, 3) == [(0, 3), (3, 6), (6, 7)]
    with pytest.raises(AttnAuditError, match="shard size"):
        spans(7, 0)


def test_sharded_audit_equals_one_process(run, tmp_path: Path) -> None:
    """Batched one instance at a time, every shard computes exactly what one process does: identical
    summary.csv. With larger batches the shards batch their instances differently (a shard sorts only its
    own instances by length), so padded lengths and float32 rounding differ: the permutation test's output
    changes (differences of nearly equal probabilities) then agree to 1e-6, not bit for bit."""
    one = audit(tmp_path / "one", run=run, limit=12, test_options=ONE_BY_ONE, **QUICK)
    sharded = audit(tmp_path / "sharded", run=run, limit=12, test_options=ONE_BY_ONE, shard_size=5, **QUICK)
    assert one.ok and sharded.ok
    _identical(tmp_path / "one", tmp_path / "sharded")
    assert not (tmp_path / "sharded" / "shards").exists()  # removed once every result is stored

    audit(tmp_path / "batched", run=run, limit=12, test_options=SMALL, **QUICK)
    audit(tmp_path / "batched-shards", run=run, limit=12, test_options=SMALL, shard_size=5, **QUICK)
    a, b = (pd.read_csv(tmp_path / name / "summary.csv") for name in ("batched", "batched-shards"))
    assert a[["test", "statistic", "published", "interpretation"]].equals(b[["test", "statistic", "published", "interpretation"]])
    numbers = pd.to_numeric(a["value"], errors="coerce").notna()
    assert a["value"][~numbers].equals(b["value"][~numbers])
    assert np.allclose(a["value"][numbers].astype(float), b["value"][numbers].astype(float), rtol=0, atol=1e-6, equal_nan=True)


def test_a_killed_audit_resumes_without_recomputing_finished_shards(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    permutation = EXPERIMENTS["permutation"]
    original = permutation.part
    computed: list[int] = []

    def dies_at_third_shard(self: Any, run: Any, examples: Any, options: Any, seed: int = 0, first: int = 0) -> Result:
        if first == 8:
            raise RuntimeError("worker killed")
        computed.append(first)
        return original(self, run, examples, options, seed, first)

    monkeypatch.setattr(permutation, "part", dies_at_third_shard)
    out = tmp_path / "out"
    first = audit(out, run=run, limit=14, test_options=ONE_BY_ONE, shard_size=4, **QUICK)
    assert set(first.failed) == {"permutation"} and computed == [0, 4]
    shards = out / "shards" / "permutation"
    assert sorted(p.name for p in shards.iterdir()) == ["0.json", "1.json"]
    kept = (shards / "0.json").read_text()
    (shards / "1.json").write_text('{"key": "')  # as if killed while writing: not trusted, recomputed

    def counts(self: Any, run: Any, examples: Any, options: Any, seed: int = 0, first: int = 0) -> Result:
        computed.append(first)
        return original(self, run, examples, options, seed, first)

    monkeypatch.setattr(permutation, "part", counts)
    computed.clear()
    second = audit(out, run=run, limit=14, test_options=ONE_BY_ONE, shard_size=4, **QUICK)
    assert second.ok and computed == [4, 8, 12]  # shard 0 was finished; the others are computed once
    audit(tmp_path / "one", run=run, limit=14, test_options=ONE_BY_ONE, **QUICK)
    _identical(tmp_path / "one", out)

    other = {**ONE_BY_ONE, "permutation": {**ONE_BY_ONE["permutation"], "permutations": 3}}
    shards.mkdir(parents=True)
    (shards / "0.json").write_text(kept)  # computed with 4 permutations
    computed.clear()
    audit(out, run=run, limit=14, test_options=other, shard_size=4, **QUICK)
    assert computed == [0, 4, 8, 12]  # other options: the stored shard is not reused


@pytest.mark.slow  # a Ray cluster's start (~15 s) keeps make test under 10 minutes; the local engine's shards (above) are the same code
def test_ray_workers_give_the_same_summary(run, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    audit(tmp_path / "one", run=run, limit=8, test_options=ONE_BY_ONE, **QUICK)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = audit(tmp_path / "ray", run=run, limit=8, test_options=ONE_BY_ONE, engine="ray", workers=2, shard_size=3, **QUICK)
        assert ray.is_initialized()  # the audit leaves a Ray it did not start running
    finally:
        ray.shutdown()
    assert result.ok
    _identical(tmp_path / "one", tmp_path / "ray")


def test_engine_errors_are_one_line(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from attnaudit import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as without the package
    cases = {
        ("--engine", "ray"): "--engine ray needs the ray package: pip install 'attnaudit[ray]'",
        ("--engine", "dask"): "unknown engine 'dask'; choose local or ray",
        ("--workers", "2"): "--workers and --address are for --engine ray",
        ("--engine", "ray", "--workers", "0"): "--workers must be at least 1, got 0",
    }
    for args, expected in cases.items():
        out = tmp_path / "-".join(args)
        monkeypatch.setattr(sys, "argv", ["attnaudit", "audit", "--run", str(run.path), "--out", str(out), *args, "--quiet"])
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.splitlines() == [f"error: {expected}"]
        assert not (out / "results").exists()
