"""One signature, one result type for every faithfulness test.

An experiment is a class registered with :func:`register` that declares

* ``name`` / ``description`` / ``paper`` — shown by ``attnaudit tests``;
* ``Options`` — a dataclass of its own options (defaults + ``metadata={"help": ...}``);
  the CLI builds ``attnaudit run <name>`` from it, so CLI and API cannot drift apart;
* ``applies(run) -> str | None`` — why the test does not apply to this model, or None;
* ``run(run, examples, options, seed) -> Result`` and ``plot(result, directory) -> [paths]``;
* ``settings`` — an :class:`AuditSettings`: how the audit, the demo and the report use it.

This module holds the base class, :class:`Result` and the registry; the runner (:func:`~attnaudit.experiments.runner.run_test`)
is :mod:`attnaudit.experiments.runner`, what several tests share is ``experiments/common/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError, InputError, named
from attnaudit.io import (
    RESULT_NAMES,
    atomic_write,
    atomic_write_json,
    check_fields,
    read_json,
)
from attnaudit.run import Run


@dataclass
class Result:
    """What a test measured: headline ``summary``, per-``instances`` rows, named ``tables``.

    Saved as ``results/<test>.json`` (everything) plus ``results/<test>.csv`` (instances),
    both loadable into pandas; ``meta`` records run, split, options, seed, timing, notes and
    the published figures to compare against.
    """

    test: str
    summary: dict[str, Any] = field(default_factory=dict)
    instances: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, directory: str | Path) -> Path:
        """Write ``<test>.json`` and ``<test>.csv`` atomically into ``directory``, and
        ``<test>_<table>.csv`` for each table named in ``meta["csv_tables"]``."""
        directory = Path(directory)
        frames = {self.test: self.instances}
        frames.update({f"{self.test}_{name}": self.tables.get(name, []) for name in self.meta.get("csv_tables", [])})
        for stem, rows in frames.items():
            if rows:
                frame = pd.DataFrame(rows)

                def write(tmp: Path, frame: pd.DataFrame = frame) -> None:
                    frame.to_csv(tmp, index=False)

                atomic_write(directory / f"{stem}.csv", write)
        return atomic_write_json(directory / f"{self.test}.json", self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Result:
        """A saved result; anything else (another JSON, fields of the wrong type) is an ``InputError``."""
        data = read_json(path)
        kinds = {"test": str, "summary": dict, "instances": list, "tables": dict, "meta": dict, "figures": list}
        if not isinstance(data, dict) or any(not isinstance(data.get(k, kind()), kind) for k, kind in kinds.items()):
            raise InputError(path, "not an attnaudit result file")
        _check_result_parts(path, data)
        try:
            return cls(**data)
        except TypeError:
            raise InputError(path, "not an attnaudit result file") from None

    def frame(self, table: str | None = None) -> pd.DataFrame:
        """Instances (default) or a named table as a DataFrame."""
        if table is None:
            return pd.DataFrame(self.instances)
        if table not in self.tables:
            raise AttnAuditError(f"result {self.test!r} has no table {table!r}; it has {sorted(self.tables)}")
        return pd.DataFrame(self.tables[table])


def _check_result_parts(path: str | Path, data: dict[str, Any]) -> None:
    """The parts of a result that readers index: rows are objects, figures paths, meta's lists lists."""
    rows = {"instances": data.get("instances", []), **{f"tables.{k}": v for k, v in data.get("tables", {}).items()}}
    for name, table in rows.items():
        if not isinstance(table, list) or not all(isinstance(row, dict) for row in table):
            raise InputError(path, f"field {name!r} must be an array of objects")
    if not all(isinstance(figure, str) for figure in data.get("figures", [])):
        raise InputError(path, "field 'figures' must be an array of strings")
    check_fields(path, data.get("meta", {}), optional={"notes": list, "options": dict, "audit": dict}, where="meta")


@dataclass(frozen=True)
class AuditSettings:
    """How the audit, the demo and the report use a test: one value per test class, so that the class's
    own attributes are what the test is (name, description, paper, what it needs)."""

    rank: int = 50
    """Where an audit runs this test: cheap tests first (below 50), tests without a rank (50)
    next, the training-based ones last (above 50); ties by name."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Options an audit sets by default (small sizes for the tests that train models); --set overrides them."""
    decoder_options: Mapping[str, Any] = field(default_factory=dict)
    """Options an audit sets by default on a decoder-only LLM (over ``options``; --set overrides them):
    smaller sizes where a test's cost grows with the 30-layer, 49k-vocabulary models (the SmolLM2 audit)."""
    transformers_only: bool = False
    """Whether an audit runs this test on stacked self-attention models only (it still runs on
    any model it applies to with ``attnaudit run``)."""
    demo: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The demo's options per size (``full``, ``quick``)."""
    ranks_instances: str = ""
    """The per-instance result column that orders instances from most to least faithful (the
    report's heatmaps show both ends); empty when the test has none."""
    instance_effects: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Per-instance result columns that say what the test did to one instance, each with a short
    description and the sort order that puts the most striking instances first (``"desc"`` or
    ``"asc"``): the report's explorer shows them and sorts instances by them."""
    instance_attention: str = ""
    """A result table with one row per instance (``index``) whose other columns are attention
    distributions over the instance's real keys at the explained layer (e.g. the original and the
    adversarial attention): the explorer draws them as token rows beside the test's numbers."""


class Experiment:
    """Base class of a registered faithfulness test (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    needs_prediction: ClassVar[bool] = True
    """Whether the test explains or perturbs the model's predictions; a Hugging Face encoder
    without a trained head has none, so such tests do not apply to it."""
    retrains: ClassVar[bool] = False
    """Whether the test trains new models like the audited one (seeds, uniform, adversaries, probes):
    then why it cannot retrain this model (a pretrained Hugging Face model) comes first."""
    examples: ClassVar[tuple[str, ...]] = ("runs/sst --limit 200 --data-dir ../shared/data",)
    """Arguments after ``attnaudit run NAME`` shown as examples in its ``--help``. The test suite
    runs each (tests/reliability/test_documented_commands.py), so each must name a run the test
    applies to, made by a documented command (``runs/sst``: ``attnaudit train --help``)."""

    settings: ClassVar[AuditSettings] = AuditSettings()
    """How the audit, the demo and the report use this test (:class:`AuditSettings`; defaults when not set)."""

    @dataclass
    class Options:
        pass

    @classmethod
    def explanation_choices(cls) -> list[str]:
        """The explanation methods (:mod:`attnaudit.explain`) this test can take; none by default."""
        return []

    def applies(self, run: Run) -> str | None:
        """Why this test does not apply to ``run`` (None when it does)."""
        return None

    own_inputs: ClassVar[str] = ""
    """The option naming a file of the test's own instances (:meth:`inputs`); given it, ``--hf`` needs no ``--task``."""

    def inputs(self, run: Run, options: Any) -> list[Example] | None:
        """The test's own instances (a file its options name, such as the generation test's prompts), or
        None: the run's split (the default)."""
        return None

    def why_not(self, run: Run) -> str | None:
        """Why this test cannot run on ``run``: for a test that :attr:`retrains`, :meth:`applies` first;
        then no prediction to explain (a causal LM: none without a prompt and verbalizer), else :meth:`applies`."""
        reason = self.applies(run) if self.retrains else None
        if reason:
            return reason
        if self.needs_prediction and run.config.extra.get("output") == "next_token":
            return (
                "this causal language model predicts next tokens, not classes, so it makes no prediction for this "
                "test to explain; give it a labelled --task (it then classifies zero-shot by the label names) or --prompt/--verbalizer"
            )
        if self.needs_prediction and not run.model.trained_head:
            return (
                "this model has no trained classification head, so it makes no prediction to explain; "
                "fine-tune it first (attnaudit finetune)"
            )
        return self.applies(run)

    shardable: ClassVar[bool] = False
    """Whether the test measures instance by instance, each instance's rows depending only on the instance,
    its position in the tested examples and the seed: then it implements :meth:`part` and :meth:`merge`
    (not :meth:`run`), and an audit may compute its rows in shards on several workers (``--engine ray``)."""

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        """The test on ``examples`` of ``run`` with this test's ``Options``; ``seed`` seeds every
        random choice. Subclasses implement it (a :attr:`shardable` test: one part, merged);
        :func:`run_test` adds the record and saves."""
        if not self.shardable:
            raise NotImplementedError
        return self.merge(run, [self.part(run, examples, options, seed)], options, seed)

    def plan(self, run: Run, examples: list[Example], options: Any) -> list[int]:
        """A :attr:`shardable` test's instances (positions in ``examples``) in the order one process batches them,
        ``options.batch_size`` at a time. Shards are consecutive stretches of whole batches of this order, so each
        batch is the one a single process pads and runs, and the numbers are the same bit for bit. The default is the
        order :meth:`~attnaudit.run.Run.sorted_batches` batches in (by length), which the batched tests use."""
        return run.batch_order(examples)

    def part(self, run: Run, examples: list[Example], options: Any, seed: int = 0, indices: Sequence[int] | None = None) -> Result:
        """A :attr:`shardable` test's rows of ``examples`` (in :meth:`plan` order), ``indices[i]`` the position of
        ``examples[i]`` among all tested examples (None: ``i``): instances and tables keyed by ``index`` (that
        position, which seeds an instance's draws), and counts in ``meta`` that :meth:`merge` adds up."""
        raise NotImplementedError

    def merge(self, run: Run, parts: list[Result], options: Any, seed: int = 0) -> Result:
        """The result of a :attr:`shardable` test from the :meth:`part` results of its shards: every summary,
        table and note computed from the merged rows (:func:`joined`)."""
        raise NotImplementedError

    def plot(self, result: Result, directory: Path) -> list[Path]:
        """Figures for ``result`` (PNG + SVG) written into ``directory``; default none."""
        return []

    def token_measures(self, result: Result) -> dict[str, str]:
        """For a test over generated sequences (instance rows of one token each: ``index`` the sequence, ``step`` its
        position, ``token`` its text), the per-token columns of ``result`` the report shades each sequence's tokens by,
        each with a short description; default none (no such view)."""
        return {}

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """Rows ``{statistic, value, published, interpretation}`` for the audit's verdict table.

        The default lists the summary items, each beside the published figure of the same
        name when ``meta["published"]`` has one, without an interpretation; tests override
        it to say what their numbers mean for faithfulness.
        """
        published = result.meta.get("published")
        published = published if isinstance(published, dict) else {}
        rows = []
        for key, value in result.summary.items():
            paper = published.get(key)
            rows.append(
                {
                    "statistic": key,
                    "value": value,
                    "published": paper if isinstance(paper, (int, float, str)) else "",
                    "interpretation": "",
                }
            )
        return rows




EXPERIMENTS: dict[str, type[Experiment]] = {}


def register(cls: type[Experiment]) -> type[Experiment]:
    """Class decorator adding an experiment to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    EXPERIMENTS[cls.name] = cls
    RESULT_NAMES.add(cls.name)  # a folder holding its result JSON is one attnaudit may write to
    return cls


def discover() -> dict[str, type[Experiment]]:
    """Import every module of ``attnaudit.experiments`` so each registers itself."""
    import importlib
    import pkgutil

    import attnaudit.experiments as package

    for info in pkgutil.iter_modules(package.__path__):  # every module; the shared ones (common/, runner) register none
        if not info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"attnaudit.experiments.{info.name}")
    return dict(sorted(EXPERIMENTS.items()))


def applicability(run: Run) -> dict[str, str | None]:
    """Every registered test -> None when it runs on ``run``, else why not (its own :meth:`Experiment.why_not`)."""
    return {name: cls().why_not(run) for name, cls in discover().items()}


def get_experiment(name: str) -> Experiment:
    """A fresh instance of the registered test ``name`` (one-line error listing the tests otherwise)."""
    registry = discover()
    return registry[named("test", name, registry)]()












def joined(parts: list[Result], table: str | None = None) -> list[dict[str, Any]]:
    """The instance rows (or rows of ``table``) of the parts of a shardable test, by ``index`` (stable: a part's
    rows of one instance keep their order)."""
    rows = [row for part in parts for row in (part.instances if table is None else part.tables.get(table, []))]
    return sorted(rows, key=lambda row: row["index"])


def where(examples: list[Example], indices: Sequence[int] | None) -> Sequence[int]:
    """Each example's position among all tested examples: ``indices``, or its own position when None."""
    return range(len(examples)) if indices is None else indices


def counted(parts: list[Result], key: str) -> int:
    """The sum of the parts' ``meta[key]`` counts (work done, instances left out, ...)."""
    return sum(int(part.meta.get(key, 0)) for part in parts)


def summarise(values: list[float]) -> dict[str, float]:
    """mean, std, median, n over the finite values (NaNs are counted, not averaged)."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    finite = arr[np.isfinite(arr)]
    if finite.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "median": float("nan"), "n": 0, "n_nan": int(arr.size)}
    return {
        "mean": float(finite.mean()),
        "std": float(finite.std()),
        "median": float(np.median(finite)),
        "n": int(finite.size),
        "n_nan": int(arr.size - finite.size),
    }

