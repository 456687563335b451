"""A run trained from pretrained word vectors (``train --vectors``): every model trained beside it from scratch (ROAR's
retrains, W&P's uniform model, the sanity test's permuted labels, ...) starts from the same vectors, as the run did.
Before, those sub-runs started from a random table while the run (and a ROAR curve's 0 % model) started from the
vectors, so a curve mixed two initialisations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.vocab import load_vectors
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.runner import run_test
from attnaudit.progress import set_quiet
from attnaudit.training import adversary, trainer
from attnaudit.training.adversary import Variant, train_variant, variant_config
from attnaudit.training.trainer import train

set_quiet(True)
pytestmark = pytest.mark.filterwarnings("ignore:.*vectors cover only")  # half the words have vectors, on purpose


class Started(Exception):
    """Raised by the patched training loop once it has seen the model it was given."""


def vectors_file(tmp_path: Path, words: list[str], dim: int = 6) -> Path:
    generator = torch.Generator().manual_seed(11)
    lines = [f"{w} " + " ".join(f"{v:.4f}" for v in torch.randn(dim, generator=generator).tolist()) for w in words]
    path = tmp_path / "vectors.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def vector_run(tmp_path: Path) -> tuple[Any, Path]:
    data = synthetic_task("classification", seed=0, n_train=40, n_dev=12, n_test=12)
    words = sorted({t for ex in data.train for t in ex.tokens})
    path = vectors_file(tmp_path, words[: len(words) // 2])  # half the words: the others' rows are drawn from the seed
    run = train(data, "bilstm", tmp_path / "run", vectors=str(path), epochs=1, hidden_dim=4, quiet_eval=True,
                preset="madsen2022-sst")
    return run, path


def start_of(monkeypatch: pytest.MonkeyPatch, module: Any, call: Any) -> dict[str, torch.Tensor]:
    """The parameters the training loop in ``module`` is handed by ``call()`` (the loop is stopped there)."""
    seen: dict[str, torch.Tensor] = {}

    def fake_fit(net: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        seen.update({k: v.detach().clone() for k, v in net.state_dict().items()})
        raise Started

    monkeypatch.setattr(module, "fit", fake_fit)
    with pytest.raises(Started):
        call()
    monkeypatch.undo()
    return seen


def test_a_sub_run_starts_exactly_as_its_vector_run_did(vector_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, path = vector_run
    data = run.data()
    base = start_of(monkeypatch, trainer, lambda: train(data, "bilstm", tmp_path / "again", vectors=str(path), epochs=1,
                                                        hidden_dim=4, quiet_eval=True, preset="madsen2022-sst"))
    sub = start_of(monkeypatch, adversary, lambda: train_variant(run, tmp_path / "sub", Variant(key={"kind": "check"})))
    assert base.keys() == sub.keys()
    for name in base:
        assert torch.equal(base[name], sub[name]), name  # the same seed and vectors: the same start, every parameter
    expected = load_vectors(path, run.collate.vocab, seed=0)
    expected[run.info["model"]["extra"]["zero_rows"]] = 0.0  # the preset's specials start at zero, as theirs
    assert torch.equal(sub["embedding.weight"], expected)

    other = start_of(monkeypatch, adversary, lambda: train_variant(run, tmp_path / "sub1", Variant(key={"kind": "check"}), seed=1))
    vocab = run.collate.vocab
    known = [vocab.stoi[w] for w in path.read_text().split() if w in vocab.stoi]
    assert torch.equal(other["embedding.weight"][known], sub["embedding.weight"][known])  # the vectors themselves
    assert not torch.equal(other["embedding.weight"], sub["embedding.weight"])  # the unknown words' rows: seed 1's draw


def test_the_start_enters_the_config_hash_only_for_vector_runs(vector_run, tmp_path: Path) -> None:
    run, _ = vector_run
    assert variant_config(run, Variant(key={"kind": "x"}), None, None)[2]["start"] == "vectors"
    plain = train(synthetic_task("classification", seed=0, n_train=40, n_dev=12, n_test=12), "bilstm", tmp_path / "plain",
                  epochs=1, hidden_dim=4, embed_dim=4, quiet_eval=True)
    assert "start" not in variant_config(plain, Variant(key={"kind": "x"}), None, None)[2]  # other runs keep their hashes
    assert "start" not in variant_config(run, Variant(key={"kind": "x"}, start=run.model), None, None)[2]


def test_roar_retrains_a_vector_run_from_its_vectors(vector_run, tmp_path: Path) -> None:
    run, path = vector_run
    result = run_test("roar", run, out=tmp_path / "roar", methods=["attention"], ratios=[50], epochs=1, plot=False)
    assert "racu_attention" in result.summary
    config = json.loads((tmp_path / "roar" / "subruns" / "roar" / "seed-0" / "attention" / "ratio-50" / "config.json").read_text())
    assert config["start"] == "vectors" and config["train"]["vectors"] == str(path)


def test_a_vector_run_whose_vectors_are_gone_says_so(vector_run, tmp_path: Path) -> None:
    run, path = vector_run
    path.unlink()
    with pytest.raises(AttnAuditError, match="not there now"):
        train_variant(run, tmp_path / "sub", Variant(key={"kind": "check"}))
    assert not (tmp_path / "sub").exists()  # refused before anything is written
