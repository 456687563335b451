"""Inputs that were once accepted silently (and gave a confident, meaningless answer) are now refused in one
line, or warned about: a model folder without a tokenizer, a vocabulary emptied by ``--min-freq``, a ``--task``
a run directory ignores, a text whose every word is unknown, fractional labels, a symbolic-link loop, and a
quote left open (named at the line it opened on)."""

from __future__ import annotations

from pathlib import Path

from attnaudit.architectures import save_tiny
from attnaudit.run import Run

from .helpers import TINY_TRAIN, assert_clean_failure, cli, warnings_of


def test_a_model_folder_without_a_tokenizer(tmp_path: Path) -> None:
    folder = save_tiny("bert", tmp_path / "bert")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    line = assert_clean_failure(cli("explain", "--hf", folder, "--text", "a film"), str(folder))
    assert "holds no tokenizer" in line


def test_a_vocabulary_emptied_by_min_freq(tmp_path: Path) -> None:
    line = assert_clean_failure(cli("train", "--task", "synthetic", *TINY_TRAIN, "--out", tmp_path / "run", "--min-freq", "100000"),
                                "--min-freq 100000", out=tmp_path / "run")
    assert "leaves no word in the vocabulary" in line and not (tmp_path / "run").exists()


def test_a_task_given_with_a_run_directory(trained: Run, tmp_path: Path) -> None:
    line = assert_clean_failure(cli("run", "importance", trained.path, "--task", "sst", "--out", tmp_path / "out"), "--task",
                                out=tmp_path / "out")
    assert "a run directory tests the task it was trained on" in line


def test_a_text_of_unknown_words(trained: Run) -> None:
    line = assert_clean_failure(cli("explain", "--run", trained.path, "--text", "zzq yyq xxq"), "--text")
    assert "none of the words" in line


def test_fractional_labels_are_classes_with_a_warning(tmp_path: Path) -> None:
    data = tmp_path / "scores.csv"
    data.write_text("text,label\n" + "a good film,0.5\na bad plot,1.7\nfine acting,2.25\n" * 4, encoding="utf-8")
    done = cli("train", "--task", f"csv:{data}", *TINY_TRAIN, "--out", tmp_path / "run")
    assert done.returncode == 0, done.stderr
    assert any("are fractional numbers; each distinct value is read as a class" in line for line in warnings_of(done))


def test_a_symbolic_link_loop_and_an_open_quote(tmp_path: Path) -> None:
    loop_a, loop_b = tmp_path / "a.csv", tmp_path / "b.csv"
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    line = assert_clean_failure(cli("train", "--task", f"csv:{loop_a}", *TINY_TRAIN, "--out", tmp_path / "r1"), str(loop_a))
    assert "symbolic link that leads nowhere (or in a loop)" in line
    quoted = tmp_path / "quote.csv"
    quoted.write_text('text,label\na good film,pos\n"a bad plot,neg\nfine acting,pos\nok,neg\n', encoding="utf-8")
    line = assert_clean_failure(cli("train", "--task", f"csv:{quoted}", *TINY_TRAIN, "--out", tmp_path / "r2"), str(quoted), line=3)
    assert "a quote opened in this row is never closed" in line
