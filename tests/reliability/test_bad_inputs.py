"""A corpus of bad inputs, each run through the CLI in a fresh process.

Malformed input must end with exit code 2 and exactly one ``error:`` line on stderr naming
the file (and line), no traceback, and no result file in the output folder. Odd but usable
input (one-word sentences, 5,000-token sentences, unknown words, Latin-1 bytes) must work,
with a one-line warning where something was changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnaudit.data.tasks import load_task
from attnaudit.errors import AttnAuditWarning
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train

from .helpers import TINY_TRAIN, assert_clean_failure, cli, synthetic_rows, warnings_of, write_table

set_quiet(True)


# --------------------------------------------------------------------------- malformed data files

FIRST = "{},{}".format(*synthetic_rows(1)[0])
DATA_CASES = {
    # name: (file name, content, the line the error must name or None)
    "empty csv": ("empty.csv", b"", None),
    "csv, too many columns": ("wide.csv", f"text,label\n{FIRST}\na b c,positive,extra\n".encode(), 3),
    "tsv, too few columns": ("narrow.tsv", b"text\tlabel\ngood film\tpositive\nbad film\n", 3),
    "conll, wrong column count": ("chunks.conll", b"He PRP B-NP\nran VBD B-VP\n\nShe PRP B-NP\nsat B-VP\n", 5),
    "csv, NaN label": ("nan_label.csv", b"text,label\ngood film,positive\nbad film,NaN\n", 3),
    "csv, NaN text": ("nan_text.csv", b"text,label\ngood film,positive\nNaN,negative\n", 3),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_malformed_training_data_fails_cleanly(case: str, tmp_path: Path) -> None:
    name, content, line = DATA_CASES[case]
    (tmp_path / name).write_bytes(content)
    fmt = {".csv": "csv", ".tsv": "tsv", ".conll": "conll"}[Path(name).suffix]
    out = tmp_path / "out"
    proc = cli("train", "--task", f"{fmt}:{tmp_path / name}", "--out", out, *TINY_TRAIN)
    assert_clean_failure(proc, str(tmp_path / name), line, out)


def test_missing_data_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    error = assert_clean_failure(
        cli("train", "--task", "sst", "--data-dir", tmp_path / "nowhere", "--out", out, *TINY_TRAIN),
        str(tmp_path / "nowhere"), out=out,
    )
    assert "data directory not found" in error
    (tmp_path / "empty").mkdir()
    assert_clean_failure(
        cli("train", "--task", "conll2000", "--data-dir", tmp_path / "empty", "--out", out, *TINY_TRAIN),
        str(tmp_path / "empty" / "conll2000" / "train.txt.gz"), out=out,
    )


def test_unknown_label_at_test_time_names_the_line(trained: Run, run_copy: Path, tmp_path: Path) -> None:
    """The test file is changed after training to hold a label the model has no output for."""
    run_dir = run_copy
    test_file = Path(trained.task.test.removeprefix("csv:"))  # type: ignore[union-attr]
    changed = tmp_path / "test.csv"
    changed.write_text(test_file.read_text().replace(",negative\n", ",neutral\n", 1))
    config = json.loads((run_dir / "config.json").read_text())
    config["task"]["test"] = f"csv:{changed}"
    (run_dir / "config.json").write_text(json.dumps(config))
    line = next(i for i, text in enumerate(changed.read_text().splitlines(), 1) if text.endswith(",neutral"))
    out = tmp_path / "out"
    error = assert_clean_failure(cli("run", "importance", run_dir, "--out", out, "--quiet"), str(changed), line, out)
    assert "unknown label 'neutral'" in error


def test_dev_or_test_label_absent_from_training_is_a_warning(tmp_path: Path) -> None:
    """Given at training time, the extra label becomes an (untrained) output class, with one warning."""
    rows = synthetic_rows(60)
    write_table(tmp_path / "train.csv", rows[:50])
    write_table(tmp_path / "test.csv", rows[50:] + [("an odd one", "neutral")])
    out = tmp_path / "out"
    proc = cli("train", "--task", f"csv:{tmp_path / 'train.csv'}", "--test", f"csv:{tmp_path / 'test.csv'}", "--out", out, *TINY_TRAIN)
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc) == ["warning: labels neutral occur in dev/test but not in training data"]
    assert json.loads((out / "config.json").read_text())["task"]["labels"] == ["negative", "neutral", "positive"]


# --------------------------------------------------------------------------- odd but usable data


def test_latin1_file_loads_with_one_warning(tmp_path: Path) -> None:
    rows = synthetic_rows(40)
    text = "text,label\n" + "\n".join(f"{t},{y}" for t, y in rows) + "\ncaf\xe9 na\xefve cr\xe8me,positive\n"
    (tmp_path / "latin1.csv").write_bytes(text.encode("latin-1"))
    out = tmp_path / "out"
    proc = cli("train", "--task", f"csv:{tmp_path / 'latin1.csv'}", "--out", out, *TINY_TRAIN)
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc) == [f"warning: {tmp_path / 'latin1.csv'}: not UTF-8, read as Latin-1"]
    assert (out / "metrics.json").exists()
    with pytest.warns(AttnAuditWarning, match="Latin-1"):
        data = load_task(f"csv:{tmp_path / 'latin1.csv'}")
    assert ["café", "naïve", "crème"] in [ex.tokens for ex in data.train + data.dev + data.test]


def test_5000_token_sentence_is_truncated_with_a_warning(tmp_path: Path) -> None:
    rows = synthetic_rows(40)
    long_text = " ".join(f"w{i % 50}" for i in range(5000))
    write_table(tmp_path / "long.csv", [*rows, (long_text, "positive")])
    out = tmp_path / "out"
    proc = cli("train", "--task", f"csv:{tmp_path / 'long.csv'}", "--out", out, "--model", "transformer", "--epochs", "2",
               "--embed-dim", "8", "--d-model", "8", "--heads", "2", "--layers", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    (line,) = warnings_of(proc)  # one line, though the long sentence is met in both epochs
    assert line.startswith("warning: ") and line.endswith("longer than max_len=512; truncated")
    assert json.loads((out / "metrics.json").read_text())["epochs"] == 2


def test_one_word_sentences_are_excluded_with_a_note(tmp_path: Path) -> None:
    """Importance (τ needs 2 items) and erasure (nothing to erase short of all) leave them out and say so."""
    rows = synthetic_rows(60)
    write_table(tmp_path / "train.csv", rows[:50])
    write_table(tmp_path / "test.csv", [*rows[50:], ("good", "positive"), ("bad", "negative")])
    run = train(f"csv:{tmp_path / 'train.csv'}", "bilstm", tmp_path / "run", test=f"csv:{tmp_path / 'test.csv'}",
                epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    out = tmp_path / "out"
    for test, options in (("importance", ["--methods", "gradient,loo"]), ("erasure", ["--rankings", "attention,random"])):
        proc = cli("run", test, run.path, "--out", out, "--quiet", *options)
        assert proc.returncode == 0, proc.stderr
        assert warnings_of(proc) == []
        result = json.loads((out / f"{test}.json").read_text())
        notes = " ".join(result["meta"]["notes"])
        assert "2 instance(s)" in notes, notes
    importance = json.loads((out / "importance.json").read_text())
    assert importance["summary"]["excluded_short"] == 2 and importance["summary"]["n"] == 10
    erasure = json.loads((out / "erasure.json").read_text())
    singles = [row for row in erasure["instances"] if row["length"] == 1]
    assert len(singles) == 2 and all(row["fraction_attention"] is None for row in singles)


def test_all_unknown_tokens_are_scored(run_copy: Path, tmp_path: Path) -> None:
    """A test set of words never seen in training maps to <unk>: evaluated, not rejected."""
    run_dir = run_copy
    write_table(tmp_path / "unknown.csv", [("zyx qwv plo", "positive"), ("mnb vcx", "negative"), ("lkj", "positive")])
    config = json.loads((run_dir / "config.json").read_text())
    config["task"]["test"] = f"csv:{tmp_path / 'unknown.csv'}"
    (run_dir / "config.json").write_text(json.dumps(config))
    proc = cli("evaluate", run_dir, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "accuracy" in proc.stdout and warnings_of(proc) == []


def test_bad_sweep_file(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text("grid:\n  tasks: [synthetic]\n  models: [bilstm]\ntrain:\n  epochs: -\n")
    out = tmp_path / "out"
    assert_clean_failure(cli("sweep", tmp_path / "sweep.yaml", "--out", out, "--quiet"), str(tmp_path / "sweep.yaml"), 5, out)
    assert not out.exists()
