"""One reader of option values for every entry point, with one error format.

A test's options are a dataclass (``Experiment.Options``) whose type hints say what each
option holds. The same value reaches it from three places: ``attnaudit run <test> --opt V``
and ``--set TEST.OPTION=V`` give text, a sweep's YAML gives already-typed values. Text is read
by :func:`parse_text`, typed values are checked by :func:`conforms`; both follow the hints, so
the three entry points cannot disagree (tests/test_options.py feeds them the same values).
"""

from __future__ import annotations

import math
import re
import types
import typing
from pathlib import Path
from typing import Any

from attnaudit.errors import AttnAuditError, InputError, spelled, unknown
from attnaudit.io import read_json_object

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")
_NONE = ("none", "null")


def _parts(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    return typing.get_origin(hint), typing.get_args(hint)


def _is_union(origin: Any) -> bool:
    return origin is typing.Union or origin is types.UnionType


def optional_inner(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; any other hint -> ``(hint, False)``."""
    origin, args = _parts(hint)
    if _is_union(origin) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007 (a Union built from a tuple at run time)
    return hint, False


def sequence_item(hint: Any) -> Any | None:
    """The item type of a list/tuple hint (through ``| None``), or None when it is no sequence."""
    inner, _ = optional_inner(hint)
    origin, args = _parts(inner)
    if origin in (list, tuple):
        items = [a for a in args if a is not Ellipsis]
        return items[0] if items else str
    return None


def type_name(hint: Any) -> str:
    """A short readable name: ``int``, ``list of float``, ``int or none``."""
    inner, optional = optional_inner(hint)
    item = sequence_item(inner)
    if item is not None:
        name = f"comma-separated {type_name(item)} values"
    elif _parts(inner)[0] is typing.Literal:
        name = " or ".join(str(a) for a in _parts(inner)[1])
    else:
        name = getattr(inner, "__name__", None) or str(inner).replace("typing.", "")
    return f"{name} or none" if optional else name


def _scalar(text: str, hint: Any, where: str, expected: str | None = None) -> Any:
    """One scalar from text, as ``hint`` (int, float, bool, str, Literal); ``expected`` names the
    whole option's type in the error (a list's, for one of its items)."""
    origin, args = _parts(hint)
    try:
        if hint is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        if hint is int:
            return int(text)
        if hint is float:
            value = float(text)
            if not math.isfinite(value):
                raise AttnAuditError(f"{where}: must be a finite number, got {text!r}")
            return value
        if origin is typing.Literal:
            if text not in [str(a) for a in args]:
                raise ValueError
            return next(a for a in args if str(a) == text)
    except ValueError:
        raise AttnAuditError(f"{where}: expected {expected or type_name(hint)}, got {text!r}") from None
    return text


def parse_text(text: str, hint: Any, where: str) -> Any:
    """Read command-line ``text`` as the type ``hint`` declares; ``where`` names the option in errors.

    Sequences are comma-separated (``"0.2,3"``); an empty sequence is refused, because leaving
    the option out is how the default is asked for. ``none``/``null`` give None where allowed.
    """
    inner, optional = optional_inner(hint)
    text = text.strip()
    if optional and text.lower() in _NONE:
        return None
    item = sequence_item(inner)
    if item is None:
        return _scalar(text, inner, where, type_name(hint) if optional else None)
    values = [_scalar(v.strip(), item, where, type_name(inner)) for v in text.split(",") if v.strip()]
    if not values:
        raise AttnAuditError(f"{where}: empty list {text!r}; give {type_name(inner)}, or leave the option out for the default")
    return tuple(values) if _parts(inner)[0] is tuple else values


def conforms(value: Any, hint: Any) -> bool:
    """Whether an already-typed value (YAML, Python) fits ``hint``; numbers must be finite."""
    origin, args = _parts(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if _is_union(origin):
        return any(conforms(value, a) for a in args)
    if origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        return isinstance(value, (list, tuple)) and (not inner or all(conforms(v, inner[0]) for v in value))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    return True


def check_value(value: Any, hint: Any, where: str) -> Any:
    """``value`` (already typed) as ``hint`` wants it: ints widened to float, lists to tuples where declared."""
    if not conforms(value, hint):
        raise AttnAuditError(f"{where}: expected {type_name(hint)}, got {value!r}")
    inner, _ = optional_inner(hint)
    item = sequence_item(inner)
    if value is None:
        return None
    if item is not None:
        values = [float(v) if item is float else v for v in value]
        return tuple(values) if _parts(inner)[0] is tuple else values
    return float(value) if inner is float else value


def option_hints(options_class: type) -> dict[str, Any]:
    """The option names and type hints of an Options dataclass."""
    return typing.get_type_hints(options_class)


def parse_assignment(item: str, registry: dict[str, Any]) -> tuple[str, str, Any]:
    """``"permutation.permutations=20"`` -> ``("permutation", "permutations", 20)``, typed per the test's Options."""
    key, sep, value = item.partition("=")
    test, dot, option = key.strip().partition(".")
    if not sep or not dot or not option:
        raise AttnAuditError(f"--set expects TEST.OPTION=VALUE, got {item!r}")
    found = spelled(test.strip(), registry)
    if found is None:
        raise AttnAuditError(f"--set {key}: {unknown('test', test.strip(), registry)}")
    test = found
    hints = option_hints(registry[test].Options)
    option = spelled(option.strip(), hints) or option.strip()
    if option not in hints:
        raise AttnAuditError(f"--set {key}: test {test!r}: {unknown('option', option, hints) if hints else 'takes no options'}")
    return test, option, parse_text(value, hints[option], f"--set {key.strip()}")


SEED_MAX = 2**32 - 1


def check_seed(seed: Any, where: str = "--seed") -> int:
    """A seed every random source accepts (NumPy takes 0..2^32-1); refused before any work otherwise."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise AttnAuditError(f"{where} must be an integer from 0 to {SEED_MAX}, got {seed!r}")
    return seed


DTYPE_NAMES = ("float32", "bfloat16")
"""``--dtype`` values: a decoder LLM's parameter dtype (float32 is the reference; bfloat16 halves memory)."""


def check_dtype(name: str, where: str = "--dtype") -> str:
    """A ``--dtype`` name, refused in one line unless it is one of :data:`DTYPE_NAMES`."""
    return _scalar(str(name), typing.Literal[DTYPE_NAMES], where)


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""``--device-map`` names accelerate places layers by; otherwise a JSON file mapping module names to devices."""


def parse_device_map(value: str, where: str = "--device-map") -> str | dict[str, str | int]:
    """A ``--device-map``: an accelerate strategy (:data:`DEVICE_MAP_STRATEGIES`) or a ``.json`` file mapping
    module names to ``cpu``, ``disk``, ``cuda:N`` or a GPU index; refused in one line otherwise."""
    if value in DEVICE_MAP_STRATEGIES:
        return value
    path = Path(value)
    if path.suffix != ".json" or not path.is_file():
        raise AttnAuditError(f"{where} must be one of {', '.join(DEVICE_MAP_STRATEGIES)} or a .json file of module -> device, got {value!r}")
    mapping = read_json_object(path)
    bad = [k for k, v in mapping.items() if isinstance(v, bool) or not isinstance(v, (str, int))]
    if not mapping or bad:
        raise InputError(str(path), f"{where} needs an object of module name -> device (cpu, disk, cuda:N or a GPU index)"
                         + (f"; {bad[0]!r} is not one" if bad else ""))
    return dict(mapping)


def parse_max_memory(value: str, where: str = "--max-memory") -> dict[str | int, str]:
    """``cpu=2GiB,0=20GiB`` (device=size, as accelerate reads them) as a dict; refused in one line otherwise."""
    out: dict[str | int, str] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        device, _, size = part.partition("=")
        if not size or not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B)?", size.strip(), re.IGNORECASE):
            raise AttnAuditError(f"{where} takes device=size pairs such as cpu=2GiB,0=20GiB; got {part!r}")
        out[int(device) if device.strip().isdigit() else device.strip()] = size.strip()
    if not out:
        raise AttnAuditError(f"{where} takes device=size pairs such as cpu=2GiB,0=20GiB; got {value!r}")
    return out


def check_devices(device_map: str | dict[str, str | int], max_memory: dict[str | int, str] | None) -> None:
    """Every device a ``--device-map`` or ``--max-memory`` names exists on this machine (``cpu``, ``disk``, a GPU
    index or ``cuda:N`` below the GPUs present, ``mps`` where present): one line before any model is loaded."""
    import torch

    gpus = torch.cuda.device_count()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    known = ["cpu", "disk", *(["mps"] if mps else []), *([f"cuda:0 ... cuda:{gpus - 1} (or 0 ... {gpus - 1})"] if gpus else [])]

    def exists(device: object) -> bool:
        if isinstance(device, int) and not isinstance(device, bool):
            return 0 <= device < gpus
        name = str(device).strip()
        if name in ("cpu", "disk") or (name == "mps" and mps):
            return True
        index = name.removeprefix("cuda").removeprefix(":")
        return name.startswith("cuda") and (index == "" and gpus > 0 or index.isdigit() and int(index) < gpus)

    named = [("--device-map", f"module {module!r}", device) for module, device in (device_map.items() if isinstance(device_map, dict) else [])]
    named += [("--max-memory", "budget", device) for device in (max_memory or {})]
    for option, what, device in named:
        if not exists(device):
            present = f"{gpus} GPU(s)" if gpus else "no GPU"
            raise AttnAuditError(f"{option}: {what} names device {device!r}, which this machine does not have ({present}); use {', '.join(known)}")


def check_max_length(value: int | None, where: str = "--max-length") -> int | None:
    """A ``--max-length`` (tokens of text kept): None or a positive integer."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise AttnAuditError(f"{where} must be a positive number of tokens, got {value!r}")
    return value
