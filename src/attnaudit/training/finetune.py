"""Fine-tune a Hugging Face encoder with a classification head (``attnaudit finetune``).

AdamW with linear warm-up/decay (the usual BERT recipe), cross-entropy on the head's
logits computed through :class:`~attnaudit.models.hf.HFAttentionModel` (so training sees
exactly the model the tests later examine), one dev evaluation per epoch and the best
dev-accuracy epoch kept. The run directory (``config.json`` with ``kind: hf``, ``hf/``
from ``save_pretrained`` in safetensors, ``metrics.json``) loads with
:func:`attnaudit.run.load_run`, so every post-hoc test accepts it.

Idempotent like ``train``: a finished run directory with the same settings is loaded, not
retrained (``metrics.json`` is written last, as the commit point).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnaudit.data.types import TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.io import atomic_write_json, digest, read_json_object, writes_folder
from attnaudit.progress import status, track
from attnaudit.run import Run, TaskSpec, absolute_dir
from attnaudit.seed import set_seed
from attnaudit.training.checkpoint import METRICS
from attnaudit.training.trainer import evaluate_examples


def _settings_hash(settings: dict[str, Any]) -> str:
    return digest(settings)


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
) -> Run:
    """Fine-tune ``hf`` (``minilm``, a local directory or hub name) on ``task``; return the best-dev run.

    ``limit`` trains on a seeded random sample of that many training examples (dev and
    test stay whole). ``max_len`` caps wordpieces per input (default: the model's limit).
    """
    from attnaudit.models.hf import load_hf, load_hf_run, save_hf_run
    from attnaudit.pretrained import resolve_source

    if epochs < 1 or batch_size < 1 or lr <= 0 or not 0 <= warmup < 1:
        raise AttnAuditError("finetune needs epochs >= 1, batch_size >= 1, lr > 0 and 0 <= warmup < 1")
    if limit is not None and limit < 1:
        raise AttnAuditError(f"--limit must be at least 1, got {limit}")
    out = Path(out)
    if isinstance(task, TaskData):
        data = task
    else:
        from attnaudit.data.tasks import load_task

        data = load_task(task, data_dir=data_dir)
    spec_name = task if isinstance(task, str) else data.name
    settings = {
        "task": spec_name,
        "source": str(hf) if str(hf).lower() == "minilm" else resolve_source(hf),
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "limit": limit,
        "seed": seed,
        "warmup": warmup,
        "weight_decay": weight_decay,
        "max_len": max_len,
    }
    digest = _settings_hash(settings)
    config_file = out / "config.json"
    if (out / METRICS).exists() and config_file.exists() and read_json_object(config_file, optional={"finetune": dict}).get("finetune", {}).get("hash") == digest:
        status(f"[green]{out}[/]: already fine-tuned with these settings, loading it")
        return load_hf_run(out, device=device, data_dir=data_dir)
    if not data.train or not data.dev:
        raise AttnAuditError(f"task {spec_name!r} needs train and dev examples to fine-tune")

    (out / METRICS).unlink(missing_ok=True)  # stale results of other settings; rewritten last
    set_seed(seed)
    run = load_hf(hf, task=data, data_dir=data_dir, device=device, num_labels=len(data.labels))
    run.task = TaskSpec(
        spec=spec_name, task_type=data.task_type, labels=list(data.labels), data_dir=absolute_dir(data_dir)
    )
    if max_len is not None:
        run.collate.max_len = min(max_len, run.model.config.max_len)
    train_set = list(data.train)
    if limit is not None and limit < len(train_set):
        train_set = random.Random(seed).sample(train_set, limit)
    model = run.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * -(-len(train_set) // batch_size)
    from transformers import get_linear_schedule_with_warmup

    scheduler = get_linear_schedule_with_warmup(optimizer, int(warmup * steps), steps)
    loss_fn = nn.CrossEntropyLoss()
    history: list[dict[str, Any]] = []
    best, seconds = float("-inf"), 0.0
    extra = {"finetune": {**settings, "hash": digest, "train_examples": len(train_set)}}
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        model.train()
        total, count = 0.0, 0
        batches = run.batches(train_set, batch_size, shuffle=True, seed=seed * 1000 + epoch)
        for batch in track(batches, f"fine-tune epoch {epoch}/{epochs}", total=-(-len(train_set) // batch_size)):
            loss = loss_fn(model(batch).logits, batch.labels)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        model.eval()
        scores = evaluate_examples(run, data.dev)
        seconds += time.perf_counter() - start
        history.append({"epoch": epoch, "train_loss": total / max(count, 1), "dev": scores})
        improved = scores["accuracy"] > best
        status(f"epoch {epoch}: train loss {total / max(count, 1):.4f}, dev accuracy {scores['accuracy']:.4f}{' *' if improved else ''}")
        if improved:
            best = scores["accuracy"]
            model.trained_head = True
            model.config.extra["trained_head"] = True
            save_hf_run(run, out, extra)
    best_run = load_hf_run(out, device=device, data_dir=data_dir)
    best_run._data = data
    metrics = {
        "dev": next(h["dev"] for h in history if h["dev"]["accuracy"] == best),  # the saved epoch's own scores
        "test": evaluate_examples(best_run, data.test) if data.test else {},
        "epochs": epochs,
        "best_dev": best,
        "train_seconds": seconds,
        "train_examples": len(train_set),
        "history": history,
        "selection": "best dev accuracy",
        "notes": list(data.notes),
    }
    atomic_write_json(out / METRICS, metrics)
    status(f"[green]done[/]: dev accuracy {metrics['dev']['accuracy']:.4f}" + (
        f", test accuracy {metrics['test']['accuracy']:.4f}" if metrics["test"] else ""
    ))
    return best_run
