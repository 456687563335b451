"""A Hugging Face translation model that cannot be obtained offline ends with one ``error:`` line naming
what to pass instead, exit 2, nothing written (the hub path a user with internet runs)."""

from __future__ import annotations

from pathlib import Path

from .helpers import assert_clean_failure, cli


def test_hub_translation_model_offline(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = cli("run", "alignment", "--hf", "Helsinki-NLP/opus-mt-de-en", "--task", "synthetic-translation", "--out", out,
               "--quiet", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")})
    line = assert_clean_failure(proc, "Helsinki-NLP/opus-mt-de-en", out=out)
    assert "give a local model folder (a translation model: one from attnaudit train-nmt --arch marian)" in line
