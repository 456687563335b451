"""The benchmark page's long-context block is generated from ``benchmarks/results/long_context.json``
(:mod:`benchmarks.long_context_table`): it matches the page, and a hand-made result renders as expected."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `benchmarks` is a folder of the checkout, not an installed package

from benchmarks import long_context_table, table  # noqa: E402


def test_the_page_block_equals_the_rendered_result() -> None:
    page = table.PAGE.read_text(encoding="utf-8")
    start, end = page.index(long_context_table.START), page.index(long_context_table.END)
    assert page[start: end + len(long_context_table.END)] == long_context_table.render()


def test_a_hand_made_result_renders_its_cells(tmp_path: Path) -> None:
    answer = {"peak_rss_mb": 2000.0, "seconds": 12.5, "operation_peak_mb": 1900.0, "loaded_rss_mb": 500.0, "tokens": 8192}
    data = {
        "cases": ["hf_forward", "ours_attention", "inseq_saliency"], "cap_gb": 12.0, "ours_worst_peak_ratio": 0.75,
        "command": "python -m benchmarks.bench_long_context", "commit": "0123456789abcdef", "load_average": [3.0, 2.0, 1.0],
        "lengths": [{"tokens": 8192, "cases": {"hf_forward": answer, "ours_attention": {**answer, "peak_rss_mb": 1500.0},
                                               "inseq_saliency": {"failed": "out of memory under the cap", "error": "x"}},
                     "ratio_to_hf_forward": {"ours_attention": {"peak_rss_mb": 0.75, "operation_peak_mb": 1.0, "seconds": 1.0}}}],
    }
    path = tmp_path / "long_context.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    block = long_context_table.render(path)
    assert "| T = 8,192 |" in block
    assert "| attnaudit `explain --method attention` | 1,500 MB (0.75×), 12.5 s |" in block
    assert "| inseq 0.7.1 `saliency` | out of memory under the cap |" in block
    assert "Worst ratio of ours: 0.75× (goal ≤ 1.3×)" in block and "commit 0123456789" in block
    assert long_context_table.render(tmp_path / "absent.json").count("no `benchmarks/results/long_context.json` yet") == 1
