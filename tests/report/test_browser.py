"""The report in a real browser (Debian's headless Chromium): escaped tokens stay text, heatmaps render.

Skipped when ``/usr/bin/chromium`` is absent (CI installs it with apt-get).
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from attnaudit.audit import audit
from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import TaskData
from attnaudit.progress import set_quiet
from attnaudit.report.html import HEAT_RGB
from attnaudit.training.trainer import train

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
INJECTED = "<script>document.title='pwned'</script>"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report from a tiny run whose test sentences all contain the injected token."""
    if not Path(CHROMIUM).exists():
        pytest.skip("headless chromium not installed (apt-get install chromium)")
    set_quiet(True)
    data = synthetic_task("classification", seed=0, n_train=120, n_dev=10, n_test=10)

    def inject(ex):
        tokens = list(ex.tokens)
        free = next(i for i in range(len(tokens)) if i not in (ex.rationale or []))
        tokens[free] = INJECTED
        return replace(ex, tokens=tokens)

    data = TaskData(data.name, data.task_type, [inject(e) for e in data.train], data.dev, [inject(e) for e in data.test], data.labels)
    root = tmp_path_factory.mktemp("browser")
    run = train(data, "bilstm", root / "run", epochs=1, embed_dim=8, hidden_dim=8, quiet_eval=True)
    result = audit(root / "audit", run=run, only=["rationale", "importance"], limit=4,
                   test_options={"rationale": {"ig_steps": 2}, "importance": {"methods": ["gradient"]}})
    assert result.ok
    return result.report


def test_injected_token_is_text_not_script(report: Path, tmp_path: Path) -> None:
    done = _chromium(tmp_path, "--dump-dom", report.as_uri())
    dom = done.stdout
    assert "<title>Attention faithfulness audit: bilstm on synthetic</title>" in dom  # the script never ran
    assert "<script>document.title" not in dom
    assert dom.lower().count("<script") == 2  # only the explorer's data block and its code
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom  # shown as text
    assert dom.count('<div class="instance">') == 4
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert console == []


def test_heatmaps_render_in_colour(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,2200", "--hide-scrollbars", report.as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.std() > 10  # not a blank page
    # the heatmaps are the only place the page draws in the heat colour (figures come later, below the fold)
    heat = (np.abs(pixels - np.array(HEAT_RGB)).max(-1) <= 6).sum()
    assert heat > 500
    rows = np.flatnonzero((np.abs(pixels - np.array(HEAT_RGB)).max(-1) <= 60).any(1))
    assert rows.size and rows.min() > 300  # below the verdict table, where the heatmap section starts
