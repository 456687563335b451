"""``generation.html`` of a sequence explained over segments, in Debian's headless Chromium: a segment's score shades
every token of the segment. Skipped when ``/usr/bin/chromium`` (or playwright) is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnaudit.explain.generation import Generated
from attnaudit.explain.generation_view import generation_page

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"


def test_a_segment_shades_all_its_tokens(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("headless chromium not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    source = ["Dave", " met", ".", " The", " end"]
    first = [{"position": 0, "positions": [0, 1, 2], "token": "Dave met.", "side": "source", "word": 0, "segment": 0},
             {"position": 3, "positions": [3, 4], "token": "The end", "side": "source", "word": 1, "segment": 1}]
    items = [first, [*first, {"position": 5, "token": " x", "side": "target", "word": 0, "segment": 2}]]
    steps = [{"step": t, "token": tok, "id": t, "probability": 0.5, "log_probability": 0.0, "entropy": 1.0, "rank": 1, "top": tok}
             for t, tok in enumerate([" x", " y"])]
    generated = Generated(source=source, target=[" x", " y"], steps=steps, scores={"loo": [[0.25, 0.5], [0.5, 0.125, 1.0]]}, items=items,
                          skipped={}, meta={"kind": "decoder", "model": "hf", "mode": "forced", "segments": {"unit": "sentence"}})
    path = tmp_path / "generation.html"
    path.write_text(generation_page(generated, None))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page()
        problems: list[str] = []
        tab.on("pageerror", lambda e: problems.append(str(e)))
        tab.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        tab.goto(path.as_uri())
        tab.wait_for_selector("#gv-root[data-ready='1']", timeout=10000)

        def shading() -> list[str | None]:
            return tab.eval_on_selector_all("#gv-source .tok, #gv-target .tok", "ns => ns.map(n => n.getAttribute('data-score'))")

        assert shading() == ["0.25", "0.25", "0.25", "0.5", "0.5", None, None]
        tab.click("#gv-target button[data-step='1']")
        assert shading() == ["0.5", "0.5", "0.5", "0.125", "0.125", "1", None]
        browser.close()
    assert problems == []
