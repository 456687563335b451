"""The pages show what ``benchmarks/reproduce_training_tests.py`` returned (``training_tests.json``): part ``sst``,
Wiegreffe & Pinter's tests on the SST BiLSTM, and parts ``conll`` and ``conll-words``, the CoNLL-2000 tagging study's
tables, in the results page's summary and the training-tests page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _part(name: str = "sst") -> dict[str, Any]:
    part = json.loads((ROOT / "benchmarks" / "results" / "training_tests.json").read_text())["parts"][name]
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


# The CoNLL-2000 parts (``--only conll`` with POS features, ``--only conll-words`` without): every figure of their
# tables on the training-tests page and the results page's summary row is read back from the JSON part.

_NUMBER = re.compile(r"−?\d+\.\d+")


def _cells(text: str, label: str) -> list[str]:
    """The cells after the label of the table row ``| label | … |`` (exactly one such row in ``text``)."""
    rows = [line for line in text.splitlines() if line.startswith(f"| {label} |")]
    assert len(rows) == 1, (label, rows)
    return [cell.strip() for cell in rows[0].split("|")[2:-1]]


def _numbers(cell: str) -> list[float]:
    """The figures of a cell, a difference in brackets left out."""
    return [float(n.replace("−", "-")) for n in _NUMBER.findall(re.sub(r"\(.*?\)", "", cell))]


def _mark(cell: str, within: bool) -> None:
    assert ("✓" in cell) == within and ("✗" in cell) == (not within), cell


def _conll_sections() -> dict[str, str]:
    page = (ROOT / "docs" / "sections" / "training-tests.md").read_text()
    start = page.index("#### CoNLL-2000 (the sequence-tagging study)")
    words = page.index("#### CoNLL-2000 without POS features")
    end = page.find("\n#### ", words + 1)  # the next section, or the page's end
    end = len(page) if end < 0 else end
    return {"conll": page[start:words], "conll-words": page[words:end]}


@pytest.mark.parametrize("name", ["conll", "conll-words"])
def test_the_training_tests_page_shows_the_conll_parts(name: str) -> None:
    part, text = _part(name), _conll_sections()[name]
    scales = [part["kl_scales"]["token"], part["kl_scales"]["entry"]]
    for table, labels in (("table1_adversary_f1", ["original model (Table 1)", "adversary λ=0.2", "adversary λ=3"]),
                          ("table2_probe_f1", ["probe `frozen`, original attention (Table 2)", "probe `frozen`, adversary λ=0.2",
                                               "probe `frozen`, adversary λ=3"])):
        for i, label in enumerate(labels):
            cells = _cells(text, label)
            assert _numbers(cells[0]) == [scales[0][table][i]["published"]]
            for cell, scale in zip(cells[1:], scales):
                row = scale[table][i]
                assert _numbers(cell) == [round(row["ours"], 3)], (label, cell)
                _mark(cell, row["within_tolerance"])
    middle = _cells(text, "adversary λ=0.5 / 1 / 2")
    for cell, scale in zip(middle[1:], scales):
        by = {r["lambda"]: r["test_f1"] for r in scale["lambda_sweep"]}
        assert _numbers(cell) == [round(by[lam], 3) for lam in (0.5, 1.0, 2.0)]
    context = _cells(text, "probe `context`, original / λ=0.2 / λ=3")
    for cell, scale in zip(context[1:], scales):
        assert _numbers(cell) == [round(v, 3) for v in scale["probe_context_variant"].values()]
    walls = part["wall_seconds"]
    assert f"{part['total_wall_seconds']:,.0f} s wall (base {walls['base']:.0f} s" in " ".join(text.split())


def test_the_entry_scale_sweep_table_shows_the_conll_part() -> None:
    sweep = _part("conll")["kl_scales"]["entry"]["lambda_sweep"]
    text = _conll_sections()["conll"]
    assert _numbers(" ".join(_cells(text, "mean KL per entry"))) == [round(r["mean_kl_entry"], 3) for r in sweep]
    assert _numbers(" ".join(_cells(text, "mean KL per token and head (nats)"))) == [round(r["mean_kl"], 1) for r in sweep]
    assert _numbers(" ".join(_cells(text, "mean NLL of the base's tags"))) == [round(r["mean_nll"], 3) for r in sweep]
    assert _numbers(" ".join(_cells(text, "mean peak attention weight"))) == [round(r["mean_max_attention"], 3) for r in sweep]


def test_the_results_page_shows_the_conll_part() -> None:
    scales = _part("conll")["kl_scales"]
    page = (ROOT / "docs" / "sections" / "results.md").read_text()
    for label, table in (("original / adversary λ = 0.2 / adversary λ = 3 (Table 1)", "table1_adversary_f1"),
                         ("`frozen` probe on original / λ = 0.2 / λ = 3 attention (Table 2)", "table2_probe_f1")):
        cells = _cells(page, label)
        assert _numbers(cells[0]) == [r["published"] for r in scales["token"][table]]
        for cell, scale in zip(cells[1:], ("token", "entry")):
            assert _numbers(cell) == [round(r["ours"], 3) for r in scales[scale][table]], (label, cell)
    cells = _cells(page, "stricter `context` probe (no query/key path, no residual)")
    for cell, scale in zip(cells[1:], ("token", "entry")):
        assert _numbers(cell) == [round(v, 3) for v in scales[scale]["probe_context_variant"].values()]
