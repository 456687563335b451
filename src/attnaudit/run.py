"""A trained model together with everything needed to feed it: the unit experiments take.

A :class:`Run` is loaded from a run directory (``load_run``) or returned by ``train``; Hugging
Face models get a ``Run`` from their adapter. Experiments only use ``run.model`` (the
:class:`AttentionModel` interface), ``run.batches`` and ``run.examples``.

A run directory's ``config.json`` records its ``kind``; :func:`load_run` hands the directory
to the loader registered for that kind (:data:`RUN_LOADERS`). The built-in kinds name their
loader's module, imported only when a run of that kind is loaded, so this module imports no
model family and no trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol

import torch

from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.io import JsonKinds, atomic_write_json, check_fields, read_json
from attnaudit.models.interface import AttentionModel, ModelConfig
from attnaudit.weights import load_tensors

CONFIG = "config.json"
STAGE = ".partial"
"""The folder inside a run folder where ``train``, ``finetune`` and ``train-nmt`` build the run before moving it in
(:mod:`attnaudit.training.staging`): a folder with a stage and no config is an unfinished training, never a run."""



def absolute_dir(data_dir: str | Path | None) -> str | None:
    """A data directory as recorded in a run: absolute, so the run finds its data from any folder."""
    return str(Path(data_dir).expanduser().resolve()) if data_dir else None

@dataclass
class TaskSpec:
    """How to reload a run's data: the ``--task`` string, data directory and split seed."""

    spec: str
    task_type: str
    labels: list[str]
    data_dir: str | None = None
    seed: int = 0
    dev: str | None = None
    test: str | None = None
    min_length: int = 0
    """Examples with fewer tokens are dropped from every split (0: none)."""

    def load(self, data_dir: str | Path | None = None) -> TaskData:
        from attnaudit.data.tasks import load_task

        return load_task(
            self.spec, data_dir=data_dir or self.data_dir, seed=self.seed, dev=self.dev, test=self.test,
            min_length=self.min_length,
        )

    def to_dict(self) -> dict[str, Any]:
        """The spec saved with a run; ``min_length`` only when set (older runs keep their hash)."""
        return {k: v for k, v in asdict(self).items() if k != "min_length" or v}


@dataclass
class Run:
    """A model plus its collate function, labels and data spec.

    ``subruns``: where the training-based tests write the models they train beside this one
    (None: ``path/subruns``); an audit points it at its own output folder so that ``path`` is only read.
    """

    model: AttentionModel
    collate: Callable[[list[Example]], Batch]
    task: TaskSpec
    path: Path | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    info: dict[str, Any] = field(default_factory=dict)
    _data: TaskData | None = None
    subruns: Path | None = None

    @property
    def labels(self) -> list[str]:
        return self.task.labels

    @property
    def family(self) -> str:
        return self.model.config.model

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def batches(
        self, examples: list[Example], batch_size: int = 64, shuffle: bool = False, seed: int = 0
    ) -> Iterator[Batch]:
        """Padded batches on the run's device; order kept unless ``shuffle``."""
        from attnaudit.data.batching import iterate_batches

        for batch in iterate_batches(examples, self.collate, batch_size, shuffle=shuffle, seed=seed):
            yield batch.to(self.device)

    @staticmethod
    def batch_order(examples: list[Example]) -> list[int]:
        """The positions of ``examples`` in the order :meth:`sorted_batches` batches them (stable, by token count)."""
        return sorted(range(len(examples)), key=lambda i: len(examples[i].tokens))

    def sorted_batches(self, examples: list[Example], batch_size: int = 64) -> Iterator[tuple[list[int], Batch]]:
        """Batches of examples of similar length, each with its examples' positions in ``examples``.

        A stable sort by token count, so a batch pads only to a length near its own: padded
        positions cost what real ones do (a Transformer's MLP runs on each), and SST-2 batches of
        8 in dataset order carry half again as many positions as tokens. Callers key what they
        collect by position (and put instance rows back in order)."""
        order = self.batch_order(examples)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            yield chunk, next(self.batches([examples[i] for i in chunk], len(chunk)))

    def data(self, data_dir: str | Path | None = None) -> TaskData:
        """The run's task data (loaded once)."""
        if self._data is None:
            self._data = self.task.load(data_dir)
        return self._data

    def examples(
        self, split: str = "test", limit: int | None = None, data_dir: str | Path | None = None, seed: int = 0, order: str = "stratified"
    ) -> list[Example]:
        """A split's examples; with ``limit``, that many chosen by ``order`` (a sample stratified by label
        with ``seed``, or the first ones: :func:`attnaudit.data.subsets.limited`), in the split's order."""
        from attnaudit.data.subsets import limited

        return limited(self.data(data_dir).split(split), limit, seed, order)


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    """The run's ``config.json`` (atomic)."""
    return atomic_write_json(directory / CONFIG, config)


# The optional fields of a run config's ``task`` (``TaskSpec``) and their JSON types.
TASK_OPTIONAL: dict[str, JsonKinds] = {
    "data_dir": (str, type(None)), "seed": int, "dev": (str, type(None)), "test": (str, type(None)), "min_length": int,
}


def read_config(directory: Path) -> dict[str, Any]:
    """A run directory's ``config.json``, with one-line errors for files, missing folders and foreign JSON."""
    directory = Path(directory)
    if directory.is_file():
        if directory.suffix in (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle"):
            load_tensors(directory)  # a checkpoint file: refuses pickles with the right message
        raise InputError(directory, "expected a run directory (config.json + model.safetensors), got a file")
    if not directory.is_dir():
        raise InputError(directory, "run directory not found")
    path = directory / CONFIG
    if (directory / STAGE).is_dir() and not path.is_file():
        raise InputError(directory, f"its training did not finish (the unfinished run is in {STAGE}/); run the same training "
                                    "command again to resume it")
    config = read_json(path)
    if not isinstance(config, dict) or "model" not in config or "task" not in config:
        raise InputError(path, "not an attnaudit run config (needs 'model' and 'task')")
    check_fields(path, config, {"model": dict, "task": dict}, {"kind": str, "hash": str, "hf": dict})
    task = check_fields(path, config["task"], {"spec": str, "task_type": str, "labels": list}, TASK_OPTIONAL, "task")
    if not all(isinstance(label, str) for label in task["labels"]):
        raise InputError(path, "field 'task.labels' must be an array of strings")
    return config


class RunLoader(Protocol):
    """Loads the run in directory ``path`` onto ``device``, its data read from ``data_dir``."""

    def __call__(self, path: Path, device: str | None = ..., data_dir: str | Path | None = ...) -> Run: ...


# Run kind (``"kind"`` in config.json) -> its loader, or "module:function" naming it. A named
# loader is imported when a run of its kind is first loaded, so loading one kind never imports
# another's libraries (transformers takes seconds to import).
RUN_LOADERS: dict[str, RunLoader | str] = {
    "attnaudit": "attnaudit.training.checkpoint:load_attnaudit_run",
    "hf": "attnaudit.hf:load_hf_run",
    "nmt": "attnaudit.training.nmt:load_nmt_run",
}


def register_run_loader(kind: str, loader: RunLoader | str) -> None:
    """Make :func:`load_run` load runs of ``kind`` with ``loader`` (a function, or
    ``"module:function"`` imported when a run of that kind is first loaded)."""
    if not kind or not (callable(loader) or (isinstance(loader, str) and ":" in loader)):
        raise AttnAuditError(f"a run loader needs a kind and a function or 'module:function', got {kind!r}: {loader!r}")
    RUN_LOADERS[kind] = loader


def load_run(path: str | Path, device: str | None = "auto", data_dir: str | Path | None = None) -> Run:
    """Load a run directory (safetensors + JSON only) with the loader registered for its kind.

    A config without ``kind`` is an attnaudit run (the kind every ``train`` run records).
    """
    path = Path(path)
    kind = read_config(path).get("kind", "attnaudit")
    if kind not in RUN_LOADERS:
        raise InputError(path / CONFIG, f"unknown run kind {kind!r}; known kinds: {', '.join(sorted(RUN_LOADERS))}")
    loader = RUN_LOADERS[kind]
    if isinstance(loader, str):
        module, _, name = loader.partition(":")
        loader = RUN_LOADERS[kind] = getattr(import_module(module), name)
    return loader(path, device=device, data_dir=data_dir)
