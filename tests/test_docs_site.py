"""The documentation site builds strictly (every link and anchor resolves, the README is its home page), the
README stays a landing page, and its generated models table matches ``benchmarks/results/architectures.json``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `benchmarks` is a folder of the checkout, not an installed package

from benchmarks import table  # noqa: E402


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "What we found" in home and (tmp_path / "site" / "sections" / "results" / "index.html").exists()
    pages = [page.read_text(encoding="utf-8") for page in (tmp_path / "site").rglob("*.html")]
    assert not [page for page in pages if "fonts.googleapis" in page or "fonts.gstatic" in page]  # offline: no web fonts


def test_the_readme_is_a_landing_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for heading in ("## Install and quick start", "## What we found", "## Models", "## Documentation"):
        assert heading in readme
    assert readme.count("make demo") >= 1 and readme.count("make test") >= 1
    assert "`make docs`" in readme.split("## Documentation", 1)[1]  # the documentation line names the site's command


def test_the_models_table_equals_the_architecture_matrix_result() -> None:
    readme = table.README.read_text(encoding="utf-8")
    assert table.updated_readme(readme) == readme
