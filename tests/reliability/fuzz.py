"""The CLI fuzzer's schema, values and promise (tests/reliability/test_cli_fuzz.py runs it).

Every command and option comes from the code: the typer commands' signatures (``app.registered_commands``,
each parameter's ``typer.Option``/``typer.Argument``) and, for ``attnaudit run <test>``, the test's
``Options`` dataclass (the fields and their type hints that ``cli._make_run_command`` turns into options).
Each option gets the hostile values of its kind (0, -1, huge, NaN, inf, empty, unicode, control
characters, very long text, paths that are files / missing / folders / inside the run folder), put into a
command line that is valid and tiny without it (:data:`BASES`), and :func:`check` asserts the promise:
exit 0, 2 or 130; a failure is one ``error:`` line (``warning:`` lines allowed), never a traceback or
"failed unexpectedly"; nothing half-written in a fresh ``--out``; the inputs byte for byte unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import shutil
import signal
import typing
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from typer.models import ArgumentInfo, OptionInfo

from attnaudit.options import optional_inner, sequence_item

from .helpers import cli, written

# --------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
class Option:
    """One option (or positional argument) of one command: ``kind`` chooses its hostile values."""

    command: tuple[str, ...]
    flag: str | None  # None: the positional argument
    kind: str  # int, float, text, path, flag, list-int, list-float, list-text
    off: str | None = None  # a switch's negative form (--no-figures)

    def __str__(self) -> str:
        return f"{' '.join(self.command)} {self.flag or '<argument>'}"


def _kind(hint: Any) -> str:
    inner, _ = optional_inner(hint)
    item = sequence_item(inner)
    if item is not None:
        return "text" if item is str else f"list-{_kind(item)}"
    return {int: "int", float: "float", str: "text", bool: "flag"}.get(inner, "path" if inner is Path else "text")


def _info(annotation: Any) -> tuple[Any, OptionInfo | ArgumentInfo]:
    """The type and the typer parameter of an ``Annotated[T, typer.Option(...)]`` parameter."""
    base, *extra = typing.get_args(annotation)
    info = next(e for e in extra if isinstance(e, (OptionInfo, ArgumentInfo)))
    return base, info


def _option(command: tuple[str, ...], name: str, annotation: Any, kind: str | None = None) -> Option:
    base, info = _info(annotation)
    kind = kind or _kind(base)
    if isinstance(info, ArgumentInfo):
        return Option(command, None, kind)
    decls = ([info.default] if isinstance(info.default, str) else []) + list(info.param_decls or [])
    longs = [part for decl in decls for part in decl.split("/") if part.startswith("--")]
    flag = longs[0] if longs else "--" + name.replace("_", "-")
    if kind != "flag" or base is not bool:
        return Option(command, flag, kind)
    # A switch declared "--on/--off" has both forms; one declared as "--quiet" only itself; an undeclared one both (typer).
    off = longs[1] if len(longs) > 1 else (None if decls else "--no-" + flag[2:])
    return Option(command, flag, kind, off)


def _signature_options(command: tuple[str, ...], callback: Any, kinds: dict[str, str] | None = None) -> list[Option]:
    hints = typing.get_type_hints(callback, include_extras=True) if not hasattr(callback, "__signature__") else {}
    options = []
    for parameter in inspect.signature(callback).parameters.values():
        annotation = hints.get(parameter.name, parameter.annotation)
        options.append(_option(command, parameter.name, annotation, (kinds or {}).get(parameter.name)))
    return options


COMMON_RUN = ("run_dir", "split", "limit", "limit_order", "seed", "out", "hf", "task", "prompt", "verbalizer", "chat", "system", "items",
              "max_length", "dtype", "device_map", "max_memory", "data_dir", "device", "segments", "quiet")
"""The options every ``attnaudit run <test>`` shares (cli._make_run_command), apart from the test's own."""


def schema() -> dict[tuple[str, ...], tuple[list[Option], list[Option]]]:
    """Every command: (its own options, the ``run`` commands' shared options) from the code."""
    from attnaudit import cli
    from attnaudit.experiments import discover

    cli.register_run_commands()
    found: dict[tuple[str, ...], tuple[list[Option], list[Option]]] = {}
    for info in cli.app.registered_commands:
        assert info.callback is not None
        name = info.name or info.callback.__name__.replace("_", "-")
        found[(name,)] = (_signature_options((name,), info.callback), [])
    registered = {c.name: c.callback for c in cli.run_app.registered_commands if not c.hidden}
    for test, experiment in discover().items():
        hints = typing.get_type_hints(experiment.Options)
        kinds = {f.name: _kind(hints[f.name]) for f in fields(experiment.Options)}
        options = _signature_options(("run", test), registered[test], kinds)
        own = [o for o, p in zip(options, inspect.signature(registered[test]).parameters) if p not in COMMON_RUN]
        shared = [o for o, p in zip(options, inspect.signature(registered[test]).parameters) if p in COMMON_RUN]
        assert {(o.flag or "")[2:].replace("-", "_") for o in own} == set(kinds), test  # the CLI is the Options schema
        found[("run", test)] = (own, shared)
    return found


# --------------------------------------------------------------------------- the values

LONG = "x" * 5000
UNICODE = "é日本語🙂\u202e"
CONTROL = "a\x01b\x1b[31mc\x7f"
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

VALUES: dict[str, list[str]] = {
    "int": ["0", "-1", "2147483648", "99999999999999999999999", "nan", "inf", "", "1.5", "\u0663", " 7", "0x10", "1e3"],
    "float": ["0", "-1", "nan", "inf", "-inf", "1e400", "1e-320", "", "1,5", "abc", UNICODE],
    "text": ["", " ", CONTROL, UNICODE, LONG, "-1", "nan", "{text}", "../../..", "\n", "none", "a,,b", "inf"],
    "list-int": ["", ",", "0", "-1", "1,nan", "99999999999999999999", "1;2", "\u0663", LONG],
    "list-float": ["", ",", "nan", "inf", "-1", "1e400", "0,abc", "-inf,1"],
    "list-text": ["", ",", "bogus", "attention,bogus", CONTROL, UNICODE, LONG],
    "path": ["@missing", "@file", "@dir", "@inside", "@run", "", "@unicode", "@control", "@long"],
    "flag": ["@on", "@off"],
}
"""The hostile values of each kind, as typed on a command line; ``@name``: a path of the workspace
(:meth:`Workspace.path`), ``@on``/``@off``: a switch given / its negative form."""


def values(option: Option) -> list[str]:
    """The hostile values of an option (a switch without a negative form: given)."""
    if option.kind == "flag":
        return ["@on", "@off"] if option.off else ["@on"]
    return VALUES[option.kind]


# --------------------------------------------------------------------------- the tiny workspace

BASES: dict[str, list[str]] = {
    "train": ["--task", "csv:@train", "--test", "csv:@test", "--model", "bilstm", "--out", "@out", "--epochs", "1",
              "--embed-dim", "4", "--hidden-dim", "4", "--quiet"],
    "evaluate": ["@run", "--quiet"],
    "datasets": [],
    "models": [],
    "tests": ["--run", "@run"],
    "explain": ["--run", "@run", "--text", "@words", "--method", "attention", "--out", "@out", "--quiet"],
    "explanations": ["@run"],
    "finetune": ["--hf", "@bert", "--task", "csv:@train", "--out", "@out", "--limit", "8", "--epochs", "1", "--quiet"],
    "audit": ["--run", "@run", "--only", "importance", "--limit", "4", "--no-figures", "--heatmaps", "1", "--explore", "2",
              "--out", "@out", "--quiet", "--set", "importance.methods=gradient"],
    "report": ["@results", "--heatmaps", "1", "--explore", "2", "--quiet"],
    "demo": ["--quick", "--out", "@out", "--quiet"],
    "sweep": ["@sweep", "--workers", "1", "--out", "@out", "--quiet"],
    "train-nmt": ["--task", "synthetic-translation", "--out", "@out", "--epochs", "1", "--max-steps", "2", "--layers", "1",
                  "--heads", "1", "--d-model", "8", "--d-ff", "8", "--quiet"],
    "run": ["@run", "--limit", "4", "--out", "@out", "--quiet"],
}
"""A valid, tiny command line per command (``run``: per test, plus :data:`RUN_TINY`); ``@name``: a workspace path."""

RUN_TINY: dict[str, list[str]] = {
    "adversarial": ["--adversaries", "1", "--steps", "2"],
    "diagnostic": ["--seeds", "0", "--epochs", "1"],
    "erasure": ["--random-orders", "1"],
    "faithfulness": ["--methods", "attention", "--resamples", "10", "--curve-steps", "2"],
    "global-adversary": ["--lambdas", "0.1", "--epochs", "1"],
    "importance": ["--methods", "gradient"],
    "key-adversary": ["--epochs", "1", "--hidden", "4"],
    "opposite-keys": ["--epochs", "1", "--hidden", "4"],
    "random-keys": ["--epochs", "1", "--hidden", "4"],
    "permutation": ["--permutations", "2"],
    "probe": ["--lambdas", "0.1", "--seeds", "0", "--epochs", "1", "--variants", "uniform"],
    "rationale": ["--methods", "attention"],
    "seeds": ["--seeds", "1", "--epochs", "1"],
    "uniform": ["--seeds", "0", "--epochs", "1"],
    "shuffle": ["--repeats", "1"],
    "activation-swap": ["--normalisers", "sparsemax"],
}


def base(command: tuple[str, ...]) -> list[str]:
    """The valid tiny command line of ``command`` (without the program name)."""
    if command[0] == "run":
        return ["run", command[1], *BASES["run"], *RUN_TINY.get(command[1], [])]
    return [command[0], *BASES[command[0]]]


def with_value(words: list[str], option: Option, value: str) -> list[str]:
    """``words`` with ``option`` set to ``value`` (replacing the base's value; a switch given or negated)."""
    words = list(words)
    if option.flag is None:  # the positional argument: the first @path after the command's name(s)
        at = next(i for i, w in enumerate(words) if w.startswith("@") and i >= (2 if words[0] == "run" else 1))
        words[at] = value
        return words
    for flag in {option.flag, option.off} - {None}:
        while flag in words:
            at = words.index(flag)
            del words[at:at + (1 if option.kind == "flag" else 2)]
    if option.kind == "flag":
        return [*words, str(option.off if value == "@off" and option.off else option.flag)]
    return [*words, option.flag, value]


class Workspace:
    """The tiny inputs (a trained run, two CSVs, two tiny Hugging Face models, a results folder, a sweep
    file) and fresh output folders; :meth:`digest` hashes every input file."""

    def __init__(self, root: Path, run: Path, words: str) -> None:
        self.root, self.words, self.count = root, words, 0
        self.inputs = root / "inputs"
        self.run = run  # inside self.inputs
        self.cwd = root / "cwd"
        self.cwd.mkdir(parents=True, exist_ok=True)
        # The results `report` reads (what it writes beside them, report.html, heatmaps.json..., is its output).
        self.read_by_report = sorted(str(p.relative_to(root / "results")) for p in (root / "results").rglob("*") if p.is_file())

    def path(self, name: str, out: Path) -> str:
        """The workspace path ``@name`` stands for (``out``: this case's fresh output folder)."""
        special = {
            "out": out, "run": self.run, "train": self.inputs / "train.csv", "test": self.inputs / "test.csv",
            "bert": self.inputs / "bert", "results": self.root / "results", "sweep": self.inputs / "sweep.yaml",
            "missing": self.root / "missing" / "nothing", "file": self.inputs / "train.csv", "dir": out.parent / (out.name + "-empty"),
            "inside": self.run / "inside", "unicode": out.parent / (out.name + UNICODE), "control": out.parent / (out.name + CONTROL),
            "long": out.parent / LONG,
        }
        if name == "words":
            return self.words
        if name == "dir":
            special["dir"].mkdir(parents=True, exist_ok=True)
        return str(special[name])

    def resolve(self, words: list[str], out: Path) -> list[str]:
        resolved = []
        for word in words:
            if word.startswith("csv:@"):
                resolved.append("csv:" + self.path(word[5:], out))
            elif word.startswith("@") and word not in ("@on", "@off"):
                resolved.append(self.path(word[1:], out))
            else:
                resolved.append(word)
        return resolved

    def digest(self) -> dict[str, str]:
        """The hash of every input file (the run, the data, the models, the sweep file, the results read by `report`)."""
        files = [p for p in sorted(self.inputs.rglob("*")) if p.is_file()]
        files += [self.root / "results" / name for name in self.read_by_report]
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}

    def fresh_out(self) -> Path:
        self.count += 1
        return self.root / "outs" / f"case{self.count}"


# --------------------------------------------------------------------------- the promise

PRODUCERS = frozenset({"train", "finetune", "train-nmt", "demo", "sweep"})
"""Commands that write a new run (or runs) into their --out and read no run."""


@dataclass
class Outcome:
    words: list[str]
    code: int
    stderr: str
    stdout: str


class OverBudget(BaseException):
    """A case ran past its CPU budget (a BaseException: the CLI's own handlers let it through)."""


@contextlib.contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """Raise :class:`OverBudget` once this process has spent ``seconds`` of CPU time in the block."""
    def over(*_: object) -> None:
        raise OverBudget

    previous = signal.signal(signal.SIGVTALRM, over)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


BUDGET = float(os.environ.get("FUZZ_BUDGET", "30"))
"""CPU-seconds a case may take: the tiny inputs need well under 5; a value that starts unbounded work (two
billion epochs) is stopped here and reported as such."""


def attempt(workspace: Workspace, words: list[str]) -> tuple[Outcome, list[str]]:
    """Run ``attnaudit WORDS`` (``@name`` resolved) in this process; the outcome and every broken promise."""
    out = workspace.fresh_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    resolved = workspace.resolve(words, out)
    before = workspace.digest()
    try:
        with cpu_budget(BUDGET):
            proc = cli(*resolved, cwd=workspace.cwd)
    except OverBudget:
        outcome = Outcome(resolved, -1, "", "")
        restore(workspace)
        shutil.rmtree(out.parent, ignore_errors=True)
        return outcome, [f"still working after {BUDGET:.0f} CPU-seconds: no bound on the time this value asks for"]
    outcome = Outcome(resolved, proc.returncode, proc.stderr, proc.stdout)
    broken = promise(outcome, out)
    after = workspace.digest()
    if after != before:
        # A command that writes a new run may make it anywhere, inside another run's folder too; one that
        # reads the run must add nothing to it; none may change or remove an input file.
        changed = sorted(k for k in before if before[k] != after.get(k) and not _named_out(words, resolved, k))
        added = [] if words[0] in PRODUCERS else sorted(set(after) - set(before))
        if changed or added:
            broken.append(f"inputs changed: {changed[:3]}, added: {added[:3]}")
        restore(workspace)
    for leftover in workspace.cwd.iterdir():  # `--out ''` is the working folder: emptied for the next case
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    shutil.rmtree(out.parent, ignore_errors=True)
    return outcome, broken


def _named_out(words: list[str], resolved: list[str], file: str) -> bool:
    """Whether ``file`` lies in the folder a producing command was given as ``--out``: training into an existing
    run's folder retrains it in place, by design (training/checkpoint.py ``refuse_other_run``; refused when the
    run holds test results)."""
    if words[0] not in PRODUCERS or "--out" not in resolved:
        return False
    out = Path(resolved[len(resolved) - 1 - resolved[::-1].index("--out") + 1])
    return out in Path(file).parents


def promise(outcome: Outcome, out: Path) -> list[str]:
    """The broken parts of the promise: exit 0/2/130; on failure one ``error:`` line (warnings allowed);
    no traceback, no "failed unexpectedly"; after exit 2 no result file in the fresh output folder."""
    broken = []
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if outcome.code not in (0, 2, 130):
        broken.append(f"exit {outcome.code}")
    if "Traceback" in outcome.stderr + outcome.stdout or "failed unexpectedly" in outcome.stderr:
        broken.append("traceback or unexpected failure")
    if outcome.code != 0 and len(errors) != 1:
        broken.append(f"{len(errors)} error lines")
    if any(not line.startswith(("error:", "warning:")) for line in lines):
        broken.append("stderr holds lines that are neither error: nor warning:")
    if any(ord(c) < 32 and c != "\t" or 127 <= ord(c) < 160 or c in BIDI for c in "".join(lines)):
        broken.append("a control character (an escape sequence, a bidirectional override) reaches the terminal")
    if outcome.code == 2 and written(out):
        broken.append(f"half-written: {[p.name for p in written(out)]}")
    return broken


def restore(workspace: Workspace) -> None:
    """Put the pristine inputs back after a case changed them (the next cases judge their own effect)."""
    pristine = workspace.root / "pristine"
    shutil.rmtree(workspace.inputs)
    shutil.copytree(pristine, workspace.inputs)


def show(outcome: Outcome, broken: list[str]) -> str:
    words = " ".join(repr(w) if (not w or any(c in w for c in " \n\x01")) else w for w in outcome.words)
    words = words.replace(LONG, "x*5000")
    tail = outcome.stderr.strip().replace(LONG, "x*5000")[-600:]
    return f"attnaudit {words}\n    exit {outcome.code}; {'; '.join(broken)}\n    stderr: {tail!r}"


