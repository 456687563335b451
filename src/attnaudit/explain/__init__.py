"""Explanation methods, one module each in :mod:`attnaudit.explain.methods`, registered by name
(see :mod:`attnaudit.explain.registry`).

Importing the package imports every module of ``explain/methods/``, so each method registers itself: adding
a method is adding one file there (and its test), nothing else. What several methods compute alike lives in
:mod:`attnaudit.explain.helpers`; methods never import each other. The machinery stays here: ``registry.py``,
``text.py`` (one text's decision), ``generation.py`` and ``generation_view.py`` (a generated sequence and its page).
"""

from __future__ import annotations

from attnaudit.explain import methods as methods
from attnaudit.explain.registry import EXPLANATIONS as EXPLANATIONS
from attnaudit.explain.registry import NEEDS as NEEDS
from attnaudit.explain.registry import Explanation as Explanation
from attnaudit.explain.registry import applying as applying
from attnaudit.explain.registry import choose as choose
from attnaudit.explain.registry import default_names as default_names
from attnaudit.explain.registry import explanation as explanation
from attnaudit.explain.registry import get_explanation as get_explanation
from attnaudit.explain.registry import item_mask as item_mask
from attnaudit.explain.registry import item_names as item_names
from attnaudit.explain.registry import item_roles as item_roles
from attnaudit.explain.registry import item_values as item_values
from attnaudit.explain.registry import list_explanations as list_explanations
from attnaudit.explain.registry import register as register
from attnaudit.explain.registry import unregister as unregister
