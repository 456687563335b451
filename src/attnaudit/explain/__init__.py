"""Explanation methods, one module each in :mod:`attnaudit.explain.methods`, registered by name
(see :mod:`attnaudit.explain.registry`).

Importing the package imports every module of ``explain/methods/``, so each method registers itself: adding
a method is adding one file there (and its test), nothing else. What several methods compute alike lives in
:mod:`attnaudit.explain.helpers`; methods never import each other. The machinery stays here: ``registry.py``,
``text.py`` (one text's decision), ``generation.py`` and ``generation_view.py`` (a generated sequence and its page).
"""

from __future__ import annotations

import importlib
import pkgutil

from attnaudit.explain import methods
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
    item_roles,
    item_values,
    list_explanations,
    register,
    unregister,
)

for _info in pkgutil.iter_modules(methods.__path__):
    importlib.import_module(f"{methods.__name__}.{_info.name}")

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
    "item_roles",
    "item_values",
    "list_explanations",
    "register",
    "unregister",
]
