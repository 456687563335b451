"""Adam + early stopping on dev, resumable per epoch, checkpoints as safetensors + JSON.

``train`` is idempotent: a finished run directory (``metrics.json`` present, same
config) is loaded rather than retrained, and a killed run resumes from its last
finished epoch with the same numbers an uninterrupted run gives (CPU).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit import __version__
from attnaudit.data.tasks import absolute_spec, load_task
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.io import (
    atomic_write_json,
    digest,
    read_json_object,
    remove_stray_tmp,
    writes_folder,
)
from attnaudit.metrics import score_classification, score_tagging
from attnaudit.models import MODELS, ModelConfig, build_model
from attnaudit.models.base import Intervention, evaluation
from attnaudit.progress import status, track
from attnaudit.run import CONFIG, Run, TaskSpec, absolute_dir
from attnaudit.seed import resolve_device, set_seed
from attnaudit.training.checkpoint import (
    FEATURE_VOCAB,
    METRICS,
    VOCAB,
    WEIGHTS,
    load_state_into,
    refuse_other_run,
    save_epoch,
    save_model,
    start_or_resume,
)

# Per-family defaults (the literature's settings where they exist); CLI flags override.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "bilstm": {"embed_dim": 300, "hidden_dim": 128, "lr": 1e-3, "weight_decay": 1e-5, "batch_size": 32},
    "cnn": {"embed_dim": 300, "hidden_dim": 128, "lr": 1e-3, "weight_decay": 1e-5, "batch_size": 32},
    "average": {"embed_dim": 300, "hidden_dim": 128, "lr": 1e-3, "weight_decay": 1e-5, "batch_size": 32},
    "han": {"embed_dim": 200, "hidden_dim": 100, "lr": 1e-3, "weight_decay": 0.0, "batch_size": 32},
    "flat": {"embed_dim": 200, "hidden_dim": 100, "lr": 1e-3, "weight_decay": 0.0, "batch_size": 32},
    "transformer": {
        "embed_dim": 128,
        "d_model": 128,
        "d_ff": 256,
        "layers": 1,
        "heads": 4,
        "lr": 5e-4,
        "weight_decay": 0.0,
        "batch_size": 32,
        "dropout": 0.1,
    },
}
_MODEL_FIELDS = {f.name for f in fields(ModelConfig)}
InterventionsFn = Callable[[Batch], Sequence[Intervention]]
"""``fn(batch) -> interventions`` applied in every forward of a frozen-attention model."""


@dataclass
class TrainConfig:
    """Optimisation settings, saved with the run."""

    epochs: int = 10
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    patience: int = 3
    clip: float = 5.0
    seed: int = 0
    min_freq: int = 1
    max_vocab: int | None = None
    vectors: str | None = None
    features: bool = False
    warmup: int = 0
    """Linear warmup over this many steps, then linear decay to 0 at the last epoch; 0 = constant lr."""
    word_dropout: float = 0.0
    """Probability of replacing each real training token by ``<unk>`` (a regulariser that also
    teaches the model what to do with unseen words); 0 = off."""

    def check(self) -> None:
        """Reject values that would crash or silently train nothing, before anything is written."""
        bad = [
            (self.epochs < 1, f"--epochs must be at least 1, got {self.epochs}"),
            (self.batch_size < 1, f"--batch-size must be at least 1, got {self.batch_size}"),
            (not 0 < self.lr <= 1, f"--lr must be in (0, 1], got {self.lr}"),
            (self.weight_decay < 0, f"--weight-decay must be >= 0, got {self.weight_decay}"),
            (self.patience < 1, f"--patience must be at least 1 epoch, got {self.patience}"),
            (not self.clip > 0, f"--clip must be > 0, got {self.clip}"),
            (self.min_freq < 1, f"--min-freq must be at least 1, got {self.min_freq}"),
            (self.max_vocab is not None and self.max_vocab < 1, f"--max-vocab must be at least 1, got {self.max_vocab}"),
            (self.warmup < 0, f"--warmup must be >= 0, got {self.warmup}"),
            (not 0 <= self.word_dropout < 1, f"--word-dropout must be in [0, 1), got {self.word_dropout}"),
        ]
        for failed, message in bad:
            if failed:
                raise AttnAuditError(message)


# Options added after the first release enter the config hash only when set, so run
# directories trained before they existed are still recognised as finished.
_HASH_IF_SET = {"word_dropout": 0.0}


def check_model_options(options: dict[str, Any]) -> None:
    """Model sizes must be positive and dropout a probability; checked before anything is written."""
    for name in ("embed_dim", "hidden_dim", "layers", "heads", "d_model", "d_ff", "max_len"):
        value = options.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise AttnAuditError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    dropout = options.get("dropout")
    if dropout is not None and not 0 <= dropout < 1:
        raise AttnAuditError(f"--dropout must be in [0, 1), got {dropout}")


def lr_factor(step: int, warmup: int, total: int) -> float:
    """The learning-rate multiplier at optimiser step ``step`` (0-based) of ``total``.

    Stateless (a function of the step alone), so a resumed run follows the same schedule.
    """
    if warmup <= 0:
        return 1.0
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def _dev_score(scores: dict[str, float], task_type: str) -> float:
    return scores["f1"] if task_type == "tagging" else scores["accuracy"]


def drop_words(batch: Batch, p: float, unk_id: int, first_word_id: int, generator: torch.Generator) -> Batch:
    """``batch`` with each real word id (>= ``first_word_id``, so specials stay) replaced by
    ``unk_id`` with probability ``p``, in tokens and query alike."""

    def drop(ids: Tensor | None, mask: Tensor | None) -> Tensor | None:
        if ids is None or mask is None or p <= 0:
            return ids
        hit = (torch.rand(ids.shape, generator=generator) < p).to(ids.device) & mask & (ids >= first_word_id)
        return ids.masked_fill(hit, unk_id)

    return replace(batch, tokens=drop(batch.tokens, batch.mask), query=drop(batch.query, batch.query_mask))


def predict(
    run: Run,
    examples: list[Example],
    batch_size: int = 64,
    desc: str | None = None,
    interventions: InterventionsFn | None = None,
) -> dict[str, Any]:
    """Gold labels, predictions and probabilities for ``examples`` (eval mode, no grad).

    ``interventions(batch)`` are applied in every forward (models trained with frozen attention).
    """
    model = run.model
    gold: list[Any] = []
    pred: list[Any] = []
    probs: list[list[float]] = []
    batches = run.batches(examples, batch_size)
    if desc:
        batches = track(batches, desc, total=-(-len(examples) // batch_size))
    with evaluation(model), torch.no_grad():
        for batch in batches:
            out = model(batch, interventions(batch) if interventions else ())
            p = out.logits.softmax(-1)
            if run.task.task_type == "tagging":
                ids = p.argmax(-1)
                for i, ex in enumerate(batch.examples):
                    n = int(batch.mask[i].sum())
                    pred.append([run.labels[j] for j in ids[i, :n].tolist()])
                    gold.append(list(ex.tags or [])[:n])
            else:
                pred.extend(run.labels[j] for j in p.argmax(-1).tolist())
                gold.extend(ex.label for ex in batch.examples)
                probs.extend(p.tolist())
    return {"gold": gold, "pred": pred, "probs": probs}


def evaluate_examples(
    run: Run, examples: list[Example], desc: str | None = None, interventions: InterventionsFn | None = None
) -> dict[str, float]:
    """Accuracy/macro-F1/ROC-AUC (classification) or chunk P/R/F1 (tagging)."""
    out = predict(run, examples, desc=desc, interventions=interventions)
    if run.task.task_type == "tagging":
        return score_tagging(out["gold"], out["pred"])
    return score_classification(out["gold"], out["pred"], out["probs"], run.labels)


def evaluate(run: Run | str | Path, split: str = "test", data_dir: str | Path | None = None) -> dict[str, float]:
    """Score a run (object or directory) on a split."""
    from attnaudit.run import load_run

    if not isinstance(run, Run):
        run = load_run(run, data_dir=data_dir)
    return evaluate_examples(run, run.examples(split, data_dir=data_dir), desc=f"evaluate {split}")


def _config_hash(config: dict[str, Any]) -> str:
    train_cfg = {k: v for k, v in config.get("train", {}).items() if _HASH_IF_SET.get(k, object()) != v}
    config = {**config, "train": train_cfg} if "train" in config else config
    return digest(config)


def _build_vocabs(data: TaskData, cfg: TrainConfig) -> tuple[Any, Any]:
    from attnaudit.data.vocab import Vocab

    token_lists = [ex.tokens for ex in data.train] + [ex.query for ex in data.train if ex.query]
    vocab = Vocab.build(token_lists, min_freq=cfg.min_freq, max_size=cfg.max_vocab)
    features = None
    if cfg.features:
        feats = [ex.meta["features"] for ex in data.train if "features" in ex.meta]
        if not feats:
            raise AttnAuditError(f"--features asked for, but task {data.name!r} has no per-token features")
        features = Vocab.build(feats)
    return vocab, features


@writes_folder("out")
def train(
    task: str | TaskData,
    model: str,
    out: str | Path,
    *,
    data_dir: str | Path | None = None,
    dev: str | None = None,
    test: str | None = None,
    split_seed: int = 0,
    device: str = "auto",
    resume: bool = True,
    quiet_eval: bool = False,
    **options: Any,
) -> Run:
    """Train ``model`` on ``task`` into run directory ``out`` and return the loaded run.

    ``options`` are ModelConfig fields (``attention``, ``scorer``, ``layers``, ``heads``,
    ``d_model``, ``hidden_dim``, ``embed_dim``, ``dropout``, ``max_len``, ``extra``) and
    TrainConfig fields (``epochs``, ``batch_size``, ``lr``, ``patience``, ``seed``, ...);
    ``None`` values fall back to the family defaults.
    """
    from attnaudit.data.batching import Collator
    from attnaudit.data.vocab import load_vectors
    from attnaudit.models.attention import check_normaliser
    from attnaudit.run import load_run

    if model not in MODELS:
        raise AttnAuditError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    options = {k: v for k, v in options.items() if v is not None}
    unknown = set(options) - _MODEL_FIELDS - {f.name for f in fields(TrainConfig)}
    if unknown:
        raise AttnAuditError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    merged = {**FAMILY_DEFAULTS[model], **options}
    cfg = TrainConfig(**{k: v for k, v in merged.items() if k in {f.name for f in fields(TrainConfig)}})
    cfg.check()
    check_model_options(merged)
    check_normaliser(merged.get("attention", "softmax"))

    out = Path(out)
    for folder in (out, out / "checkpoint"):  # what a killed earlier training left half-written
        remove_stray_tmp(folder)
    if isinstance(task, TaskData):
        data = task
    else:
        data = load_task(task, data_dir=data_dir, seed=split_seed, dev=dev, test=test)
    if len(data.labels) < 2:
        raise AttnAuditError(
            f"task {data.name!r} has {len(data.labels)} label(s) ({', '.join(data.labels) or 'none'}); a model needs at least 2"
        )
    spec = TaskSpec(
        spec=absolute_spec(task) if isinstance(task, str) else data.name,
        task_type=data.task_type,
        labels=list(data.labels),
        data_dir=absolute_dir(data_dir),
        seed=split_seed,
        dev=absolute_spec(dev),
        test=absolute_spec(test),
    )
    set_seed(cfg.seed)
    vocab, feature_vocab = _build_vocabs(data, cfg)
    vectors = load_vectors(cfg.vectors, vocab, seed=cfg.seed) if cfg.vectors else None
    if vectors is not None:
        merged["embed_dim"] = vectors.shape[1]  # the vectors decide the embedding size
    extra = dict(merged.get("extra", {}))
    if feature_vocab is not None:
        extra["feature_vocab_size"] = len(feature_vocab)
    model_fields = {k: v for k, v in merged.items() if k in _MODEL_FIELDS and k != "extra"}
    config = ModelConfig(
        model=model,
        task_type=data.task_type,  # type: ignore[arg-type]
        vocab_size=len(vocab),
        num_labels=len(data.labels),
        extra=extra,
        **{k: v for k, v in model_fields.items() if k not in ("model", "task_type", "vocab_size", "num_labels")},
    )
    run_config = {
        "kind": "attnaudit",
        "version": __version__,
        "model": config.to_dict(),
        "train": asdict(cfg),
        "task": spec.to_dict(),
    }
    config_hash = _config_hash({k: v for k, v in run_config.items() if k != "version"})
    run_config["hash"] = config_hash

    existing = out / CONFIG
    if resume and (out / METRICS).exists() and existing.exists() and read_json_object(existing, optional={"hash": str}).get("hash") == config_hash:
        status(f"[green]{out}[/]: already trained with this config, loading it")
        return load_run(out, device=device, data_dir=data_dir)
    refuse_other_run(out, config_hash)

    dev_device = resolve_device(device)
    net = build_model(config)
    if vectors is not None:
        net.embedding.weight.data.copy_(vectors)
    net.to(dev_device)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    collate = Collator(
        vocab, data.labels, data.task_type, hierarchical=model == "han", max_len=config.max_len, feature_vocab=feature_vocab
    )
    run = Run(model=net, collate=collate, task=spec, path=out, device=dev_device, info=run_config, _data=data)

    def save_vocabs(directory: Path) -> None:
        vocab.save(directory / VOCAB)
        if feature_vocab is not None:
            feature_vocab.save(directory / FEATURE_VOCAB)

    fresh = {"epoch": 0, "best": float("-inf"), "bad": 0, "history": [], "seconds": 0.0}
    state = start_or_resume(out, net, optimizer, run_config, fresh, save_vocabs, resume)

    loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
    n_batches = -(-len(data.train) // cfg.batch_size)
    while state["epoch"] < cfg.epochs and state["bad"] < cfg.patience:
        epoch = state["epoch"] + 1
        start = time.perf_counter()
        net.train()
        total, count = 0.0, 0
        # One generator per epoch, seeded like the shuffle: a resumed run drops the same words.
        words = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
        for step, batch in enumerate(
            track(
                run.batches(data.train, cfg.batch_size, shuffle=True, seed=cfg.seed * 1000 + epoch),
                f"epoch {epoch}/{cfg.epochs}",
                total=n_batches,
            ),
            start=(epoch - 1) * n_batches,
        ):
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * lr_factor(step, cfg.warmup, cfg.epochs * n_batches)
            if cfg.word_dropout > 0:
                batch = drop_words(batch, cfg.word_dropout, vocab.unk_id, len(vocab.specials), words)
            logits = net(batch).logits
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), cfg.clip)
            optimizer.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        scores = evaluate_examples(run, data.dev)
        score = _dev_score(scores, data.task_type)
        improved = score > state["best"]
        if improved:
            state["best"], state["bad"] = score, 0
            save_model(out, net)
        else:
            state["bad"] += 1
        state["seconds"] += time.perf_counter() - start
        state["epoch"] = epoch
        state["history"].append({"epoch": epoch, "train_loss": total / max(count, 1), "dev": scores})
        status(f"epoch {epoch}: train loss {total / max(count, 1):.4f}, dev {score:.4f}{' *' if improved else ''}")
        save_epoch(out, net, optimizer, state, config_hash)

    load_state_into(net, out / WEIGHTS)
    net.eval()
    metrics = {
        "dev": evaluate_examples(run, data.dev),
        "test": evaluate_examples(run, data.test),
        "epochs": state["epoch"],
        "best_dev": state["best"],
        "train_seconds": state["seconds"],
        "history": state["history"],
        "selection": "best dev " + ("chunk F1" if data.task_type == "tagging" else "accuracy"),
        "notes": data.notes,
    }
    atomic_write_json(out / METRICS, metrics)
    shutil.rmtree(out / "checkpoint", ignore_errors=True)  # the run is complete: no resume needed
    if not quiet_eval:
        status(f"[green]done[/]: dev {metrics['dev']}, test {metrics['test']}")
    return run
