"""The one training loop: every model attnaudit trains goes through :func:`fit`.

Classifiers and taggers (``train``), the NMT model (``train_nmt``), Hugging Face fine-tuning
(``finetune``), the training-based tests' sub-runs (uniform, seeds, adversaries, probes,
diagnostic models) and the key adversary all differ only in a :class:`Hooks` (loss of a
batch, the epoch-end evaluation, how the selected model is saved, ...) and a :class:`LoopConfig`
(epochs, early stopping, selection, optimiser); the loop itself is written once.

It owns: seeding (:func:`seeded`, the per-epoch shuffle seed ``seed·1000 + epoch``), epochs
with early stopping (``patience``) or a fixed number of epochs (``patience=None``), stopping
where the kept score is at its ceiling (a perfect dev accuracy: nothing later can be kept), model
selection on a named dev metric from a minimum epoch on, the optimiser (Adam, AMSGrad, AdamW
or SGD with per-parameter-group weight decay and frozen parameters), optional gradient
clipping, the learning-rate schedule (stateless, so a resumed run follows it exactly), a
step budget, progress bars, atomic per-epoch checkpoints and resume after ``kill -9`` with the
numbers an uninterrupted run gives, and :func:`notes` saying what it did.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor, nn

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.progress import status, track
from attnaudit.seed import set_seed

M = TypeVar("M")
LossOut = Tensor | tuple[Tensor, dict[str, Tensor]]
"""A batch's loss: a scalar, or the scalar and named values to average into the history."""



class Batcher(Protocol):
    """What :func:`fit` draws its batches from: a :class:`~attnaudit.run.Run`, or anything with its ``batches``
    (:class:`attnaudit.training.together.Feeder`: several models' batches stacked)."""

    def batches(self, examples: list[Example], batch_size: int = ..., shuffle: bool = ..., seed: int = ...) -> Iterable[Any]: ...


SCHEDULES = ("constant", "linear", "linear-hf", "inverse-sqrt")
OPTIMISERS = ("adam", "amsgrad", "adamw", "sgd")


def seeded(seed: int, build: Callable[[], M]) -> M:
    """``build()`` right after seeding Python, NumPy and torch: the same seed, the same initial weights."""
    set_seed(seed)
    return build()


@dataclass
class Optimiser:
    """The optimiser, its learning-rate schedule and gradient clipping.

    ``no_decay`` and ``frozen`` are parameter-name patterns (``fnmatch``, e.g.
    ``"*attention.scorer*"``): the first train without weight decay, the second do not train.
    ``schedule`` multiplies ``lr`` per optimiser step: ``constant``; ``linear`` (attnaudit's
    classifiers: up over ``warmup`` steps starting at ``lr/warmup``, then linearly to 0 at the
    last step); ``linear-hf`` (transformers' ``get_linear_schedule_with_warmup``: the same from
    0); ``inverse-sqrt`` (Vaswani et al.: up over ``warmup`` steps, then ``∝ 1/√step``).
    ``clip`` is the gradient-norm limit (None: no clipping).
    """

    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    no_decay: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    clip: float | None = None
    schedule: str = "constant"
    warmup: int = 0

    def __post_init__(self) -> None:
        if self.name not in OPTIMISERS:
            raise AttnAuditError(f"unknown optimiser {self.name!r}; choose one of {', '.join(OPTIMISERS)}")
        if self.schedule not in SCHEDULES:
            raise AttnAuditError(f"unknown learning-rate schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")

    def groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """Parameter groups: the trained parameters, split by whether weight decay applies."""
        named = [(n, p) for n, p in model.named_parameters() if not any(fnmatchcase(n, f) for f in self.frozen)]
        plain = [p for n, p in named if not any(fnmatchcase(n, pattern) for pattern in self.no_decay)]
        exempt = [p for n, p in named if any(fnmatchcase(n, pattern) for pattern in self.no_decay)]
        groups = [{"params": plain, "weight_decay": self.weight_decay}]
        if exempt:
            groups.append({"params": exempt, "weight_decay": 0.0})
        return [g for g in groups if g["params"]]

    def build(self, model: nn.Module) -> torch.optim.Optimizer:
        """The optimiser over :meth:`groups` of ``model``."""
        groups = self.groups(model)
        if self.name == "sgd":
            return torch.optim.SGD(groups, lr=self.lr, weight_decay=self.weight_decay)
        kind = torch.optim.AdamW if self.name == "adamw" else torch.optim.Adam
        return kind(groups, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                    amsgrad=self.name == "amsgrad")

    def factor(self, step: int, total: int) -> float:
        """The learning-rate multiplier at optimiser step ``step`` (0-based) of ``total``."""
        warmup = self.warmup
        if self.schedule == "constant" or (self.schedule == "linear" and warmup <= 0):
            return 1.0
        if self.schedule == "inverse-sqrt":
            k = step + 1
            return min(k / warmup, math.sqrt(warmup / k))
        if self.schedule == "linear-hf":
            if step < warmup:
                return float(step) / float(max(1, warmup))
            return max(0.0, float(total - step) / float(max(1, total - warmup)))
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))


@dataclass
class Selection:
    """Which epoch's model is kept, and when training stops early.

    ``metric`` names a value of the epoch's history record (``"dev.accuracy"``,
    ``"dev.loss"``, ``"dev_loss"``; None keeps the last epoch); ``mode`` ``max`` or ``min``.
    Epochs before ``min_epoch`` are never selected and do not count towards ``patience``
    (epochs in a row without improvement before stopping; None trains every epoch).
    ``ceiling`` is the best value the metric can take (1.0 for accuracy, F1 or ROC-AUC): once the kept
    epoch reaches it, no later epoch can be kept (an epoch is kept only when strictly better), so
    training stops there with the very model and scores that training on would keep.
    """

    metric: str | None = None
    mode: str = "max"
    min_epoch: int = 1
    patience: int | None = None
    ceiling: float | None = None

    def start(self) -> float:
        return float("-inf") if self.mode == "max" else float("inf")

    def better(self, value: float, best: float) -> bool:
        return value > best if self.mode == "max" else value < best

    def reached(self, best: float) -> bool:
        """Whether the kept value ``best`` is at the ceiling: no later epoch can be kept."""
        if self.metric is None or self.ceiling is None:
            return False
        return best >= self.ceiling if self.mode == "max" else best <= self.ceiling


@dataclass
class LoopConfig:
    """How long and how a model trains (see the module docstring)."""

    epochs: int
    batch_size: int
    seed: int = 0
    optimiser: Optimiser = field(default_factory=Optimiser)
    selection: Selection = field(default_factory=Selection)
    max_steps: int | None = None
    """Stop after this many optimiser steps (the epoch in which it is reached ends there)."""


@dataclass
class Hooks:
    """What one kind of training adds to the loop.

    ``loss(model, batch)``: the training loss of a batch (optionally with named values to log);
    ``evaluate()``: fields added to the epoch's history record (the dev scores selection reads);
    ``epoch_start(epoch)``: called before an epoch's first batch (per-epoch generators);
    ``weight(batch)``: the batch's weight in the epoch's mean loss (default: its size);
    ``save_best()``: keeps the selected model (default: ``model.safetensors`` in the checkpoint's
    folder, reloaded at the end); ``label``: prefix of progress lines; ``train_key``: the name of
    the mean training loss in the history; ``done()``: True when no later epoch can change the
    outcome (several models trained as one, each with its own selection, all stopped).
    """

    loss: Callable[[nn.Module, Any], LossOut]
    evaluate: Callable[[], dict[str, Any]] | None = None
    epoch_start: Callable[[int], None] | None = None
    weight: Callable[[Any], float] = len
    save_best: Callable[[], None] | None = None
    label: str = ""
    train_key: str = "train_loss"
    done: Callable[[], bool] | None = None


@dataclass
class Checkpoint:
    """Where a resumable run lives: ``out`` with ``config`` (its ``hash`` identifies the run),
    ``write_extras(out)`` writing its vocabularies; ``resume=False`` always starts afresh."""

    out: Path
    config: dict[str, Any]
    write_extras: Callable[[Path], None] | None = None
    resume: bool = True


def fit(
    model: nn.Module, run: Batcher, examples: list[Example], cfg: LoopConfig, hooks: Hooks,
    checkpoint: Checkpoint | None = None,
) -> dict[str, Any]:
    """Train ``model`` on ``examples`` (batched by ``run``); return the training state.

    The state holds ``epoch`` (epochs run), ``step``, ``best`` (the selected epoch's metric),
    ``selected`` (its epoch), ``history`` (one record per epoch) and ``seconds``. With a
    checkpoint, every epoch is saved under ``out/checkpoint`` and a killed run resumes from its
    last finished epoch; the selected weights (``out/model.safetensors``) are in ``model`` on
    return. With ``hooks.save_best`` the caller keeps (and reloads) the selected model itself;
    with neither, ``model`` holds the last epoch's weights.
    """
    from attnaudit.training.checkpoint import (
        WEIGHTS,
        load_state_into,
        save_epoch,
        save_model,
    )

    optimizer = cfg.optimiser.build(model)
    n_batches = -(-len(examples) // cfg.batch_size)
    state = _start(model, optimizer, cfg, checkpoint, n_batches)
    save_best = hooks.save_best
    if save_best is None and checkpoint is not None:
        def save_best() -> None:
            save_model(checkpoint.out, model)
    while _go_on(cfg, state) and not (hooks.done is not None and hooks.done()):
        start = time.perf_counter()
        record = _epoch(model, run, examples, optimizer, cfg, hooks, state, n_batches)
        improved = _select(cfg.selection, record, state)
        if improved and save_best is not None:
            save_best()
        state["seconds"] += time.perf_counter() - start
        state["history"].append(record)
        _report(hooks, cfg.selection, record, improved)
        if checkpoint is not None:
            save_epoch(checkpoint.out, model, optimizer, state, str(checkpoint.config["hash"]))
    if hooks.save_best is None and checkpoint is not None:
        load_state_into(model, checkpoint.out / WEIGHTS)
    model.eval()
    return state


def _fresh(cfg: LoopConfig) -> dict[str, Any]:
    return {"epoch": 0, "step": 0, "best": cfg.selection.start(), "selected": 0, "bad": 0, "history": [], "seconds": 0.0}


def _start(
    model: nn.Module, optimizer: torch.optim.Optimizer, cfg: LoopConfig, checkpoint: Checkpoint | None, n_batches: int
) -> dict[str, Any]:
    """The state to continue from: a killed run's last epoch (same config hash) or a fresh one.

    ``step`` and ``selected`` entered the state later: a checkpoint without them has run every
    batch of every epoch (there was no step budget), and its selected epoch is unknown (0).
    """
    from attnaudit.training.checkpoint import start_or_resume

    fresh = _fresh(cfg)
    if checkpoint is None:
        return fresh
    required = {k: v for k, v in fresh.items() if k not in ("step", "selected")}
    state = start_or_resume(checkpoint.out, model, optimizer, checkpoint.config, required,
                            checkpoint.write_extras, checkpoint.resume)
    state = {**fresh, "step": state["epoch"] * n_batches, **state} if state is not required else fresh
    for key in ("step", "selected"):
        if not isinstance(state[key], int) or isinstance(state[key], bool):
            raise InputError(checkpoint.out / "checkpoint" / "state.json", f"field {key!r} must be an integer")
    return state


def _go_on(cfg: LoopConfig, state: dict[str, Any]) -> bool:
    patience = cfg.selection.patience
    return (
        state["epoch"] < cfg.epochs
        and (patience is None or state["bad"] < patience)
        and (cfg.max_steps is None or state["step"] < cfg.max_steps)
        and not cfg.selection.reached(state["best"])
    )


def stopped(cfg: LoopConfig, state: dict[str, Any]) -> str:
    """Why training ended: ``epochs`` (all run), ``ceiling``, ``patience`` or ``steps`` (the budget)."""
    selection = cfg.selection
    if state["epoch"] >= cfg.epochs:
        return "epochs"
    if selection.reached(state["best"]):
        return "ceiling"
    if selection.patience is not None and state["bad"] >= selection.patience:
        return "patience"
    return "steps" if cfg.max_steps is not None and state["step"] >= cfg.max_steps else "epochs"


def _epoch(
    model: nn.Module, run: Batcher, examples: list[Example], optimizer: torch.optim.Optimizer, cfg: LoopConfig,
    hooks: Hooks, state: dict[str, Any], n_batches: int,
) -> dict[str, Any]:
    """One epoch of optimiser steps, then the epoch-end evaluation; the epoch's history record."""
    epoch = state["epoch"] + 1
    opt = cfg.optimiser
    params = [p for group in optimizer.param_groups for p in group["params"]]
    model.train()
    if hooks.epoch_start is not None:
        hooks.epoch_start(epoch)
    sums: dict[str, float] = {hooks.train_key: 0.0}
    count = 0.0
    batches = run.batches(examples, cfg.batch_size, shuffle=True, seed=cfg.seed * 1000 + epoch)
    for batch in track(batches, f"{hooks.label}epoch {epoch}/{cfg.epochs}", total=n_batches):
        if cfg.max_steps is not None and state["step"] >= cfg.max_steps:
            break  # the step budget ends this (last) epoch early
        for group in optimizer.param_groups:
            group["lr"] = opt.lr * opt.factor(state["step"], cfg.epochs * n_batches)
        loss, logs = _split(hooks.loss(model, batch))
        optimizer.zero_grad()
        loss.backward()
        if opt.clip is not None:
            nn.utils.clip_grad_norm_(params, opt.clip)
        optimizer.step()
        state["step"] += 1
        weight = hooks.weight(batch)
        for key, value in ((hooks.train_key, loss), *logs.items()):
            sums[key] = sums.get(key, 0.0) + float(value.detach()) * weight
        count += weight
    state["epoch"] = epoch
    record: dict[str, Any] = {"epoch": epoch, **{k: v / max(count, 1) for k, v in sums.items()}}
    if hooks.evaluate is not None:
        record.update(hooks.evaluate())
    return record


def _split(out: LossOut) -> tuple[Tensor, dict[str, Tensor]]:
    return out if isinstance(out, tuple) else (out, {})


def metric_value(record: dict[str, Any], metric: str) -> float:
    """``record``'s value at ``metric`` (dots go into nested records: ``dev.accuracy``)."""
    value: Any = record
    for part in metric.split("."):
        if not isinstance(value, dict) or part not in value:
            raise AttnAuditError(f"selection metric {metric!r} is not in the epoch's record ({', '.join(record)})")
        value = value[part]
    return float(value)


def _select(selection: Selection, record: dict[str, Any], state: dict[str, Any]) -> bool:
    """Whether this epoch's model is the best so far (kept); updates ``best``, ``selected`` and ``bad``."""
    epoch = record["epoch"]
    if epoch < selection.min_epoch:
        return False
    if selection.metric is None:
        state["selected"] = epoch
        return True
    value = metric_value(record, selection.metric)
    if selection.better(value, state["best"]):
        state["best"], state["bad"], state["selected"] = value, 0, epoch
        return True
    state["bad"] += 1
    return False


def _report(hooks: Hooks, selection: Selection, record: dict[str, Any], improved: bool) -> None:
    line = f"{hooks.label}epoch {record['epoch']}: {hooks.train_key.replace('_', ' ')} {record[hooks.train_key]:.4f}"
    if selection.metric is not None:
        line += f", {selection.metric} {metric_value(record, selection.metric):.4f}"
    status(line + (" *" if improved and selection.metric is not None else ""))
    if improved and selection.metric is not None and selection.reached(metric_value(record, selection.metric)):
        status(f"{hooks.label}{selection.metric} is at its ceiling {selection.ceiling:g}: no later epoch can be kept, stopping")


def notes(cfg: LoopConfig, state: dict[str, Any]) -> dict[str, Any]:
    """What the loop did, for the run's ``metrics.json``: epochs and steps run, the selected epoch
    and how it was chosen, the optimiser settings."""
    selection = cfg.selection
    return {
        "epochs_run": state["epoch"],
        "steps": state["step"],
        "selected_epoch": state["selected"],
        "selection": {"metric": selection.metric, "mode": selection.mode, "min_epoch": selection.min_epoch,
                      "patience": selection.patience, "ceiling": selection.ceiling},
        "stopped": stopped(cfg, state),
        "max_epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
        "optimiser": {**asdict(cfg.optimiser), "betas": list(cfg.optimiser.betas),
                      "no_decay": list(cfg.optimiser.no_decay), "frozen": list(cfg.optimiser.frozen)},
    }

