"""The report's explorer driven in Debian's headless Chromium (playwright, never `playwright install`):
an instance, a layer, a head and a method picked through the UI change the views; no console error,
no request beyond the file itself, hostile tokens shown as text; readable with JavaScript off.

Skipped when ``/usr/bin/chromium`` (or playwright) is absent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnaudit.run import Run
from tests.report.conftest import HOSTILE

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip("headless chromium not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


class Watched:
    """A page with every console message, page error, dialog and request recorded."""

    def __init__(self, browser: Any, javascript: bool = True) -> None:
        self.context = browser.new_context(java_script_enabled=javascript, viewport={"width": 1200, "height": 1000})
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))


def _lines(page: Any) -> list[tuple[str, str, str, str]]:
    return page.eval_on_selector_all(
        "#xp-headview line", "ls => ls.map(l => [l.dataset.q, l.dataset.k, l.getAttribute('stroke'), l.getAttribute('stroke-opacity')])"
    )


def test_picking_instance_layer_head_and_method_changes_the_views(browser: Any, audited: tuple[Run, Path]) -> None:
    _, out = audited
    report = out / "report.html"
    watched = Watched(browser)
    page = watched.page
    page.goto(report.as_uri())
    page.wait_for_selector("#xp-root[data-ready='1']", timeout=15000)
    data = json.loads(page.eval_on_selector("#explorer-data", "e => e.textContent"))
    assert page.locator("#xp-list button").count() == len(data["instances"]) == 4

    # an instance
    page.click("#xp-list button[data-pos='2']")
    page.wait_for_function("document.querySelector('#xp-title').textContent.startsWith('#2 ')")
    assert page.locator("#xp-list button.sel").get_attribute("data-pos") == "2"
    before = _lines(page)
    assert before and page.get_attribute("#xp-headview", "data-layer") == "0"

    # a layer, then a head: other lines (the head's own colour)
    page.select_option("#xp-layer", "1")
    page.wait_for_selector("#xp-headview[data-layer='1']")
    layer1 = _lines(page)
    assert layer1 != before
    page.select_option("#xp-headsel", "1")
    page.wait_for_selector("#xp-headview[data-head='1']")
    head1 = _lines(page)
    assert head1 != layer1 and {line[2] for line in head1} == {"#d62728"}
    instance = data["instances"][2]
    layer = instance["layers"][1]
    assert all(int(q) < layer["q"] and int(k) < layer["k"] for q, k, _, _ in head1)

    # hover a token: only its lines stay visible
    page.hover("#xp-headview text[data-q='0']")
    assert page.get_attribute("#xp-headview", "data-focus") == "data-q0"
    visible = page.eval_on_selector_all("#xp-headview line", "ls => ls.filter(l => l.style.display !== 'none').map(l => l.dataset.q)")
    assert visible and set(visible) == {"0"}

    # a method: its heat row appears beside the others
    methods = [m["name"] for m in data["methods"]]
    shown = page.eval_on_selector_all("#xp-heat tr[data-method]", "rs => rs.map(r => r.dataset.method)")
    assert shown == methods[:3]
    extra = methods[3]
    page.click(f"#xp-methods button[data-method='{extra}']")
    assert page.get_attribute(f"#xp-methods button[data-method='{extra}']", "aria-pressed") == "true"
    assert page.eval_on_selector_all("#xp-heat tr[data-method]", "rs => rs.map(r => r.dataset.method)") == [*methods[:3], extra]

    # the model view: every layer x head; a click opens it in the head view
    page.click("#xp-view-model")
    page.wait_for_selector("#xp-modelview")
    assert page.locator("#xp-modelview canvas").count() == sum(l["heads"] for l in instance["layers"])
    page.click("#xp-modelview canvas[data-layer='0'][data-head='1']")
    page.wait_for_selector("#xp-headview[data-layer='0'][data-head='1']")

    # search and sort
    page.fill("#xp-search", instance["text"].split()[-1])
    assert "2" in page.eval_on_selector_all("#xp-list button", "bs => bs.map(b => b.dataset.pos)")
    page.fill("#xp-search", "")
    option = page.eval_on_selector_all("#xp-sort option", "os => os.map(o => o.value)")
    median = next(o for o in option if "\u0000median_change\u0000" in o)
    page.select_option("#xp-sort", median)
    order = [int(p) for p in page.eval_on_selector_all("#xp-list button", "bs => bs.map(b => b.dataset.pos)")]
    changes = [data["instances"][p]["tests"]["permutation"]["median_change"] for p in order]
    assert changes == sorted(changes, reverse=True)

    # the adversarial attention beside the original, over the same tokens
    page.click(f"#xp-list button[data-pos='{order[0]}']")
    adversary = data["instances"][order[0]]["distributions"].get("adversarial")
    if adversary:
        drawn = page.eval_on_selector_all("#xp-tests tr[data-test='adversarial'] tr[data-distribution] .tok", "ts => ts.map(t => t.textContent)")
        assert drawn == data["instances"][order[0]]["tokens"] * 2

    # hostile tokens are text, in the heat rows and the head view
    cells = page.eval_on_selector_all("#xp-heat .tok", "ts => ts.map(t => t.textContent)")
    labels = page.eval_on_selector_all("#xp-headview text", "ts => ts.map(t => t.textContent)")
    for token in HOSTILE:
        assert token in cells and token in labels
    assert page.locator("img[src='x']").count() == 0 and page.title().startswith("Attention faithfulness audit")

    assert watched.errors == [] and watched.dialogs == []
    assert [m for m in watched.console if m.startswith("error")] == []
    assert watched.requests == [report.as_uri()]
    watched.context.close()


def test_static_report_reads_without_javascript(browser: Any, audited: tuple[Run, Path]) -> None:
    _, out = audited
    watched = Watched(browser, javascript=False)
    page = watched.page
    page.goto((out / "report.html").as_uri())
    assert page.locator("table.verdict").is_visible()
    assert page.locator("div.instance").count() > 0  # the static heatmaps
    assert re.search(r"explorer needs JavaScript", page.inner_text("#explorer"))
    assert page.locator("#xp-list").count() == 0
    watched.context.close()


def test_show_renders_inline_in_a_sandboxed_frame(browser: Any, audited: tuple[Run, Path], tmp_path: Path) -> None:
    import attnaudit

    _, out = audited
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!DOCTYPE html><html><body>{attnaudit.show(out, instance=3, explore=4)._repr_html_()}</body></html>")
    watched = Watched(browser)
    watched.page.goto(notebook.as_uri())
    frame = watched.page.frame_locator("iframe")
    frame.locator("#xp-root[data-ready='1']").wait_for(timeout=15000)
    assert frame.locator("#xp-title").inner_text().startswith("#3 ")
    assert watched.errors == [] and [m for m in watched.console if m.startswith("error")] == []
    assert all(not url.startswith(("http:", "https:")) for url in watched.requests)
    watched.context.close()
