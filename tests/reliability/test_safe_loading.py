"""Run directories are only read with safetensors and JSON: damaged or foreign files fail cleanly,
and a pickle is refused without ever being unpickled.

The pickles here are live: their ``__reduce__`` makes unpickling create a marker file (checked
once with ``pickle.loads`` itself), so a marker left behind by the CLI would prove it unpickled.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import hypothesis
import hypothesis.strategies as st
import pytest
import safetensors.torch
import torch

from attnaudit.errors import InputError
from attnaudit.progress import set_quiet
from attnaudit.run import Run, load_run
from attnaudit.training.checkpoint import load_optimizer, load_state_into, save_model, save_optimizer
from attnaudit.training.trainer import train
from attnaudit.weights import load_tensors

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


@pytest.mark.parametrize(
    ("target", "protocol"), [("model.safetensors", 4), ("model.safetensors", 0), ("model.safetensors", "torch"), ("vocab.json", 4)]
)
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


# --------------------------------------------------------------------------- safetensors that start like a pickle


def _with_header_length(tensors: dict[str, torch.Tensor], length: int) -> bytes:
    """A safetensors file of ``tensors`` whose JSON header is exactly ``length`` bytes (metadata padding)."""
    raw = safetensors.torch.save(tensors)
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    header["__metadata__"] = {"pad": ""}
    base = len(json.dumps(header, separators=(",", ":")))
    assert base <= length
    header["__metadata__"]["pad"] = "x" * (length - base)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) == length
    return length.to_bytes(8, "little") + text + raw[8 + size :]


@hypothesis.example(second=4, third=0)  # 1152 bytes: the CNN run of issue 16
@hypothesis.given(second=st.integers(2, 5), third=st.integers(0, 2))
@hypothesis.settings(max_examples=12, deadline=None)
def test_header_length_that_starts_like_pickle_magic_loads(second: int, third: int) -> None:
    """A header length whose low byte is 0x80 and second byte 2-5 starts the file with pickle
    protocol 2-5's magic (``\\x80\\x02``..``\\x80\\x05``); the file is still a valid safetensors."""
    length = 0x80 + (second << 8) + (third << 16)
    tensors = {"weight": torch.randn(3, 4), "bias": torch.arange(4, dtype=torch.float32)}
    data = _with_header_length(tensors, length)
    assert data[:2] == bytes([0x80, second])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        path.write_bytes(data)
        loaded = load_tensors(path)
        assert loaded.keys() == tensors.keys() and all(torch.equal(loaded[k], v) for k, v in tensors.items())
        path.write_bytes(data[: len(data) - 8])  # truncated data, intact header: corrupt, not "a pickle"
        with pytest.raises(InputError, match="corrupt or truncated"):
            load_tensors(path)


def test_cli_trains_and_loads_a_cnn_whose_header_starts_like_a_pickle(tmp_path: Path) -> None:
    """Issue 16: this run's header is 1152 bytes (``\\x80\\x04``); training used to fail on reload."""
    out = tmp_path / "X"
    proc = cli("train", "--task", "synthetic", "--model", "cnn", "--embed-dim", "16", "--max-vocab", "100",
               "--epochs", "1", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.safetensors").read_bytes()[:2] == b"\x80\x04"
    run = load_run(out, device="cpu")
    assert run.family == "cnn" and (out / "metrics.json").exists()
    saved = load_tensors(out / "model.safetensors")
    assert all(torch.equal(saved[k], v) for k, v in run.model.state_dict().items())


# --------------------------------------------------------------------------- weight dtypes and values


def _rewrite(path: Path, change: Callable[[str, torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rewrite a safetensors file with ``change(key, tensor)`` applied; return the original tensors."""
    original = safetensors.torch.load_file(str(path))
    safetensors.torch.save_file({k: change(k, v) for k, v in original.items()}, str(path))
    return original


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_half_precision_checkpoint_loads(dtype: torch.dtype, run_copy: Path) -> None:
    original = _rewrite(run_copy / "model.safetensors", lambda _, v: v.to(dtype))
    run = load_run(run_copy, device="cpu")
    for key, value in run.model.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, original[key].to(dtype).to(torch.float32)), key


def _first_key(path: Path) -> str:
    return sorted(safetensors.torch.load_file(str(path)))[0]


BAD_WEIGHTS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "int": (lambda v: v.round().to(torch.int64), "stored as int64"),
    "bool": (lambda v: v > 0, "stored as bool"),
    "nan": (lambda v: v.clone().index_fill_(0, torch.tensor([0]), float("nan")), "NaN or Inf"),
    "inf": (lambda v: v.clone().index_fill_(0, torch.tensor([0]), float("-inf")), "NaN or Inf"),
    "half-nan": (lambda v: v.half().index_fill_(0, torch.tensor([0]), float("nan")), "NaN or Inf"),
}


@pytest.mark.parametrize("kind", list(BAD_WEIGHTS))
def test_cli_refuses_weights_that_would_load_silently_wrong(kind: str, run_copy: Path) -> None:
    weights = run_copy / "model.safetensors"
    key = _first_key(weights)
    damage, message = BAD_WEIGHTS[kind]
    _rewrite(weights, lambda k, v: damage(v) if k == key else v)
    error = assert_clean_failure(cli("evaluate", run_copy, "--quiet"), str(weights))
    assert f"weight {key} " in error and message in error, error


def test_resume_refuses_nan_weights_but_optimizer_state_keeps_its_int_tensors(tmp_path: Path) -> None:
    """The rule is for model weights: optimizer/RNG checkpoints legitimately hold uint8/int tensors."""
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    save_optimizer(tmp_path / "optimizer.safetensors", optimizer, {"rng": torch.get_rng_state()})
    assert load_optimizer(tmp_path / "optimizer.safetensors", optimizer)["rng"].dtype == torch.uint8
    save_model(tmp_path, net)
    _rewrite(tmp_path / "model.safetensors", lambda k, v: v * float("nan") if k == "bias" else v)
    with pytest.raises(InputError, match=r"model\.safetensors: weight bias holds NaN or Inf"):
        load_state_into(torch.nn.Linear(3, 2), tmp_path / "model.safetensors")


def _hf_copy(
    tiny_hf: SimpleNamespace, folder: Path, change: Callable[[str, torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A copy of the tiny BERT with its checkpoint rewritten by ``change``; the original tensors."""
    shutil.copytree(tiny_hf.dir, folder)
    original = safetensors.torch.load_file(str(folder / "model.safetensors"))
    safetensors.torch.save_file({k: change(k, v) for k, v in original.items()}, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    return original


def test_hugging_face_half_precision_loads_as_float32(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    from attnaudit.hf import load_hf

    original = _hf_copy(tiny_hf, tmp_path / "bert", lambda _, v: v.to(torch.bfloat16) if v.is_floating_point() else v)
    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    (tmp_path / "bert" / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))  # as a bf16 release says
    params = dict(load_hf(tmp_path / "bert", device="cpu").model.hf.named_parameters())
    key = "bert.embeddings.word_embeddings.weight"
    assert {p.dtype for p in params.values()} == {torch.float32}
    assert torch.equal(params[key], original[key].to(torch.bfloat16).float())


@pytest.mark.parametrize("kind", ["int", "nan"])
def test_hugging_face_bad_weights_are_refused(kind: str, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    from attnaudit.hf import load_hf

    key = "bert.embeddings.LayerNorm.weight"
    damage, message = BAD_WEIGHTS[kind]
    _hf_copy(tiny_hf, tmp_path / "bert", lambda k, v: damage(v) if k == key else v)
    with pytest.raises(InputError, match=rf"bert/model\.safetensors: weight {key} .*{message}"):
        load_hf(tmp_path / "bert", device="cpu")


HF_BROKEN = {
    "truncated header": lambda data, marker: data[:500],
    "truncated data": lambda data, marker: data[: len(data) - 1000],
    "pickle in disguise": lambda data, marker: _pickle(marker, 4),
}


@pytest.mark.parametrize("kind", list(HF_BROKEN))
def test_cli_refuses_a_broken_hugging_face_weights_file_in_one_line(kind: str, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    folder, marker = tmp_path / "bert", tmp_path / "unpickled"
    shutil.copytree(tiny_hf.dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(HF_BROKEN[kind](weights.read_bytes(), marker))
    before = weights.read_bytes()
    proc = cli("explain", "--hf", folder, "--text", "good movie", "--method", "attention", "--out", tmp_path / "out")
    line = assert_clean_failure(proc, "model.safetensors", out=tmp_path / "out")
    assert ("pickle" in line) == (kind == "pickle in disguise") and not marker.exists() and weights.read_bytes() == before


@pytest.mark.parametrize("given", ["../../..", "/", "model/../.."])
def test_a_run_config_leading_outside_the_run_is_refused(given: str, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    from attnaudit.hf import load_hf, save_hf_run

    run = tmp_path / "run"
    save_hf_run(load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu"), run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "hf": {**config["hf"], "dir": given}}))
    proc = cli("explain", "--run", run, "--text", "good movie", "--method", "attention")
    line = assert_clean_failure(proc, "config.json")
    assert f"hf.dir {given!r} leads outside the run folder" in line


# --------------------------------------------------------------------------- file modes


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)], ids=["umask022", "umask077"])
def test_written_files_follow_the_umask(umask: int, mode: int, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    """safetensors' ``save_file`` writes its own 0600 file; every result must still get ``0o666 & ~umask``."""
    from attnaudit.experiments.experiment import Result
    from attnaudit.hf import load_hf, save_hf_run

    write_table(tmp_path / "train.csv", synthetic_rows(40))
    previous = os.umask(umask)
    try:
        run = train(f"csv:{tmp_path / 'train.csv'}", "bilstm", tmp_path / "run", epochs=1, embed_dim=8, hidden_dim=8,
                    quiet_eval=True)
        result = Result(test="demo", summary={"n": 1}, instances=[{"i": 0}]).save(tmp_path / "results")
        hf_run = save_hf_run(load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu"), tmp_path / "hf-run")
    finally:
        os.umask(previous)
    assert run.path is not None
    files = [run.path / "model.safetensors", run.path / "config.json", run.path / "metrics.json", result,
             result.with_suffix(".csv"), hf_run / "config.json", hf_run / "hf" / "model.safetensors"]
    assert {str(f): oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {str(f): oct(mode) for f in files}
