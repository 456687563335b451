"""The demo end to end at --quick sizes: every model audited, one index page linking the reports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from attnaudit.demo import SENTENCES, demo, demo_options, sentences_task
from attnaudit.progress import set_quiet


def test_quick_demo_writes_linked_reports(tmp_path: Path) -> None:
    set_quiet(True)
    index = demo(tmp_path / "demo", quick=True)
    page = index.read_text()
    links = re.findall(r'href="([^"]+)"', page)
    assert "bilstm/report.html" in links and "transformer/report.html" in links
    for link in links:
        assert (index.parent / link).exists()
    info = json.loads((index.parent / "demo.json").read_text())
    assert info["failed"] == {} and info["size"] == "quick"
    bilstm = (index.parent / "bilstm" / "summary.csv").read_text()
    assert "rationale,attention_map" in bilstm  # the report scores the explanations against the rationale
    for summary in index.parent.glob("*/summary.csv"):
        assert "verdict failed" not in summary.read_text()  # every registered test's verdict ran
    transformer = (index.parent / "transformer" / "summary.csv").read_text()
    assert "rationale,rollout_map" in transformer and "rationale,norms_map" in transformer


def test_demo_sentences_rationales_point_at_words() -> None:
    task = sentences_task()
    assert len(task.test) == len(SENTENCES)
    for ex in task.test:
        assert ex.rationale and all(0 <= r < len(ex.tokens) for r in ex.rationale)
    assert demo_options("quick")["permutation"] == {"permutations": 3}
