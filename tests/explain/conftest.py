"""Tiny trained runs of every family, each with a test batch ending in a one-item instance."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train

TINY = {"epochs": 1, "embed_dim": 16, "hidden_dim": 8, "quiet_eval": True}
FAMILIES = {
    "bilstm": ("classification", "bilstm", {}),
    "cnn": ("classification", "cnn", {"cnn_filters": 4, "cnn_kernels": (1, 3, 5)}),
    "average": ("classification", "average", {}),
    "flat": ("classification", "flat", {}),
    "transformer": ("classification", "transformer", {"d_model": 16, "heads": 2, "layers": 2}),
    "han": ("han", "han", {}),
    "pair-bilstm": ("pair", "bilstm", {}),
    "pair-average": ("pair", "average", {}),
    "pair-transformer": ("pair", "transformer", {"d_model": 16, "heads": 2, "layers": 2}),
}


def tiny_task(kind: str) -> TaskData:
    """Synthetic classification; ``han`` splits it into 4-token sentences; ``pair`` asks a question.

    The pair task asks "is it positive/negative" about the synthetic text and answers yes/no.
    """
    base = synthetic_task("classification", seed=0, n_train=150, n_dev=30, n_test=30)
    if kind == "classification":
        return base

    def convert(ex: Example, index: int) -> Example:
        if kind == "han":
            return replace(ex, sentences=[ex.tokens[i : i + 4] for i in range(0, len(ex.tokens), 4)])
        asked = "positive" if index % 2 else "negative"
        return replace(ex, query=["is", "it", asked], label="yes" if ex.label == asked else "no")

    splits = {name: [convert(ex, i) for i, ex in enumerate(base.split(name))] for name in ("train", "dev", "test")}
    if kind == "han":
        return replace(base, name="tiny-han", **splits)
    return replace(base, name="tiny-pair", task_type="pair", labels=["no", "yes"], **splits)


def short_example(kind: str) -> Example:
    """A one-item instance: one token (one sentence for HAN), so LOO is NaN and ranks are empty."""
    if kind == "han":
        return Example(tokens=["pos0", "w001"], label="positive", sentences=[["pos0", "w001"]])
    if kind == "pair":
        return Example(tokens=["pos0"], label="yes", query=["is", "it", "positive"])
    return Example(tokens=["pos0"], label="positive")


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Run, Batch]]:
    """One tiny trained run per family and a test batch whose last instance has one item."""
    set_quiet(True)
    root = tmp_path_factory.mktemp("explain-runs")
    out = {}
    for name, (kind, model, options) in FAMILIES.items():
        task = tiny_task(kind)
        run = train(task, model, root / name, **TINY, **options)
        examples = [*task.test[:6], short_example(kind)]
        out[name] = (run, run.collate(examples))
    return out


@pytest.fixture(scope="session")
def bert(tiny_hf) -> tuple[Run, Batch]:
    """The tiny random 2-layer BERT classifier of ``tiny_hf`` (post-LN, [CLS] explains) and a padded batch."""
    from attnaudit.hf import load_hf

    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    run.model.eval()
    return run, run.collate(tiny_hf.task().test[:5])


@pytest.fixture(params=["transformer", "bert"])
def encoder(request: pytest.FixtureRequest, runs: dict, bert: tuple[Run, Batch]) -> tuple[Run, Batch]:
    """Our trained mean-pooled Transformer and the tiny BERT, each with a padded batch."""
    run, batch = runs["transformer"] if request.param == "transformer" else bert
    run.model.eval()
    return run, batch
