"""The pages show what ``benchmarks/reproduce_training_tests.py --only sst`` returned (``training_tests.json``, part
``sst``): Wiegreffe & Pinter's tests on the SST BiLSTM, in the results page's summary and the training-tests page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _part() -> dict[str, Any]:
    part = json.loads((ROOT / "benchmarks" / "results" / "training_tests.json").read_text())["parts"]["sst"]
    assert "commit" in part and not part["commit"].endswith("-dirty")  # a clean commit, recorded with the part
    return part


def _flat(name: str) -> str:
    return " ".join((ROOT / "docs" / "sections" / name).read_text().split())


def _signed(value: float) -> str:
    return f"{value:+.3f}".replace("-", "−")


def test_the_training_tests_page_shows_the_sst_part() -> None:
    part, page = _part(), _flat("training-tests.md")
    uniform, seeds = part["uniform"]["summary"], part["seeds"]["summary"]
    base, frozen = uniform["base_test_accuracy"], uniform["uniform_test_accuracy"]
    assert f"| `uniform`: learned vs frozen-uniform attention, test accuracy | {base:.3f} vs {frozen:.3f} ({_signed(frozen - base)}) |" in page
    assert (f"| `seeds` (5 more seeds): test accuracy; median JSD / TVD from the base | {seeds['seeds_test_accuracy_mean']:.3f} ± "
            f"{seeds['seeds_test_accuracy_std']:.3f}; {seeds['median_jsd']:.3f} / {seeds['median_tvd']:.3f} |") in page
    lambdas = part["global-adversary"]["tables"]["lambdas"]
    assert "mean JSD | " + " / ".join(f"{r['mean_jsd']:.2f}" for r in lambdas) + " |" in page
    assert "mean TVD from the base | " + " / ".join(f"{r['mean_tvd']:.3f}" for r in lambdas) + " |" in page
    assert "adversary test accuracy | " + " / ".join(f"{r['test_accuracy']:.3f}" for r in lambdas) + " |" in page
    diagnostic = part["diagnostic"]["summary"]
    guided = " / ".join(f"{diagnostic[f'{k}_guided_test_accuracy']:.3f}" for k in ("learned", "uniform", "base", "adversary"))
    assert f"base-guided / adversary-guided (λ = 0.1) attention | {guided} |" in page
    walls = part["wall_seconds"]
    assert (f"{part['total_wall_seconds']:,.0f} s wall (base {walls['base']:.0f} s, uniform {walls['uniform']:.0f} s, 5 seeds "
            f"{walls['seeds']:.0f} s, 6 adversaries {walls['global-adversary']:,.0f} s, diagnostic {walls['diagnostic']:.0f} s") in page


def test_the_results_page_shows_the_sst_part() -> None:
    part, page = _part(), _flat("results.md")
    uniform, seeds, diagnostic = part["uniform"]["summary"], part["seeds"]["summary"], part["diagnostic"]["summary"]
    assert f"--only sst`, {part['total_wall_seconds']:,.0f} s)" in page
    base, frozen = uniform["base_test_accuracy"], uniform["uniform_test_accuracy"]
    assert f"| `uniform`: learned vs uniform attention, test accuracy | {base:.3f} vs {frozen:.3f} |" in page
    assert f"from the base | {seeds['median_jsd']:.3f} / {seeds['median_tvd']:.3f} |" in page
    guided = " / ".join(f"{diagnostic[f'{k}_guided_test_accuracy']:.3f}" for k in ("learned", "uniform", "base", "adversary"))
    assert f"adversary (λ 0.1) attention | {guided} |" in page
