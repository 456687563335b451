"""CONTRIBUTING.md cannot go stale: every file or folder it names exists, and every dotted name it gives
(``explain.registry.NEEDS``, ``AttentionModel.lacks``) is there to import; so is every file or folder the
README names."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnaudit"
TEXT = (ROOT / "CONTRIBUTING.md").read_text()
QUOTED = re.findall(r"`([^`\s]+)`", TEXT)
LAYOUT = re.search(r"## Layout\n\n```\n(.*?)```", TEXT, re.S)


def _exists(name: str) -> bool:
    """A path from the repository root or from the package; a bare file name anywhere in the package."""
    name = name.rstrip("/")
    if (ROOT / name).exists() or (PACKAGE / name).exists():
        return True
    return "/" not in name and any(PACKAGE.rglob(name))


def _paths() -> list[str]:
    quoted = [q for q in QUOTED if re.fullmatch(r"[\w./-]+(\.py|\.md|/)", q) and "<" not in q and not q.startswith("--")]
    assert LAYOUT is not None, "CONTRIBUTING.md has no ## Layout block"
    listed = re.findall(r"^ {2}([\w./]+(?:\.py|/))", LAYOUT.group(1), re.M)
    listed += re.findall(r"^(\w+/)\s", LAYOUT.group(1), re.M)
    return sorted(set(quoted + listed))


def _dotted() -> list[str]:
    return sorted({q for q in QUOTED if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", q) and not q.endswith((".py", ".md", ".json", ".csv"))})


def _resolve(name: str) -> object:
    """``name`` imported: a module path (with or without ``attnaudit.``) and attributes, or ``Class.attribute``."""
    parts = name.removeprefix("attnaudit.").split(".")
    if parts[0][0].isupper():  # Class.attribute: the class is found where the package defines it
        owners = [p for p in PACKAGE.rglob("*.py") if re.search(rf"^class {parts[0]}\b", p.read_text(), re.M)]
        assert owners, f"no class {parts[0]}"
        module = ".".join(owners[0].relative_to(PACKAGE.parent).with_suffix("").parts)
        parts = [*module.split(".")[1:], *parts]
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(["attnaudit", *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


def test_every_path_it_names_exists() -> None:
    paths = _paths()
    assert len(paths) > 20, paths  # the layout and the how-tos name many
    missing = [p for p in paths if not _exists(p)]
    assert not missing, f"CONTRIBUTING.md names what does not exist: {missing}"


def test_every_dotted_name_it_gives_imports() -> None:
    names = _dotted()
    assert "explain.registry.NEEDS" in names and "AttentionModel.lacks" in names
    for name in names:
        assert _resolve(name) is not None, name


def test_every_path_the_readme_names_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    paths = sorted({q for q in re.findall(r"`([\w./-]+(?:\.py|/))`", readme) if q != "/"})
    assert "models/hf/" in paths and "resolve.py" in paths
    missing = [p for p in paths if not _exists(p)]
    assert not missing, f"README.md names what does not exist: {missing}"
