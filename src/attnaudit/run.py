"""A trained model together with everything needed to feed it: the unit experiments take.

A :class:`Run` is loaded from a run directory (``load_run``) or returned by ``train``; Hugging
Face models get a ``Run`` from their adapter. Experiments only use ``run.model`` (the
:class:`AttentionModel` interface), ``run.batches`` and ``run.examples``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.models.base import AttentionModel, ModelConfig


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

    def load(self, data_dir: str | Path | None = None) -> TaskData:
        from attnaudit.data.tasks import load_task

        return load_task(
            self.spec, data_dir=data_dir or self.data_dir, seed=self.seed, dev=self.dev, test=self.test
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    def data(self, data_dir: str | Path | None = None) -> TaskData:
        """The run's task data (loaded once)."""
        if self._data is None:
            self._data = self.task.load(data_dir)
        return self._data

    def examples(self, split: str = "test", limit: int | None = None, data_dir: str | Path | None = None) -> list[Example]:
        """The first ``limit`` examples of a split (deterministic order)."""
        if limit is not None and limit < 1:
            raise AttnAuditError(f"--limit must be at least 1, got {limit}")
        items = self.data(data_dir).split(split)
        return items[:limit] if limit else items


def load_run(path: str | Path, device: str | None = "auto", data_dir: str | Path | None = None) -> Run:
    """Load a run directory written by ``train`` (safetensors + JSON only)."""
    from attnaudit.data.batching import Collator
    from attnaudit.data.vocab import Vocab
    from attnaudit.errors import InputError
    from attnaudit.models import build_model
    from attnaudit.seed import resolve_device
    from attnaudit.training.checkpoint import FEATURE_VOCAB, VOCAB, WEIGHTS, load_state_into, read_config

    path = Path(path)
    raw = read_config(path)
    if raw.get("kind") == "hf":
        from attnaudit.models.hf import load_hf_run

        return load_hf_run(path, device=device, data_dir=data_dir)
    if raw.get("kind") == "nmt":
        from attnaudit.models.seq2seq import load_nmt_run

        return load_nmt_run(path, device=device, data_dir=data_dir)
    try:
        config = ModelConfig.from_dict(raw["model"])
        task = TaskSpec(**raw["task"])
        model = build_model(config)
    except (TypeError, ValueError, AttributeError, AttnAuditError) as exc:
        # a config that parses but cannot build a model: bad types, sizes or names
        raise InputError(path / "config.json", f"malformed run config: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    vocab = Vocab.load(path / VOCAB)
    if len(vocab) != config.vocab_size:
        raise InputError(path / VOCAB, f"vocabulary has {len(vocab)} entries but the model expects {config.vocab_size}")
    feature_vocab = Vocab.load(path / FEATURE_VOCAB) if (path / FEATURE_VOCAB).exists() else None
    load_state_into(model, path / WEIGHTS)
    dev = resolve_device(device)
    model.to(dev).eval()
    collate = Collator(
        vocab,
        task.labels,
        task.task_type,  # type: ignore[arg-type]
        hierarchical=config.model == "han",
        max_len=config.max_len,
        feature_vocab=feature_vocab,
    )
    if data_dir is not None:
        task.data_dir = str(data_dir)
    return Run(model=model, collate=collate, task=task, path=path, device=dev, info=raw)
