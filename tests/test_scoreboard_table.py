"""The README's faithfulness scoreboard tables are generated from ``benchmarks/results/scoreboard*.json``
and must match them; the rendering is checked on a hand-made result."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `benchmarks` is a folder of the checkout, not an installed package

from benchmarks import scoreboard_table as table


def _row(mode: str, method: str, comp: float, suff: float, **more: float) -> dict:
    return {"mode": mode, "method": method, "aopc_comp": comp, "aopc_comp_low": comp - 0.01, "aopc_comp_high": comp + 0.01,
            "aopc_suff": suff, "aopc_suff_low": suff - 0.01, "aopc_suff_high": suff + 0.01, **more}


def _board(rows: list[dict]) -> dict:
    return {"n": 3, "methods": sorted({r["method"] for r in rows}), "scoreboard": rows, "wall_seconds": 12.0,
            "cpu_seconds": 10.0, "load_before": [2.0, 1.0, 1.0], "load_after": [3.0, 1.0, 1.0]}


def test_readme_block_equals_the_tables_generated_from_the_results() -> None:
    readme = table.README.read_text(encoding="utf-8")
    block = readme[readme.index(table.START): readme.index(table.END) + len(table.END)]
    assert block == table.render(table.load())


def test_rendering_ranks_by_deletion_and_places_the_published_numbers() -> None:
    data = {
        "minilm": {"scoreboard": _board([_row("delete", "rollout", 0.1, 0.2), _row("delete", "alti", 0.3, -0.05),
                                         _row("mask", "alti", 0.25, 0.01)])},
        "minilm_sst_trees": _board([_row("delete", "alti", 0.0, 0.0, auprc=0.61, token_f1=0.4)]),
    }
    lines = table.render(data).splitlines()
    alti, rollout = (next(line for line in lines if f"| {m} |" in line) for m in ("alti", "rollout"))
    assert alti.startswith("| 1 | alti | 0.300 [0.290, 0.310] | −0.050 [−0.060, −0.040] | 0.250 [0.240, 0.260]")
    assert "| 0.610 / 0.400 | 0.269 / 0.057 | 0.416 |" in alti
    assert rollout.startswith("| 2 | rollout |") and rollout.endswith("| – [–, –] | – [–, –] | – / – | 0.076 / 0.179 | – |")
    assert "3 sentences, 2 methods: 12 s wall, 10 s CPU, load average 2.0/3.0 before/after" in "\n".join(lines)


def test_decoder_table_ranks_smollm2_beside_minilm_and_says_when_cpu_time_is_unknown() -> None:
    decoder = {**_board([_row("delete", "attention", 0.2, 0.1), _row("delete", "attnlrp", 0.4, -0.1)]),
               "cpu_seconds": None, "load_before": [], "load_after": []}
    data = {"minilm": {"scoreboard": _board([_row("delete", "attnlrp", 0.33, -0.08)])}, "smollm2": decoder}
    lines = table.decoder_table(data)
    assert lines[2] == "| 1 | attnlrp | 0.400 [0.390, 0.410] | −0.100 [−0.110, −0.090] | 0.330 / −0.080 |"
    assert lines[3] == "| 2 | attention | 0.200 [0.190, 0.210] | 0.100 [0.090, 0.110] | – |"
    assert lines[-1] == "SmolLM2-135M-Instruct zero-shot, GLUE dev: 3 sentences, 2 methods: 12 s wall."
    assert table.decoder_table({"minilm": data["minilm"]}) == []


def test_check_flags_a_stale_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(f"intro\n{table.START}\n| old |\n{table.END}\nrest\n", encoding="utf-8")
    monkeypatch.setattr(table, "README", stale)
    assert table.main(["--check"]) == 1
    assert "differs" in capsys.readouterr().out
    assert table.main([]) == 0
    text = stale.read_text(encoding="utf-8")
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "| old |" not in text
    assert table.main(["--check"]) == 0
