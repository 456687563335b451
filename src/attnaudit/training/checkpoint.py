"""Run directories: ``model.safetensors`` + ``config.json`` + ``vocab.json``; never pickle.

A checkpoint is only ever read with safetensors and JSON, so loading an untrusted run
cannot execute code. A file that looks like a pickle (``torch.save`` output) is refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from attnaudit.errors import AttnAuditError, InputError
from attnaudit.io import atomic_write, atomic_write_json, check_fields, open_input, read_json, read_json_object

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
VOCAB = "vocab.json"
FEATURE_VOCAB = "feature_vocab.json"
METRICS = "metrics.json"

_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")
_MAX_HEADER = 100_000_000  # safetensors' own bound on the JSON header


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    """Atomically write tensors (made contiguous, CPU) as safetensors."""
    clean = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}

    def write(tmp: Path) -> None:
        try:
            save_file(clean, str(tmp), metadata=metadata)
        except SafetensorError as exc:  # a full disk arrives as "I/O error: ... (os error 28)": keep it an OSError
            code = re.search(r"os error (\d+)", str(exc))
            if code is None:
                raise
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(tmp)) from None

    return atomic_write(path, write)


def _sniff(path: Path) -> str:
    """``"safetensors"`` when ``path`` parses as one (an 8-byte little-endian header length, at
    most the rest of the file, then that many bytes of JSON object), else ``"pickle"`` when it
    starts with pickle/zip magic, else ``"unknown"``.

    Parsing first matters: a header of 1152 bytes starts the file with ``\\x80\\x04``, which is
    also pickle protocol 4's magic.
    """
    with open_input(path) as fh:  # a regular, readable file (not a folder, FIFO or device)
        size = os.fstat(fh.fileno()).st_size
        prefix = fh.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        if 0 < length <= min(size - 8, _MAX_HEADER):
            try:
                if isinstance(json.loads(fh.read(length)), dict):
                    return "safetensors"
            except ValueError:  # not JSON, or not text
                pass
    return "pickle" if prefix.startswith(_PICKLE_MAGIC) else "unknown"


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; refuse pickles and report corruption as one line."""
    path = Path(path)
    if not path.exists():
        raise InputError(path, "checkpoint not found")
    try:
        kind = _sniff(path)
    except OSError as exc:
        raise InputError(path, f"cannot read the checkpoint ({exc.strerror or exc})") from None
    if kind == "pickle":
        raise InputError(path, "looks like a pickle/torch.save file; attnaudit only loads safetensors and never unpickles")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise InputError(path, f"corrupt or truncated safetensors file ({str(exc).splitlines()[0][:120]})") from None


def checked_weight(path: Path, key: str, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Weight ``key`` of ``path`` cast to the model's ``dtype`` (so float16/bfloat16 checkpoints load).

    Refused: integer/bool values for a floating parameter (a cast would load them silently as
    whole numbers), and NaN/Inf, which would make every score computed with the model NaN.
    """
    stored = str(value.dtype).removeprefix("torch.")
    wanted = str(dtype).removeprefix("torch.")
    if value.dtype != dtype and not (value.is_floating_point() and dtype.is_floating_point):
        raise InputError(path, f"weight {key} is stored as {stored}; the model needs {wanted}")
    value = value.to(dtype)
    if dtype.is_floating_point and not bool(torch.isfinite(value).all()):
        cast = "" if stored == wanted else f" (cast from {stored} to {wanted})"
        raise InputError(path, f"weight {key} holds NaN or Inf values{cast}")
    return value


def save_model(directory: Path, model: nn.Module) -> Path:
    """The model's weights as ``model.safetensors`` (atomic)."""
    return save_tensors(directory / WEIGHTS, model.state_dict())


def load_state_into(model: nn.Module, path: Path) -> None:
    """Load weights, turning shape/key mismatches into a clear error (e.g. a foreign vocabulary).

    Floating weights are cast to the parameter's dtype; see :func:`checked_weight` for what is refused."""
    state = load_tensors(path)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise InputError(path, f"checkpoint does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for key, value in state.items():
        if value.shape != own[key].shape:
            raise InputError(
                path,
                f"checkpoint does not match the model/vocabulary: {key} has shape {tuple(value.shape)}, "
                f"expected {tuple(own[key].shape)}",
            )
    model.load_state_dict({key: checked_weight(path, key, value, own[key].dtype) for key, value in state.items()})


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    """The run's ``config.json`` (atomic)."""
    return atomic_write_json(directory / CONFIG, config)


# The optional fields of a run config's ``task`` (``TaskSpec``) and their JSON types.
TASK_OPTIONAL = {"data_dir": (str, type(None)), "seed": int, "dev": (str, type(None)), "test": (str, type(None))}


def read_config(directory: Path) -> dict[str, Any]:
    """A run directory's ``config.json``, with one-line errors for files, missing folders and foreign JSON."""
    directory = Path(directory)
    if directory.is_file():
        if directory.suffix in (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle"):
            load_tensors(directory)  # a checkpoint file: refuses pickles with the right message
        raise InputError(directory, "expected a run directory (config.json + model.safetensors), got a file")
    if not directory.is_dir():
        raise InputError(directory, "run directory not found")
    path = directory / CONFIG
    config = read_json(path)
    if not isinstance(config, dict) or "model" not in config or "task" not in config:
        raise InputError(path, "not an attnaudit run config (needs 'model' and 'task')")
    check_fields(path, config, {"model": dict, "task": dict}, {"kind": str, "hash": str, "hf": dict})
    task = check_fields(path, config["task"], {"spec": str, "task_type": str, "labels": list}, TASK_OPTIONAL, "task")
    if not all(isinstance(label, str) for label in task["labels"]):
        raise InputError(path, "field 'task.labels' must be an array of strings")
    return config


def save_optimizer(path: Path, optimizer: torch.optim.Optimizer, extra: dict[str, torch.Tensor]) -> None:
    """Optimizer state as safetensors (tensors) + JSON metadata (param groups, scalars)."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = dict(extra)
    scalars: dict[str, Any] = {}
    for pid, pstate in state["state"].items():
        for name, value in pstate.items():
            key = f"opt.{pid}.{name}"
            if torch.is_tensor(value):
                tensors[key] = value
            else:
                scalars[key] = value
    meta = {"param_groups": state["param_groups"], "scalars": scalars}
    save_tensors(path, tensors, metadata={"optimizer": json.dumps(meta)})


def load_optimizer(path: Path, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Restore optimizer state written by :func:`save_optimizer`; return the extra tensors."""
    from safetensors import safe_open

    tensors = load_tensors(path)
    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads((fh.metadata() or {})["optimizer"])
    state: dict[int, dict[str, Any]] = {}
    extra: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = value
        else:
            extra[key] = value
    for key, value in meta["scalars"].items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return extra


def resume_epoch(
    out: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config_hash: str,
    fresh: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Restore the last finished epoch of a killed run with the same config hash.

    Returns its saved training state (model, optimizer and torch RNG are restored), or None
    when there is no matching checkpoint. ``fresh`` (the state a new run starts from) gives
    the fields the state must have; a ``state.json`` of another shape is an ``InputError``.
    """
    state_file = Path(out) / "checkpoint" / "state.json"
    if not state_file.exists():
        return None
    state = read_json_object(state_file, optional={"hash": str})
    if state.get("hash") != config_hash:
        return None
    if fresh is not None:
        state = _checked_state(state_file, state, fresh)
    weights, optimizer_file = _epoch_files(state_file.parent, state.get("epoch", 0))
    if not (weights.exists() and optimizer_file.exists()):
        return None  # a checkpoint of an older layout (or damaged by hand): start afresh
    load_state_into(model, weights)
    torch.set_rng_state(load_optimizer(optimizer_file, optimizer)["rng"])
    return state


def _epoch_files(ckpt: Path, epoch: int) -> tuple[Path, Path]:
    """The weights and optimizer + RNG files of ``epoch``'s checkpoint."""
    return ckpt / f"last-{epoch}.safetensors", ckpt / f"optimizer-{epoch}.safetensors"


def _checked_state(path: Path, state: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """``state`` when it has every field of ``fresh`` with a value of the same JSON type.

    A float field may be null: JSON has no infinity, so the ±inf a best score starts at was
    written as null; it is restored as that starting value.
    """
    kinds = {key: (float, type(None)) if isinstance(value, float) else type(value) for key, value in fresh.items()}
    check_fields(path, state, kinds)
    return {**state, **{key: fresh[key] for key in kinds if state[key] is None}}


def start_or_resume(
    out: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
    fresh: dict[str, Any],
    write_extras: Callable[[Path], None] | None = None,
    resume: bool = True,
) -> dict[str, Any]:
    """The training state to continue from: a killed run's last finished epoch (same config
    hash), else ``fresh`` after clearing stale files and writing ``config.json`` and the extras
    (``write_extras(out)``: vocabularies)."""
    from attnaudit.progress import status

    out.mkdir(parents=True, exist_ok=True)
    restored = resume_epoch(out, model, optimizer, config["hash"], fresh) if resume else None
    if restored is not None:
        status(f"resuming {out} after epoch {restored['epoch']}")
        return restored
    clear_checkpoint(out)
    write_config(out, config)
    if write_extras is not None:
        write_extras(out)
    return fresh


def refuse_other_run(out: Path, config_hash: str) -> None:
    """Refuse to train over a run with another config whose test results are in ``out/results``:
    they would describe the old model. (Without results a different config retrains in place,
    as the training-based tests' sub-runs do when an option changes.)"""
    config = out / CONFIG
    if not config.is_file() or not (out / "results").exists():
        return
    try:
        other = read_json(config)
    except AttnAuditError:
        return  # an unreadable config protects nothing; the new run replaces it
    if isinstance(other, dict) and other.get("hash") != config_hash:
        model = other.get("model", {}).get("model") if isinstance(other.get("model"), dict) else None
        raise AttnAuditError(
            f"{out}: holds a {model or 'model'} run with a different config and its test results in "
            f"results/; choose another --out, or delete that directory first"
        )


def clear_checkpoint(out: Path) -> None:
    """Remove a stale epoch checkpoint and ``metrics.json`` before a run starts afresh."""
    import shutil

    (Path(out) / METRICS).unlink(missing_ok=True)
    shutil.rmtree(Path(out) / "checkpoint", ignore_errors=True)


def save_epoch(out: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], config_hash: str) -> None:
    """Checkpoint an epoch: weights, then optimizer + RNG, under the epoch's own names, then
    ``state.json`` last (the commit point), then the previous epoch's files.

    A write that fails (a full disk) or a kill at any point leaves the last committed epoch
    whole: its files are only removed once ``state.json`` names the new ones.
    """
    ckpt = Path(out) / "checkpoint"
    keep = _epoch_files(ckpt, state["epoch"])
    save_tensors(keep[0], model.state_dict())
    save_optimizer(keep[1], optimizer, {"rng": torch.get_rng_state()})
    atomic_write_json(ckpt / "state.json", {**state, "hash": config_hash})
    for stale in ckpt.glob("*.safetensors"):
        if stale not in keep:
            stale.unlink(missing_ok=True)
