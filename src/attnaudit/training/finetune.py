"""Fine-tune a Hugging Face encoder or decoder with a classification head (``attnaudit finetune``).

Encoders (BERT family) pool ``[CLS]``; decoder-only models (Llama/SmolLM2, Qwen2, GPT-2) get a
sequence-classification head read at each example's last *real* token
(:meth:`~attnaudit.models.hf.model.HFModel.decode`, from the mask, so any padding side
works). ``train_layers`` trains only the head, the last ``N`` layers and what follows them
(final norm, pooler); everything before is frozen, both out of the optimiser (the loop's
``Optimiser.frozen``) and out of autograd, so the backward pass stops at the first trained
layer — what makes a 135M decoder trainable on a few CPU cores.

AdamW with linear warm-up/decay (the usual BERT recipe) and clipping at 1, cross-entropy on
the head's logits computed through :class:`~attnaudit.hf.HFModel` (so training
sees exactly the model the tests later examine), every epoch trained (no early stopping), one
dev evaluation per epoch and the best dev-accuracy epoch kept; all of it by the one loop,
:func:`attnaudit.training.loop.fit`. The run directory (``config.json`` with ``kind: hf``, ``hf/``
from ``save_pretrained`` in safetensors, ``metrics.json``) loads with
:func:`attnaudit.run.load_run`, so every post-hoc test accepts it.

Idempotent like ``train``: a finished run directory with the same settings is loaded, not
retrained (``metrics.json`` is written last, as the commit point).
"""

from __future__ import annotations

import math
import random
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from attnaudit import bounds
from attnaudit.data.types import TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.io import atomic_write_json, digest, read_json_object, writes_folder
from attnaudit.progress import status
from attnaudit.run import Run, TaskSpec, absolute_dir
from attnaudit.training.checkpoint import METRICS
from attnaudit.training.loop import (
    Hooks,
    LoopConfig,
    Optimiser,
    Selection,
    fit,
    notes,
    seeded,
)
from attnaudit.training.staging import staged
from attnaudit.training.trainer import cross_entropy, evaluate_examples

if TYPE_CHECKING:
    from torch import Tensor

    from attnaudit.data.types import Batch
    from attnaudit.models.hf import HFCollator, HFModel

AFTER_LAYERS = ("norm", "ln_f", "pooler")
"""Base-model modules that run after the layers (decoders' final norm, BERT's pooler): trained with the head."""


def _settings_hash(settings: dict[str, Any]) -> str:
    return digest(settings)


def _hf_model(model: nn.Module) -> HFModel:
    """``model`` (load_hf's) as the Hugging Face adapter whose transformers model is fine-tuned."""
    from attnaudit.models.hf import HFModel

    if not isinstance(model, HFModel):
        raise AttnAuditError("fine-tuning needs a Hugging Face model (load_hf's)")
    return model


def frozen_patterns(model: HFModel, train_layers: int | None) -> tuple[str, ...]:
    """Parameter-name patterns of ``model`` fixed when only the head, the last ``train_layers``
    layers and the modules after them train (the rest: embeddings, earlier layers); None: none."""
    if train_layers is None:
        return ()
    layers, base = model.layers, model.hf.base_model
    if not 0 <= train_layers <= len(layers):
        raise AttnAuditError(f"--train-layers must be between 0 and the model's {len(layers)} layers, got {train_layers}")
    names = {id(module): name for name, module in model.named_modules()}
    cut = len(layers) - train_layers
    patterns = [f"{names[id(layer)]}.*" for layer in layers[:cut]]
    after = [module for name in AFTER_LAYERS if isinstance(module := getattr(base, name, None), nn.Module)]
    skip = {id(p) for module in [*layers, *after] for p in module.parameters()}
    inside = {id(p) for p in base.parameters()}
    patterns += [name for name, p in model.named_parameters() if id(p) in inside and id(p) not in skip]
    return tuple(patterns)


def freeze(model: nn.Module, patterns: tuple[str, ...]) -> int:
    """Take the parameters matching ``patterns`` out of autograd; the number of parameters still trained."""
    for name, param in model.named_parameters():
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            param.requires_grad_(False)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _check(epochs: int, batch_size: int, lr: float, warmup: float, limit: int | None, train_layers: int | None,
           max_len: int | None = None) -> None:
    """Refuse impossible settings before anything is loaded or written."""
    if epochs < 1 or batch_size < 1 or not 0 < lr < math.inf or not 0 <= warmup < 1:  # --lr nan/inf: one line, not torch's error
        raise AttnAuditError("finetune needs epochs >= 1, batch_size >= 1, a finite lr > 0 and 0 <= warmup < 1")
    if limit is not None and limit < 1:
        raise AttnAuditError(f"--limit must be at least 1, got {limit}")
    if max_len is not None and max_len < 1:  # -1 reached the tokenizer: OverflowError, "failed unexpectedly"
        raise AttnAuditError(f"--max-len must be at least 1, got {max_len}")
    if train_layers is not None and train_layers < 0:
        raise AttnAuditError(f"--train-layers must be at least 0, got {train_layers}")
    bounds.epochs(epochs)  # no early stopping: every epoch runs


def _hooks(run: Run, data: TaskData, out: Path, extra: dict[str, Any], masking: tuple[int, list[int], int] | None = None) -> Hooks:
    """Cross-entropy on the head's logits, dev scores per epoch; the kept epoch is saved as an
    ``hf`` run directory (``save_pretrained``) with its head marked as trained. ``masking``: (mask id, kept ids,
    seed) of masked fine-tuning (:func:`~attnaudit.training.masking.mask_batch`: half of each batch masked)."""
    from attnaudit.hf import save_hf_run
    from attnaudit.training.masking import mask_batch

    def save_best() -> None:
        run.model.trained_head = True
        run.model.config.extra["trained_head"] = True
        save_hf_run(run, out, extra)

    def loss(net: nn.Module, batch: Batch) -> Tensor:
        labels = batch.labels
        assert labels is not None  # training examples are labelled
        if masking is not None:
            batch = mask_batch(batch, *masking)
        return cross_entropy()(net(batch).logits, labels)

    return Hooks(
        loss=loss,
        evaluate=lambda: {"dev": evaluate_examples(run, data.dev)},
        save_best=save_best,
        label="fine-tune ",
    )


def _masking(run: Run, seed: int) -> tuple[int, list[int], int]:
    """(mask id, special ids never masked, seed) of masked fine-tuning; one line where the tokenizer has no mask token."""
    tokenizer = run.model.tokenizer  # the interface's: a Hugging Face model's tokenizer
    if getattr(tokenizer, "mask_token_id", None) is None:
        raise AttnAuditError("--masking replaces tokens by the mask token; this model's tokenizer has none (an encoder such as minilm has)")
    return int(tokenizer.mask_token_id), list(tokenizer.all_special_ids), seed


@writes_folder("out")
def finetune(
    task: str | TaskData,
    out: str | Path,
    hf: str = "minilm",
    epochs: int = 1,
    lr: float = 2e-5,
    batch_size: int = 16,
    limit: int | None = None,
    seed: int = 0,
    data_dir: str | Path | None = None,
    device: str = "auto",
    warmup: float = 0.1,
    weight_decay: float = 0.01,
    max_len: int | None = None,
    train_layers: int | None = None,
    masking: bool = False,
    variant: str | None = None,
) -> Run:
    """Fine-tune ``hf`` (``minilm``, ``smollm2``, a local directory, ``.gguf`` file or hub name) on
    ``task``; return the best-dev run.

    ``limit`` trains on a seeded random sample of that many training examples (dev and
    test stay whole). ``max_len`` caps wordpieces per input (default: the model's limit).
    ``train_layers`` trains only the head and the last N layers (None: every parameter).
    ``masking``: masked fine-tuning (Madsen et al. 2024; :mod:`attnaudit.training.masking`): half of each batch
    masked at a per-example ratio drawn from U[0, 1), so that erased inputs are in distribution; needs a tokenizer
    with a mask token. ``variant``: a name of the data's variant (a test's masked copy of ``task``), part of
    the settings' hash, so that a folder fine-tuned on other data is never taken for this one.
    """
    from attnaudit.hf import load_hf, load_hf_run
    from attnaudit.pretrained import resolve_source

    _check(epochs, batch_size, lr, warmup, limit, train_layers, max_len)
    out = Path(out)
    from attnaudit.data.tasks import load_task

    data = task if isinstance(task, TaskData) else load_task(task, data_dir=data_dir)
    spec_name = task if isinstance(task, str) else data.name
    source = str(hf) if str(hf).lower() in ("minilm", "smollm2") else resolve_source(hf)
    settings = {"task": spec_name, "source": source, "epochs": epochs, "lr": lr, "batch_size": batch_size, "limit": limit,
                "seed": seed, "warmup": warmup, "weight_decay": weight_decay, "max_len": max_len}
    if train_layers is not None:  # a default left out keeps earlier runs' hashes
        settings["train_layers"] = train_layers
    if masking:
        settings["masking"] = True
    if variant is not None:
        settings["variant"] = variant
    digest = _settings_hash(settings)
    config_file = out / "config.json"
    if (
        (out / METRICS).exists()
        and config_file.exists()
        and read_json_object(config_file, optional={"finetune": dict}).get("finetune", {}).get("hash") == digest
    ):
        status(f"[green]{out}[/]: already fine-tuned with these settings, loading it")
        return load_hf_run(out, device=device, data_dir=data_dir)
    if not data.train or not data.dev:
        raise AttnAuditError(f"task {spec_name!r} needs train and dev examples to fine-tune")

    run = seeded(seed, lambda: load_hf(hf, task=data, data_dir=data_dir, device=device, num_labels=len(data.labels)))
    run.task = TaskSpec(
        spec=spec_name, task_type=data.task_type, labels=list(data.labels), data_dir=absolute_dir(data_dir)
    )
    if max_len is not None:
        cast("HFCollator", run.collate).max_len = min(max_len, run.model.config.max_len)  # a classification run's
    train_set = list(data.train)
    if limit is not None and limit < len(train_set):
        train_set = random.Random(seed).sample(train_set, limit)
    frozen = frozen_patterns(_hf_model(run.model), train_layers)
    trained = freeze(run.model, frozen)
    extra = {"finetune": {**settings, "hash": digest, "train_examples": len(train_set), "trained_parameters": trained}}
    steps = epochs * -(-len(train_set) // batch_size)
    optimiser = Optimiser("adamw", lr, weight_decay, frozen=frozen, clip=1.0, schedule="linear-hf", warmup=int(warmup * steps))
    loop = LoopConfig(epochs, batch_size, seed, optimiser, Selection("dev.accuracy", ceiling=1.0))
    with staged(out) as stage:  # the run appears in `out` whole, or not at all (a full disk, a kill)
        state = fit(run.model, run, train_set, loop, _hooks(run, data, stage, extra, _masking(run, seed) if masking else None))
        best_run = load_hf_run(stage, device=device, data_dir=data_dir)
        best_run._data = data
        metrics = {
            "dev": state["history"][state["selected"] - 1]["dev"],  # the saved epoch's own scores
            "test": evaluate_examples(best_run, data.test) if data.test else {},
            "epochs": epochs,
            "best_dev": state["best"],
            "train_seconds": state["seconds"],
            "train_examples": len(train_set),
            "trained_parameters": trained,
            "history": state["history"],
            "selection": "best dev accuracy",
            "training": notes(loop, state),
            "notes": list(data.notes),
        }
        atomic_write_json(stage / METRICS, metrics)
    best_run = load_hf_run(out, device=device, data_dir=data_dir)  # from where it now lies
    best_run._data = data
    status(f"[green]done[/]: dev accuracy {metrics['dev']['accuracy']:.4f}" + (
        f", test accuracy {metrics['test']['accuracy']:.4f}" if metrics["test"] else ""
    ))
    return best_run
