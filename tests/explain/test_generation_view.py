"""``generation.html``, the page ``explain --generate/--target`` writes: the tokens, every step's scores and records,
word scores with ``--aggregate``; one script, allowed by its hash; hostile tokens stay text."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from attnaudit.explain.generation import Generated
from attnaudit.explain.generation_view import generation_page
from attnaudit.explain.text import explain_text
from attnaudit.progress import set_quiet

set_quiet(True)

PROMPT = "the film was very good"
HOSTILE = ["</script><b>bold</b>", '"><img src=x onerror=alert(1)>']


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from attnaudit.architectures import save_tiny

    return save_tiny("llama", tmp_path_factory.mktemp("view") / "llama")


def embedded(page: str) -> dict[str, Any]:
    block = re.search(r'<script type="application/json" id="generation-data">(.*?)</script>', page, re.S)
    assert block, "no data block"
    return json.loads(block.group(1))


def scripts(page: str) -> tuple[list[str], str]:
    """The page's executable scripts and its Content-Security-Policy."""
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1))
    return re.findall(r"<script>(.*?)</script>", page, re.S), csp


def test_explain_writes_the_page_with_tokens_scores_steps_and_words(llama: Path, tmp_path: Path) -> None:
    generated = explain_text(str(llama), PROMPT, ["attention", "input_gradient"], tmp_path, target=" bad film", contrast=" good movie",
                             aggregate="sum")
    assert isinstance(generated, Generated)
    path = tmp_path / "generation.html"
    assert str(path) in generated.files and str(path) in json.loads((tmp_path / "generation.json").read_text())["files"]
    page = path.read_text()
    data = embedded(page)
    assert data["source"] == generated.source and data["target"] == generated.target and data["kind"] == "decoder"
    assert [step["contrast"] for step in data["steps"]] == [step["contrast"] for step in generated.steps]
    for method, steps in generated.scores.items():
        for t, values in enumerate(steps):
            assert data["scores"][method][t] == pytest.approx(values, rel=1e-3, abs=1e-9)
            assert [i["position"] for i in data["items"][t]] == [i["position"] for i in generated.items[t]]
    words = generated.words("sum")
    for t, items in enumerate(generated.items):  # each item carries its word's merged score and text
        for i, item in enumerate(items):
            row = words[(words["step"] == t) & (words["method"] == "input_gradient") & (words["side"] == item["side"])
                        & (words["word"] == item["word"])].iloc[0]
            assert data["words"]["scores"]["input_gradient"][t][i] == pytest.approx(row["score"], rel=1e-3)
            assert data["words"]["text"][t][i] == row["token"]
    assert data["words"]["how"] == "sum"
    steps = page.split('<section id="steps">')[1].split("</section>")[0]
    assert all(f"{step['probability']:.4g}" in steps for step in generated.steps)  # the static steps table
    definitions = page.split('<section id="definitions">')[1]
    assert "<td>input_gradient</td><td>reduction</td>" in definitions and "p(target token) - p(contrast token)" in definitions


def test_one_script_allowed_by_its_hash_and_no_network(llama: Path, tmp_path: Path) -> None:
    explain_text(str(llama), PROMPT, ["attention"], tmp_path, generate=2)
    page = (tmp_path / "generation.html").read_text()
    code, csp = scripts(page)
    assert len(code) == 1 and page.lower().count("<script") == 2  # the data block and the view's code
    digest = base64.b64encode(hashlib.sha256(code[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}';" in csp and "default-src 'none'" in csp and "connect-src 'none'" in csp
    assert "innerHTML" not in code[0] and "insertAdjacentHTML" not in code[0] and "eval(" not in code[0] and "</" not in code[0]
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert embedded(page)["words"] is None  # no --aggregate: no word scores


def _hostile() -> Generated:
    """Two steps over hostile tokens, one score missing (NaN)."""
    source = ["<s>", HOSTILE[0], "x"]
    items = [[{"position": p, "token": t, "side": "source", "word": p} for p, t in enumerate(source)]]
    items.append([*items[0], {"position": 3, "token": HOSTILE[1], "side": "target", "word": 0}])
    steps = [{"step": t, "token": token, "id": t, "probability": 0.5, "log_probability": math.log(0.5), "entropy": 1.0, "rank": 1,
              "top": token} for t, token in enumerate(HOSTILE[::-1])]
    return Generated(source=source, target=HOSTILE[::-1], steps=steps, scores={"attention": [[0.2, -0.5, math.nan], [0.1, 0.2, 0.3, 0.4]]},
                     items=items, skipped={"loo": f"not for {HOSTILE[0]}"}, meta={"text": HOSTILE[0], "model": HOSTILE[1], "kind": "decoder"})


def test_hostile_tokens_stay_text_and_a_missing_score_is_null() -> None:
    page = generation_page(_hostile(), "max")
    for token in HOSTILE:
        assert token not in page  # escaped in the tables, \u003c-escaped in the data
        assert html.escape(token, quote=True) in page
    assert "<b>bold" not in page and "<img src" not in page
    data = embedded(page)
    assert data["source"][1] == HOSTILE[0] and data["target"] == HOSTILE[::-1]
    assert data["scores"]["attention"][0] == [0.2, -0.5, None] and data["words"]["scores"]["attention"][0] == [0.2, -0.5, None]
    assert "loo" in page.split('<section id="definitions">')[1]
    code, _ = scripts(page)
    assert len(code) == 1
