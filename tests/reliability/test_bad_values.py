"""Bad values inside otherwise well-formed files: labels, control characters, TeX-like text,
JSON of the wrong shape, and tables without a header row.

Each case either works the way a user means it (``1`` and ``1.0`` are one class, a NUL byte is
dropped with one warning, ``$\\frac{$`` is drawn as written) or fails with one ``error:`` line
naming the file, never a traceback.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.tasks import load_task
from attnaudit.data.types import TaskData
from attnaudit.errors import AttnAuditWarning, InputError
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train

from .helpers import TINY_TRAIN, assert_clean_failure, cli, synthetic_rows, warnings_of, write_table

set_quiet(True)


def jsonl(path: Path, records: list[dict[str, object]] | list[str]) -> Path:
    """A JSON Lines file; string records are written as they are (for JSON that ``json.dumps`` will not write)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def control_free(tokens: list[str]) -> bool:
    return not any(ord(c) < 32 or 127 <= ord(c) < 160 for t in tokens for c in t)


def total(task: TaskData) -> int:
    """Examples in all three splits."""
    return len(task.train) + len(task.dev) + len(task.test)


# --------------------------------------------------------------------------- labels


def test_label_spellings_of_one_number_are_one_class(tmp_path: Path) -> None:
    """JSONL 1, 1.0 and "1" and CSV 1 and 1.0 (a test file beside a JSONL train file) are one class."""
    rows = synthetic_rows(60)
    spellings = {"positive": (1, 1.0, "1", "1.0"), "negative": (0, 0.0, "0", "-0")}
    train_file = jsonl(tmp_path / "train.jsonl", [{"text": t, "label": spellings[y][i % 4]} for i, (t, y) in enumerate(rows[:50])])
    write_table(tmp_path / "test.csv", [(t, ("1", "1.0")[i % 2] if y == "positive" else "0") for i, (t, y) in enumerate(rows[50:])])
    out = tmp_path / "out"
    proc = cli("train", "--task", f"jsonl:{train_file}", "--test", f"csv:{tmp_path / 'test.csv'}", "--out", out, *TINY_TRAIN)
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc) == []
    assert json.loads((out / "config.json").read_text())["task"]["labels"] == ["0", "1"]


def test_true_and_false_are_a_boolean_class_pair(tmp_path: Path) -> None:
    rows = synthetic_rows(40)
    values = {"positive": (True, "true", "True", "TRUE"), "negative": (False, "false", "False", "FALSE")}
    path = jsonl(tmp_path / "b.jsonl", [{"text": t, "label": values[y][i % 4]} for i, (t, y) in enumerate(rows)])
    assert load_task(f"jsonl:{path}").labels == ["false", "true"]
    write_table(tmp_path / "b.csv", [(t, ("True", "false")[y == "negative"]) for t, y in rows])
    assert load_task(f"csv:{tmp_path / 'b.csv'}").labels == ["false", "true"]


REFUSED_LABELS = {
    # name: (file name, content, line the error names)
    "jsonl NaN": ("nan.jsonl", '{"text": "good", "label": 1}\n{"text": "bad", "label": NaN}\n', 2),
    "jsonl Infinity": ("inf.jsonl", '{"text": "good", "label": 1}\n\n{"text": "bad", "label": Infinity}\n', 3),
    "jsonl 'Infinity'": ("inf_text.jsonl", '{"text": "good", "label": 1}\n{"text": "bad", "label": "-Infinity"}\n', 2),
    "jsonl empty": ("empty.jsonl", '{"text": "good", "label": 1}\n{"text": "bad", "label": "  "}\n', 2),
    "csv Infinity": ("inf.csv", "text,label\ngood film,1\nbad film,Infinity\n", 3),
    "tsv inf": ("inf.tsv", "text\tlabel\ngood film\t1\nbad film\t0\nmeh\tinf\n", 4),
    "csv empty": ("empty.csv", "text,label\ngood film,1\nbad film,\n", 3),
}


@pytest.mark.parametrize("case", list(REFUSED_LABELS))
def test_nan_infinite_and_empty_labels_are_refused_with_the_line(case: str, tmp_path: Path) -> None:
    name, content, line = REFUSED_LABELS[case]
    (tmp_path / name).write_text(content)
    out = tmp_path / "out"
    fmt = Path(name).suffix.lstrip(".")
    proc = cli("train", "--task", f"{fmt}:{tmp_path / name}", "--out", out, *TINY_TRAIN)
    assert_clean_failure(proc, str(tmp_path / name), line, out)


def _jsonl_labels(lines: list[str]) -> list[str | None]:
    """The labels ``read_jsonl`` gives JSON label values written as ``lines``."""
    from attnaudit.data.readers import read_jsonl

    with tempfile.TemporaryDirectory() as folder:
        path = jsonl(Path(folder) / "l.jsonl", [f'{{"text": "x", "label": {value}}}' for value in lines])
        return [ex.label for ex in read_jsonl(path)]


@settings(max_examples=60, deadline=None)
@given(st.integers())
def test_label_normaliser_one_class_per_integer(n: int) -> None:
    """str(n), f"{n}.0", JSON n, JSON n.0 and JSON "n" are one class, and distinct integers stay distinct."""
    from attnaudit.data.readers import normalise_label

    names = {normalise_label(value, "x.csv", 1) for value in (str(n), f"{n}.0", f" {n} ", n, float(n) if abs(n) < 2**53 else n)}
    names |= set(_jsonl_labels([str(n), f"{n}.0", f'"{n}"', f'"{n}.0"']))
    assert names == {str(n)}


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_label_normaliser_keeps_the_value_of_finite_numbers(x: float) -> None:
    from attnaudit.data.readers import normalise_label

    name = normalise_label(x, "x.csv", 1)
    assert name == normalise_label(repr(x), "x.csv", 1) == _jsonl_labels([json.dumps(x)])[0]
    assert float(name) == x


@given(st.sampled_from(["nan", "NaN", "-nan", "inf", "-Infinity", "+INF", "", "  "]))
def test_label_normaliser_refuses_non_classes(text: str) -> None:
    from attnaudit.data.readers import normalise_label

    with pytest.raises(InputError, match=r"^d\.csv:7: "):
        normalise_label(text, "d.csv", 7)


# --------------------------------------------------------------------------- control characters


def test_control_characters_are_removed_with_one_warning(tmp_path: Path) -> None:
    """NUL bytes and escape codes in a CSV never become tokens; one warning says how many."""
    rows = synthetic_rows(40)
    body = "text,label\n" + "".join(f"{t},{y}\n" for t, y in rows[:-2])
    body += f"{rows[-2][0]}\x00\x00 end,{rows[-2][1]}\n\x1b[1m{rows[-1][0]},{rows[-1][1]}\x7f\n"
    (tmp_path / "nul.csv").write_bytes(body.encode())
    out = tmp_path / "out"
    proc = cli("train", "--task", f"csv:{tmp_path / 'nul.csv'}", "--out", out, *TINY_TRAIN)
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc) == [f"warning: {tmp_path / 'nul.csv'}: removed 4 control characters (such as NUL) from the text"]
    vocab = json.loads((out / "vocab.json").read_text())
    assert vocab["tokens"] and control_free(vocab["tokens"])
    assert json.loads((out / "config.json").read_text())["task"]["labels"] == ["negative", "positive"]


def test_escaped_control_characters_in_jsonl_are_removed_with_one_warning(tmp_path: Path) -> None:
    rows = synthetic_rows(30)
    records: list[dict[str, object]] = [{"text": t, "label": y} for t, y in rows]
    records[0]["text"] = "good\u0000 film\u001b"
    records[1]["text"] = ["good", "\u0000", "fi\u0007lm"]
    path = jsonl(tmp_path / "c.jsonl", records)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_task(f"jsonl:{path}")
    assert [str(w.message) for w in caught if issubclass(w.category, AttnAuditWarning)] == [
        f"{path}: removed 4 control characters (such as NUL) from the text"
    ]
    examples = data.train + data.dev + data.test
    assert all(control_free(ex.tokens) for ex in examples)
    assert ["good", "film"] in [ex.tokens for ex in examples]


# --------------------------------------------------------------------------- TeX-like text in figures

TEX = ["$\\frac{$", "$x_$"]


def test_tex_like_labels_and_tokens_are_drawn_literally(tmp_path: Path) -> None:
    """Labels and tokens that matplotlib would parse as mathtext draw every figure, and the report."""
    from attnaudit.audit import audit

    records = [
        {"text": [TEX[0], "word", f"w{i % 7}", TEX[1], "signal" if i % 2 else "noise"], "label": TEX[i % 2]}
        for i in range(60)
    ]
    path = jsonl(tmp_path / "tex.jsonl", records)
    run = train(f"jsonl:{path}", "bilstm", tmp_path / "run", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    assert sorted(run.labels) == sorted(TEX)
    tests = ["importance", "permutation", "erasure"]
    outcome = audit(tmp_path / "audit", run=run, only=tests, limit=6, heatmap_instances=1,
                    test_options={"permutation": {"permutations": 5}})
    assert outcome.failed == {} and sorted(outcome.results) == sorted(tests)
    for test in tests:
        figures = outcome.results[test].figures
        assert figures and all(Path(f).stat().st_size > 0 for f in figures), test
    report = (tmp_path / "audit" / "report.html").read_text()
    assert "$\\frac{$" in report and "$x_$" in report


# --------------------------------------------------------------------------- JSON of the wrong shape


def test_state_json_that_is_not_an_object(tmp_path: Path) -> None:
    out = tmp_path / "out"
    state = out / ".partial" / "checkpoint" / "state.json"  # an unfinished training's stage (training/staging.py)
    state.parent.mkdir(parents=True)
    state.write_text("[1, 2]")
    proc = cli("train", "--task", "synthetic", "--out", out, *TINY_TRAIN)
    error = assert_clean_failure(proc, str(state))
    assert "expected a JSON object, found an array" in error
    assert state.read_text() == "[1, 2]"


@pytest.mark.parametrize("field, value", [("epoch", "one"), ("history", {}), ("bad", 1.5)])
def test_state_json_with_a_field_of_the_wrong_type(trained: Run, run_copy: Path, field: str, value: object) -> None:
    """A checkpoint of this very config (hash matches) whose state has a field of the wrong type."""
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "metrics.json").unlink()
    state = {"epoch": 1, "best": 0.5, "bad": 0, "history": [], "seconds": 1.0, "hash": config["hash"], field: value}
    (run_copy / ".partial" / "checkpoint").mkdir(parents=True)  # a retraining in place, built in the stage
    (run_copy / ".partial" / "checkpoint" / "state.json").write_text(json.dumps(state))
    with pytest.raises(InputError, match=rf"state\.json: field '{field}' must be"):
        train(trained.task.spec, "bilstm", run_copy, test=trained.task.test, epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)


def test_config_json_of_the_wrong_shape(run_copy: Path, tmp_path: Path) -> None:
    config = json.loads((run_copy / "config.json").read_text())
    for task, message in (
        ({**config["task"], "labels": "negative positive"}, "field 'task.labels' must be an array"),
        ({**config["task"], "seed": "0"}, "field 'task.seed' must be an integer"),
        ("csv:train.csv", "field 'task' must be an object"),
    ):
        (run_copy / "config.json").write_text(json.dumps({**config, "task": task}))
        error = assert_clean_failure(cli("evaluate", run_copy, "--quiet"), str(run_copy / "config.json"))
        assert message in error, error
    # training into a finished run's folder reads its config.json first
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    (out / "config.json").write_text('["not", "a", "config"]')
    error = assert_clean_failure(cli("train", "--task", "synthetic", "--out", out, *TINY_TRAIN), str(out / "config.json"))
    assert "expected a JSON object" in error


RESULT = {"test": "importance", "summary": {"n": 1}, "instances": [], "tables": {}, "meta": {}, "figures": []}
REPORT_CASES = {
    # name: (file, content, part of the error)
    "result rows": ("importance.json", {**RESULT, "instances": [1, 2]}, "field 'instances' must be an array of objects"),
    "result meta": ("importance.json", {**RESULT, "meta": {"notes": "one"}}, "field 'meta.notes' must be an array"),
    "audit.json": ("audit.json", {"tests": "all"}, "field 'tests' must be an array"),
    "audit.json entry": ("audit.json", {"tests": [{"test": 3}]}, "field 'tests[0].test' must be a string"),
    "heatmaps.json": ("heatmaps.json", {"instances": [{"items": ["a"], "scores": {"attention": ["x"]}}]},
                      "'instances[0].scores.attention' must be an array of numbers"),
}


@pytest.mark.parametrize("case", list(REPORT_CASES))
def test_report_inputs_of_the_wrong_shape(case: str, tmp_path: Path) -> None:
    name, content, message = REPORT_CASES[case]
    folder = tmp_path / "audit"
    (folder / "results").mkdir(parents=True)
    (folder / "results" / "importance.json").write_text(json.dumps(RESULT))
    path = folder / name if name == "audit.json" else folder / "results" / name
    path.write_text(json.dumps(content))
    error = assert_clean_failure(cli("report", folder), str(path))
    assert message in error, error
    assert not (folder / "report.html").exists()


# --------------------------------------------------------------------------- tables without a header


def test_headerless_tsv_is_read_without_header_option(tmp_path: Path) -> None:
    """``sentence<TAB>0`` rows: the first row is data (its label is like the others'), and the notes say so."""
    rows = [(t, "1" if y == "positive" else "0") for t, y in synthetic_rows(50)]
    path = write_table(tmp_path / "plain.tsv", rows, sep="\t", header=False)
    out = tmp_path / "out"
    proc = cli("train", "--task", f"tsv:{path}", "--out", out, *TINY_TRAIN)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["task"]["labels"] == ["0", "1"]
    notes = json.loads((out / "metrics.json").read_text())["notes"]
    assert any(f"{path}: first row read as data (no header)" in note for note in notes), notes
    assert total(load_task(f"tsv:{path}")) == 50


def test_header_sniffing_and_explicit_header(tmp_path: Path) -> None:
    rows = synthetic_rows(30)
    headed = write_table(tmp_path / "headed.csv", rows)
    task = load_task(f"csv:{headed}")
    assert task.labels == ["negative", "positive"]
    assert any("first row read as the header" in note for note in task.notes)
    # text labels: a first row whose label no other row has is a header...
    named = tmp_path / "named.csv"
    named.write_text("sentence,sentiment\n" + "".join(f"{t},{y}\n" for t, y in rows))
    with pytest.raises(InputError, match=r"no text column: unknown column 'text' \(choose from sentence, sentiment\)"):
        load_task(f"csv:{named}")
    assert total(load_task(f"csv:{named}?text=0&label=1")) == 30
    # ...and one that shares its label with other rows is data
    bare = write_table(tmp_path / "bare.csv", rows, header=False)
    assert total(load_task(f"csv:{bare}")) == 30
    # an explicit header option wins over the sniffing
    forced = load_task(f"csv:{bare}?header=1&text=0&label=1")
    assert total(forced) == 29
    assert not any("first row read" in note for note in forced.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AttnAuditWarning)  # the row labelled "label" may land in dev/test only
        as_data = load_task(f"csv:{headed}?header=0")
    assert "label" in as_data.labels and total(as_data) == 31
