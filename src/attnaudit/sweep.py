"""Sweeps: a YAML grid of train + audit jobs, run in a local process pool or on Ray.

The grid is the product datasets × models × seeds (× λ), where the models are families to train
(× normalisers) and Hugging Face models to load (× their prompts, verbalizers, dtypes and
maximum lengths). Each job is one :func:`attnaudit.audit.audit` call that trains its model into
``OUT/<job-id>/run`` (or loads it) and audits it into ``OUT/<job-id>/``, then writes
``OUT/<job-id>/job.json`` (atomically, last: the job's commit point). Re-running a sweep skips jobs whose ``job.json`` says they finished
with the same settings; failed jobs run again (the audit resumes from its stored results).
Everything is aggregated into ``OUT/sweep.csv`` (one row per job: parameters, status, error,
then one column per ``test.statistic``) and ``OUT/sweep.json`` (the same plus every job's
test summaries and verdict rows), and ``OUT/study.html`` compares the jobs (:mod:`attnaudit.study`).
See ``examples/sweep.yaml`` and ``examples/study.yaml`` for the file format.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import time
import traceback
import typing
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from attnaudit import bounds
from attnaudit.cluster import check_engine, map_tasks, ray_session
from attnaudit.errors import AttnAuditError, AttnAuditWarning, InputError, error_line
from attnaudit.io import (
    atomic_write,
    atomic_write_json,
    csv_cell,
    digest,
    read_input,
    read_json,
)
from attnaudit.options import SEED_MAX, check_dtype, check_max_length, check_value, conforms, type_name
from attnaudit.progress import status, track
from attnaudit.study import write_study

JOB_FILE = "job.json"
TABLE_CSV = "sweep.csv"
TABLE_JSON = "sweep.json"
# YAML grid key -> job parameter (the name of the matching `attnaudit train` option).
GRID_KEYS = {"tasks": "task", "models": "model", "hf": "hf", "normalisers": "attention", "prompts": "prompt",
             "verbalizers": "verbalizer", "dtypes": "dtype", "max_lengths": "max_length", "chats": "chat", "systems": "system",
             "seeds": "seed", "lambdas": "lambda"}
MODEL_AXES = ("models", "hf")
"""At least one: families attnaudit trains, and Hugging Face models it loads (a job per model, not their product)."""
HF_AXES = ("prompts", "verbalizers", "dtypes", "max_lengths", "chats", "systems")
"""Loading settings of the ``hf`` models (``audit --hf`` options); the ``models`` jobs do not take them."""
TRAINED_AXES = ("normalisers",)
"""Settings of the trained ``models`` only (an ``hf`` model's attention is its own)."""
TOP_KEYS = ("out", "data_dir", "grid", "train", "audit")
AUDIT_KEYS = ("only", "skip", "split", "limit", "set")
LAMBDA_OPTION = "lambdas"
"""A test whose Options has this list field receives ``[λ]`` from the grid's ``lambdas`` axis."""
# `train` keyword arguments a sweep may fix for all jobs (the grid sets task, model, attention, seed).
TRAIN_EXTRA = {"dev": str | None, "test": str | None, "split_seed": int}
GRID_CONTROLLED = {"model", "task_type", "vocab_size", "num_labels", "attention", "seed"}
PARAM_COLUMNS = ["job", "task", "model", "hf", "architecture", "attention", "prompt", "verbalizer", "dtype", "max_length", "chat", "system",
                 "seed", "lambda", "status", "error", "seconds"]


@dataclass
class SweepConfig:
    """A validated sweep file: the grid axes and the settings shared by every job."""

    path: Path
    grid: dict[str, list[Any]]
    out: str | None = None
    data_dir: str | None = None
    train: dict[str, Any] = field(default_factory=dict)
    only: list[str] | None = None
    skip: list[str] | None = None
    split: str = "test"
    limit: int | None = None
    test_options: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Job:
    """One train + audit job; picklable, so it can go to a spawned process or a Ray worker."""

    id: str
    params: dict[str, Any]
    out: str
    cwd: str
    data_dir: str | None
    train: dict[str, Any]
    only: list[str] | None
    skip: list[str] | None
    split: str
    limit: int | None
    test_options: dict[str, dict[str, Any]]

    def digest(self) -> str:
        """Hash of everything that determines the job's results (not where it runs)."""
        settings = {k: v for k, v in asdict(self).items() if k not in ("out", "cwd")}
        return digest(settings)


@dataclass
class SweepResult:
    """Every job's record (from this run or an earlier one) and the aggregated table."""

    out: Path
    jobs: list[dict[str, Any]]
    skipped: list[str]
    csv: Path
    json: Path
    study: Path

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [job for job in self.jobs if job["status"] != "done"]

    @property
    def ok(self) -> bool:
        return not self.failed


# --------------------------------------------------------------------------- reading the YAML


class _Reader:
    """Walks the composed YAML nodes so every error can name the file and line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise InputError(path, "sweep file not found" if not path.exists() else "expected a YAML file")
        try:
            text = read_input(path).decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(path, "not a UTF-8 text file") from None
        self.loader = yaml.SafeLoader(text)
        try:
            self.root = self.loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise InputError(path, f"invalid YAML: {exc.problem or exc.context}", mark.line + 1 if mark else None) from None
        except yaml.YAMLError as exc:
            raise InputError(path, f"invalid YAML: {str(exc).splitlines()[0]}") from None
        if self.root is None:
            raise InputError(path, "empty sweep file; it needs at least grid.tasks and grid.models")

    def fail(self, node: yaml.Node | None, message: str) -> typing.NoReturn:
        raise InputError(self.path, message, node.start_mark.line + 1 if node is not None else None)

    def value(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.fail(node, f"invalid YAML value: {str(exc).splitlines()[0]}")

    def mapping(self, node: yaml.Node, what: str, allowed: typing.Iterable[str] | None = None) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """``{key: (key node, value node)}``, rejecting non-mappings, duplicate and unknown keys."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping of names to values")
        allowed = list(allowed) if allowed is not None else None
        items: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str):
                self.fail(key_node, f"{what}: keys must be names, got {key!r}")
            if key in items:
                self.fail(key_node, f"{what}: duplicate key {key!r}")
            if allowed is not None and key not in allowed:
                self.fail(key_node, f"{what}: unknown key {key!r}; expected one of {', '.join(allowed)}")
            items[key] = (key_node, value_node)
        return items

    def items(self, node: yaml.Node, what: str) -> list[tuple[yaml.Node, Any]]:
        """A list (or one scalar, read as a one-item list) as ``(node, value)`` pairs."""
        if isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a list")
        nodes = node.value if isinstance(node, yaml.SequenceNode) else [node]
        pairs = [(n, self.value(n)) for n in nodes]
        if not pairs:
            self.fail(node, f"{what} is empty")
        return pairs


def _axis(reader: _Reader, node: yaml.Node, key: str) -> list[Any]:
    """One grid axis, each item checked (names, normalisers, seeds, λ values); no duplicates."""
    from attnaudit.models import MODELS
    from attnaudit.models.normalisers import check_normaliser

    what = f"grid.{key}"
    values: list[Any] = []
    for item_node, value in reader.items(node, what):
        if key in ("hf", *HF_AXES):
            value = _hf_item(reader, item_node, key, value)
        if key in ("tasks", "models", "normalisers") and not isinstance(value, str):
            reader.fail(item_node, f"{what}: expected a name, got {value!r}")
        if key == "models" and value not in MODELS:
            reader.fail(item_node, f"{what}: unknown model {value!r}; choose one of {', '.join(MODELS)}")
        if key == "normalisers":
            try:
                check_normaliser(value)
            except AttnAuditError as exc:
                reader.fail(item_node, f"{what}: {exc}")
        if key == "seeds" and not (conforms(value, int) and 0 <= value <= SEED_MAX):
            reader.fail(item_node, f"{what}: expected an integer seed from 0 to {SEED_MAX}, got {value!r}")
        if key == "lambdas" and not conforms(value, float):
            reader.fail(item_node, f"{what}: expected a number, got {value!r}")
        if value in values:
            reader.fail(item_node, f"{what}: {value!r} listed twice")
        values.append(value)
    return values


def _hf_item(reader: _Reader, node: yaml.Node, key: str, value: Any) -> Any:
    """One item of the ``hf`` axis or of its settings, checked as ``audit --hf`` checks it; a verbalizer
    is kept as ``{label: word}`` (written in the file as a mapping or as ``--verbalizer`` text)."""
    what = f"grid.{key}"
    if key == "hf" and isinstance(value, dict):
        return _hf_entry(reader, node, value)
    if key == "verbalizers" and isinstance(value, dict):
        words = {str(label): word for label, word in value.items() if isinstance(word, str)}
        if len(words) < 2 or len(words) != len(value):
            reader.fail(node, f"{what}: expected at least two label: word pairs with text words, got {value!r}")
        return words
    if key == "chats" and not isinstance(value, bool):
        reader.fail(node, f"{what}: expected true or false (the tokenizer's chat template, as --chat), got {value!r}")
    if key not in ("max_lengths", "chats") and (not isinstance(value, str) or not value.strip()):
        reader.fail(node, f"{what}: expected {'a model name or folder' if key == 'hf' else 'text'}, got {value!r}")
    if key == "prompts" and value.count("{text}") != 1:
        reader.fail(node, f"{what}: a prompt must contain {{text}} exactly once, got {value!r}")
    try:
        return _checked_hf_item(key, value)
    except AttnAuditError as exc:
        reader.fail(node, f"{what}: {exc}")


def _hf_entry(reader: _Reader, node: yaml.Node, entry: dict[str, Any]) -> dict[str, Any]:
    """An ``hf`` item with settings of its own, ``{name: smollm2, prompt: ..., verbalizer: ...}``: each setting
    checked as its grid axis's items are (a prompt for the decoder only, beside an encoder without one)."""
    settings = {GRID_KEYS[key]: key for key in HF_AXES}
    unknown = sorted(set(entry) - {"name", *settings})
    if unknown or "name" not in entry:
        problem = f"unknown key {unknown[0]!r}" if unknown else "missing 'name'"
        reader.fail(node, f"grid.hf: {problem}; an entry is a name or {{name: NAME, {', '.join(settings)}}}")
    checked = {"name": _hf_item(reader, node, "hf", entry["name"])}
    if isinstance(checked["name"], dict):
        reader.fail(node, "grid.hf: an entry's name is a model name or folder")
    return checked | {key: _hf_item(reader, node, settings[key], value) for key, value in entry.items() if key != "name"}


def _checked_hf_item(key: str, value: Any) -> Any:
    """``value`` as the audit would read it; an ``AttnAuditError`` when it would refuse it."""
    from attnaudit.models.hf import parse_verbalizer
    from attnaudit.pretrained import resolve_source

    if key == "hf":
        resolve_source(value)  # a path that is no model folder or .gguf file fails now, a hub name when its job loads
    elif key == "verbalizers":
        return parse_verbalizer(value)
    elif key == "dtypes":
        return check_dtype(value, f"grid.{key}")
    elif key == "max_lengths":
        return check_max_length(value, f"grid.{key}")
    return value


def _train_hints() -> dict[str, Any]:
    """Options of ``train`` a sweep may set, with their types."""
    from attnaudit.models.interface import ModelConfig
    from attnaudit.training.trainer import TrainConfig

    hints: dict[str, Any] = {}
    for cls in (ModelConfig, TrainConfig):
        types = typing.get_type_hints(cls)
        hints.update({f.name: types[f.name] for f in fields(cls) if f.name not in GRID_CONTROLLED})
    return {**hints, **TRAIN_EXTRA}


def _test_list(reader: _Reader, node: yaml.Node, what: str, registry: dict[str, Any]) -> list[str]:
    names = []
    for item_node, name in reader.items(node, what):
        if name not in registry:
            reader.fail(item_node, f"{what}: unknown test {name!r}; available: {', '.join(registry)}")
        names.append(name)
    return names


def _audit_section(reader: _Reader, node: yaml.Node, config: SweepConfig) -> None:
    """``audit:`` — only, skip, split, limit and per-test options (``set``), checked against each test's Options."""
    from attnaudit.experiments.experiment import discover

    registry = discover()
    section = reader.mapping(node, "audit", AUDIT_KEYS)
    if "only" in section:
        config.only = _test_list(reader, section["only"][1], "audit.only", registry)
    if "skip" in section:
        config.skip = _test_list(reader, section["skip"][1], "audit.skip", registry)
    if "split" in section:
        split = reader.value(section["split"][1])
        if split not in ("train", "dev", "test", "all"):
            reader.fail(section["split"][1], f"audit.split: expected train, dev, test or all, got {split!r}")
        config.split = split
    if "limit" in section:
        limit = reader.value(section["limit"][1])
        if limit is not None and (not conforms(limit, int) or limit < 1):
            reader.fail(section["limit"][1], f"audit.limit: expected a positive integer or null, got {limit!r}")
        config.limit = limit
    if "set" in section:
        for test, (test_key, options_node) in reader.mapping(section["set"][1], "audit.set").items():
            if test not in registry:
                reader.fail(test_key, f"audit.set: unknown test {test!r}; available: {', '.join(registry)}")
            hints = typing.get_type_hints(registry[test].Options)
            for option, (option_key, value_node) in reader.mapping(options_node, f"audit.set.{test}").items():
                option = option.replace("-", "_")
                if option not in hints:
                    reader.fail(option_key, f"audit.set.{test}: no option {option!r}; it takes {', '.join(hints) or 'none'}")
                try:
                    value = check_value(reader.value(value_node), hints[option], f"audit.set.{test}.{option}")
                except AttnAuditError as exc:
                    reader.fail(value_node, str(exc))
                config.test_options.setdefault(test, {})[option] = value
            if (config.only and test not in config.only) or test in (config.skip or ()):
                reader.fail(test_key, f"audit.set.{test}: that test is not selected (audit.only / audit.skip)")


def lambda_tests(config: SweepConfig) -> list[str]:
    """The selected tests that take a ``lambdas`` option (they receive the grid's λ)."""
    from attnaudit.experiments.experiment import discover

    registry = discover()
    selected = [n for n in registry if (not config.only or n in config.only) and n not in (config.skip or ())]
    return [n for n in selected if LAMBDA_OPTION in {f.name for f in fields(registry[n].Options)}]


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep YAML file; errors name the file and line (``InputError``)."""
    reader = _Reader(Path(path))
    top = reader.mapping(reader.root, "the sweep file", TOP_KEYS)
    if "grid" not in top:
        reader.fail(reader.root, "missing 'grid' (with at least tasks, and models or hf)")
    grid_section = reader.mapping(top["grid"][1], "grid", GRID_KEYS)
    if "tasks" not in grid_section:
        reader.fail(top["grid"][0], "grid: missing 'tasks'")
    if not any(key in grid_section for key in MODEL_AXES):
        reader.fail(top["grid"][0], "grid: missing 'models' or 'hf' (families to train, Hugging Face models to load)")
    for axes, owner in ((HF_AXES, "hf"), (TRAINED_AXES, "models")):
        for key in axes:
            if key in grid_section and owner not in grid_section:
                reader.fail(grid_section[key][0], f"grid.{key}: applies to grid.{owner}, and the grid has none")
    if "train" in top and "models" not in grid_section:
        reader.fail(top["train"][0], "train: applies to grid.models (families to train), and the grid has none")
    grid = {key: _axis(reader, value, key) for key, (_, value) in grid_section.items()}
    for (item_node, _), entry in zip(reader.items(grid_section["hf"][1], "grid.hf") if "hf" in grid else [], grid.get("hf", [])):
        both = [key for key in HF_AXES if isinstance(entry, dict) and GRID_KEYS[key] in entry and key in grid]
        if both:
            reader.fail(item_node, f"grid.hf: {entry['name']} sets its own {GRID_KEYS[both[0]]} and grid.{both[0]} sets one too; keep one")
    config = SweepConfig(path=Path(path), grid=grid)
    for key in ("out", "data_dir"):
        if key in top:
            value = reader.value(top[key][1])
            if not isinstance(value, str) or not value:
                reader.fail(top[key][1], f"{key}: expected a path, got {value!r}")
            setattr(config, key, value)
    if "train" in top:
        hints = _train_hints()
        for option, (key_node, value_node) in reader.mapping(top["train"][1], "train").items():
            if option in GRID_CONTROLLED:
                reader.fail(key_node, f"train.{option}: set by the grid (tasks, models, normalisers, seeds), not here")
            if option not in hints:
                reader.fail(key_node, f"train: unknown option {option!r}; allowed: {', '.join(sorted(hints))}")
            value = reader.value(value_node)
            if not conforms(value, hints[option]):
                reader.fail(value_node, f"train.{option}: expected {type_name(hints[option])}, got {value!r}")
            config.train[option] = value
    if "audit" in top:
        _audit_section(reader, top["audit"][1], config)
    if "lambdas" in grid:
        takers = lambda_tests(config)
        lambda_node = grid_section["lambdas"][1]
        if not takers:
            reader.fail(lambda_node, f"grid.lambdas: none of the selected tests has a {LAMBDA_OPTION!r} option")
        for test in takers:
            if LAMBDA_OPTION in config.test_options.get(test, {}):
                reader.fail(lambda_node, f"grid.lambdas and audit.set.{test}.{LAMBDA_OPTION} both set λ; keep one")
    reader.loader.dispose()
    return config


# --------------------------------------------------------------------------- planning


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-.")[:40] or "x"


def job_id(params: dict[str, Any], settings: dict[str, int] | None = None) -> str:
    """A readable folder name: ``task_model_normaliser_s<seed>[_l<λ>]``, or for a Hugging Face model
    ``task_<name>[_p<i>][_v<i>][_<dtype>][_len<n>]_s<seed>[_l<λ>]`` (``settings``: the place of the job's
    prompt and verbalizer in their grid axes, from 1; a model's own prompt has none)."""
    if "hf" in params:
        parts = [_slug(params["task"]), _slug(params["hf"])]
        places = settings or {}
        parts += [f"{letter}{places[key]}" for key, letter in (("prompt", "p"), ("verbalizer", "v")) if key in places]
        parts += [str(params["dtype"])] if "dtype" in params else []
        parts += [f"len{params['max_length']}"] if "max_length" in params else []
        parts += ["chat"] if params.get("chat") else []
        parts += [f"sys{places['system']}"] if "system" in places else []
    else:
        parts = [_slug(params["task"]), params["model"], _slug(params["attention"])]
    parts.append(f"s{params['seed']}")
    if "lambda" in params:
        parts.append(f"l{params['lambda']:g}")
    return "_".join(parts)


def _model_params(config: SweepConfig) -> list[dict[str, Any]]:
    """Each model's part of a job's parameters: trained families × normalisers, then the Hugging Face
    models × their settings (only the settings the grid names)."""
    grid = config.grid
    entries = [{"model": m, "attention": a} for m in grid.get("models", []) for a in grid.get("normalisers") or ["softmax"]]
    hf_axes = {GRID_KEYS[key]: grid[key] for key in HF_AXES if key in grid}
    for item in grid.get("hf", []):
        own = dict(item) if isinstance(item, dict) else {"name": item}
        name = own.pop("name")
        for values in itertools.product(*hf_axes.values()):
            entries.append({"hf": name, **own, **dict(zip(hf_axes, values))})
    return entries


def plan(config: SweepConfig, out: str | Path, data_dir: str | Path | None = None) -> list[Job]:
    """The grid's jobs in a fixed order (tasks, then models and their settings, seeds, λ)."""
    lambdas = config.grid.get("lambdas")
    takers = lambda_tests(config) if lambdas else []
    out = Path(out).resolve()
    jobs: list[Job] = []
    seen: set[str] = set()
    combos = itertools.product(config.grid["tasks"], _model_params(config), config.grid.get("seeds") or [0], lambdas or [None])
    for task, model, seed, lam in combos:
        params = {"task": task, **model, "seed": seed, **({"lambda": lam} if lam is not None else {})}
        test_options = {k: dict(v) for k, v in config.test_options.items()}
        for test in takers:
            test_options.setdefault(test, {})[LAMBDA_OPTION] = [float(params["lambda"])]
        places = {GRID_KEYS[key]: config.grid[key].index(params[GRID_KEYS[key]]) + 1
                  for key in ("prompts", "verbalizers", "systems") if key in config.grid and GRID_KEYS[key] in params}
        ident = job_id(params, places)
        if ident in seen:  # two task specs with the same slug: keep the folders apart
            ident += "-" + hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:6]
        seen.add(ident)
        jobs.append(
            Job(
                id=ident,
                params=params,
                out=str(out / ident),
                cwd=os.getcwd(),
                data_dir=str(Path(data_dir).resolve()) if data_dir else None,
                train=dict(config.train) if "model" in params else {},
                only=config.only,
                skip=config.skip,
                split=config.split,
                limit=config.limit,
                test_options=test_options,
            )
        )
    return jobs


def finished(job: Job) -> dict[str, Any] | None:
    """The stored record of ``job`` when it already finished with the same settings."""
    path = Path(job.out) / JOB_FILE
    if not path.exists():
        return None
    try:
        record = read_json(path)
    except AttnAuditError:
        return None
    ok = isinstance(record, dict) and record.get("status") == "done" and record.get("digest") == job.digest()
    return record if ok else None


# --------------------------------------------------------------------------- one job


def run_job(job: Job) -> dict[str, Any]:
    """Train and audit one job; never raises: the outcome (done/failed, error, summary rows) is returned.

    Runs with one torch thread (the pool or Ray provides the parallelism) and writes the
    record to ``OUT/<job-id>/job.json`` last, so a job killed midway is simply rerun.
    """
    import torch

    from attnaudit.audit import audit
    from attnaudit.progress import set_quiet

    torch.set_num_threads(1)
    set_quiet(True)
    if Path(job.cwd).is_dir():  # relative task paths mean what they meant where the sweep started
        os.chdir(job.cwd)
    start = time.perf_counter()
    record: dict[str, Any] = {"id": job.id, "params": job.params, "digest": job.digest(), "status": "failed", "error": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AttnAuditWarning)
        try:
            Path(job.out).mkdir(parents=True, exist_ok=True)
            outcome = audit(
                job.out, task=job.params["task"], only=job.only, skip=job.skip, split=job.split, limit=job.limit,
                seed=job.params["seed"], data_dir=job.data_dir, device="auto", test_options=job.test_options, **_model_kwargs(job),
            )
            record["architecture"] = _architecture(Path(job.out))
            record["summary"] = {name: result.summary for name, result in outcome.results.items()}
            record["rows"] = outcome.rows
            record["failed_tests"] = outcome.failed
            if outcome.ok:
                record["status"] = "done"
            else:
                record["error"] = "test(s) failed: " + "; ".join(f"{k}: {v}" for k, v in outcome.failed.items())
        except Exception as exc:  # a failing job is reported; the sweep goes on
            record["error"] = error_line(exc)
            record["traceback"] = traceback.format_exc(limit=8)
    record["warnings"] = sorted({str(w.message) for w in caught if issubclass(w.category, AttnAuditWarning)})
    record["seconds"] = round(time.perf_counter() - start, 3)
    try:
        atomic_write_json(Path(job.out) / JOB_FILE, record)
    except OSError as exc:  # the job folder itself is unusable; the sweep still gets the record
        record["error"] = record["error"] or f"could not write {JOB_FILE}: {exc}"
        record["status"] = "failed"
    return record


def _model_kwargs(job: Job) -> dict[str, Any]:
    """What the audit is given about the model: a family to train with its options, or a Hugging Face model with its settings."""
    params = job.params
    if "hf" in params:
        settings = ("prompt", "verbalizer", "dtype", "max_length", "system")  # a system prompt without chat: the audit refuses it
        return {"hf": params["hf"], **{key: params[key] for key in settings if key in params}, **({"chat": True} if params.get("chat") else {})}
    return {"model": params["model"], "attention": params["attention"], **job.train}


def _architecture(folder: Path) -> str | None:
    """The audited model's architecture as the audit recorded it (``audit.json``): a Hugging Face
    ``model_type`` (``llama``, ``bert``) or the trained family."""
    from attnaudit.report.summary import AUDIT

    try:
        return read_json(folder / AUDIT).get("architecture")
    except (AttnAuditError, AttributeError):
        return None


def _crashed(job: Job, exc: BaseException) -> dict[str, Any]:
    """Record for a job whose worker died (killed, out of memory) before returning."""
    return {"id": job.id, "params": job.params, "digest": job.digest(), "status": "failed", "error": f"worker died: {error_line(exc)}"}


# --------------------------------------------------------------------------- engines


def _init_worker() -> None:
    """Process-pool initialiser: one thread per worker (the pool is the parallelism); Ctrl-C, which the terminal sends
    to every process of the sweep, is the parent's to handle (it stops the workers): no worker prints a traceback."""
    import signal

    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


STOP_SECONDS = 5.0
"""How long an interrupted sweep waits for a terminated worker to exit before killing it."""


def _stop_pool(pool: Any) -> None:
    """Cancel the queued jobs and end the running ones now (their folders resume on the next run). The executor has no
    public way to end running workers (``shutdown`` waits for them), hence its ``_processes``."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(STOP_SECONDS)
        if process.is_alive():
            process.kill()


def _run_local(jobs: list[Job], workers: int) -> Iterator[dict[str, Any]]:
    """Jobs in a spawn-context process pool; yields records as jobs finish."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools and locks
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker)
    try:
        futures = {pool.submit(run_job, job): job for job in jobs}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as exc:  # BrokenProcessPool and the like: the job's worker died
                yield _crashed(futures[future], exc)
    except BaseException:  # Ctrl-C (KeyboardInterrupt), or the caller stopped reading: end the workers, do not wait
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)


def _run_ray(jobs: list[Job], address: str | None, workers: int | None) -> Iterator[dict[str, Any]]:
    """Jobs as Ray tasks (one CPU each) on the cluster at ``address``, or a local Ray when none is running; Ctrl-C
    cancels them (their job folders resume on the next run)."""
    with ray_session(address, workers) as ray:
        for job, record, error in map_tasks(ray, run_job, jobs):
            yield record if error is None else _crashed(job, error)


# --------------------------------------------------------------------------- aggregation


def table_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per job: parameters, status, error, seconds, then ``test.statistic`` columns.

    The statistics are each test's whole summary, plus the audit's verdict rows that are not
    in it; a skipped or failed test has ``test.skipped`` / ``test.error`` with the reason.
    """
    rows = []
    for record in records:
        params = {key: csv_cell(value) for key, value in record["params"].items()}
        if "hf" in params and record.get("architecture"):  # a trained family's column `model` is its architecture
            params["architecture"] = record["architecture"]
        row = {"job": record["id"], **params, "status": record["status"], "error": record.get("error") or "",
               "seconds": record.get("seconds")}
        for test, summary in record.get("summary", {}).items():
            row.update({f"{test}.{key}": csv_cell(value) for key, value in summary.items()})
        for item in record.get("rows", []):
            statistic = item["statistic"]
            value = item["interpretation"] if statistic in ("skipped", "error") else item["value"]
            row.setdefault(f"{item['test']}.{statistic}", csv_cell(value))
        rows.append(row)
    return rows


def write_table(out: Path, records: list[dict[str, Any]], config: Path) -> tuple[Path, Path]:
    """``OUT/sweep.csv`` (wide, one row per job) and ``OUT/sweep.json`` (records with summary rows)."""
    import pandas as pd

    rows = table_rows(records)
    columns = [c for c in PARAM_COLUMNS if any(c in r for r in rows)]
    columns += sorted({c for r in rows for c in r} - set(columns))
    frame = pd.DataFrame(rows, columns=columns)
    csv = atomic_write(out / TABLE_CSV, lambda tmp: frame.to_csv(tmp, index=False))
    summary = {
        "config": str(config),
        "jobs": len(records),
        "failed": sum(r["status"] != "done" for r in records),
        "records": [{k: v for k, v in r.items() if k != "traceback"} for r in records],
    }
    return csv, atomic_write_json(out / TABLE_JSON, summary)


def sweep(
    config: str | Path | SweepConfig,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
    out: str | Path | None = None,
    data_dir: str | Path | None = None,
) -> SweepResult:
    """Run every job of a sweep file that has not finished yet and aggregate all of them.

    ``engine`` is ``local`` (a spawn process pool of ``workers`` processes, default one per
    core) or ``ray`` (tasks with ``num_cpus=1`` on ``ray.init(address=address)``; with no
    address and no running Ray, a local one with ``workers`` CPUs). ``out`` and ``data_dir``
    override the file's ``out``/``data_dir``; the data directory falls back to
    ``$ATTNAUDIT_DATA``. Failed jobs are in ``result.failed``; they never stop the others.
    """
    check_engine(engine, workers, address, pool=True)
    settings = config if isinstance(config, SweepConfig) else load_config(config)
    folder = out or settings.out
    if not folder:
        raise AttnAuditError(f"{settings.path}: no output folder; give --out or set 'out:' in the file")
    data = data_dir or settings.data_dir or os.environ.get("ATTNAUDIT_DATA")
    jobs = plan(settings, folder, data)
    root = Path(folder).resolve()
    root.mkdir(parents=True, exist_ok=True)

    records: dict[str, dict[str, Any]] = {}
    for job in jobs:
        stored = finished(job)
        if stored is not None:
            records[job.id] = stored
    todo = [job for job in jobs if job.id not in records]
    skipped = list(records)
    status(f"sweep: {len(jobs)} job(s), {len(skipped)} already finished, {len(todo)} to run ({engine}) -> {root}")
    if todo:
        count = min(workers or bounds.cores(), len(todo))
        stream = _run_local(todo, count) if engine == "local" else _run_ray(todo, address, workers)
        for record in track(stream, "sweep jobs", total=len(todo)):
            records[record["id"]] = record
            if record["status"] != "done":
                status(f"[red]failed[/] {record['id']}: {record['error']}")
    ordered = [records[job.id] for job in jobs]
    csv, summary = write_table(root, ordered, settings.path)
    study = write_study(root, ordered, f"Study: {settings.path.name}")
    return SweepResult(out=root, jobs=ordered, skipped=skipped, csv=csv, json=summary, study=study)
