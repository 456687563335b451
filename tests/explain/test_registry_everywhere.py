"""The registry is the only list of explanation methods: a method registered here shows up in the
CLI listing, in `attnaudit tests`, in each test's choices and defaults and in the report's heatmaps,
and is gone from all of them once unregistered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from typer.testing import CliRunner

from attnaudit.cli import app
from attnaudit.experiments.experiment import discover
from attnaudit.explain import explanation, item_mask, list_explanations, unregister
from attnaudit.report.heatmaps import compute_heatmaps, heatmap_methods

NAME = "zzprobe"


@pytest.fixture
def probe() -> Iterator[str]:
    """A throw-away explanation of the prediction: the item's position, 0 at padding."""

    @explanation(NAME, "position of the item (registered by a test)", needs=("prediction",))
    def position(model, batch):
        mask = item_mask(model, batch)
        return torch.arange(mask.shape[1], dtype=torch.float32)[None, :] * mask

    try:
        yield NAME
    finally:
        unregister(NAME)


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return result.output


def _tests_with(name: str) -> set[str]:
    """The tests whose row of `attnaudit tests` lists explanation ``name``."""
    rows = [line.split("│") for line in _cli("tests").splitlines() if line.startswith("│")]
    found, current = set(), ""
    for cells in rows:
        current = cells[1].strip() or current  # a wrapped row continues the test above
        if name in cells[-2]:
            found.add(current)
    return found


def test_a_registered_method_appears_everywhere_and_leaves_with_unregister(runs: dict, probe: str) -> None:
    run, batch = runs["bilstm"]
    assert probe in _cli("explanations")
    assert probe in _cli("explanations", str(run.path))
    assert _tests_with(probe) == {"importance", "rationale", "erasure", "rollout", "faithfulness", "sanity", "in-distribution", "roar"}
    registry = discover()
    for test in ("importance", "rationale", "erasure", "rollout", "faithfulness", "sanity", "in-distribution", "roar"):
        assert probe in registry[test].explanation_choices(), test
    assert probe in registry["rationale"].Options().methods  # a default method is scored by default
    assert probe in [m.name for m in heatmap_methods(run)]
    shown = compute_heatmaps(run, batch.examples[:3], [0, 2], {})
    assert shown[1]["scores"][probe][:3] == [0.0, 1.0, 2.0]

    unregister(probe)
    assert probe not in _cli("explanations") and not _tests_with(probe)
    assert probe not in registry["rationale"].Options().methods
    assert probe not in [m.name for m in heatmap_methods(run)]


def test_the_listing_for_a_run_mirrors_list_explanations(runs: dict) -> None:
    run, _ = runs["bilstm"]
    listed = _cli("explanations", str(run.path))
    for method in list_explanations(run):
        assert f"│ {method.name} " in listed
    assert "not for this model: rollout:" in listed and "│ rollout " not in listed
