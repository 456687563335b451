"""CLI helpers: comma-separated sequences map onto the Options field types."""

from __future__ import annotations

import pytest

from attnaudit.cli import _parse_sequence
from attnaudit.errors import AttnAuditError


def test_parse_sequence_types() -> None:
    assert _parse_sequence("0, 0.5,2", list[float]) == [0.0, 0.5, 2.0]
    assert _parse_sequence("1,2", tuple[int, ...]) == (1, 2)
    assert _parse_sequence("a,b", list[str] | None) == ["a", "b"]
    with pytest.raises(AttnAuditError, match="comma-separated list of float"):
        _parse_sequence("x", list[float])


def test_parse_sequence_refuses_an_empty_list() -> None:
    with pytest.raises(AttnAuditError, match="empty list"):
        _parse_sequence(" , ", list[float])
