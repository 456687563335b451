"""One audit in shards (attnaudit.shards): the same summary as one process, resuming a killed audit
without recomputing finished shards, Ray workers, and the one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from attnaudit import shards
from attnaudit.audit import audit
from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import EXPERIMENTS, Result, discover, get_experiment
from attnaudit.experiments.runner import make_options
from attnaudit.progress import set_quiet
from attnaudit.shards import spans
from attnaudit.training.trainer import train

set_quiet(True)
TESTS = ["rationale", "permutation", "erasure", "adversarial", "importance"]  # every one in shards
SMALL = {
    "permutation": {"permutations": 4},
    "rationale": {"ig_steps": 2, "methods": ["attention", "gradient"]},
    "erasure": {"random_orders": 2},
    "adversarial": {"adversaries": 2, "steps": 3},
    "importance": {"methods": ["gradient"]},
}
ONE_BY_ONE = {name: {**values, "batch_size": 1} for name, values in SMALL.items()}
BATCHED = {name: {**values, "batch_size": 2} for name, values in SMALL.items()}
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
        assert a.instances == b.instances and a.summary == b.summary and a.tables == b.tables, name


def test_which_tests_are_shardable() -> None:
    shardable = {name for name, cls in discover().items() if cls.shardable}
    assert {"permutation", "erasure", "rationale", "adversarial", "rollout", "importance"} <= shardable
    assert not {"seeds", "uniform"} & shardable  # training-based
    assert spans(7, 3) == [(0, 3), (3, 6), (6, 7)]
    with pytest.raises(AttnAuditError, match="shard size"):
        spans(7, 0)


def test_sharded_audit_equals_one_process(run, tmp_path: Path) -> None:
    """Shards are stretches of whole batches of the order one process batches in (Experiment.plan), so the
    shards' batches are padded as one process pads them: the same numbers bit for bit, batched or one by one
    (a shard size of 5 rounds up to whole batches of 2)."""
    for name, options in (("one-by-one", ONE_BY_ONE), ("batched", BATCHED)):
        one = audit(tmp_path / name, run=run, limit=12, test_options=options, **QUICK)
        sharded = audit(tmp_path / f"{name}-shards", run=run, limit=12, test_options=options, shard_size=5, **QUICK)
        assert one.ok and sharded.ok
        _identical(tmp_path / name, tmp_path / f"{name}-shards")
        assert not (tmp_path / f"{name}-shards" / "shards").exists()  # removed once every result is stored


def test_a_transformers_rollout_and_importance_in_shards_equal_one_process(tmp_path: Path) -> None:
    """Rollout and flow (every layer's map, flow for the first --flow-limit instances) and importance (every head's
    τ list, merged in the order one process appends to it) of a tiny Transformer."""
    data = synthetic_task("classification", seed=0, n_train=160, n_dev=20, n_test=20)
    tiny = train(data, "transformer", tmp_path / "run", epochs=1, embed_dim=8, d_model=8, heads=2, layers=2, d_ff=16, quiet_eval=True)
    options = {"rollout": {"batch_size": 2, "flow_limit": 5}, "importance": {"methods": ["gradient"], "batch_size": 2}}
    quick = {**QUICK, "only": ["rollout", "importance"]}
    audit(tmp_path / "one", run=tiny, limit=12, test_options=options, **quick)
    audit(tmp_path / "sharded", run=tiny, limit=12, test_options=options, shard_size=3, **quick)
    assert (tmp_path / "one" / "summary.csv").read_text() == (tmp_path / "sharded" / "summary.csv").read_text()
    for test in ("rollout", "importance"):
        a, b = (Result.load(tmp_path / name / "results" / f"{test}.json") for name in ("one", "sharded"))
        assert a.instances == b.instances and a.tables == b.tables and a.summary == b.summary, test
    rollout = Result.load(tmp_path / "one" / "results" / "rollout.json")
    assert sum("L0_flow_entropy" in row for row in rollout.instances) == 5  # flow for instances 0..4 only
    assert len(a.tables["heads"]) == 2 * 3  # importance: 2 layers x (2 heads + their mean), every head's tau merged


def test_a_shard_is_whole_batches_of_the_plan(run, tmp_path: Path) -> None:
    """Erasure batches by length: its plan is that order, and a shard holds whole batches of it."""
    from attnaudit.shards import InProcess, Sharded

    examples = run.examples("test", limit=12)
    erasure = get_experiment("erasure")
    options = make_options(erasure, BATCHED["erasure"])
    order = erasure.plan(run, examples, options)
    assert order == run.batch_order(examples) and [len(examples[i].tokens) for i in order] == sorted(len(e.tokens) for e in examples)
    seen: list[list[int]] = []

    class Recording(InProcess):
        def parts(self, experiment: Any, run: Any, examples: Any, options: Any, seed: int, todo: Any) -> Any:
            seen.extend(indices for _, indices in todo)
            return super().parts(experiment, run, examples, options, seed, todo)

    Sharded(tmp_path, Recording(), size=5)(erasure, run, examples, options, 0, "key")
    assert seen == [order[0:6], order[6:12]]  # 5 rounded up to whole batches of 2


def test_a_killed_audit_resumes_without_recomputing_finished_shards(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    permutation = EXPERIMENTS["permutation"]
    original = permutation.part
    computed: list[int] = []  # where each computed shard starts in the plan
    order = get_experiment("permutation").plan(run, run.examples("test", limit=14), None)

    def dies_at_third_shard(self: Any, run: Any, examples: Any, options: Any, seed: int = 0, indices: Any = None) -> Result:
        if indices[0] == order[8]:
            raise RuntimeError("worker killed")
        computed.append(order.index(indices[0]))
        return original(self, run, examples, options, seed, indices)

    monkeypatch.setattr(permutation, "part", dies_at_third_shard)
    out = tmp_path / "out"
    first = audit(out, run=run, limit=14, test_options=ONE_BY_ONE, shard_size=4, **QUICK)
    assert set(first.failed) == {"permutation"} and computed == [0, 4]
    shards = out / "shards" / "permutation"
    assert sorted(p.name for p in shards.iterdir()) == ["0.json", "1.json"]
    kept = (shards / "0.json").read_text()
    (shards / "1.json").write_text('{"key": "')  # as if killed while writing: not trusted, recomputed

    def counts(self: Any, run: Any, examples: Any, options: Any, seed: int = 0, indices: Any = None) -> Result:
        if indices is not None:  # a shard (one process computes one part of every example)
            computed.append(order.index(indices[0]))
        return original(self, run, examples, options, seed, indices)

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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"num_workers_soft_limit": 2})  # at most 2 worker processes
    try:
        result = audit(tmp_path / "ray", run=run, limit=8, test_options=ONE_BY_ONE, engine="ray", workers=2, shard_size=3, **QUICK)
        assert ray.is_initialized()  # the audit leaves a Ray it did not start running
    finally:
        ray.shutdown()
    assert result.ok
    _identical(tmp_path / "one", tmp_path / "ray")


@pytest.mark.slow  # starts a Ray cluster (see above)
def test_a_killed_ray_worker_is_restarted_and_the_audit_equals_one_process(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after the first shard is stored one worker's process is killed (``ray.kill``): Ray restarts the actor
    (it loads the run again) and reruns the task it had; nothing is lost and nothing changes."""
    ray = pytest.importorskip("ray")
    pools: list[Any] = []
    started, stored = shards.RayWorkers._started, shards._store

    def recorded(self: Any) -> Any:
        pools.append(self)
        return started(self)

    killed: list[Any] = []

    def kills_a_worker(*args: Any) -> None:
        stored(*args)
        if not killed:
            killed.append(pools[-1].actors[0])
            ray.kill(killed[0], no_restart=False)

    monkeypatch.setattr(shards.RayWorkers, "_started", recorded)
    monkeypatch.setattr(shards, "_store", kills_a_worker)
    audit(tmp_path / "one", run=run, limit=12, test_options=ONE_BY_ONE, **QUICK)
    result = audit(tmp_path / "ray", run=run, limit=12, test_options=ONE_BY_ONE, engine="ray", workers=2, shard_size=2, **QUICK)
    assert result.ok and killed
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
