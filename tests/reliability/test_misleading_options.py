"""Options that were silently ignored or misleading (issue #47) and what the CLI fuzzer found (test_cli_fuzz.py):
each is now refused in one line before any work, or named correctly.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from attnaudit.architectures import save_tiny
from attnaudit.run import Run

from .helpers import assert_clean_failure, cli, written


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny saved GPT-2 (a decoder whose tokenizer has no mask token)."""
    return save_tiny("gpt2", tmp_path_factory.mktemp("gpt2") / "model")


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("extra", [[], ["--target", " a b"]], ids=["alone", "with-target"])
def test_sample_applies_with_generate_only(gpt2: Path, extra: list[str], tmp_path: Path) -> None:
    """`--sample` without `--generate` (one decision, or a forced --target) was accepted and ignored; refused like --aggregate."""
    line = assert_clean_failure(cli("explain", "--hf", gpt2, "--text", "a b c", "--sample", *extra, "--out", tmp_path / "out"), "--sample",
                                out=tmp_path / "out")
    assert "applies with --generate" in line


def test_an_unknown_method_among_known_ones_is_named(trained: Run, tmp_path: Path) -> None:
    for args in (("explain", "--run", trained.path, "--text", "a b", "--method", "attention,bogus"),
                 ("run", "faithfulness", trained.path, "--methods", "attention,bogus", "--out", tmp_path / "out")):
        line = assert_clean_failure(cli(*args), "unknown method 'bogus'", out=tmp_path / "out")
        assert "'attention'" not in line.split("(choose")[0]


def test_a_baseline_the_model_lacks_is_not_suggested(gpt2: Path) -> None:
    line = assert_clean_failure(cli("explain", "--hf", gpt2, "--text", "a b c", "--method", "ig", "--baseline", "mask", "--steps", "2"),
                                "ig baseline 'mask'")
    advice = line.split("choose", 1)[1]
    assert "has no mask token" in line and "mask" not in advice and "zero" in advice


@pytest.mark.parametrize("command", ["run", "audit", "explain"])
def test_an_out_inside_the_run_folder_is_refused(command: str, run_copy: Path) -> None:
    inside = run_copy / "results-here"
    before = digest(run_copy)
    args = {
        "run": ("run", "importance", run_copy, "--limit", "4", "--out", inside, "--quiet"),
        "audit": ("audit", "--run", run_copy, "--only", "importance", "--limit", "4", "--out", inside, "--quiet"),
        "explain": ("explain", "--run", run_copy, "--text", "a b", "--out", inside, "--quiet"),
    }[command]
    line = assert_clean_failure(cli(*args), f"--out {inside}", out=inside)
    assert "inside the run folder" in line or "inside the model folder" in line
    assert not inside.exists() and digest(run_copy) == before
    assert_clean_failure(cli(*args[:-3], "--out", run_copy, "--quiet"), f"--out {run_copy}")  # the run folder itself
    assert digest(run_copy) == before


def test_a_task_given_to_an_audit_of_a_run_is_refused(trained: Run, tmp_path: Path) -> None:
    """`audit --run RUN --task T` audited RUN's own task and said nothing of T (as `run TEST RUN --task` refuses)."""
    line = assert_clean_failure(cli("audit", "--run", trained.path, "--task", "sst", "--out", tmp_path / "a", "--quiet"), "--task",
                                out=tmp_path / "a")
    assert "a run directory is audited on the task it was trained on" in line and not (tmp_path / "a").exists()


@pytest.mark.parametrize(("test", "switch"), [("shuffle", "per-layer"), ("rollout", "include-special")])
def test_a_switch_on_by_default_can_be_turned_off(test: str, switch: str, trained: Run, tmp_path: Path) -> None:
    """The tests' boolean options default to on and had no off form: `--no-per-layer` was "No such option"."""
    proc = cli("run", test, trained.path, f"--no-{switch}", "--out", tmp_path / "out")
    line = assert_clean_failure(proc, f"test '{test}' does not apply")  # parsed: the BiLSTM is what is refused
    assert "No such option" not in line


def test_a_bpe_vocabulary_beyond_memory_is_one_line(tmp_path: Path) -> None:
    """`train-nmt --source-vocab 2147483648` made the tokenizers library abort the interpreter (exit 134, a Rust backtrace)."""
    for option in ("--source-vocab", "--target-vocab"):
        proc = cli("train-nmt", "--task", "synthetic-translation", "--out", tmp_path / "nmt", option, "2147483648", "--quiet")
        line = assert_clean_failure(proc, f"{option} 2147483648: needs about", out=tmp_path / "nmt")
        assert "BPE trainer" in line and "limit here" in line and not (tmp_path / "nmt").exists()


def test_control_characters_of_an_argument_do_not_reach_the_terminal(tmp_path: Path) -> None:
    """An argument echoed in an error (a file name with an escape sequence, a newline, a bidirectional override)
    is shown escaped: one line, nothing that recolours or rewrites the terminal."""
    name = "a\x1b[31mb\nc\u202ed"
    proc = cli("train", "--task", f"csv:{tmp_path / name}", "--model", "bilstm", "--out", tmp_path / "run")
    line = assert_clean_failure(proc, "file not found", out=tmp_path / "run")
    assert "\\x1b[31mb\\x0ac\\u202ed" in line
    assert not any(ord(c) < 32 or c == "\u202e" for c in proc.stderr.rstrip("\n"))
    assert written(tmp_path / "run") == []


def test_a_data_dir_that_is_a_file_is_refused(trained: Run, tmp_path: Path) -> None:
    """A --data-dir naming a file was accepted wherever the task did not need it (the fuzzer's `sweep --data-dir FILE`)."""
    a_file = Path(str(trained.path)) / "config.json"
    for args in (("datasets",), ("evaluate", trained.path), ("sweep", tmp_path / "sweep.yaml")):
        proc = cli(*args, "--data-dir", a_file)
        assert_clean_failure(proc, "'--data-dir'")
        assert "is a file" in proc.stderr


def test_an_nmt_size_of_zero_is_refused(tmp_path: Path) -> None:
    """`train-nmt --d-ff 0` trained a model without its feed-forward layers and said nothing."""
    for option in ("--d-ff", "--layers", "--heads", "--d-model", "--max-train-len"):
        proc = cli("train-nmt", "--task", "synthetic-translation", "--out", tmp_path / "nmt", option, "0", "--quiet")
        line = assert_clean_failure(proc, f"{option} must be at least 1, got 0", out=tmp_path / "nmt")
        assert line and not (tmp_path / "nmt").exists()


@pytest.mark.parametrize(("option", "value", "needle"), [("--lr", "nan", "a finite lr > 0"), ("--lr", "inf", "a finite lr > 0"),
                                                          ("--max-len", "-1", "--max-len must be at least 1, got -1")])
def test_finetune_values_found_by_the_fuzzer(option: str, value: str, needle: str, tmp_path: Path) -> None:
    """`--lr nan` was torch's "Invalid learning rate" (failed unexpectedly, exit 1), `--lr inf` trained to NaN
    weights and left them in --out, `--max-len -1` an OverflowError in the tokenizer."""
    proc = cli("finetune", "--hf", "missing-model-never-loaded", "--task", "synthetic", "--out", tmp_path / "ft", option, value)
    line = assert_clean_failure(proc, needle, out=tmp_path / "ft")
    assert line and not (tmp_path / "ft").exists()


def test_adversaries_beyond_memory_are_one_line(trained: Run, tmp_path: Path) -> None:
    """`run adversarial --adversaries 2147483648` asked torch for 64 GiB (failed unexpectedly); 10**23 overflowed."""
    for value in ("2147483648", "99999999999999999999999"):
        proc = cli("run", "adversarial", trained.path, "--adversaries", value, "--out", tmp_path / "out")
        line = assert_clean_failure(proc, f"--adversaries {value}: needs about", out=tmp_path / "out")
        assert "limit here" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("test", ["diagnostic", "seeds", "uniform"])
def test_a_seed_out_of_range_is_refused_before_any_sub_run(test: str, trained: Run, tmp_path: Path) -> None:
    """`run diagnostic --seeds -1` trained the base sub-run into --out, then refused the seed."""
    proc = cli("run", test, trained.path, "--seeds=-1", "--epochs", "1", "--out", tmp_path / "out")
    line = assert_clean_failure(proc, "--seeds must be an integer from 0 to", out=tmp_path / "out")
    assert line and not (tmp_path / "out").exists()


def test_resamples_beyond_memory_are_one_line(trained: Run, tmp_path: Path) -> None:
    """`run faithfulness --resamples 2147483648` was numpy's MemoryError (64 GiB), 10**23 "Maximum allowed dimension"."""
    for value in ("2147483648", "99999999999999999999999"):
        proc = cli("run", "faithfulness", trained.path, "--resamples", value, "--out", tmp_path / "out")
        line = assert_clean_failure(proc, f"--resamples {value}: needs about", out=tmp_path / "out")
        assert "limit here" in line


def test_memory_no_bound_foresaw_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """An allocation that fails anyway is the machine's limit: one line, exit 2, not "please report it"."""
    from attnaudit.data import tasks

    def exhausted() -> None:
        raise MemoryError("Unable to allocate 64.0 GiB for an array")

    monkeypatch.setattr(tasks, "list_tasks", exhausted)
    line = assert_clean_failure(cli("datasets"), "out of memory: Unable to allocate 64.0 GiB")
    assert "please report" not in line and "smaller sizes" in line


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("--lr", "nan", "--lr must be a finite number above 0"), ("--lr", "-1", "--lr must be a finite number above 0"),
    ("--lr", "inf", "--lr must be a finite number above 0"), ("--warmup", "0", "--warmup must be at least 1"),
    ("--max-steps", "0", "--max-steps must be at least 1"), ("--d-ff", "2147483648", "needs about"),
    ("--layers", "99999999999999999999999", "needs about"),
])
def test_train_nmt_values_found_by_the_fuzzer(option: str, value: str, needle: str, tmp_path: Path) -> None:
    """Each was "failed unexpectedly" (torch's invalid learning rate, a division by zero in the schedule, a 64 GiB
    allocation, an overflow) or exit 2 with the BPE files and a half checkpoint left in --out (`--max-steps 0`, `--lr inf`)."""
    proc = cli("train-nmt", "--task", "synthetic-translation", "--out", tmp_path / "nmt", "--quiet", option, value)
    line = assert_clean_failure(proc, needle, out=tmp_path / "nmt")
    assert line and not (tmp_path / "nmt").exists()


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("--hidden-dim", "2147483648", "past what torch can address"), ("--embed-dim", "99999999999999999999999", "past what torch can address"),
    ("--weight-decay", "nan", "--weight-decay must be a finite number >= 0"),
    ("--weight-decay", "inf", "--weight-decay must be a finite number >= 0"),
])
def test_train_values_found_by_the_fuzzer(option: str, value: str, needle: str, tmp_path: Path) -> None:
    """A size whose model cannot even be laid out on the meta device went on to a real allocation (128 GiB, or an
    overflow: failed unexpectedly); `--weight-decay nan` was torch's error, `inf` trained to NaN weights left in --out."""
    proc = cli("train", "--task", "synthetic", "--model", "bilstm", "--epochs", "1", "--out", tmp_path / "run", "--quiet", option, value)
    line = assert_clean_failure(proc, needle, out=tmp_path / "run")
    assert line and not (tmp_path / "run").exists()
