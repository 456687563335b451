"""``generation.html`` driven in Debian's headless Chromium (playwright, never `playwright install`): hovering and
clicking a generated token, the method and the word scores change the shading; hostile tokens shown as text; no
console error, no request beyond the file itself.

Skipped when ``/usr/bin/chromium`` (or playwright) is absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnaudit.explain.generation import Generated
from attnaudit.explain.generation_view import generation_page

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
HOSTILE = "</script><img src=x onerror=alert(1)>"


def _generated() -> Generated:
    """A decoder's two steps over a three-token prompt; the second reads the first generated token too.
    Prompt tokens 1 and 2 form one word (so their ``sum`` is the word's score)."""
    source = ["<s>", HOSTILE, "ab"]
    words = [0, 1, 1]
    first = [{"position": p, "token": t, "side": "source", "word": w} for p, (t, w) in enumerate(zip(source, words))]
    items = [first, [*first, {"position": 3, "token": " x", "side": "target", "word": 0}]]
    steps = [{"step": t, "token": token, "id": t, "probability": p, "log_probability": 0.0, "entropy": 1.0, "rank": 1, "top": token,
              "contrast": " z", "contrast_id": 9, "contrast_probability": 0.125} for t, (token, p) in enumerate([(" x", 0.25), (" y", 0.75)])]
    scores = {"attention": [[0.1, 0.2, 0.4], [0.0, 0.5, 0.25, 1.0]], "input_gradient": [[1.0, -0.5, 0.0], [0.0, 0.0, 0.0, 0.5]]}
    return Generated(source=source, target=[" x", " y"], steps=steps, scores=scores, items=items, skipped={},
                     meta={"kind": "decoder", "model": "hf", "mode": "forced"})


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not Path(CHROMIUM).exists():
        pytest.skip("headless chromium not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    path = tmp_path_factory.mktemp("generation-browser") / "generation.html"
    path.write_text(generation_page(_generated(), "sum"))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page()
        problems: list[str] = []
        tab.on("console", lambda m: problems.append(f"{m.type}: {m.text}"))
        tab.on("pageerror", lambda e: problems.append(str(e)))
        tab.on("dialog", lambda d: (problems.append(d.message), d.dismiss()))
        tab.on("request", lambda r: None if r.url == path.as_uri() else problems.append(r.url))
        tab.goto(path.as_uri())
        tab.wait_for_selector("#gv-root[data-ready='1']", timeout=10000)
        yield tab, problems
        browser.close()


def _shading(tab: Any) -> list[str | None]:
    return tab.eval_on_selector_all("#gv-source .tok, #gv-target .tok", "ns => ns.map(n => n.getAttribute('data-score'))")


def test_a_step_a_method_and_word_scores_change_the_shading(page: Any) -> None:
    tab, problems = page
    assert tab.text_content("#gv-source [data-position='1']") == HOSTILE  # text, not markup
    assert tab.locator("#gv-source img").count() == 0
    assert _shading(tab) == ["0.1", "0.2", "0.4", None, None]  # step 0 reads the prompt only
    tab.click("#gv-target button[data-step='1']")
    assert tab.get_attribute("#gv-root", "data-step") == "1"
    assert _shading(tab) == ["0", "0.5", "0.25", "1", None]  # and then the first generated token
    assert "rgba(230, 97, 1, 0.5)" in tab.get_attribute("#gv-source [data-position='1']", "style")
    assert "0.125" in tab.text_content("#gv-step")  # the contrast's probability
    tab.hover("#gv-target button[data-step='0']")
    assert tab.get_attribute("#gv-root", "data-step") == "0"
    tab.hover("#gv-method")  # leaving the token returns to the one clicked
    assert tab.get_attribute("#gv-root", "data-step") == "1"
    tab.select_option("#gv-method", "input_gradient")
    tab.click("#gv-target button[data-step='0']")
    assert _shading(tab) == ["1", "-0.5", "0", None, None]
    assert "rgba(11, 87, 208, 0.5)" in tab.get_attribute("#gv-source [data-position='1']", "style")  # negative: blue
    tab.select_option("#gv-unit", "words")
    assert _shading(tab) == ["1", "-0.5", "-0.5", None, None]  # tokens 1 and 2 are one word: their sum
    assert tab.locator("#gv-top li").count() == 2  # each word listed once
    assert problems == []
