"""Screenshots of the report's explorer for the README, taken in Debian's headless Chromium.

    .venv/bin/attnaudit demo
    .venv/bin/python -m benchmarks.explorer_screenshots demo-output/minilm/report.html demo-output/transformer/report.html

The first report gives the head view and the model view (layer 2, head 3), the second the
explanations side by side (attention, gradient, IG) of the instance whose output moved most under permutation; written to ``docs/img/explorer-*.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"


def _open(browser: Any, report: Path) -> Any:
    page = browser.new_page(viewport={"width": 1150, "height": 900}, device_scale_factor=1)
    page.goto(report.resolve().as_uri())
    page.wait_for_selector("#xp-root[data-ready='1']")
    return page


def shoot(attention_report: Path, methods_report: Path, out: Path = IMG) -> list[Path]:
    """Head view, model view and explanations of the first instances; returns the PNG paths."""
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = _open(browser, attention_report)
        page.select_option("#xp-layer", "2")
        page.select_option("#xp-headsel", "3")
        page.wait_for_selector("#xp-headview[data-layer='2'][data-head='3']")
        page.hover("#xp-headview text[data-q='5']")
        written.append(out / "explorer-head-view.png")
        page.locator("#xp-root").screenshot(path=written[-1])
        page.click("#xp-view-model")
        page.wait_for_selector("#xp-modelview")
        written.append(out / "explorer-model-view.png")
        page.locator(".xp-main").screenshot(path=written[-1])
        page.close()
        page = _open(browser, methods_report)
        values = page.eval_on_selector_all("#xp-sort option", "os => os.map(o => o.value)")
        page.select_option("#xp-sort", next(v for v in values if "median_change" in v))
        page.click("#xp-list button >> nth=0")
        page.click("#xp-methods button[data-method='ig']")
        page.click("#xp-methods button[data-method='loo']")
        page.eval_on_selector("#xp-root", "e => e.scrollIntoView()")
        box = page.locator("#xp-root").bounding_box()
        written.append(out / "explorer-methods.png")
        page.screenshot(path=written[-1], clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": 330})
        browser.close()
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attention_report", type=Path)
    parser.add_argument("methods_report", type=Path)
    args = parser.parse_args()
    print("\n".join(map(str, shoot(args.attention_report, args.methods_report))))
