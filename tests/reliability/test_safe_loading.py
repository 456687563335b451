"""Run directories are only read with safetensors and JSON: damaged or foreign files fail cleanly,
and a pickle is refused without ever being unpickled.

The pickles here are live: their ``__reduce__`` makes unpickling create a marker file (checked
once with ``pickle.loads`` itself), so a marker left behind by the CLI would prove it unpickled.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from attnaudit.errors import InputError
from attnaudit.progress import set_quiet
from attnaudit.run import Run, load_run
from attnaudit.training.checkpoint import load_optimizer, load_tensors
from attnaudit.training.trainer import train

from .helpers import assert_clean_failure, cli, synthetic_rows, write_table

set_quiet(True)


class Payload:
    """Unpickling this creates ``marker`` (via the builtin ``open``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def _pickle(marker: Path, protocol: int | str) -> bytes:
    """The payload as a plain pickle of the given protocol, or as ``torch.save`` output ("torch")."""
    if protocol == "torch":
        buffer = io.BytesIO()
        torch.save({"weight": Payload(marker)}, buffer)
        return buffer.getvalue()
    return pickle.dumps(Payload(marker), protocol=int(protocol))


PROTOCOLS = [0, 2, 4, 5, "torch"]


def test_the_payloads_are_live(tmp_path: Path) -> None:
    for protocol in PROTOCOLS:
        marker = tmp_path / f"live-{protocol}"
        data = _pickle(marker, protocol)
        if protocol == "torch":
            torch.load(io.BytesIO(data), weights_only=False)
        else:
            pickle.loads(data)
        assert marker.exists(), protocol


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_loaders_refuse_pickles_without_unpickling(protocol: int | str, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    path = tmp_path / "weights.safetensors"
    path.write_bytes(_pickle(marker, protocol))
    for load in (load_tensors, lambda p: load_optimizer(p, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))):
        with pytest.raises(InputError, match=str(path)):
            load(path)
    assert not marker.exists()


@pytest.mark.parametrize(("target", "protocol"), [("model.safetensors", 4), ("model.safetensors", 0), ("model.safetensors", "torch"), ("vocab.json", 4)])
def test_cli_refuses_a_pickle_inside_a_run(target: str, protocol: int | str, run_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    (run_copy / target).write_bytes(_pickle(marker, protocol))
    out = tmp_path / "out"
    assert_clean_failure(cli("run", "importance", run_copy, "--out", out, "--quiet"), str(run_copy / target), out=out)
    assert not marker.exists()


def test_cli_refuses_a_pickle_given_as_the_run(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    (tmp_path / "model.pt").write_bytes(_pickle(marker, "torch"))
    error = assert_clean_failure(cli("evaluate", tmp_path / "model.pt", "--quiet"), str(tmp_path / "model.pt"))
    assert "pickle" in error and "never unpickles" in error
    assert not marker.exists()
    with pytest.raises(InputError, match="pickle"):
        load_run(tmp_path / "model.pt")
    assert not marker.exists()


# --------------------------------------------------------------------------- damaged or foreign files


def test_truncated_checkpoint(run_copy: Path, tmp_path: Path) -> None:
    weights = run_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "out"
    error = assert_clean_failure(cli("run", "importance", run_copy, "--out", out, "--quiet"), str(weights), out=out)
    assert "corrupt or truncated" in error


def test_garbage_checkpoint(run_copy: Path, tmp_path: Path) -> None:
    (run_copy / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    out = tmp_path / "out"
    assert_clean_failure(cli("run", "importance", run_copy, "--out", out, "--quiet"), str(run_copy / "model.safetensors"), out=out)


def test_vocabulary_that_does_not_match_the_checkpoint(run_copy: Path, tmp_path: Path) -> None:
    vocab = json.loads((run_copy / "vocab.json").read_text())
    vocab["tokens"] = [*vocab["tokens"], "one", "more"]
    (run_copy / "vocab.json").write_text(json.dumps(vocab))
    out = tmp_path / "out"
    error = assert_clean_failure(cli("run", "importance", run_copy, "--out", out, "--quiet"), str(run_copy / "vocab.json"), out=out)
    assert "vocabulary has" in error


def test_weights_of_another_model(trained: Run, run_copy: Path, tmp_path: Path) -> None:
    """Weights from a run with a larger vocabulary: a shape mismatch named on the weights file."""
    rows = synthetic_rows(40, seed=3)
    write_table(tmp_path / "other.csv", [(text + " extra words", label) for text, label in rows])
    other = train(f"csv:{tmp_path / 'other.csv'}", "bilstm", tmp_path / "other", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    assert other.path is not None and other.config.vocab_size != trained.config.vocab_size
    shutil.copy(other.path / "model.safetensors", run_copy / "model.safetensors")
    out = tmp_path / "out"
    error = assert_clean_failure(
        cli("run", "importance", run_copy, "--out", out, "--quiet"), str(run_copy / "model.safetensors"), out=out
    )
    assert "does not match" in error
