"""Checkpoints are safetensors + JSON; pickles and corrupt files are refused with one line."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from attnaudit.errors import InputError
from attnaudit.run import read_config
from attnaudit.training.checkpoint import load_optimizer, load_state_into, save_model, save_optimizer
from attnaudit.weights import load_tensors, save_tensors


def test_model_round_trip(tmp_path: Path) -> None:
    net = nn.Linear(3, 2)
    save_model(tmp_path, net)
    other = nn.Linear(3, 2)
    load_state_into(other, tmp_path / "model.safetensors")
    assert torch.equal(net.weight, other.weight)


def test_pickle_is_refused_without_unpickling(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self):  # would run on unpickling
            return (Path(tmp_path / "pwned").touch, ())

    bad = tmp_path / "model.pt"
    bad.write_bytes(pickle.dumps(Boom(), protocol=4))
    with pytest.raises(InputError, match="never unpickles"):
        load_tensors(bad)
    torch.save({"w": torch.ones(2)}, tmp_path / "torch.pt")
    with pytest.raises(InputError, match="never unpickles"):
        read_config(tmp_path / "torch.pt")
    assert not (tmp_path / "pwned").exists()


def test_truncated_checkpoint_is_one_line_error(tmp_path: Path) -> None:
    path = save_tensors(tmp_path / "m.safetensors", {"w": torch.randn(50, 50)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="corrupt or truncated"):
        load_tensors(path)


def test_short_files_are_sniffed_without_reading_past_the_end(tmp_path: Path) -> None:
    """Pickle magic with no parseable safetensors header is a pickle; anything else unparseable is corrupt."""
    path = tmp_path / "m.safetensors"
    for data, message in ((b"\x80\x04\x95", "never unpickles"), (b"", "corrupt or truncated"),
                          ((2**40).to_bytes(8, "little") + b"{}", "corrupt or truncated"),
                          (b"\x80\x04" + bytes(6) + b"[1]" + b" " * 1149, "never unpickles")):
        path.write_bytes(data)
        with pytest.raises(InputError, match=message):
            load_tensors(path)


def test_load_state_into_casts_floats_and_refuses_other_dtypes(tmp_path: Path) -> None:
    net = nn.Linear(3, 2)
    path = save_tensors(tmp_path / "m.safetensors", {"weight": net.weight.half(), "bias": net.bias.bfloat16()})
    other = nn.Linear(3, 2)
    load_state_into(other, path)
    assert other.weight.dtype == torch.float32 and torch.equal(other.weight, net.weight.half().float())
    assert torch.equal(other.bias, net.bias.bfloat16().float())
    save_tensors(path, {"weight": net.weight.to(torch.int32), "bias": net.bias})
    with pytest.raises(InputError, match=r"m\.safetensors: weight weight is stored as int32; the model needs float32"):
        load_state_into(other, path)
    save_tensors(path, {"weight": net.weight.double() * 1e300, "bias": net.bias})  # overflows float32
    with pytest.raises(InputError, match=r"weight weight holds NaN or Inf values \(cast from float64 to float32\)"):
        load_state_into(other, path)


def test_shape_mismatch_names_the_tensor(tmp_path: Path) -> None:
    save_model(tmp_path, nn.Embedding(10, 4))
    with pytest.raises(InputError, match=r"weight has shape \(10, 4\), expected \(12, 4\)"):
        load_state_into(nn.Embedding(12, 4), tmp_path / "model.safetensors")


def test_optimizer_state_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(5, 4)).sum().backward()
        opt.step()
    save_optimizer(tmp_path / "opt.safetensors", opt, {"rng": torch.get_rng_state()})
    opt2 = torch.optim.Adam(net.parameters(), lr=0.5)
    extra = load_optimizer(tmp_path / "opt.safetensors", opt2)
    assert torch.equal(extra["rng"], torch.get_rng_state())
    assert opt2.param_groups[0]["lr"] == 0.01
    for p in net.parameters():
        assert torch.equal(opt.state[p]["exp_avg"], opt2.state[p]["exp_avg"])


def test_read_config_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="run directory not found"):
        read_config(tmp_path / "nope")
    (tmp_path / "config.json").write_text('{"x": 1}')
    with pytest.raises(InputError, match="not an attnaudit run config"):
        read_config(tmp_path)
