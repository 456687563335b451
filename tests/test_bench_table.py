"""The benchmark page's table is generated from ``benchmarks/results/*.json`` and must match it;
the timing statistics behind it (min / median / max, ratio per round, interleaving) are checked
on hand-made numbers."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `benchmarks` is a folder of the checkout, not an installed package

from benchmarks import common, table


def test_readme_block_equals_the_table_generated_from_the_results() -> None:
    readme = table.PAGE.read_text(encoding="utf-8")
    block = readme[readme.index(table.START): readme.index(table.END) + len(table.END)]
    assert block == table.render(table.load())


def test_check_flags_a_stale_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    stale = tmp_path / "benchmarks.md"
    stale.write_text(f"intro\n{table.START}\n| old | 2.7× |\n{table.END}\nrest\n", encoding="utf-8")
    monkeypatch.setattr(table, "PAGE", stale)
    assert table.main(["--check"]) == 1
    assert "differs" in capsys.readouterr().out
    assert table.main([]) == 0  # writes the generated block between the markers, keeps the rest
    text = stale.read_text(encoding="utf-8")
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "| old |" not in text
    assert table.main(["--check"]) == 0


def test_every_timed_result_has_repeats_ranges_and_machine() -> None:
    results = table.load()
    assert {row.stem for row in table.ROWS} <= results.keys()
    for stem, data in results.items():
        timing = data["timing"]
        assert timing["repeats"] >= common.REPEATS, stem
        for stat in [*timing["seconds"].values(), *(timing[k] for k in ("ratio",) if k in timing)]:
            assert stat["min"] <= stat["median"] <= stat["max"], stem
            assert len(stat["runs"]) == timing["repeats"], stem
        assert len(timing["load_average_before"]) == 3 and len(timing["load_average_after"]) == 3, stem
        assert {"cpu_count", "usable_cores", "torch_threads", "torch_version", "date"} <= data["machine"].keys(), stem
    for stem in (row.stem for row in table.ROWS):
        timing = results[stem]["timing"]
        per_round = common.pair_ratios(timing["seconds"]["peer"]["runs"], timing["seconds"]["ours"]["runs"])
        assert timing["ratio"]["runs"] == pytest.approx(per_round), stem
        assert results[stem]["ratio"] == pytest.approx(statistics.median(per_round)), stem


def test_stats_of_hand_made_numbers() -> None:
    assert common.stats([3.0, 1.0, 10.0, 2.0]) == {"min": 1.0, "median": 2.5, "max": 10.0, "runs": [3.0, 1.0, 10.0, 2.0]}
    assert common.stats([4.0]) == {"min": 4.0, "median": 4.0, "max": 4.0, "runs": [4.0]}
    with pytest.raises(ValueError, match="no values"):
        common.stats([])


def test_ratio_is_taken_per_round_not_of_the_medians() -> None:
    peer, ours = [10.0, 2.0, 6.0], [5.0, 1.0, 6.0]
    ratios = common.pair_ratios(peer, ours)
    assert ratios == [2.0, 2.0, 1.0]
    assert common.stats(ratios)["median"] == 2.0  # the ratio of the medians would be 6 / 5 = 1.2
    with pytest.raises(ValueError, match="2 numerators for 3 denominators"):
        common.pair_ratios([1.0, 2.0], ours)


def test_time_interleaved_alternates_order_and_summarises(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])
    calls: list[str] = []
    costs = {"ours": iter([9.0, 1.0, 2.0, 4.0, 3.0, 5.0]), "peer": iter([9.0, 4.0, 4.0, 4.0, 6.0, 10.0])}

    def timed(name: str):
        def fn() -> str:
            calls.append(name)
            clock[0] += next(costs[name])  # the first value of each is the untimed warm-up
            return f"{name} output"
        return fn

    record, outputs = common.time_interleaved({"ours": timed("ours"), "peer": timed("peer")}, repeats=5)
    assert calls == ["ours", "peer", "ours", "peer", "peer", "ours", "ours", "peer", "peer", "ours", "ours", "peer"]
    assert outputs == {"ours": "ours output", "peer": "peer output"}
    assert record["repeats"] == 5
    assert record["seconds"]["ours"] == {"min": 1.0, "median": 3.0, "max": 5.0, "runs": [1.0, 2.0, 4.0, 3.0, 5.0]}
    assert record["seconds"]["peer"]["median"] == 4.0
    assert record["ratio"] == {"min": 1.0, "median": 2.0, "max": 4.0, "runs": [4.0, 2.0, 1.0, 2.0, 2.0]}


def test_time_interleaved_named_ratios_and_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])
    calls: list[str] = []

    def cost(name: str, seconds: float):
        def fn() -> None:
            calls.append(name)
            clock[0] += seconds
        return fn

    record, _ = common.time_interleaved(
        {"ours": cost("ours", 3.0), "peer": cost("peer", 2.0)}, 2, ratios={"cost": ("ours", "peer")}, warmup=()
    )
    assert calls == ["ours", "peer", "peer", "ours"]
    assert "ratio" not in record and record["cost"]["median"] == 1.5
    with pytest.raises(ValueError, match="at least 1"):
        common.time_interleaved({"ours": cost("ours", 1.0)}, 0)


def test_spans_read_as_median_and_range() -> None:
    assert common.ratio_span({"min": 1.52, "median": 1.94, "max": 2.4}) == "1.9× (1.5–2.4×)"
    assert common.ratio_span({"min": 0.72, "median": 0.861, "max": 0.87}) == "0.86× (0.72–0.87×)"
    assert common.ratio_span({"min": 150.2, "median": 196.4, "max": 210.0}) == "196× (150–210×)"
    assert common.span({"min": 0.1234, "median": 0.25, "max": 1.0}, ".3g", " s") == "0.25 s (0.123–1 s)"


def test_readme_llm_scale_block_equals_the_tables_generated_from_the_results() -> None:
    readme = table.PAGE.read_text(encoding="utf-8")
    block = readme[readme.index(table.LLM_START): readme.index(table.LLM_END) + len(table.LLM_END)]
    assert block == table.render_llm()


def _llm_result() -> dict:
    """A hand-made ``bench_llm_scale`` result: T=32 fully measured, T=2048 with the all-layers ops skipped."""
    def timing(seconds: dict[str, list[float]]) -> dict:
        out = {"repeats": len(next(iter(seconds.values()))), "seconds": {k: common.stats(v) for k, v in seconds.items()},
               "load_average_before": [1.0, 1, 1], "load_average_after": [3.0, 1, 1]}
        if "capture" in seconds:
            out["capture_cost"] = common.stats(common.pair_ratios(seconds["capture"], seconds["peer"]))
        return out

    every = {"peer": [1.0, 2.0], "capture": [1.2, 2.0], "norms": [1.5, 1.5], "rollout": [2.0, 2.0], "rollout_streaming": [2.0, 3.0]}
    return {
        "name": "llm_scale_cpu", "device": "cpu", "device_name": "Some CPU", "threads": 1, "weights": "random",
        "dtype": "float32", "command": "python bench", "commit": "0123456789abcdef",
        "machine": {"date": "2026-11-26T06:00:00", "torch_version": "2.13.0"},
        "tolerances": {"max_weight_difference": 1e-5}, "max_weight_difference": 0.0, "agree": True,
        "lengths": [
            {"length": 32, "timing": timing(every), "skipped": {},
             "memory_bytes": {"peer": 2**20, "capture": 3 * 2**20, "norms": 2**20, "rollout": 8 * 2**20, "rollout_streaming": 2**19}},
            {"length": 2048, "timing": timing({"rollout_streaming": [40.0, 50.0, 45.0]}), "skipped": {"capture": "too big", "rollout": "too big"},
             "memory_bytes": {"peer": 4096 * 2**20, "rollout_streaming": 600 * 2**20}},
        ],
    }


def test_llm_scale_table_of_a_hand_made_result(tmp_path: Path) -> None:
    (tmp_path / "llm_scale_cpu.json").write_text(__import__("json").dumps(_llm_result()), encoding="utf-8")
    text = table.render_llm(tmp_path)
    lines = text.splitlines()
    assert lines[0] == table.LLM_START and lines[-1] == table.LLM_END
    assert "**Some CPU** (cpu, 1 thread), random weights, float32; 2/3 interleaved rounds" in text
    assert "load average 1.00–3.00" in text
    # T=32: capture / peer per round = 1.2, 1.0 -> median 1.1; memory in MiB
    assert "| 32 | 1.50 s (1.00–2.00 s) | 1.60 s (1.20–2.00 s) | 1.50 s (1.50–1.50 s) | 2.00 s (2.00–2.00 s) | 2.50 s (2.00–3.00 s) " \
           "| 1.1× (1.0–1.2×) | 1 / 3 / 8 / 0.50 |" in lines
    assert "| 2048 | skipped | skipped | skipped | skipped | 45.0 s (40.0–50.0 s) | – | 4,096 / – / – / 600 |" in lines
    assert "Streaming rollout at T = 2048: peak 600 MiB against 4,096 MiB for HF's eager forward (7× less)." in lines
    assert "capture at T=2048 (too big); rollout at T=2048 (too big)" in text
    assert "![time and peak memory against T](../../benchmarks/results/llm_scale_cpu.png)" in lines


def test_results_keep_no_path_of_this_machine() -> None:
    """write_result makes every path inside the checkout relative (nested values included); paths elsewhere stay;
    and no stored result holds this checkout's absolute path."""
    inside = str(common.ROOT / "benchmarks" / "runs" / "x" / "a.png")
    value = {"run": inside, "figures": [inside, "/elsewhere/b.png"], "n": 3, "nested": {"path": inside}}
    assert common.relative_paths(value) == {
        "run": "benchmarks/runs/x/a.png", "figures": ["benchmarks/runs/x/a.png", "/elsewhere/b.png"], "n": 3,
        "nested": {"path": "benchmarks/runs/x/a.png"},
    }
    for path in common.RESULTS.glob("*.json"):
        assert str(common.ROOT) not in path.read_text(encoding="utf-8"), path.name


def test_provenance_records_the_thread_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables that change how CPU threads run are stored with a result where set, and only those."""
    for name in common.THREAD_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert common.provenance()["environment"] == {}
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("UNRELATED_SETTING", "x")
    assert common.provenance()["environment"] == {"OMP_WAIT_POLICY": "PASSIVE"}
