"""Shared by the reliability tests: running the CLI and checking how it fails."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
from filelock import FileLock

from attnaudit.data.synthetic import synthetic_task

CLI = [sys.executable, "-m", "attnaudit.cli"]
TINY_TRAIN = ["--model", "bilstm", "--epochs", "1", "--embed-dim", "8", "--hidden-dim", "8", "--quiet"]
RESULT_SUFFIXES = (".json", ".csv", ".safetensors", ".html")


def cli(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``attnaudit ARGS`` as the console script runs it, output captured: in this process, so the
    imports (10–15 s of torch, scipy and transformers on the 2-core CI machine) are paid once per
    worker, not once per command; in a fresh single-threaded interpreter when ``env`` is given
    (Hugging Face reads its settings when first imported)."""
    words = [str(a) for a in args]
    if env is not None:
        return fresh_cli(*words, cwd=cwd, env=env)
    with _without("ATTNAUDIT_DATA"):
        code, out, err = in_process(words, cwd or Path.cwd())
    return subprocess.CompletedProcess([*CLI, *words], code, out, err)


def fresh_cli(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``attnaudit ARGS`` in a fresh interpreter (single-threaded), output captured."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    environment.pop("ATTNAUDIT_DATA", None)
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=environment, timeout=600
    )


def in_process(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """``attnaudit ARGS`` run by :func:`attnaudit.cli.main` in this process from ``cwd``: exit code,
    stdout, stderr. An exception main lets through is printed as the interpreter would (exit 1);
    warnings, the quiet switch, argv and the working directory are restored afterwards."""
    from attnaudit import cli, progress

    out, err = io.StringIO(), io.StringIO()
    code = 0
    previous, argv, quiet = Path.cwd(), sys.argv, progress.is_quiet()
    os.chdir(cwd)
    sys.argv = ["attnaudit", *args]
    cli._shown_warnings.clear()
    try:
        # catch_warnings restores main's showwarning hook and resets "once per location" memory,
        # so each command shows its warnings as a fresh process would.
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("default")
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # noqa: BLE001 - what an uncaught exception prints in a real process
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
        os.chdir(previous)
        progress.set_quiet(quiet)
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _without(name: str) -> Iterator[None]:
    """The environment without variable ``name`` for the duration."""
    value = os.environ.pop(name, None)
    try:
        yield
    finally:
        if value is not None:
            os.environ[name] = value


def written(out: Path) -> list[Path]:
    """Result-like files under ``out`` (metrics, results, weights, reports); none expected after a failure."""
    if not out.exists():
        return []
    return [p for p in out.rglob("*") if p.is_file() and p.suffix in RESULT_SUFFIXES]


def assert_clean_failure(proc: subprocess.CompletedProcess[str], names: str, line: int | None = None, out: Path | None = None) -> str:
    """Exit 2, one ``error:`` line naming ``names`` (``names:line`` when given), nothing else but warnings.

    Returns the error line. ``out``: the output folder the command was given, which must hold
    no result file afterwards (nothing half-written).
    """
    lines = proc.stderr.splitlines()
    errors = [line_ for line_ in lines if line_.startswith("error:")]
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert len(errors) == 1, proc.stderr
    assert all(line_.startswith(("error:", "warning:")) for line_ in lines), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    where = f"{names}:{line}:" if line is not None else names
    assert where in errors[0], errors[0]
    if out is not None:
        assert written(out) == [], written(out)
    return errors[0]


def warnings_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The ``warning:`` lines of a run that must otherwise be silent on stderr (``--quiet``)."""
    lines = proc.stderr.splitlines()
    assert all(line.startswith("warning:") for line in lines), proc.stderr
    return lines


def write_table(path: Path, rows: list[tuple[str, str]], sep: str = ",", header: bool = True) -> Path:
    """A text/label table (CSV or TSV) with the given rows."""
    frame = pd.DataFrame(rows, columns=["text", "label"])
    frame.to_csv(path, sep=sep, index=False, header=header)
    return path


def synthetic_rows(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (text, label) rows of the synthetic classification task."""
    data = synthetic_task("classification", seed=seed, n_train=n, n_dev=0, n_test=0)
    return [(" ".join(ex.tokens), str(ex.label)) for ex in data.train]


# Timing, and the fingerprint of where the inputs live (absolute paths differ between the two folders).
TIMING_KEYS = frozenset({"seconds", "train_seconds", "fingerprint", "audit"})


def comparable(obj: object, *roots: Path) -> object:
    """A result/metrics JSON without timing fields and with its folders replaced by ``<root>``.

    Two runs of the same seed must agree on everything else, exactly.
    """
    if isinstance(obj, dict):
        return {k: comparable(v, *roots) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [comparable(v, *roots) for v in obj]
    if isinstance(obj, str):
        for root in roots:
            obj = obj.replace(str(root), "<root>")
    return obj


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that ``build(folder)`` fills once per test run. Under xdist the first worker to ask
    builds it (the others wait on a lock) in the run's common temporary folder and every worker
    copies from it; alone, it is built here."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        folder = factory.mktemp(name)
        build(folder)
        return folder
    shared = factory.getbasetemp().parent / name
    with FileLock(str(shared) + ".lock"):
        if not (shared / ".built").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            build(shared)
            (shared / ".built").touch()
    return shared
