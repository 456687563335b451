"""Usage mistakes (unknown commands and options, bad values, unusable output paths) end with one
``error:`` line and exit 2, before any work is done and without leaving files behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from .helpers import TINY_TRAIN, assert_clean_failure, cli, written

USAGE_CASES = {
    "unknown command": (["frobnicate"], "No such command"),
    "unknown test": (["run", "nosuchtest", "x"], "No such command 'nosuchtest'"),
    "unknown option": (["train", "--bogus"], "No such option: --bogus"),
    "missing option": (["train", "--task", "synthetic"], "Missing option '--model'"),
    "not an integer": (["run", "importance", "x", "--limit", "abc"], "--limit"),
}


@pytest.mark.parametrize("case", list(USAGE_CASES))
def test_usage_errors_are_one_line(case: str) -> None:
    args, expected = USAGE_CASES[case]
    assert_clean_failure(cli(*args), expected)


TRAIN_OPTION_CASES = {
    "batch size 0": (["--batch-size", "0"], "--batch-size must be at least 1"),
    "no epochs": (["--epochs", "0"], "--epochs must be at least 1"),
    "patience 0": (["--patience", "0"], "--patience must be at least 1"),
    "negative learning rate": (["--lr", "-1"], "--lr must be in (0, 1]"),
    "huge learning rate": (["--lr", "1e30"], "--lr must be in (0, 1]"),
    "word dropout above 1": (["--word-dropout", "1.5"], "--word-dropout must be in [0, 1)"),
    "negative max vocab": (["--max-vocab", "-3"], "--max-vocab must be at least 1"),
    "zero hidden size": (["--hidden-dim", "0"], "--hidden-dim must be a positive integer"),
    "unknown preset": (["--preset", "nope"], "unknown preset 'nope'; choose jain-wallace"),
    "unknown optimiser": (["--optimizer", "lion"], "unknown optimiser 'lion'"),
    "unknown selection score": (["--select", "dev-bleu"], "--select must be one of"),
    "clip not a number": (["--clip", "tight"], "--clip: expected float or none, got 'tight'"),
    "patience not a number": (["--patience", "forever"], "--patience: expected int or none, got 'forever'"),
    "unknown loss": (["--loss", "max"], "--loss must be mean or sum"),
    "min epoch past the last": (["--min-epoch", "2"], "--min-epoch must be in 1..1"),
    "dropout 1": (["--dropout", "1"], "--dropout must be in [0, 1)"),
    "empty no-decay list": (["--no-decay", ","], "--no-decay: empty list"),
    "negative min length": (["--min-length", "-1"], "--min-length must be a whole number of tokens >= 0"),
    "min length keeps nothing": (["--min-length", "1000"], "--min-length 1000 leaves no training examples"),
    "wrap on a transformer": (["--model", "transformer", "--wrap"], "--wrap applies to the bilstm"),
}


@pytest.mark.parametrize("case", list(TRAIN_OPTION_CASES))
def test_bad_training_options_fail_before_anything_is_written(case: str, tmp_path: Path) -> None:
    args, expected = TRAIN_OPTION_CASES[case]
    out = tmp_path / "out"
    error = assert_clean_failure(cli("train", "--task", "synthetic", "--out", out, *TINY_TRAIN, *args), expected)
    assert not out.exists(), error


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "tpu", "cuda:abc"])
def test_unusable_device_is_one_line(device: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert_clean_failure(cli("train", "--task", "synthetic", "--out", out, "--device", device, *TINY_TRAIN), "--device")
    assert written(out) == []


def test_output_path_that_is_a_file(run_copy: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "taken.txt"
    blocker.write_text("keep me")
    assert_clean_failure(cli("train", "--task", "synthetic", "--out", blocker, *TINY_TRAIN), str(blocker))
    assert_clean_failure(cli("run", "importance", run_copy, "--out", blocker, "--quiet"), str(blocker))
    assert_clean_failure(cli("audit", "--run", run_copy, "--out", blocker, "--quiet"), str(blocker))
    assert blocker.read_text() == "keep me"


def test_run_path_that_is_a_text_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    error = assert_clean_failure(cli("run", "importance", text, "--quiet"), str(text))
    assert "expected a run directory" in error


def test_audit_checks_limit_and_split_before_running_tests(run_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    assert_clean_failure(cli("audit", "--run", run_copy, "--out", out, "--limit", "-1", "--quiet"), "--limit", out=out)
    assert_clean_failure(cli("audit", "--run", run_copy, "--out", out, "--split", "bogus", "--quiet"), "unknown split", out=out)
    assert_clean_failure(cli("audit", "--run", run_copy, "--out", out, "--heatmaps", "-1", "--quiet"), "--heatmaps", out=out)


def test_non_finite_lambda_is_refused_before_training(tmp_path: Path) -> None:
    from attnaudit.errors import AttnAuditError
    from attnaudit.training.attention_adversaries import check_lambdas

    check_lambdas([0.0, 0.5, 3])
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(AttnAuditError, match="finite and non-negative"):
            check_lambdas([0.2, bad])


def test_training_over_a_run_with_results_is_refused(run_copy: Path) -> None:
    (run_copy / "results").mkdir()
    (run_copy / "results" / "importance.json").write_text("{}")
    before = sorted(p.name for p in run_copy.iterdir())
    error = assert_clean_failure(cli("train", "--task", "synthetic", "--model", "cnn", "--out", run_copy, "--epochs", "1",
                                     "--quiet"), str(run_copy))
    assert "different config" in error and sorted(p.name for p in run_copy.iterdir()) == before


def test_config_that_parses_but_cannot_build_a_model(run_copy: Path) -> None:
    config = json.loads((run_copy / "config.json").read_text())
    for field, value in (("hidden_dim", "big"), ("hidden_dim", -5), ("model", "gpt9")):
        damaged = {**config, "model": {**config["model"], field: value}}
        (run_copy / "config.json").write_text(json.dumps(damaged))
        error = assert_clean_failure(cli("evaluate", run_copy), str(run_copy / "config.json"))
        assert "malformed run config" in error


def test_corrupt_result_is_named_by_report(run_copy: Path, tmp_path: Path) -> None:
    folder = tmp_path / "results-only"
    folder.mkdir()
    (folder / "importance.json").write_text("{broken")
    error = assert_clean_failure(cli("report", folder), str(folder))
    assert "importance.json" in error
    (folder / "importance.json").write_text(json.dumps({"test": "importance", "summary": "oops"}))
    error = assert_clean_failure(cli("report", folder), str(folder))
    assert "not an attnaudit result file" in error
    assert_clean_failure(cli("report", tmp_path / "nowhere"), "not found")


def test_run_trained_elsewhere_finds_its_files(trained_copy_elsewhere: Path, tmp_path: Path) -> None:
    proc = cli("evaluate", trained_copy_elsewhere.resolve(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def trained_copy_elsewhere(tmp_path: Path) -> Path:
    """A run trained with relative data paths from its own folder (then used from another)."""
    from .helpers import synthetic_rows, write_table

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    rows = synthetic_rows(60)
    write_table(home / "data" / "train.csv", rows[:50])
    write_table(home / "data" / "test.csv", rows[50:])
    proc = cli("train", "--task", "csv:data/train.csv", "--test", "csv:data/test.csv", "--out", "run", *TINY_TRAIN, cwd=home)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((home / "run" / "config.json").read_text())
    assert os.path.isabs(config["task"]["spec"].partition(":")[2]) and os.path.isabs(config["task"]["test"].partition(":")[2])
    return home / "run"


SEED_CASES = {
    "negative seed to train": ["train", "--task", "synthetic", "--seed", "-1", *TINY_TRAIN],
    "seed past 2^32-1 to a test": ["run", "importance", "RUN", "--seed", "4294967296"],
    "seed past 2^32-1 to an audit": ["audit", "--run", "RUN", "--seed", "99999999999"],
}


@pytest.mark.parametrize("case", list(SEED_CASES))
def test_seed_outside_the_range_every_generator_takes(case: str, run_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [str(run_copy) if a == "RUN" else a for a in SEED_CASES[case]]
    assert_clean_failure(cli(*args, "--out", out), "--seed")
    assert not out.exists()


SET_CASES = {
    "a test --only leaves out": (["--only", "importance", "--set", "permutation.permutations=5"], "not selected"),
    "a test that does not run on this model": (["--only", "shuffle", "--set", "shuffle.repeats=2"], "does not run on this bilstm"),
    "a value of the wrong type": (["--set", "permutation.permutations=many"], "expected int, got 'many'"),
}


@pytest.mark.parametrize("case", list(SET_CASES))
def test_set_that_the_audit_would_ignore_is_refused(case: str, run_copy: Path, tmp_path: Path) -> None:
    args, expected = SET_CASES[case]
    out = tmp_path / "audit"
    assert_clean_failure(cli("audit", "--run", run_copy, "--out", out, *args, "--quiet"), expected)
    assert written(out) == []


def test_an_unforeseen_failure_is_one_line_and_debug_shows_it(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """The last resort: an exception no check foresaw is one ``error:`` line naming the command (exit 1);
    ``attnaudit --debug`` lets the traceback through, to report it."""
    import attnaudit.explain.text

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(attnaudit.explain.text, "explain_text", broken)
    done = cli("explain", "--hf", "minilm", "--text", "a film", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: attnaudit explain failed unexpectedly: ZeroDivisionError: division by zero "
        "(run it again with `attnaudit --debug ...` for the traceback, and please report it)"
    ]
    debug = cli("--debug", "explain", "--hf", "minilm", "--text", "a film", cwd=tmp_path)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ZeroDivisionError" in debug.stderr
