"""attnaudit: is this model's attention a faithful explanation of its predictions?

The Python API mirrors the CLI: ``train``, ``evaluate``, ``load_run``, ``run_test``
(``attnaudit run <test>``), ``list_tests`` (``attnaudit tests``), ``test_applicability``
(``attnaudit tests --hf/--run``), ``explain_text`` (``attnaudit explain``), ``audit``, ``report``,
``show`` (the report's instance explorer, inline in Jupyter).
Names are imported lazily so ``import attnaudit`` stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    "train": ("attnaudit.training.trainer", "train"),
    "evaluate": ("attnaudit.training.trainer", "evaluate"),
    "predict": ("attnaudit.training.trainer", "predict"),
    "load_run": ("attnaudit.run", "load_run"),
    "load_task": ("attnaudit.data.tasks", "load_task"),
    "run_test": ("attnaudit.experiments.runner", "run_test"),
    "list_tests": ("attnaudit.experiments.experiment", "discover"),
    "Result": ("attnaudit.experiments.experiment", "Result"),
    "Intervention": ("attnaudit.models.interface", "Intervention"),
    "explain_text": ("attnaudit.explain.text", "explain_text"),
    "Explained": ("attnaudit.explain.text", "Explained"),
    "test_applicability": ("attnaudit.experiments.experiment", "applicability"),
    "show": ("attnaudit.report", "show"),
}


def __getattr__(name: str) -> Any:
    if name in _API:
        module, attr = _API[name]
        return getattr(import_module(module), attr)
    raise AttributeError(f"module 'attnaudit' has no attribute {name!r}")


__all__ = ["__version__", *_API]
