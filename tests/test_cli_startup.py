"""``attnaudit --help`` and each command's ``--help`` start without torch or transformers.

The tests' ``run <test>`` commands are generated from every registered test, whose modules import torch;
they are registered only when ``run`` is invoked, so the help a newcomer types first costs a fraction of
a second (``benchmarks/bench_cli_help.py`` measures it), not the ~7 CPU-seconds of importing every test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import sys
sys.argv = ["attnaudit", *{args!r}]
from attnaudit.cli import main
code = 0
try:
    main()
except SystemExit as exit:
    code = exit.code
heavy = sorted(name for name in ("torch", "transformers", "pandas", "attnaudit.experiments") if name in sys.modules)
print("HEAVY=" + ",".join(heavy), "CODE=" + str(code), file=sys.stderr)
"""


def plain_environment() -> dict[str, str]:
    """This process's environment without the documented-commands fixture's tiny site (tests/reliability), whose
    sitecustomize imports torch: that session-wide setting would otherwise decide this test by the order tests run in."""
    env = {k: v for k, v in os.environ.items() if k != "ATTNAUDIT_TEST_TINY_SYNTHETIC"}
    kept = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p and os.path.basename(p.rstrip(os.sep)) != "tiny_site"]
    return env | ({"PYTHONPATH": os.pathsep.join(kept)} if kept else {})


def imported(*args: str) -> tuple[list[str], str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(args=list(args))], capture_output=True, text=True, timeout=120,
                          env=plain_environment())
    line = done.stderr.strip().splitlines()[-1]
    heavy = line.split()[0].removeprefix("HEAVY=")
    return [name for name in heavy.split(",") if name], line.split()[1].removeprefix("CODE=")


@pytest.mark.parametrize("args", [("--help",), ("explain", "--help"), ("audit", "--help"), ("train", "--help")])
def test_help_imports_no_model_library(args: tuple[str, ...]) -> None:
    heavy, code = imported(*args)
    assert heavy == [] and code in ("0", "None")


def test_run_still_lists_every_registered_test() -> None:
    done = subprocess.run([sys.executable, "-m", "attnaudit.cli", "run", "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "importance" in done.stdout and "permutation" in done.stdout
