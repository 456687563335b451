"""The explanation methods, one module each; importing this package imports every module here, and each
registers itself with :func:`~attnaudit.explain.registry.explanation`. A method imports the registry and
:mod:`attnaudit.explain.helpers`, never another method.

Hand-written discovery rather than a plugin library: registration by import is all it needs (adding a
method is adding one file here).
"""

from __future__ import annotations

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
