"""A run directory whose config records a kind no loader is registered for (another program's,
or a newer attnaudit's) is refused in one line naming its config and the known kinds; before,
it was read as an attnaudit run."""

from __future__ import annotations

import json
from pathlib import Path

from .helpers import assert_clean_failure, cli


def test_run_of_an_unknown_kind_is_refused_in_one_line(run_copy: Path) -> None:
    config = run_copy / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "kind": "other-program"}))
    before = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()}
    error = assert_clean_failure(cli("run", "importance", run_copy, "--limit", "5", "--quiet"), str(config))
    assert error.endswith("unknown run kind 'other-program'; known kinds: attnaudit, hf, nmt"), error
    assert {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()} == before
