"""attnaudit.options: one reader for `run <test> --opt`, `--set TEST.OPTION=V` and sweep YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.audit import parse_settings
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import discover
from attnaudit.options import SEED_MAX, check_seed, check_value, conforms, parse_text, type_name
from attnaudit.sweep import load_config


def test_parse_text_follows_the_hint() -> None:
    assert parse_text("0, 0.5,2", list[float], "--x") == [0.0, 0.5, 2.0]
    assert parse_text("1,2", tuple[int, ...], "--x") == (1, 2)
    assert parse_text("a,b", list[str] | None, "--x") == ["a", "b"]
    assert parse_text("none", int | None, "--x") is None
    assert parse_text("yes", bool, "--x") is True
    assert parse_text("7", int, "--x") == 7


@pytest.mark.parametrize(
    ("text", "hint", "message"),
    [
        ("x", list[float], "--x: expected comma-separated float values, got 'x'"),
        (" , ", list[float], "--x: empty list"),
        ("1.5", int, "--x: expected int, got '1.5'"),
        ("many", int | None, "--x: expected int or none, got 'many'"),
        ("nan", float, "--x: must be a finite number"),
        ("maybe", bool, "--x: expected bool"),
    ],
)
def test_parse_text_refuses_in_one_format(text: str, hint: object, message: str) -> None:
    with pytest.raises(AttnAuditError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_text(text, hint, "--x")


def test_type_names() -> None:
    assert type_name(list[float]) == "comma-separated float values"
    assert type_name(int | None) == "int or none"


def test_check_value_widens_and_refuses() -> None:
    assert check_value([1, 2], list[float], "x") == [1.0, 2.0]
    assert check_value(3, float, "x") == 3.0
    assert not conforms(True, int) and not conforms(float("inf"), float)
    with pytest.raises(AttnAuditError, match="x: expected int"):
        check_value("3", int, "x")


def test_seed_range() -> None:
    assert check_seed(0) == 0 and check_seed(SEED_MAX) == SEED_MAX
    for bad in (-1, SEED_MAX + 1, 1.5, True):
        with pytest.raises(AttnAuditError, match="0 to 4294967295"):
            check_seed(bad)


def _sweep_value(tmp_path: Path, test: str, option: str, value: object) -> object:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"grid": {"tasks": ["synthetic"], "models": ["bilstm"]},
                                    "audit": {"only": [test], "set": {test: {option: value}}}}))
    return load_config(path).test_options[test][option]


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(min_value=0, max_value=10, allow_nan=False).map(lambda v: round(v, 3)), min_size=1, max_size=4),
       integer=st.integers(min_value=1, max_value=500))
def test_entry_points_agree(tmp_path_factory: pytest.TempPathFactory, values: list[float], integer: int) -> None:
    """The same values through the CLI text reader, --set and a sweep file give the same Options values."""
    import typing

    from attnaudit.cli import _cli_type  # noqa: F401  (the CLI types sequences as text for parse_text)

    tmp = tmp_path_factory.mktemp("sweep")
    hints = typing.get_type_hints(discover()["global-adversary"].Options)
    text = ",".join(repr(v) for v in values)
    cli = parse_text(text, hints["lambdas"], "--lambdas")
    via_set = parse_settings([f"global-adversary.lambdas={text}"])["global-adversary"]["lambdas"]
    via_yaml = _sweep_value(tmp, "global-adversary", "lambdas", values)
    assert cli == via_set == via_yaml == [float(v) for v in values]
    perm_hints = typing.get_type_hints(discover()["permutation"].Options)
    assert (parse_text(str(integer), perm_hints["permutations"], "--permutations")
            == parse_settings([f"permutation.permutations={integer}"])["permutation"]["permutations"]
            == _sweep_value(tmp, "permutation", "permutations", integer) == integer)
