"""The report's side-by-side view of the faithfulness paradigms reads every number from the stored results."""

from __future__ import annotations

from pathlib import Path

from attnaudit.experiments.experiment import Result
from attnaudit.report.html import Section, render
from attnaudit.report.paradigms import disagreement, paradigm_rows, paradigms_section


def results() -> dict[str, Result]:
    board = [{"mode": "delete", "method": m, "aopc_comp": v, "aopc_comp_low": v - 0.01, "aopc_comp_high": v + 0.01}
             for m, v in (("attention", 0.30), ("gradient", 0.20), ("random", 0.05))]
    board.append({"mode": "mask", "method": "attention", "aopc_comp": 0.9, "aopc_comp_low": 0.8, "aopc_comp_high": 1.0})  # not the delete mode
    racu = [{"method": "attention", "racu": 10.0, "low": 5.0, "high": 15.0}, {"method": "gradient", "racu": 30.0, "low": 25.0, "high": 35.0},
            {"method": "loo", "racu": -8.0, "low": -12.0, "high": -3.0}]
    sanity = [{"method": "attention", "verdict": "fails", "spearman_full": 0.8}, {"method": "gradient", "verdict": "passes", "spearman_full": 0.02}]
    return {"faithfulness": Result("faithfulness", tables={"scoreboard": board}), "roar": Result("roar", tables={"racu_summary": racu}),
            "sanity": Result("sanity", tables={"methods": sanity}),
            "in-distribution": Result("in-distribution", summary={"ood_share_random_0": 0.04, "ood_share_random_100": 0.95})}


def test_one_row_per_method_with_each_paradigms_numbers() -> None:
    rows = {r["method"]: r for r in paradigm_rows(results())}
    assert set(rows) == {"attention", "gradient", "random", "loo"}
    assert rows["attention"]["erasure"] == 0.30 and rows["attention"]["racu"] == 10.0 and rows["attention"]["sanity"] == "fails"
    assert rows["random"]["racu"] is None and rows["loo"]["erasure"] is None and rows["loo"]["sanity"] is None


def test_the_sentence_says_where_the_paradigms_disagree() -> None:
    sentence = disagreement(paradigm_rows(results()))
    assert sentence == ("The paradigms disagree: erasure ranks attention first, retraining gradient; attention ranks first by a "
                        "faithfulness paradigm yet fails the randomisation check; retraining finds loo worse than random.")
    agreeing = paradigm_rows({k: v for k, v in results().items() if k != "sanity"})
    for row in agreeing:
        row["racu"] = {"attention": 40.0, "gradient": 20.0}.get(row["method"], row["racu"])
        row["racu_high"] = None if row["method"] == "loo" else row["racu_high"]
    assert disagreement(agreeing) == "The paradigms measured (erasure, retraining) agree on the best method and find no contradiction."
    assert disagreement(paradigm_rows({"roar": results()["roar"]})).startswith("Only retraining paradigm was measured")


def test_the_page_shows_the_section_with_the_in_distribution_caveat() -> None:
    html = paradigms_section(results())
    assert "0.300 [0.290, 0.310]" in html and "10.0 [5.0, 15.0]" in html and "fails (ρ = 0.8" in html
    assert "95% of the inputs with 100 % of their tokens masked are out of distribution" in html
    sections = [Section(name=name, result=result) for name, result in results().items()]
    page = render("r", [], sections, None, "", [], Path("."))
    assert 'id="paradigms"' in page and 'href="#paradigms"' in page
    assert paradigms_section({}) == ""
