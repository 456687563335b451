"""One audit on several workers: a test's instances in shards, each checkpointed, merged in order.

``attnaudit audit --engine ray`` computes every :attr:`~attnaudit.experiments.experiment.Experiment.shardable`
test in shards: consecutive stretches of whole batches of the order in which one process batches the
tested examples (:meth:`~attnaudit.experiments.experiment.Experiment.plan`), each instance keeping its
position among all of them (which seeds its draws). A shard's batches are the single process's, padded
alike, so its rows are the rows a single process computes, bit for bit. Each finished shard is written
atomically to ``OUT/shards/<test>/<k>.json`` under the hash of everything
the result depends on; a rerun after a killed worker or driver loads the finished shards and
computes only the others. The driver merges the rows in order and the test recomputes its summary,
tables and figures from them (:meth:`~attnaudit.experiments.experiment.Experiment.merge`). Tests
that are not shardable (those that train models, or keep state across instances) run whole on one
worker. Each Ray worker is an actor that loads the audited run once (with ``num_gpus`` when the
cluster has GPUs) and restores its trained weights after every task. The in-process engine
(:class:`InProcess`) computes the same shards here; the tests use it.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from attnaudit.cluster import connect, import_ray, wait_one
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError, error_line
from attnaudit.experiments.experiment import Experiment, Result, get_experiment
from attnaudit.experiments.runner import make_options
from attnaudit.io import atomic_write_text, read_json
from attnaudit.progress import status
from attnaudit.run import Run
from attnaudit.seed import set_seed

SHARD_SIZE = 32
"""Instances per shard (rounded up to whole batches of the test): a finished shard is what a killed audit keeps."""

Span = tuple[int, int]
Todo = list[tuple[int, list[int]]]
"""Shards to compute: ``(k, positions)`` of the tested examples in shard ``k``."""


def spans(count: int, size: int) -> list[Span]:
    """Consecutive ``[start, stop)`` slices of ``count`` instances, ``size`` each (the last may be shorter)."""
    if size < 1:
        raise AttnAuditError(f"shard size must be at least 1, got {size}")
    return [(start, min(start + size, count)) for start in range(0, count, size)]


@dataclass(frozen=True)
class Source:
    """How a worker loads the audited run: a run folder or a Hugging Face model on a task, with the
    folder the training-based tests write their sub-runs to, and the unit its batches are segmented by (``--segments``)."""

    subruns: str
    run: str | None = None
    hf: str | None = None
    task: str | None = None
    data_dir: str | None = None
    device: str = "auto"
    hf_options: dict[str, Any] = field(default_factory=dict)
    segments: str | None = None

    def load(self) -> Run:
        """The run, loaded as the audit's driver loaded it (its collator segmenting as the driver's does)."""
        from attnaudit.explain.helpers.segments import segmented
        from attnaudit.resolve import load_model

        hf_options = {"task": self.task, **self.hf_options} if self.hf is not None else {}
        run = load_model(self.hf, self.run, device=self.device, data_dir=self.data_dir, **hf_options)
        return replace(segmented(run, self.segments), subruns=Path(self.subruns))


class Worker:
    """One worker's copy of the audited run (loaded once), computing parts and whole tests on it."""

    def __init__(self, source: Source) -> None:
        self.run = source.load()
        self.trained = {k: v.detach().clone() for k, v in self.run.model.state_dict().items()}

    def compute(self, name: str, options: dict[str, Any], seed: int, examples: list[Example], indices: list[int] | None) -> Result:
        """Test ``name``'s part of ``examples`` at positions ``indices`` (None: the whole test on ``examples``);
        the trained weights are restored afterwards, as the audit does between tests."""
        experiment = get_experiment(name)
        opts = make_options(experiment, options)
        set_seed(seed)
        self.run.model.eval()
        try:
            if indices is None:
                return experiment.run(self.run, examples, opts, seed=seed)
            return experiment.part(self.run, examples, opts, seed, indices)
        finally:
            current = self.run.model.state_dict()
            if any(not torch.equal(current[k], v) for k, v in self.trained.items()):
                self.run.model.load_state_dict(self.trained)


class Executor(Protocol):
    """Where tests and parts are computed: this process or Ray workers."""

    def whole(self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int) -> Result: ...

    def parts(
        self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int, todo: Todo
    ) -> Iterator[tuple[int, Result]]: ...


class InProcess:
    """Parts and whole tests in this process, on the driver's run."""

    def whole(self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int) -> Result:
        return experiment.run(run, examples, options, seed=seed)

    def parts(
        self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int, todo: Todo
    ) -> Iterator[tuple[int, Result]]:
        for k, indices in todo:
            set_seed(seed)
            yield k, experiment.part(run, [examples[i] for i in indices], options, seed, indices)


def _options(options: Any) -> dict[str, Any]:
    """A test's options as plain values (rebuilt by the worker with its Options class)."""
    return asdict(options) if is_dataclass(options) and not isinstance(options, type) else {}


class RayWorkers:
    """Ray actors (:class:`Worker`), each loading the run once; Ray is connected and the actors started
    at the first task (an audit whose results are all stored starts none)."""

    def __init__(self, ray: Any, source: Source, workers: int | None, address: str | None) -> None:
        self.ray, self.source, self.workers, self.address = ray, source, workers, address
        self.actors: list[Any] = []
        self.started = False

    def _started(self) -> list[Any]:
        if not self.actors:
            self.started = connect(self.ray, self.address, self.workers)
            resources = self.ray.cluster_resources()
            count = self.workers or max(1, math.floor(resources.get("CPU", 1)))
            gpus = float(resources.get("GPU", 0))
            per_worker = min(1.0, gpus / count) if gpus else 0
            actor = self.ray.remote(num_cpus=1, num_gpus=per_worker, max_restarts=2, max_task_retries=2)(Worker)
            self.actors = [actor.remote(self.source) for _ in range(count)]
            status(f"ray: {count} worker(s)" + (f", {per_worker:g} GPU each" if per_worker else ""))
        return self.actors

    def close(self) -> None:
        """Stop the actors, and Ray when it was started here."""
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
        if self.started:
            self.ray.shutdown()

    def _get(self, ref: Any) -> Result:
        """The task's result; a failure inside the task raises its own error (one line), not Ray's wrapper."""
        wait_one(self.ray, [ref])  # Ctrl-C is seen within a second, not once the task ends
        try:
            result: Result = self.ray.get(ref)
            return result
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, Exception) else None
            raise (cause or AttnAuditError(error_line(exc))) from None

    def whole(self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int) -> Result:
        actor = self._started()[0]
        return self._get(actor.compute.remote(experiment.name, _options(options), seed, examples, None))

    def parts(
        self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int, todo: Todo
    ) -> Iterator[tuple[int, Result]]:
        if not todo:
            return
        queue, running = list(todo), dict[Any, tuple[int, Any]]()
        values = _options(options)
        idle = list(self._started())
        while queue or running:
            while queue and idle:
                actor, (k, indices) = idle.pop(), queue.pop(0)
                running[actor.compute.remote(experiment.name, values, seed, [examples[i] for i in indices], indices)] = (k, actor)
            done = wait_one(self.ray, list(running))
            k, actor = running.pop(done[0])
            idle.append(actor)
            yield k, self._get(done[0])


@dataclass
class Sharded:
    """Computes a test's result through ``executor``: shardable tests in checkpointed shards under
    ``folder``/<test>, the others whole (:class:`~attnaudit.experiments.runner.Compute`)."""

    folder: Path
    executor: Executor
    size: int = SHARD_SIZE

    def __call__(self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int, key: str) -> Result:
        if not experiment.shardable:
            return self.executor.whole(experiment, run, examples, options, seed)
        order = experiment.plan(run, examples, options)
        batch = max(1, int(getattr(options, "batch_size", 1)))
        layout = [order[start:stop] for start, stop in spans(len(order), -(-self.size // batch) * batch)]  # whole batches
        directory = self.folder / experiment.name
        parts = {k: part for k, shard in enumerate(layout) if (part := _stored(directory / f"{k}.json", key, shard)) is not None}
        todo = [(k, shard) for k, shard in enumerate(layout) if k not in parts]
        if parts:
            status(f"{experiment.name}: {len(parts)} of {len(layout)} shard(s) already finished")
        for k, part in self.executor.parts(experiment, run, examples, options, seed, todo):
            _store(directory / f"{k}.json", key, layout[k], part)
            parts[k] = part
        return experiment.merge(run, [parts[k] for k in range(len(layout))], options, seed)

    def done(self, name: str) -> None:
        """Test ``name``'s result is stored: its shards are no longer needed."""
        shutil.rmtree(self.folder / name, ignore_errors=True)
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()


def _store(path: Path, key: str, indices: list[int], part: Result) -> None:
    """A finished shard of the examples at ``indices``, atomically, under ``key``; JSON that keeps NaN and infinities."""
    record = {"key": key, "indices": indices, "part": part.to_dict()}
    atomic_write_text(path, json.dumps(record, allow_nan=True, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    """numpy and torch scalars as Python numbers; anything else is refused."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _stored(path: Path, key: str, indices: list[int]) -> Result | None:
    """The shard stored at ``path`` when it was computed under ``key`` for ``indices``, else None (recomputed)."""
    if not path.exists():
        return None
    try:
        record = read_json(path)
        if record.get("key") != key or record.get("indices") != indices:
            return None
        return Result(**record["part"])
    except (AttnAuditError, AttributeError, KeyError, TypeError):
        return None


@contextmanager
def engine_for(
    engine: str, source: Source | None, folder: Path, workers: int | None = None, address: str | None = None,
    size: int | None = None,
) -> Iterator[Sharded | None]:
    """The audit's way of computing results: None (each test whole, in this process) for ``local``
    without a shard ``size``; in-process shards with one; Ray workers for ``ray`` (``source``: what they load)."""
    if engine == "local":
        yield None if size is None else Sharded(folder, InProcess(), size)
        return
    if source is None:
        raise AttnAuditError("--engine ray needs a run saved in a folder (--run RUN, --hf MODEL or --task/--model)")
    pool = RayWorkers(import_ray(), source, workers, address)
    try:
        yield Sharded(folder, pool, size or SHARD_SIZE)
    finally:
        pool.close()
