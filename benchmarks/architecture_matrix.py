"""``python -m benchmarks.architecture_matrix``: every catalogued Hugging Face architecture through attnaudit.

For each of the tiny random models of :mod:`attnaudit.architectures` (48 families: decoders, encoders,
encoder-decoders): :func:`attnaudit.architectures.check` (captured weights, logits, a weight replacement
and a restart against transformers' own eager forward; the generated tokens' distributions and the row-only
capture against the full one), then, from a saved folder as a user would pass
it, ``attnaudit explain`` (decoders: two generated tokens; encoder-decoders: each token of a forced target)
and an audit of every test that applies among ``importance``, ``permutation``
and ``erasure`` (encoder-decoders: ``alignment`` and ``identifiability`` on a tiny German–English set).
Writes ``benchmarks/results/architectures.json``; ``python -m benchmarks.table`` puts its summary in the
README (the models table). ``tests/test_architectures.py`` runs the same checks in ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attnaudit.architectures import CHECKS, TOLERANCE, check, end_to_end, list_architectures, save_tiny, write_reviews
from benchmarks.common import RESULTS, write_result


def run_command(line: str) -> str | None:
    """Run one ``attnaudit`` command line in this process; None when it exits 0, else its last line of output."""
    import shlex

    from attnaudit import cli

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["attnaudit", *shlex.split(line)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv = argv
    if not code:  # main returns None or 0 on success
        return None
    lines = (err.getvalue() or out.getvalue()).strip().splitlines()
    return lines[-1] if lines else f"exit {code}"


def measure(model_type: str, workdir: Path, reviews: Path, data_dir: Path) -> dict[str, Any]:
    """One architecture's row: the adapter checks and the end-to-end commands' outcome."""
    started = time.perf_counter()
    row = check(model_type)
    generates = row["generation"] is None if row["kind"] == "encoder" else row["generation"] <= TOLERANCE
    rows_only = row["rows"] is None if row["kind"] == "encoder-decoder" else row["rows"] <= TOLERANCE
    rows_only = rows_only and (row["kind"] == "encoder-decoder" or row["logits_only"] <= TOLERANCE)
    row["passes"] = all(row[name] is not None and row[name] <= TOLERANCE for name in CHECKS) and row["intervention_changes"]
    row["passes"] = row["passes"] and generates and rows_only
    folder = save_tiny(model_type, workdir / model_type)
    failures = [f for f in (run_command(line) for line in end_to_end(model_type, folder, reviews, data_dir)) if f]
    row["end_to_end"] = "ok" if not failures else failures[0]
    row["passes"] = row["passes"] and not failures
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per kind: how many architectures pass every check, of how many."""
    kinds: dict[str, dict[str, int]] = {}
    for row in rows:
        counts = kinds.setdefault(row["kind"], {"passed": 0, "total": 0})
        counts["total"] += 1
        counts["passed"] += bool(row["passes"])
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated model types (default: all)")
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else list_architectures()
    from tests.fake_data import make_fake_data  # the tiny German-English set the test suite uses

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        reviews, data_dir = write_reviews(workdir), make_fake_data(workdir / "data")
        for model_type in chosen:
            rows.append(measure(model_type, workdir, reviews, data_dir))
            print(f"{model_type}: {'passes' if rows[-1]['passes'] else 'FAILS'} ({rows[-1]['end_to_end']}, {rows[-1]['seconds']} s)", flush=True)
    result = {
        "name": "architectures",
        "what": "tiny random models (attnaudit.architectures) checked against transformers' eager forward, then explained and audited",
        "tolerance": TOLERANCE,
        "checks": list(CHECKS),
        "summary": summary(rows),
        "architectures": rows,
        "reproduce": "python -m benchmarks.architecture_matrix",
    }
    path = write_result("architectures", result)
    print(f"wrote {path.relative_to(RESULTS.parent.parent)}")
    return 0 if all(row["passes"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
