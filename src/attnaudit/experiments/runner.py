"""The runner: one test on one run (:func:`run_test`, what ``attnaudit run <test>``, the audit and the API call), its
options made from what was given (:func:`make_options`) and the fingerprint of everything its result depends on.
The base class, :class:`~attnaudit.experiments.experiment.Result` and the registry are in
:mod:`attnaudit.experiments.experiment`."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from attnaudit.bounds import check_test_options
from attnaudit.data.segments import check_unit
from attnaudit.data.subsets import describe, limited
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError, spelled, unknown
from attnaudit.experiments.experiment import Experiment, Result, get_experiment
from attnaudit.explain.helpers.segments import segment_unit, segmented
from attnaudit.io import (
    check_output_dir,
    digest,
    locked,
    refuse_inside,
    remove_stray_tmp,
)
from attnaudit.run import Run


class Compute(Protocol):
    """How :func:`run_test` computes a test's result: ``(experiment, run, examples, options, seed, key)``,
    ``key`` the hash of everything the result depends on (:func:`fingerprint`), under which parts are stored."""

    def __call__(self, experiment: Experiment, run: Run, examples: list[Example], options: Any, seed: int, key: str) -> Result: ...


def make_options(experiment: Experiment, values: dict[str, Any]) -> Any:
    """Build the experiment's Options dataclass, rejecting unknown names."""
    known = [f.name for f in fields(experiment.Options)]
    values = {spelled(key, known) or key: value for key, value in values.items()}
    strays = sorted(set(values) - set(known))
    if strays:
        raise AttnAuditError(f"test {experiment.name!r}: {unknown('option', strays[0], known) if known else 'takes no options'}")
    for name, value in values.items():
        numbers = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise AttnAuditError(f"test {experiment.name!r}: option {name} must be finite, got {value!r}")
    options = experiment.Options(**values)
    check_test_options(asdict(options))  # what a value costs, before any model is loaded
    return options


def run_identity(run: Run) -> str:
    """A hash of what the run is (its saved config, or the Hugging Face source), for result reuse."""
    info = run.info or {}
    return str(info.get("hash") or digest({"info": info, "task": run.task.to_dict(), "model": run.config.to_dict()}))


def file_fingerprint(path: Path) -> dict[str, Any]:
    """``{path, size, sha256}`` of one file (its modification time is left out: a copy or a touch changes nothing)."""
    with open(path, "rb") as handle:
        sha = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"path": str(path), "size": path.stat().st_size, "sha256": sha}


def fingerprint(
    name: str, run: Run, options: Any, *, split: str, limit: int | None, seed: int, figures: bool, data_dir: str | Path | None = None,
    limit_order: str = "stratified",
) -> dict[str, Any]:
    """What a result of test ``name`` on ``run`` depends on, with its ``hash``: the only key an audit resumes by.

    Test, options, split, limit, seed, figures, the run's identity and weight files, the task
    and its data files (size + SHA-256; built-in tasks are named by their spec) and the
    package version. A stored result is reused only when this recomputes to the same hash.
    """
    from attnaudit import __version__
    from attnaudit.data.tasks import task_files

    spec = run.task
    files = task_files(spec.spec, data_dir or spec.data_dir, spec.dev, spec.test)
    weights = sorted(Path(run.path).glob("*.safetensors")) + sorted(Path(run.path).glob("hf/*.safetensors")) if run.path else []
    body = {
        "test": name,
        "options": asdict(options) if is_dataclass(options) and not isinstance(options, type) else {},
        "split": split,
        "limit": limit,
        "limit_order": limit_order,
        "seed": seed,
        "figures": figures,
        "run": run_identity(run),
        "weights": [file_fingerprint(f) for f in weights],
        "task": spec.to_dict(),
        "data": [file_fingerprint(f) for f in files],
        "version": __version__,
    }
    unit = segment_unit(run)
    if unit is not None:  # only when set: results without segments keep their hash
        body["segments"] = unit
    return {**body, "hash": digest(body)}


def run_test(
    name: str,
    run: Run | str | Path,
    *,
    split: str = "test",
    limit: int | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    data_dir: str | Path | None = None,
    device: str = "auto",
    plot: bool = True,
    limit_order: str = "stratified",
    compute: Compute | None = None,
    segments: str | None = None,
    **options: Any,
) -> Result:
    """Run test ``name`` on a run (object or directory) and save JSON, CSV and figures.

    ``limit``: test that many examples of ``split``, a sample stratified by label drawn with ``seed``
    (``limit_order="first"``: the first ones); ``meta["subset"]`` records what was tested.

    Results go to ``out`` (default ``RUN/results``); the training-based tests' sub-runs to
    ``run.subruns`` when set (an audit sets ``OUT/subruns``), else ``out/subruns`` when ``out``
    is given, else ``RUN/subruns``. ``meta["fingerprint"]`` records what the result depends on
    (:func:`fingerprint`). Raises a one-line error when the test does not apply to the model family.
    ``compute``: how the test's result is computed (an audit's ``--engine ray``: :mod:`attnaudit.shards`);
    default :meth:`Experiment.run` in this process. ``segments`` (``word``, ``sentence``, ``line``, ``paragraph``;
    spans given in JSONL rows take precedence): the features every explanation and erasure of the test works with
    (:func:`~attnaudit.explain.helpers.segments.segmented`).
    """
    from attnaudit.resolve import load_model
    from attnaudit.seed import set_seed

    experiment = get_experiment(name)
    opts = make_options(experiment, options)
    if segments is not None:
        check_unit(segments)  # before loading
    if out is not None:
        directory = check_output_dir(out)  # before loading the run: a bad --out fails at once
        refuse_inside(out, run.path if isinstance(run, Run) else run, allowed="results")  # RUN/results: the default
    if not isinstance(run, Run):
        run = load_model(run=run, device=device, data_dir=data_dir)
    run = segmented(run, segments)
    if out is None:
        directory = check_output_dir(Path(run.path) / "results" if run.path else Path("results"))
    elif run.subruns is None and run.path is not None:
        run = replace(run, subruns=directory / "subruns")  # --out: the run directory is only read
    remove_stray_tmp(directory)  # what a killed earlier run left half-written, here and in its sub-runs
    if run.subruns is not None:
        remove_stray_tmp(run.subruns, recursive=True)
    elif run.path is not None:
        remove_stray_tmp(Path(run.path) / "subruns", recursive=True)
    reason = experiment.why_not(run)
    if reason:
        raise AttnAuditError(f"test {name!r} does not apply to this {run.family} model: {reason}")
    own = experiment.inputs(run, opts)
    full = own if own is not None else run.examples(split, data_dir=data_dir)
    examples = limited(full, limit, seed, limit_order)
    if not examples:
        raise AttnAuditError(f"split {split!r} has no examples")
    stamp = fingerprint(name, run, opts, split=split, limit=limit, seed=seed, figures=plot, data_dir=data_dir, limit_order=limit_order)
    with locked(run.path if out is None and run.path else directory):  # the run directory, or --out
        set_seed(seed)
        start = time.perf_counter()
        if compute is None:
            result = experiment.run(run, examples, opts, seed=seed)
        else:
            result = compute(experiment, run, examples, opts, seed, stamp["hash"])
        result.meta.update(
            {
                "run": str(run.path) if run.path else None,
                "model": run.family,
                "task": run.task.spec,
                "split": split,
                "limit": limit,
                "limit_order": limit_order,
                "n": len(examples),
                "subset": describe(split, full, examples, limit, limit_order, seed),
                "seed": seed,
                "options": asdict(opts) if is_dataclass(opts) and not isinstance(opts, type) else {},
                "seconds": round(time.perf_counter() - start, 3),
                "fingerprint": stamp,
                **({"segments": segment_unit(run)} if segment_unit(run) else {}),
            }
        )
        zero_shot = run.config.extra.get("zero_shot")
        if zero_shot:  # a causal LM classifying by prompt: say how, and what the ranked items are
            note = f"zero-shot: prompt {zero_shot['prompt']!r}, verbalizer {zero_shot['verbalizer']}; {zero_shot['items']}"
            result.meta["notes"] = [*result.meta.get("notes", []), note]
        if plot:
            result.figures = [str(p) for p in experiment.plot(result, directory)]
        result.save(directory)
    return result
