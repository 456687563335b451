"""The explanation methods, one module each; each registers itself with
:func:`~attnaudit.explain.registry.explanation` when :mod:`attnaudit.explain` imports every module here.
A method imports the registry and :mod:`attnaudit.explain.helpers`, never another method."""
