"""Hugging Face folders of the families that once ended in tracebacks (DeBERTa, DeBERTa-v2, MPNet: ``KeyError: 0``;
a T5 config without ``decoder_start_token_id``: ``AttributeError``) now run; a folder attnaudit cannot run (a
vision model, an empty folder) is one ``error:`` line naming it, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnaudit.architectures import save_tiny

from .helpers import assert_clean_failure, cli

REVIEWS = "text,label\n" + "the film was very good,pos\nthe plot was dull,neg\ngreat acting !,pos\ni hated it,neg\n" * 4


@pytest.mark.parametrize("family", ["deberta", "deberta-v2", "mpnet"])
def test_encoders_outside_the_attention_interface_run_every_command(family: str, tmp_path: Path) -> None:
    folder = save_tiny(family, tmp_path / family)
    data = tmp_path / "reviews.csv"
    data.write_text(REVIEWS, encoding="utf-8")
    for args in (
        ("explain", "--hf", folder, "--text", "the film was good", "--out", tmp_path / "explained"),
        ("tests", "--hf", folder),
        ("finetune", "--hf", folder, "--task", f"csv:{data}", "--epochs", "1", "--batch-size", "4", "--out", tmp_path / "tuned", "--quiet"),
        ("audit", "--run", tmp_path / "tuned", "--only", "importance,permutation", "--limit", "4", "--no-figures", "--explore", "0",
         "--out", tmp_path / "audit", "--quiet"),
    ):
        done = cli(*args)
        assert done.returncode == 0, (args[0], done.stderr[-1500:])
        assert "Traceback" not in done.stdout + done.stderr


def test_t5_without_a_decoder_start_token_runs(tmp_path: Path) -> None:
    """The decoder starts from the pad token then, as T5's released checkpoints do."""
    folder = save_tiny("t5", tmp_path / "t5")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.pop("decoder_start_token_id", None)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    done = cli("tests", "--hf", folder)
    runs = next(line for line in done.stdout.splitlines() if line.startswith("runs ("))
    assert done.returncode == 0 and "alignment" in runs.split(": ", 1)[1].split(", "), done.stderr[-1500:]


def test_a_model_that_is_no_text_transformer_is_one_line(tmp_path: Path) -> None:
    from transformers import ViTConfig, ViTModel

    folder = tmp_path / "vit"
    vit = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=16)
    ViTModel(vit).save_pretrained(folder)
    bert = save_tiny("bert", tmp_path / "bert")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bert / name, folder / name)
    line = assert_clean_failure(cli("explain", "--hf", folder, "--text", "the film", "--out", tmp_path / "out"), str(folder), out=tmp_path / "out")
    assert "vit" in line and "not a text transformer" in line


def test_an_empty_folder_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    line = assert_clean_failure(cli("explain", "--hf", folder, "--text", "the film", "--out", tmp_path / "out"), str(folder), out=tmp_path / "out")
    assert "config.json" in line
