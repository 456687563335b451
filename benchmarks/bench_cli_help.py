"""``attnaudit --help`` as a newcomer types it, against the same CLI registering every test first (before).

Each side is a fresh process running what the ``attnaudit`` console script runs, timed in ``--repeats`` interleaved rounds
(:func:`benchmarks.common.time_interleaved`); "before" registers every ``run <test>`` command, as every
invocation did until only ``run`` registered them (importing each test imports torch and transformers).
Writes ``benchmarks/results/cli_help.json``. Run: ``.venv/bin/python -m benchmarks.bench_cli_help [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPEATS, time_interleaved, write_result  # noqa: E402

OURS = "import sys; from attnaudit import cli; sys.argv = ['attnaudit', '--help']; cli.main()"  # the console script's code
BEFORE = "import sys; from attnaudit import cli; cli.register_run_commands(); sys.argv = ['attnaudit', '--help']; cli.main()"


def _run(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout


def main(argv: list[str] | None = None) -> dict:
    """Time both, check they print the same help, write the result file and return its content."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    ours, before = [sys.executable, "-c", OURS], [sys.executable, "-c", BEFORE]
    timing, out = time_interleaved({"ours": lambda: _run(ours), "peer": lambda: _run(before)}, args.repeats)
    if out["ours"] != out["peer"]:
        raise SystemExit("the two commands printed different help")
    payload = {
        "what": "attnaudit --help, a fresh process each: ours (run's test commands registered only for `run`) "
        "against peer = the same CLI registering every test first (the behaviour before)",
        "ours_s": timing["seconds"]["ours"]["median"],
        "before_s": timing["seconds"]["peer"]["median"],
        "timing": timing,
    }
    write_result("cli_help", payload)
    return payload


if __name__ == "__main__":
    print(main())
