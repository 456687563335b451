"""Every command the README and the ``--help`` texts show runs, on tiny data (issue: a documented
command broke while the suite stayed green). See tests/reliability/documented.py for how the
commands are found and where they run."""

from __future__ import annotations

from attnaudit.experiments import discover

from .documented import PLACEHOLDERS, PRODUCERS, Documented, Workspace, documented_commands

COMMANDS = documented_commands()


def _resolve(command: Documented) -> list[str]:
    """A prose placeholder (``attnaudit run uniform RUN``) becomes the run that test's own
    examples name; nothing else changes."""
    args = list(command.args)
    if args[0] == "run" and any(a in PLACEHOLDERS for a in args):
        run = discover()[args[1]].examples[0].split()[0]
        args = [run if a in PLACEHOLDERS else a for a in args]
    return args


def test_documentation_shows_commands() -> None:
    verbs = {c.verb for c in COMMANDS}
    assert {"train", "run", "audit", "report", "finetune", "sweep", "demo", "train-nmt", "evaluate"} <= verbs
    tested = {c.args[1] for c in COMMANDS if c.verb == "run"}
    assert set(discover()) <= tested, f"tests without a documented example: {set(discover()) - tested}"


def test_every_producing_command_runs(docs_workspace: Workspace) -> None:
    assert docs_workspace.producer_failures == []


def test_every_documented_command_runs(docs_workspace: Workspace) -> None:
    """All of them in the order shown, in one test: later commands read what earlier ones wrote
    (`report audits/sst` after `audit --run runs/sst --out audits/sst`). Every failure is listed."""
    failures = []
    for command in COMMANDS:
        if command.verb in PRODUCERS:
            continue
        code, out, err = docs_workspace.run(docs_workspace.rewrite(tuple(_resolve(command))))
        if code != 0 or "Traceback" in err:
            failures.append(f"{command}\nexit {code}\n{err[-1500:]}\n{out[-300:]}")
    assert not failures, "\n\n".join(failures)
