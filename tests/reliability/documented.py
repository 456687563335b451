"""Collect the commands the documentation shows, and run them in-process on tiny data.

A documented command that fails is the worst bug we can ship, so the test suite executes
every ``attnaudit ...`` line of the README's code blocks and inline code, and every example
in every ``--help`` text, in a scratch folder laid out like a checkout: ``main/`` (the working
directory, with ``examples/``) beside ``shared/data/`` (tests/fake_data.py: every named dataset
in its real format, a few dozen rows). ``../shared/data`` therefore resolves as in the docs;
absolute ``/tmp/...`` paths are moved into the scratch folder. The built-in synthetic tasks are
shrunk (tests/reliability/tiny_site/sitecustomize.py), also in the worker processes of sweeps, and the
example sweep keeps its first seed and normaliser (:meth:`Workspace._small_sweep`) and the example study two of
its tests (:meth:`Workspace._small_study`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .helpers import in_process

REPO = Path(__file__).resolve().parents[2]
TINY_SITE = Path(__file__).with_name("tiny_site")
# Words that stand for "your run / your folder / your value" in prose. A shown command holding one
# (as a word or a part of a path such as RUN/results) is a pattern and is not run: the convention
# the docs follow to mark a fragment (CONTRIBUTING.md). A prose mention of a command that is not a
# whole command is written without its `attnaudit` prefix (`run norms`), so it is not taken for one.
PLACEHOLDERS = ("RUN", "RUN_DIR", "DIR", "DIR0", "DIR1", "TEST", "TESTS", "NAME", "X", "FOLDER", "SOURCE", "TARGET",
                "PREFIX", "S", "FILE", "PATH", "M", "N", "OUT")
PRODUCERS = ("train", "finetune", "train-nmt")
# Runs the README names that a reproduction script writes (python -m benchmarks.reproduce_base_models
# trains the SST BiLSTM into benchmarks/runs/sst-bilstm): stood in for by the documented run of
# the same model, copied after the producing commands ran.
SCRIPT_RUNS = {"benchmarks/runs/sst-bilstm": "runs/sst"}


@dataclass(frozen=True)
class Documented:
    """One documented command: where it is shown and its words after ``attnaudit``."""

    source: str
    args: tuple[str, ...]

    @property
    def verb(self) -> str:
        return self.args[0] if self.args else ""

    def __str__(self) -> str:
        return f"{self.source}: attnaudit {shlex.join(self.args)}"


# What a shown command may start with before `attnaudit`: environment settings, nice, time.
WRAPPER = re.compile(r"^(?:[A-Z_]+=\S+\s+|nice\s+-n\s*-?\d+\s+|(?:/usr/bin/)?time(?:\s+-v)?\s+)+")


def _placeholder(word: str) -> bool:
    """Whether a word is, or holds as a path or value part, one of :data:`PLACEHOLDERS`."""
    return any(part in PLACEHOLDERS for part in re.split(r"[/=,]", word))


def _shown_words(line: str) -> list[str] | None:
    """The words after ``attnaudit`` in a shell line (comment dropped), patterns included; None when it is prose."""
    line = WRAPPER.sub("", line.split(" # ")[0].split("\t#")[0].strip())
    if not line.startswith("attnaudit "):
        return None
    try:
        return shlex.split(line)[1:]
    except ValueError:
        return None


def _words(line: str) -> list[str] | None:
    """The words after ``attnaudit`` in a shell line (comment dropped), or None when it is prose or a pattern."""
    words = _shown_words(line)
    if not words or any(w in ("...", "[NAME") or w.startswith("<") or _placeholder(w) for w in words):
        return None  # a pattern such as `attnaudit run <test>` or `attnaudit report DIR`, not a command
    return words


def fenced_blocks(text: str) -> tuple[list[tuple[str, str]], str]:
    """The fenced code blocks of a markdown text as (language, body), and the text outside them.

    Fences are paired line by line (a block in another language must not make its closing fence
    look like the opening of the next one)."""
    blocks: list[tuple[str, str]] = []
    prose: list[str] = []
    fence: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        marker = line.strip()
        if fence is None and marker.startswith("```"):
            fence, body = marker[3:].strip(), []
        elif fence is not None and marker == "```":
            blocks.append((fence, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def markdown_commands(path: Path, patterns: bool = False) -> list[Documented]:
    """``attnaudit`` commands in fenced shell blocks (continuations joined) and in inline code; with
    ``patterns``, also the commands holding a placeholder (``attnaudit run probe RUN --out RUN-results``)."""
    words_of = _shown_words if patterns else _words
    blocks, prose = fenced_blocks(path.read_text(encoding="utf-8"))
    found: list[Documented] = []
    for language, body in blocks:
        if language not in ("", "bash", "sh", "shell", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            words = words_of(line)
            if words:
                found.append(Documented(path.name, tuple(words)))
    for span in re.findall(r"`(attnaudit [^`]+)`", prose):
        words = words_of(span)
        if words is not None and len(words) > 1:  # `attnaudit train` alone names a command in prose
            found.append(Documented(path.name, tuple(words)))
    return found


def help_commands() -> list[Documented]:
    """Every ``attnaudit ...`` example line in the help text of every command and ``run`` test."""
    import typer

    from attnaudit import cli

    cli.register_run_commands()
    found: list[Documented] = []

    def visit(command: object, path: str) -> None:
        for line in (getattr(command, "help", None) or "").splitlines():
            line = line.strip().removeprefix("Example:").removeprefix("Examples:").strip()
            words = _words(line)
            if words is not None:
                found.append(Documented(f"{path} --help", tuple(words)))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):  # a hidden alias (run global_adversary) shows the same text
                visit(sub, f"{path} {name}")

    visit(typer.main.get_command(cli.app), "attnaudit")
    return found


class Workspace:
    """The scratch checkout: ``main/`` (cwd) and ``shared/data/`` (fake data)."""

    def __init__(self, root: Path) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        from fake_data import make_fake_data

        self.root = root
        self.main = root / "main"
        self.main.mkdir(parents=True)
        shutil.copytree(REPO / "examples", self.main / "examples")
        self._small_sweep()
        self._small_study()
        make_fake_data(root / "shared" / "data")
        self.producer_failures: list[str] = []

    def _small_sweep(self) -> None:
        """The scratch copy of examples/sweep.yaml with its first seed and normaliser only: 4 jobs
        instead of 16 (both tasks and models, the same engines and code; sparsemax and seeds are
        tested apart), a minute less per test run."""
        path = self.main / "examples" / "sweep.yaml"
        text = path.read_text()
        for old, new in (("seeds: [0, 1]", "seeds: [0]"), ("normalisers: [softmax, sparsemax]", "normalisers: [softmax]")):
            assert old in text, f"examples/sweep.yaml changed: update Workspace._small_sweep ({old})"
            text = text.replace(old, new)
        path.write_text(text)

    def _small_study(self) -> None:
        """The scratch copy of examples/study.yaml with two quick tests instead of six and without SmolLM2: a Hugging
        Face model and a trained one are still audited side by side on the study page (a zero-shot decoder in a
        study, its statistics and ranking are tested apart, in tests/test_study.py), in a third of the time."""
        path = self.main / "examples" / "study.yaml"
        text = path.read_text()
        for old, new in (("only: [importance, permutation, erasure, faithfulness, norms, rollout]", "only: [permutation, norms]"),
                         ("    - smollm2\n", "")):
            assert old in text, f"examples/study.yaml changed: update Workspace._small_study ({old!r})"
            text = text.replace(old, new)
        path.write_text(text)

    @classmethod
    def existing(cls, root: Path) -> Workspace:
        """A workspace already laid out in ``root`` (a copy of a built one)."""
        workspace = cls.__new__(cls)
        workspace.root, workspace.main, workspace.producer_failures = root, root / "main", []
        return workspace

    def add_script_runs(self) -> None:
        """Copy the stand-ins of :data:`SCRIPT_RUNS` into place."""
        for target, source in SCRIPT_RUNS.items():
            if (self.main / source).is_dir():
                shutil.copytree(self.main / source, self.main / target)

    def rewrite(self, args: tuple[str, ...]) -> list[str]:
        """Absolute ``/tmp/...`` paths moved under the scratch folder; everything else as shown."""
        return [re.sub(r"^/tmp/", f"{self.root}/tmp/", a) for a in args]

    def run(self, args: tuple[str, ...] | list[str]) -> tuple[int, str, str]:
        """``attnaudit ARGS`` in this process (as the console script runs it): exit code, stdout, stderr."""
        return in_process(list(args), self.main)


def tiny_environment() -> dict[str, str]:
    """Environment that shrinks the synthetic tasks in this process's children (sweep workers)."""
    path = os.pathsep.join(p for p in (str(TINY_SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "ATTNAUDIT_TEST_TINY_SYNTHETIC": "1"}


DOCS = REPO / "docs"


def documented_commands() -> list[Documented]:
    """The README's commands, the docs pages', then every ``--help`` example, in the order shown; a command
    shown word for word in several places is run once, where it first appears (a second run of the same
    command in the same workspace would only repeat the first: 24 such repeats, over a minute of make test)."""
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
    shown = [c for page in pages if page.exists() for c in markdown_commands(page)] + help_commands()
    first: dict[tuple[str, ...], Documented] = {}
    for command in shown:
        first.setdefault(tuple(command.args), command)
    return list(first.values())
