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


def test_small_models_table_shows_every_method_of_either_model() -> None:
    """A method scored on the BiLSTM only (input x gradient: not scored on a Transformer) keeps its row,
    after the Transformer's ranking; the Transformer's methods absent on the BiLSTM show a dash there."""
    data = {
        "sst_bilstm": {"test_accuracy": 0.8, "scoreboard": _board([_row("delete", "attention", 0.2, 0.1),
                                                                   _row("delete", "input_gradient", 0.1, 0.2),
                                                                   _row("mask", "input_gradient", 0.12, 0.15)])},
        "sst_transformer": {"test_accuracy": 0.8, "scoreboard": _board([_row("delete", "attention", 0.05, 0.3),
                                                                        _row("delete", "alti", 0.3, 0.1)])},
    }
    data["sst_bilstm"]["scoreboard"]["subset"] = {"chosen": "stratified by label, seed 0", "of": 1726,
                                                  "labels": {"negative": 2, "positive": 1}}
    lines = table.small_models_table(data)
    assert any(line.startswith("BiLSTM (SST test accuracy 0.800): 3 sentences (stratified by label, seed 0, of 1,726; "
                               "2 negative, 1 positive), 2 methods: 12 s wall") for line in lines)
    assert lines[2:5] == [
        "| alti | – | – | 0.300 / 0.100 | – |",
        "| attention | 0.200 / 0.100 | – | 0.050 / 0.300 | – |",
        "| input_gradient | 0.100 / 0.200 | 0.120 / 0.150 | – | – |",
    ]


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
