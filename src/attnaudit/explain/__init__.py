"""Explanation methods, one module each, registered by name (see :mod:`attnaudit.explain.registry`).

Importing the package imports every module in it, so each method registers itself: adding a
method is adding one file (and its test), nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from attnaudit.explain.registry import (
    EXPLANATIONS,
    NEEDS,
    Explanation,
    applying,
    choose,
    default_names,
    explanation,
    get_explanation,
    item_mask,
    item_names,
    item_values,
    list_explanations,
    register,
    unregister,
)

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("registry", "text", "generation") and not _info.name.startswith("_"):  # text: explain_text, above the methods
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "EXPLANATIONS",
    "NEEDS",
    "Explanation",
    "applying",
    "choose",
    "default_names",
    "explanation",
    "get_explanation",
    "item_mask",
    "item_names",
    "item_values",
    "list_explanations",
    "register",
    "unregister",
]
