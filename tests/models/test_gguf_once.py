"""A GGUF file is de-quantised once per process: later loads get an independent deep copy.

A counting stand-in for transformers' loader (``from_pretrained`` builds a small module) and a
placeholder ``.gguf`` file check what the cache is keyed by (file, size, modification time,
options) and that a copy handed out can be changed without touching the next one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnaudit.models import hf_decoder


class Loader:
    """``from_pretrained`` counts its calls and builds a Linear whose weight records the options."""

    calls = 0

    @classmethod
    def from_pretrained(cls, folder: str, gguf_file: str, **kwargs: object) -> torch.nn.Module:
        cls.calls += 1
        torch.manual_seed(cls.calls)
        return torch.nn.Linear(3, 2)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_decoder, "_GGUF_LOADED", {})
    Loader.calls = 0


def test_second_load_is_a_copy_of_the_first(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF....")
    first = hf_decoder._load(Loader, str(tmp_path), {"gguf_file": "m.gguf"}, dtype=torch.float32)
    with torch.no_grad():
        first.weight.add_(1.0)  # a caller changing its model (fine-tuning) ...
    second = hf_decoder._load(Loader, str(tmp_path), {"gguf_file": "m.gguf"}, dtype=torch.float32)
    assert Loader.calls == 1
    assert second is not first and not torch.equal(second.weight, first.weight)  # ... does not change the next load
    torch.testing.assert_close(second.weight + 1.0, first.weight)


def test_other_options_or_a_changed_file_load_again(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF....")
    hf_decoder._load(Loader, str(tmp_path), {"gguf_file": "m.gguf"}, dtype=torch.float32)
    hf_decoder._load(Loader, str(tmp_path), {"gguf_file": "m.gguf"}, dtype=torch.bfloat16)
    assert Loader.calls == 2
    path.write_bytes(b"GGUF......")
    os.utime(path, ns=(1, 1))
    hf_decoder._load(Loader, str(tmp_path), {"gguf_file": "m.gguf"}, dtype=torch.float32)
    assert Loader.calls == 3
    assert len(hf_decoder._GGUF_LOADED) == hf_decoder.GGUF_KEEP  # the oldest was let go
