"""Shared fixtures: the real-data directory (skip when absent) and CPU-only, single-thread torch."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    """One converted-model cache (:mod:`attnaudit.models.hf.gguf`) for the whole run, never the
    user's: made by the main process before xdist starts its workers, which inherit it."""
    if not hasattr(config, "workerinput"):
        os.environ["ATTNAUDIT_CACHE"] = tempfile.mkdtemp(prefix="attnaudit-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop("ATTNAUDIT_CACHE", ""), ignore_errors=True)

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """``$ATTNAUDIT_DATA`` or ``../shared/data`` next to the repo, if it exists."""
    env = os.environ.get("ATTNAUDIT_DATA")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    return path if path.is_dir() else None


@pytest.fixture
def shared_data() -> Path:
    """The real datasets; tests that use this skip cleanly when they are absent."""
    path = shared_data_dir()
    if path is None:
        pytest.skip("real datasets not found (set ATTNAUDIT_DATA or provide ../shared/data)")
    return path


@pytest.fixture(scope="session")
def tiny_transformer_run(tmp_path_factory: pytest.TempPathFactory):
    """A 2-layer, 2-head (d_model 16, d_head 8) entmax15 Transformer trained briefly on the
    synthetic classification task (~90% test accuracy); shared by the sparse-attention and
    identifiability tests (tests/experiments/test_{activation_swap,shuffle,keys,identifiability}.py).
    """
    from attnaudit.data.synthetic import synthetic_task
    from attnaudit.progress import is_quiet, set_quiet
    from attnaudit.training.trainer import train

    data = synthetic_task("classification", seed=0, n_train=600, n_dev=60, n_test=60)
    previous = is_quiet()
    set_quiet(True)
    try:
        return train(
            data, "transformer", tmp_path_factory.mktemp("tiny-transformer") / "run", epochs=3, lr=3e-3,
            d_model=16, heads=2, layers=2, embed_dim=16, d_ff=32, attention="entmax15", quiet_eval=True,
        )
    finally:
        set_quiet(previous)


# --- Tiny trained runs shared by tests/experiments/test_permutation.py and test_adversarial.py ---

TINY_RUN_OPTIONS = {
    "bilstm": ("bilstm", "classification", {"embed_dim": 16, "hidden_dim": 8}),
    "han": ("han", "han", {"embed_dim": 16, "hidden_dim": 8}),
    "transformer": ("transformer", "classification", {"embed_dim": 16, "d_model": 16, "heads": 2, "layers": 2, "d_ff": 32}),
    "pair": ("bilstm", "pair", {"embed_dim": 16, "hidden_dim": 8}),
    "transformer-pair": ("transformer", "pair", {"embed_dim": 16, "d_model": 16, "heads": 2, "layers": 2, "d_ff": 32}),
    "tagger": ("transformer", "tagging", {"embed_dim": 16, "d_model": 16, "heads": 2, "layers": 1, "d_ff": 32}),
}


def tiny_task(kind: str):
    """A small synthetic task: classification, tagging, han (documents of 6-word sentences) or pair.

    pair: the passage is a synthetic classification text, the query asks about one polarity
    (``qpositive`` / ``qnegative``), the label says whether that polarity wins.
    """
    from dataclasses import replace

    from attnaudit.data.synthetic import synthetic_task
    from attnaudit.data.types import TaskData

    data = synthetic_task("tagging" if kind == "tagging" else "classification", seed=0, n_train=160, n_dev=30, n_test=30)
    if kind in ("classification", "tagging"):
        return data

    def convert(examples):
        out = []
        for i, ex in enumerate(examples):
            if kind == "han":
                out.append(replace(ex, sentences=[ex.tokens[j : j + 6] for j in range(0, len(ex.tokens), 6)]))
            else:
                asked = "positive" if i % 2 else "negative"
                out.append(replace(ex, query=[f"q{asked}"], label="yes" if ex.label == asked else "no"))
        return out

    return TaskData(
        name=f"tiny-{kind}",
        task_type="pair" if kind == "pair" else "classification",
        train=convert(data.train),
        dev=convert(data.dev),
        test=convert(data.test),
        labels=["no", "yes"] if kind == "pair" else data.labels,
    )


@pytest.fixture(scope="session")
def tiny_attention_run(tmp_path_factory):
    """Factory ``get(name)`` -> a tiny run trained for 2 epochs (once per session); names: TINY_RUN_OPTIONS."""
    from attnaudit.training.trainer import train

    runs = {}

    def get(name: str):
        if name not in runs:
            model, kind, options = TINY_RUN_OPTIONS[name]
            runs[name] = train(
                tiny_task(kind), model, tmp_path_factory.mktemp(name), epochs=2, seed=0, quiet_eval=True, **options
            )
        return runs[name]

    return get


# --- Tiny Hugging Face BERT (built locally, never downloaded), shared by tests/test_hf.py,
# --- tests/experiments/test_{norms,rollout}.py and tests/training/test_finetune.py ---

HF_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie", "plot", "the", "was", "not",
            "very", "fun", ".", ",", "!", "a", "dog", "runs"]
HF_TEXTS = [
    ("the movie was good .", "pos"),
    ("bad plot", "neg"),
    ("the movie was not very fun !", "neg"),
    ("good", "pos"),
    ("a dog runs , the plot was good", "pos"),
    ("not good", "neg"),
    ("very fun movie !", "pos"),
    ("the plot was bad .", "neg"),
]


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory):
    """Namespace: ``dir`` (a saved 2-layer, 4-head, d=32 random BERT with a 2-label head + WordPiece
    tokenizer), ``tokenizer()``, ``config(**kw)`` (the BertConfig) and ``task(kind)`` (TaskData of 8
    short sentences, classification or pair, labels neg/pos).
    """
    from types import SimpleNamespace

    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    from attnaudit.data.types import Example, TaskData

    def tokenizer():
        return BertTokenizer(vocab={w: i for i, w in enumerate(HF_VOCAB)})

    def config(**kw):
        return BertConfig(vocab_size=len(HF_VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, **kw)

    def task(kind: str = "classification"):
        data = [Example(tokens=t.split(), label=y, meta={"source": f"tiny:{i + 1}"}) for i, (t, y) in enumerate(HF_TEXTS)]
        if kind == "pair":
            data = [Example(tokens=ex.tokens, query=["a", "dog", "runs"], label=ex.label, meta=ex.meta) for ex in data]
        return TaskData(name=f"tiny-{kind}", task_type=kind, train=data, dev=data, test=data, labels=["neg", "pos"])

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-bert")
    BertForSequenceClassification(config(num_labels=2)).save_pretrained(path, safe_serialization=True)
    tokenizer().save_pretrained(path)
    return SimpleNamespace(dir=path, tokenizer=tokenizer, config=config, task=task, vocab=HF_VOCAB)
