"""The GGUF conversion cache: converted once per file, reused, keyed by the file, atomic, optional."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnaudit.models.hf import gguf as gguf_cache


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATTNAUDIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _gguf(tmp_path: Path, content: bytes = b"GGUF") -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    return path


def _convert(calls: list[Path]):
    def convert(out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    return convert


def test_root_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNAUDIT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_cache.cache_root() == tmp_path / "xdg" / "attnaudit"
    monkeypatch.setenv("ATTNAUDIT_CACHE", str(tmp_path / "mine"))
    assert gguf_cache.cache_root() == tmp_path / "mine"


def test_converted_once_then_reused(tmp_path: Path, root: Path) -> None:
    gguf, calls = _gguf(tmp_path), []
    first = gguf_cache.converted(gguf, _convert(calls))
    again = gguf_cache.converted(gguf, _convert(calls))
    assert first == again and first is not None and first.parent == root / "gguf"
    assert len(calls) == 1 and (first / "model.safetensors").read_bytes() == b"weights"
    assert [p.name for p in first.parent.iterdir() if p.is_dir()] == [first.name]  # no scratch left


def test_a_changed_file_converts_anew(tmp_path: Path, root: Path) -> None:
    gguf, calls = _gguf(tmp_path), []
    first = gguf_cache.converted(gguf, _convert(calls))
    gguf.write_bytes(b"GGUF but longer")
    second = gguf_cache.converted(gguf, _convert(calls))
    assert first != second and len(calls) == 2


def test_a_failed_conversion_leaves_nothing(tmp_path: Path, root: Path) -> None:
    gguf = _gguf(tmp_path)

    def broken(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise ValueError("not a GGUF model")

    with pytest.raises(ValueError, match="not a GGUF"):
        gguf_cache.converted(gguf, broken)
    assert not [p for p in (root / "gguf").iterdir() if p.is_dir()]
    assert gguf_cache.converted(gguf, _convert([])) is not None  # and a later load converts


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_cache_means_no_cache(tmp_path: Path, root: Path) -> None:
    root.mkdir()
    root.chmod(0o500)
    try:
        assert gguf_cache.converted(_gguf(tmp_path), _convert([])) is None
    finally:
        root.chmod(0o700)


def test_a_cache_that_is_a_file_means_no_cache(tmp_path: Path, root: Path) -> None:
    root.write_text("not a folder")
    calls: list[Path] = []
    assert gguf_cache.converted(_gguf(tmp_path), _convert(calls)) is None and calls == []
