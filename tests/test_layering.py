"""The house's layering, read from the source (nothing imported): no import cycles among attnaudit's modules, the
Hugging Face adapter reached through its package's face only, and generic code through the model interface."""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "attnaudit"


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _imports(path: Path, name: str, package: bool, modules: dict[str, tuple[Path, bool]], top_level: bool) -> set[str]:
    """attnaudit modules ``path`` imports: at module level only (``top_level``, ``if TYPE_CHECKING`` left out), or anywhere."""
    tree = ast.parse(path.read_text())
    if top_level:
        nodes = [n for stmt in tree.body if not (isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test))
                 for n in ast.walk(stmt) if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    else:
        nodes = list(ast.walk(tree))
    here = name if package else name.rpartition(".")[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                prefix = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*prefix, *([node.module] if node.module else [])])
            subs = {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules}
            found |= subs | ({base} if len(subs) < len(node.names) else set())
    return {m for m in found if m in modules and m != name}


def test_no_module_level_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(path, name, package, modules, top_level=True) for name, (path, package) in modules.items()}
    assert len(graph) > 100
    try:
        TopologicalSorter(graph).static_order()
    except CycleError as cycle:  # pragma: no cover - the failure message is the point
        raise AssertionError(f"import cycle: {' -> '.join(cycle.args[1])}") from None


def test_the_hf_adapter_is_reached_through_its_face() -> None:
    """Outside ``models/hf/`` the code imports ``attnaudit.models.hf`` itself, never one of its modules."""
    modules = _modules()
    private = {m for m in modules if m.startswith("attnaudit.models.hf.")}
    offenders = {
        name: sorted(found & private)
        for name, (path, package) in modules.items()
        if not name.startswith("attnaudit.models.hf") and (found := _imports(path, name, package, modules, top_level=False)) & private
    }
    assert not offenders, offenders


def test_generic_code_talks_to_the_interface() -> None:
    """No cast to the Hugging Face family, no probing for a tokenizer, outside ``models/``."""
    pattern = re.compile(r"cast\(\s*[\"']HFModel[\"']|getattr\([\w.]*model[\w.]*,\s*[\"']tokenizer[\"']")
    offenders = [f"{path.relative_to(SRC)}:{i}" for path in PACKAGE.rglob("*.py") if "models" not in path.relative_to(PACKAGE).parts[:1]
                 for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, offenders
