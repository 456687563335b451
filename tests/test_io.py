"""Atomic writes leave either the complete file or nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnaudit.errors import InputError
from attnaudit.io import atomic_write, atomic_write_json, read_json


def test_json_round_trip_converts_arrays_and_non_finite(tmp_path: Path) -> None:
    path = atomic_write_json(tmp_path / "r.json", {"a": np.arange(3), "b": torch.tensor([1.5]), "c": math.nan, "d": (1, 2)})
    assert read_json(path) == {"a": [0, 1, 2], "b": [1.5], "c": None, "d": [1, 2]}


def test_failed_writer_leaves_no_file_and_keeps_old_content(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")

    def boom(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("killed midway")

    with pytest.raises(RuntimeError):
        atomic_write(target, boom)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_read_json_reports_line_of_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(InputError, match=r"bad\.json:3: invalid JSON"):
        read_json(path)
    with pytest.raises(InputError, match="file not found"):
        read_json(tmp_path / "missing.json")
    assert json.loads(atomic_write_json(tmp_path / "x.json", {}).read_text()) == {}


def test_digest_ignores_key_order_and_csv_cell_keeps_scalars() -> None:
    from attnaudit.io import csv_cell, digest

    assert digest({"a": 1, "b": [2, 3]}) == digest({"b": [2, 3], "a": 1}) != digest({"a": 1, "b": [3, 2]})
    assert len(digest({})) == 16
    assert csv_cell({"x": [1, 2]}) == '{"x": [1, 2]}' and csv_cell((1, 2)) == "[1, 2]"
    assert csv_cell(0.5) == 0.5 and csv_cell("text") == "text" and csv_cell(None) is None
