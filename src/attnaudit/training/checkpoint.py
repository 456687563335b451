"""attnaudit run directories: ``model.safetensors`` + ``config.json`` + ``vocab.json``, and the
per-epoch checkpoints that make training resumable; safetensors + JSON only, never pickle.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnaudit.data.batching import Collator
from attnaudit.data.vocab import Vocab
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.io import JsonKinds, atomic_write_json, check_fields, read_json, read_json_object
from attnaudit.models import ModelConfig, build_model
from attnaudit.run import CONFIG, Run, TaskSpec, absolute_dir, read_config, write_config
from attnaudit.seed import resolve_device
from attnaudit.weights import checked_weight, load_tensors, save_tensors

WEIGHTS = "model.safetensors"
VOCAB = "vocab.json"
FEATURE_VOCAB = "feature_vocab.json"
METRICS = "metrics.json"


def save_model(directory: Path, model: nn.Module) -> Path:
    """The model's weights as ``model.safetensors`` (atomic)."""
    return save_tensors(directory / WEIGHTS, model.state_dict())


def load_state_into(model: nn.Module, path: Path) -> None:
    """Load weights, turning shape/key mismatches into a clear error (e.g. a foreign vocabulary).

    Floating weights are cast to the parameter's dtype; see :func:`~attnaudit.weights.checked_weight` for what is refused."""
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
    kinds: dict[str, JsonKinds] = {key: (float, type(None)) if isinstance(value, float) else type(value) for key, value in fresh.items()}
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


def finished_run(out: Path, config_hash: str, resume: bool) -> bool:
    """Whether ``out`` holds a finished run of this very config (with ``resume``: its ``metrics.json`` and a config of
    hash ``config_hash``), said on the console: the caller loads it instead of training again. Otherwise a folder
    holding another run's test results is refused (:func:`refuse_other_run`) and the caller trains."""
    from attnaudit.progress import status

    config = out / CONFIG
    if resume and (out / METRICS).exists() and config.exists() and read_json_object(config, optional={"hash": str}).get("hash") == config_hash:
        status(f"[green]{out}[/]: already trained with this config, loading it")
        return True
    refuse_other_run(out, config_hash)
    return False


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


def load_attnaudit_run(path: str | Path, device: str | None = "auto", data_dir: str | Path | None = None) -> Run:
    """Load a run directory written by ``train`` or a training-based test (kind ``attnaudit``)."""
    path = Path(path)
    raw = read_config(path)
    try:
        config = ModelConfig.from_dict(raw["model"])
        task = TaskSpec(**raw["task"])
        model = build_model(config)
    except (TypeError, ValueError, AttributeError, AttnAuditError) as exc:
        # a config that parses but cannot build a model: bad types, sizes or names
        raise InputError(path / CONFIG, f"malformed run config: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    vocab = Vocab.load(path / VOCAB)
    if len(vocab) != config.vocab_size:
        raise InputError(path / VOCAB, f"vocabulary has {len(vocab)} entries but the model expects {config.vocab_size}")
    feature_vocab = Vocab.load(path / FEATURE_VOCAB) if (path / FEATURE_VOCAB).exists() else None
    load_state_into(model, path / WEIGHTS)
    dev = resolve_device(device)
    model.to(dev).eval()
    collate = Collator(
        vocab,
        task.labels,
        task.task_type,  # type: ignore[arg-type]
        hierarchical=config.model == "han",
        max_len=config.max_len,
        feature_vocab=feature_vocab,
    )
    if data_dir is not None:
        task.data_dir = absolute_dir(data_dir)
    return Run(model=model, collate=collate, task=task, path=path, device=dev, info=raw)
