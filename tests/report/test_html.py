"""The HTML report: self-contained, every piece of data escaped, verdicts beside published figures."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.experiments.experiment import Result
from attnaudit.html_page import esc, fmt, table
from attnaudit.io import atomic_write_json
from attnaudit.plotting import save_figure
from attnaudit.report import build_report
from attnaudit.report.html import heatmap_block

INJECTED = "<script>document.title='pwned'</script>"


def _result(tmp_path: Path) -> Result:
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    paths = save_figure(fig, tmp_path / "results", "demo_curve")
    return Result(
        test="zz-unregistered",
        summary={"median_change_mean": 0.0123, "fraction_insensitive": 0.8},
        instances=[{"index": 0, "token": INJECTED}],
        tables={"per_class": [{"predicted": INJECTED, "n": 3}]},
        meta={"notes": [f"a note with {INJECTED}"], "published": {"fraction_insensitive": 0.75, "source": "J&W"},
              "n": 1, "split": "test", "seed": 0},
        figures=[str(p) for p in paths],
    )


def test_escapes_tokens_notes_and_tables_and_inlines_figures(tmp_path: Path) -> None:
    result = _result(tmp_path)
    result.save(tmp_path / "results")
    heatmaps = {
        "selection": "the first 1 instances",
        "instances": [{"index": 0, "label": INJECTED, "predicted": "positive", "tau": 0.5, "items": ["good", INJECTED],
                       "rationale": [0], "scores": {"attention": [0.2, 0.8], "gradient": [1.0, 0.0]}}],
    }
    atomic_write_json(tmp_path / "results" / "heatmaps.json", heatmaps)
    page = build_report(tmp_path).read_text()
    assert "<script" not in page.lower()
    assert page.count(esc(INJECTED)) >= 4  # heatmap token, label, note, table cell
    assert re.search(r'<img class="figure" alt="demo_curve" src="data:image/png;base64,[A-Za-z0-9+/=]{100,}">', page)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from anywhere
    verdict = page.split('<section id="verdict">')[1].split("</section>")[0]
    assert "median_change_mean" in verdict  # default verdict: first summary row when there is no interpretation
    section = page.split('<section id="test-zz-unregistered">')[1]
    assert "<td class=\"num\">0.75</td>" in section  # the published figure of the same name sits beside ours


def test_heatmap_block_scales_each_row_to_its_maximum() -> None:
    block = heatmap_block({"index": 3, "label": "x", "items": ["a", "b"], "rationale": [1],
                           "scores": {"attention": [0.5, 1.0], "loo": [-2.0, 0.0]}})
    alphas = re.findall(r"rgba\(230,97,1,([0-9.]+)\)", block)
    assert alphas == ["0.500", "1.000", "1.000", "0.000"]
    assert block.count('class="tok rat"') == 2  # item 1 is rationale in both rows


def test_format_and_table_helpers() -> None:
    assert fmt(float("nan")) == "n/a" and fmt(None) == "n/a" and fmt(0.123456) == "0.1235"
    assert fmt({"a": "<b>"}) == esc('{"a": "<b>"}')
    html = table([{"a": 1}, {"b": "<i>"}], limit=1)
    assert "<th>a</th><th>b</th>" in html and "first 1 of 2 rows" in html and "<i>" not in html


def test_report_computes_heatmaps_from_the_run_directory(tiny_attention_run, tmp_path: Path) -> None:
    run = tiny_attention_run("bilstm")
    results = Path(run.path) / "results"
    run_test("importance", run, limit=6, out=results)
    (results / "heatmaps.json").unlink(missing_ok=True)
    page = build_report(run.path, instances=1).read_text()
    stored = (results / "heatmaps.json").read_text()
    assert "most and 1 least faithful" in stored
    assert page.count('<div class="instance">') == 2
    assert "τ(attention, gradient)" in page


def test_report_of_a_run_out_folder_finds_the_run_from_the_results(tiny_attention_run, tmp_path: Path) -> None:
    run = tiny_attention_run("bilstm")
    out = tmp_path / "mine"  # `attnaudit run importance RUN --out mine`: result JSON directly in the folder
    run_test("importance", run, limit=6, out=out)
    page = build_report(out, instances=1).read_text()
    assert (out / "heatmaps.json").exists() and not (out / "results").exists()
    assert page.count('<div class="instance">') == 2 and "τ(attention, gradient)" in page
    assert (out / "report.html").exists() and (out / "summary.csv").exists()


def test_no_results_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AttnAuditError, match="no results"):
        build_report(tmp_path)


def test_a_run_directory_without_results_asks_for_them(tiny_attention_run, tmp_path: Path) -> None:
    bare = tmp_path / "run"  # the run's config.json, metrics.json ... but no results/
    shutil.copytree(tiny_attention_run("bilstm").path, bare, ignore=shutil.ignore_patterns("results"))
    with pytest.raises(AttnAuditError, match="no results/ folder"):
        build_report(bare)


def test_verdict_statistics_read_as_words_with_the_id_as_tooltip() -> None:
    from attnaudit.report.html import Section, statistic_words, verdict_table

    assert statistic_words("tau_attention_vs_gradient_mean") == "mean τ(attention, gradient)"
    assert statistic_words("max_jsd_mean") == "mean max JSD"
    assert statistic_words("aopc_comp_ranking_delete") == "AOPC comprehensiveness ranking delete"
    assert statistic_words("best-layer AER, fixed setting (weight / norm)") == "best-layer AER, fixed setting (weight / norm)"
    section = Section(name="importance", status="ok", verdict=[
        {"statistic": "tau_attention_vs_gradient_mean", "value": 0.25, "published": "", "interpretation": "weak agreement"}])
    html = verdict_table([section])
    assert '<td title="tau_attention_vs_gradient_mean">mean τ(attention, gradient)</td>' in html
