"""The CLI fuzzer (issue #47, item 6): every command and option, generated from the code, with hostile values.

The commands and options come from the typer signatures and the tests' ``Options`` (tests/reliability/fuzz.py);
each case is a valid tiny command line with one option set to a boundary or hostile value, run in this
process, and must keep the promise (:func:`fuzz.promise`): exit 0, 2 or 130, a failure in one ``error:`` line,
no traceback, nothing half-written, the inputs unchanged.

``make test`` runs every command × option once, with one of the option kind's values chosen by rotation (the
run tests' shared options on one test, ``permutation``; the costly ``demo`` and ``sweep`` with values that must
be refused), plus a few hypothesis-drawn combinations (derandomized: the same cases on every machine). The
slow test runs every value of every option of every command and more drawn combinations.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnaudit.architectures import save_tiny
from attnaudit.progress import is_quiet, set_quiet
from attnaudit.training.trainer import train

from .fuzz import Option, Workspace, attempt, base, schema, show, values, with_value
from .helpers import cli, fresh_cli, synthetic_rows, write_table

SCHEMA = schema()
SHARED_ON = ("run", "permutation")
"""The run test whose shared options (run directory, --split, --limit, --out, --hf...) make test fuzzes;
the slow test fuzzes them on every test."""
COSTLY = {"demo", "sweep"}
"""Commands whose valid runs cost seconds to minutes (a demo trains three models, a sweep starts a process
pool): make test gives them only values they must refuse (:data:`REFUSED`)."""
REFUSED = {"int": "-1", "float": "nan", "text": "a\x01b\x1b[31mc\x7f", "path": "@file", "list-int": ",", "list-float": ",",
           "list-text": ","}


def cases(every_value: bool) -> list[tuple[Option, str]]:
    """(option, value) pairs: every command × option with one value by rotation, or with each of its values
    (``FUZZ_ONLY=cheap``: not demo and sweep, the shared run options on one test)."""
    chosen: list[tuple[Option, str]] = []
    cheap = os.environ.get("FUZZ_ONLY") == "cheap"
    for command, (own, shared) in SCHEMA.items():
        if cheap and command[0] in COSTLY:
            continue
        options = own + (shared if (every_value and not cheap) or command == SHARED_ON else [])
        for option in options:
            pool = values(option)
            if every_value:
                chosen += [(option, value) for value in pool]
            elif command[0] in COSTLY:
                if option.kind != "flag":
                    chosen.append((option, REFUSED[option.kind]))
            else:
                chosen.append((option, pool[len(chosen) % len(pool)]))
    return chosen


def options_covered() -> int:
    """Command × option pairs of the schema (the run tests' shared options counted once per test)."""
    return sum(len(own) + len(shared) for own, shared in SCHEMA.values())


@pytest.fixture(scope="module", autouse=True)
def _command_built_once() -> Iterator[None]:
    """typer rebuilds the whole click command tree (39 commands, ~0.05 s) on every call of the app; a process
    calls it once, the fuzzer hundreds of times: the tree is built once here (a click command keeps no state
    between invocations; :func:`test_in_process_is_the_console_script` checks the outputs agree)."""
    import typer.main

    real, built = typer.main.get_command, {}

    def get_command(app: typer.Typer) -> Any:
        if id(app) not in built:
            built[id(app)] = real(app)
        return built[id(app)]

    patch = pytest.MonkeyPatch()
    patch.setattr(typer.main, "get_command", get_command)
    yield
    patch.undo()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The tiny inputs every case reads: a BiLSTM (embeddings and states of 4) trained one epoch on 48
    rows, the CSVs, a tiny BERT, the results of one test (for `report`), a one-job sweep file."""
    root = tmp_path_factory.mktemp("fuzz")
    inputs = root / "inputs"
    inputs.mkdir()
    rows = synthetic_rows(60)
    write_table(inputs / "train.csv", rows[:48])
    write_table(inputs / "test.csv", rows[48:])
    previous = is_quiet()
    set_quiet(True)
    try:
        train(f"csv:{inputs / 'train.csv'}", "bilstm", inputs / "run", test=f"csv:{inputs / 'test.csv'}", epochs=1, embed_dim=4,
              hidden_dim=4, quiet_eval=True)
    finally:
        set_quiet(previous)
    save_tiny("bert", inputs / "bert")
    (inputs / "sweep.yaml").write_text(
        f"grid:\n  tasks: ['csv:{inputs / 'train.csv'}']\n  models: [bilstm]\n"
        "train:\n  epochs: 1\n  embed_dim: 4\n  hidden_dim: 4\naudit:\n  only: [importance]\n  limit: 4\n", encoding="utf-8")
    shutil.copytree(inputs, root / "pristine")
    made = cli("run", "importance", inputs / "run", "--limit", "4", "--methods", "gradient", "--out", root / "results", "--quiet")
    assert made.returncode == 0, made.stderr
    return Workspace(root, inputs / "run", " ".join(rows[0][0].split()[:4]))


UNBOUNDED_TIME: dict[tuple[str, str], str] = {}
"""Options whose huge values start work no bound stops: empty since the time bounds (``bounds.check_time``; issue #47
item 1). ``finetune --epochs``, ``run adversarial --steps``, ``run erasure --random-orders`` and ``run faithfulness
--curve-steps`` were here: tests/reliability/test_time_bounds.py holds them as regression tests."""

LONG_BY_DESIGN = {
    ("demo", "--quick"): "--no-quick is the full demo: a fixed few minutes of training by design, past the fuzzer's budget",
}
"""Cases whose work is bounded but longer than :data:`fuzz.BUDGET` by design (no value of theirs asks for more): the
fuzzer stops them at its budget and reports them here instead of failing."""


def known(option: Option, broken: list[str]) -> bool:
    """A case stopped at the budget that :data:`LONG_BY_DESIGN` records (printed, not failed)."""
    where = (" ".join(option.command), str(option.flag))
    return len(broken) == 1 and "no bound on the time" in broken[0] and where in {**UNBOUNDED_TIME, **LONG_BY_DESIGN}


def fuzz(workspace: Workspace, chosen: list[tuple[Option, str]]) -> list[str]:
    """Every broken promise among the cases, shown as the command line and what it printed."""
    found: list[str] = []
    codes: dict[int, int] = {}
    for option, value in chosen:
        started = time.process_time()
        outcome, broken = attempt(workspace, with_value(base(option.command), option, value))
        if time.process_time() - started > 0.5:  # shown with -s: where the budget goes
            print(f"{time.process_time() - started:.1f} s CPU: {option} {value[:20]!r} exit {outcome.code}")
        if broken and known(option, broken):
            print(f"KNOWN {option}: {LONG_BY_DESIGN[(' '.join(option.command), str(option.flag))]}: {value!r}")
        elif broken:
            found.append(f"{option}: " + show(outcome, broken))
            print("BROKEN " + found[-1])
        codes[outcome.code] = codes.get(outcome.code, 0) + 1
        if os.environ.get("FUZZ_SHOW"):
            print(f"{option} {value[:30]!r} -> {outcome.code} {outcome.stderr.strip()[-150:]!r}")
    print(f"exit codes: {codes}")
    return found


def test_the_bases_run(workspace: Workspace) -> None:
    """Each valid tiny command line the cases start from works (a broken base would make every case an error)."""
    for command in SCHEMA:
        if command[0] in COSTLY or (command[0] == "run" and command != SHARED_ON):
            continue  # the run tests that do not apply to a BiLSTM refuse it in one line, after reading their options
        outcome, broken = attempt(workspace, base(command))
        assert outcome.code == 0 and not broken, show(outcome, broken)


def test_every_command_and_option(workspace: Workspace) -> None:
    chosen = cases(every_value=False)
    covered = {option for option, _ in chosen}
    print(f"fuzzed: {len(covered)} command x option cases of {options_covered()} ({len(SCHEMA)} commands)")
    assert len(covered) >= 200
    assert fuzz(workspace, chosen) == []


def draw_and_run(workspace: Workspace, data: st.DataObject, costly: bool = False) -> None:
    """Two or three hostile options at once on one command (hypothesis); ``costly``: demo and sweep too."""
    commands = sorted(c for c in SCHEMA if SCHEMA[c][0] and (costly or (c[0] not in COSTLY and (c[0] != "run" or c == SHARED_ON))))
    command = data.draw(st.sampled_from(commands))
    own, shared = SCHEMA[command]
    options = data.draw(st.lists(st.sampled_from(own + shared), min_size=min(2, len(own + shared)), max_size=3, unique=True))
    words = base(command)
    for option in options:
        words = with_value(words, option, data.draw(st.sampled_from(values(option))))
    outcome, broken = attempt(workspace, words)
    assert not broken, show(outcome, broken)


@settings(max_examples=25, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_drawn_combinations(workspace: Workspace, data: st.DataObject) -> None:
    """Hostile options combined (derandomized: the same 25 cases on every machine)."""
    draw_and_run(workspace, data)


@pytest.mark.slow
@settings(max_examples=400, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_many_drawn_combinations(workspace: Workspace, data: st.DataObject) -> None:
    draw_and_run(workspace, data, costly=True)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("command", sorted(SCHEMA), ids=" ".join)
def test_every_value_of_every_option(workspace: Workspace, command: tuple[str, ...]) -> None:
    """Every hostile value of every option of ``command`` (the run tests with their shared options too)."""
    chosen = [(option, value) for option, value in cases(every_value=True) if option.command == command]
    print(f"{' '.join(command)}: {len(chosen)} option x value cases")
    assert fuzz(workspace, chosen) == []


def test_the_fuzzer_sees_every_command_and_test() -> None:
    """The schema is the code's: every top-level command and every registered test, each test's Options fields."""
    from attnaudit import cli as cli_module
    from attnaudit.experiments import discover

    tops = {c.name or c.callback.__name__ for c in cli_module.app.registered_commands if c.callback is not None}
    assert {c[0] for c in SCHEMA if c[0] != "run"} == {name.replace("_", "-") for name in tops}
    assert {c[1] for c in SCHEMA if c[0] == "run"} == set(discover())
    assert all(values(option) for own, shared in SCHEMA.values() for option in own + shared)
    assert Path(__file__).with_name("fuzz.py").is_file()



@pytest.mark.parametrize(
    "words",
    [["train", "--task", "x", "--model", "bilstm", "--out", "@out", "--epochs", "nan"], ["datasets", "--data-dir", "@file"],
     ["explain", "--run", "@run", "--text", "a\x1b[31m", "--steps", "0"]],
    ids=["nan", "file-as-folder", "below-range"],
)
def test_in_process_is_the_console_script(workspace: Workspace, words: list[str]) -> None:
    """The fuzzer's in-process calls (one command tree) say what the console script in a fresh interpreter says
    (cases refused while parsing: no model library is imported, a fresh interpreter costs half a second)."""
    out = workspace.fresh_out()
    resolved = workspace.resolve(words, out)
    inside, fresh = cli(*resolved, cwd=workspace.cwd), fresh_cli(*resolved, cwd=workspace.cwd)
    assert (inside.returncode, inside.stderr, inside.stdout) == (fresh.returncode, fresh.stderr, fresh.stdout)
    assert inside.returncode == 2 and inside.stderr.startswith("error:")


SEGMENT_OPTIONS = {(("explain",), "--segments"), (("explain",), "--replace"), (("explain",), "--baseline"), (("audit",), "--segments"),
                   (SHARED_ON, "--segments")}
"""The options of segments and baselines (issue 45 item 2), fuzzed with every value of their kind."""


def test_segments_and_baselines_with_every_value(workspace: Workspace) -> None:
    chosen = [(option, value) for command, (own, shared) in SCHEMA.items() for option in own + shared
              if (command, option.flag) in SEGMENT_OPTIONS for value in values(option)]
    assert {(option.command, option.flag) for option, _ in chosen} == SEGMENT_OPTIONS
    assert fuzz(workspace, chosen) == []
