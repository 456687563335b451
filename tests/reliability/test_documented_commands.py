"""Every command the README and the ``--help`` texts show runs, on tiny data (issue: a documented
command broke while the suite stayed green). See tests/reliability/documented.py for how the
commands are found and where they run."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnaudit.errors import AttnAuditError
from attnaudit.experiments import discover
from attnaudit.io import refuse_inside

from .documented import DOCS, PLACEHOLDERS, PRODUCERS, REPO, Documented, Workspace, _words, documented_commands, markdown_commands

COMMANDS = documented_commands()


def _resolve(command: Documented) -> list[str]:
    """The command's words (commands holding a placeholder are patterns, never collected)."""
    assert not any(a in PLACEHOLDERS for a in command.args), command
    return list(command.args)


def _outputs(args: list[str]) -> list[str]:
    return [value for flag, value in zip(args, args[1:]) if flag == "--out"]


def chains(commands: list[Documented]) -> list[list[Documented]]:
    """The non-producing commands grouped so that one which reads what another wrote (its ``--out``
    folder or a path inside it: ``report audits/sst`` after ``audit ... --out audits/sst``) runs
    after it in the same group, in the order shown; unrelated groups can run on different workers."""
    shown = [c for c in commands if c.verb not in PRODUCERS]
    parent = list(range(len(shown)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    writer: dict[str, int] = {}
    for i, command in enumerate(shown):
        args = _resolve(command)
        for arg in args:
            for path, j in writer.items():
                if arg == path or arg.startswith(path.rstrip("/") + "/"):
                    parent[root(i)] = root(j)
        for path in _outputs(args):
            writer[path] = i
    groups: dict[int, list[Documented]] = {}
    for i, command in enumerate(shown):
        groups.setdefault(root(i), []).append(command)
    return list(groups.values())


CHAINS = chains(COMMANDS)


def test_documentation_shows_commands() -> None:
    verbs = {c.verb for c in COMMANDS}
    assert {"train", "run", "audit", "report", "finetune", "sweep", "demo", "train-nmt", "evaluate"} <= verbs
    tested = {c.args[1] for c in COMMANDS if c.verb == "run"}
    assert set(discover()) <= tested, f"tests without a documented example: {set(discover()) - tested}"


def test_commands_after_a_block_in_another_language_are_found(tmp_path: Path) -> None:
    """A python block's closing fence once paired with the next bash block's opening, so the bash
    commands after it were read as prose and never run (5 README commands)."""
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\ntext `attnaudit tests --hf minilm`\n\n```bash\n"
                    "attnaudit report audits/sst --explore 100   # comment\nattnaudit train \\\n  --task sst\n```\n"
                    "```yaml\nattnaudit: not a command\n```\n", encoding="utf-8")
    found = [c.args for c in markdown_commands(page)]
    assert found == [("report", "audits/sst", "--explore", "100"), ("train", "--task", "sst"), ("tests", "--hf", "minilm")]


def test_wrapped_commands_are_found_and_patterns_are_not() -> None:
    assert _words("nice -n 5 /usr/bin/time -v attnaudit tests --hf smollm2") == ["tests", "--hf", "smollm2"]
    assert _words("OMP_NUM_THREADS=1 attnaudit datasets") == ["datasets"]
    assert _words("nice -n 5 attnaudit audit --hf smollm2 --out DIR --only TESTS") is None
    assert _words("niceattnaudit tests") is None


def _writes_inside_what_it_reads(args: tuple[str, ...], root: Path) -> bool:
    """Whether the commands' own rule (io.refuse_inside: ``run`` may name the run's ``results``, nothing else inside
    it) refuses a shown command's ``--out`` against the run it reads (``run TEST RUN``, ``--run RUN``), with the paths
    laid out under ``root``."""
    flags = dict(zip(args, args[1:]))
    read = [flags[f] for f in ("--run",) if f in flags] + ([args[2]] if args[0] == "run" and len(args) > 2 else [])
    out = flags.get("--out")
    for folder in read if out is not None else []:
        (root / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
        try:
            refuse_inside(root / str(out).lstrip("/"), root / folder.lstrip("/"), allowed="results" if args[0] == "run" else None)
        except AttnAuditError:
            return True
    return False


def test_no_shown_command_or_pattern_writes_inside_the_folder_it_reads(tmp_path: Path) -> None:
    """The commands read a run and refuse an ``--out`` inside it (io.refuse_inside). The training-tests page still showed
    patterns such as ``attnaudit run global-adversary RUN --out RUN/results/kl-token-small`` that now stop with exit 2,
    and the reproduction script wrote there too. Patterns are never run, so they are checked here."""
    assert _writes_inside_what_it_reads(("run", "probe", "RUN", "--out", "RUN/results/kl-token"), tmp_path)
    assert _writes_inside_what_it_reads(("audit", "--run", "runs/sst", "--out", "runs/sst"), tmp_path)
    assert not _writes_inside_what_it_reads(("run", "probe", "RUN", "--out", "RUN/results"), tmp_path)
    assert not _writes_inside_what_it_reads(("run", "probe", "RUN", "--out", "RUN-results/kl-token"), tmp_path)
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
    shown = [c for page in pages for c in markdown_commands(page, patterns=True)]
    assert any(c.args[:2] == ("run", "global-adversary") and "RUN" in c.args for c in shown)  # the patterns are read
    assert [str(c) for c in shown if _writes_inside_what_it_reads(c.args, tmp_path / "checkout")] == []


def test_chains_keep_every_command_once_and_readers_after_writers() -> None:
    flat = [c for chain in CHAINS for c in chain]
    assert sorted(map(str, flat)) == sorted(str(c) for c in COMMANDS if c.verb not in PRODUCERS)
    assert len(CHAINS) > 1
    for chain in CHAINS:
        order = [COMMANDS.index(c) for c in chain]
        assert order == sorted(order)
    grouped = {str(c): i for i, chain in enumerate(CHAINS) for c in chain}
    for command in flat:
        if command.verb == "report":  # `report audits/sst` reads the audit that wrote audits/sst
            writers = [c for c in flat if _outputs(_resolve(c)) == [command.args[1]]]
            assert writers and all(grouped[str(w)] == grouped[str(command)] for w in writers), command


def test_every_producing_command_runs(docs_workspace: Workspace) -> None:
    assert docs_workspace.producer_failures == []


SLOW = ("attnaudit sweep examples/sweep.yaml --engine ray", "attnaudit demo")
"""Chains run with the slow tests (``make test-all``) to keep ``make test`` under 10 minutes: the one that starts a Ray
cluster (~25 s; the Ray sweep engine itself is tested in ``make test``, tests/test_sweep.py) and the documented demo
pair (~70 s; the quick demo is tested in ``make test``, tests/test_demo.py)."""


def _marked(chain: list[Documented]) -> object:
    """A chain as a test parameter, marked slow when it starts with one of :data:`SLOW`."""
    return pytest.param(chain, marks=pytest.mark.slow) if any(s in str(chain[0]) for s in SLOW) else chain


@pytest.mark.parametrize("chain", [_marked(chain) for chain in CHAINS], ids=[str(chain[0])[:80] for chain in CHAINS])
def test_every_documented_command_runs(docs_workspace: Workspace, chain: list[Documented]) -> None:
    """The commands of one chain in the order shown: later ones read what earlier ones wrote.
    Every failure is listed."""
    failures = []
    for command in chain:
        code, out, err = docs_workspace.run(docs_workspace.rewrite(tuple(_resolve(command))))
        if code != 0 or "Traceback" in err:
            failures.append(f"{command}\nexit {code}\n{err[-1500:]}\n{out[-300:]}")
    assert not failures, "\n\n".join(failures)
