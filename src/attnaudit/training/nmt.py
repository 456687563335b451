"""Training and evaluation of the NMT model (:class:`~attnaudit.models.seq2seq.Seq2SeqTransformer`).

``train_nmt`` writes a run directory of kind ``nmt`` (the weights, both BPE vocabularies and
``metrics.json``) and ``load_nmt_run`` reads it back; ``evaluate_nmt`` scores teacher-forced
cross-entropy, ``translate`` decodes greedily and ``bleu_score`` scores those translations.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from attnaudit import __version__, bounds
from attnaudit.data.tasks import load_task
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.data.word_alignments import PAD_ID, Seq2SeqCollator, SubwordTokenizer
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.io import atomic_write_json, digest, writes_folder
from attnaudit.models.interface import ModelConfig, evaluation
from attnaudit.models.normalisers import check_normaliser
from attnaudit.models.seq2seq import Seq2SeqTransformer
from attnaudit.progress import status, track
from attnaudit.run import CONFIG, Run, TaskSpec, absolute_dir, read_config
from attnaudit.seed import resolve_device
from attnaudit.training.checkpoint import (
    METRICS,
    WEIGHTS,
    finished_run,
    load_state_into,
)
from attnaudit.training.loop import (
    Checkpoint,
    Hooks,
    LoopConfig,
    Optimiser,
    Selection,
    fit,
    notes,
    seeded,
)
from attnaudit.training.staging import staged

if TYPE_CHECKING:
    from attnaudit.models.hf import HFModel

SOURCE_BPE = "source_bpe.json"
TARGET_BPE = "target_bpe.json"


@dataclass
class NMTConfig:
    """Model size and optimisation of :func:`train_nmt`, saved with the run."""

    layers: int = 3
    heads: int = 4
    d_model: int = 128
    d_ff: int = 512
    dropout: float = 0.1
    attention: str = "softmax"
    source_vocab: int = 8000
    target_vocab: int = 8000
    max_len: int = 256
    max_train_len: int = 80
    epochs: int = 10
    max_steps: int | None = None
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 1000
    label_smoothing: float = 0.1
    clip: float = 1.0
    patience: int = 3
    seed: int = 0


# --- evaluation ----------------------------------------------------------------------


def translate(run: Run, examples: list[Example], batch_size: int = 64, desc: str | None = None) -> list[list[str]]:
    """Greedy translations (target words) of ``examples``, in order."""
    if not hasattr(run.model, "greedy"):
        raise AttnAuditError(f"translate needs an encoder-decoder run, got a {run.family} model")
    model = cast("Seq2SeqTransformer | HFModel", run.model)  # the encoder-decoders: ours and Hugging Face's
    # Sorted by length so that a batch stops decoding soon after its longest sentence.
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].tokens))
    stripped = [Example(tokens=examples[i].tokens, meta=examples[i].meta) for i in order]
    batches = run.batches(stripped, batch_size)
    if desc:
        batches = track(batches, desc, total=-(-len(examples) // batch_size))
    decoded: list[list[str]] = []
    for batch in batches:
        decoded.extend(run.collate.target.words(ids) for ids in model.greedy(batch))  # type: ignore[attr-defined]
    out: list[list[str]] = [[] for _ in examples]
    for position, index in enumerate(order):
        out[index] = decoded[position]
    return out


def evaluate_nmt(run: Run, examples: list[Example], batch_size: int = 64) -> dict[str, float]:
    """Teacher-forced per-subword cross-entropy (nats, no smoothing), perplexity and accuracy."""
    model = run.model
    total, correct, count = 0.0, 0, 0
    with evaluation(model), torch.no_grad():
        for batch in run.batches(examples, batch_size):
            logits = model(batch).logits
            labels = batch.labels
            assert labels is not None  # translation pairs have targets
            real = labels != -100
            total += float(nn.functional.cross_entropy(logits[real], labels[real], reduction="sum"))
            correct += int((logits.argmax(-1)[real] == labels[real]).sum())
            count += int(real.sum())
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "token_accuracy": correct / max(count, 1)}


def bleu_score(run: Run, examples: list[Example], batch_size: int = 64, desc: str | None = None) -> float:
    """Corpus BLEU (sacrebleu 13a) of greedy translations against the examples' targets
    (both space-joined words; the targets are 13a-tokenised, re-tokenising them is a no-op)."""
    from attnaudit.algorithms.metrics import (
        bleu,  # sacrebleu, scipy, sklearn: only when BLEU is asked for
    )

    hypotheses = translate(run, examples, batch_size, desc)
    return bleu([" ".join(h) for h in hypotheses], [" ".join(ex.target or []) for ex in examples])


# --- training ------------------------------------------------------------------------


@writes_folder("out")
def train_nmt(
    task: str | TaskData,
    out: str | Path,
    *,
    data_dir: str | Path | None = None,
    split_seed: int = 0,
    device: str = "auto",
    resume: bool = True,
    bleu_split: str | None = "dev",
    arch: str = "nmt",
    **options: Any,
) -> Run:
    """Train the NMT model on a seq2seq task into run directory ``out``; return the run.

    ``options`` are :class:`NMTConfig` fields. Teacher forcing with label-smoothed cross
    entropy, Adam (0.9, 0.98) with linear warm-up then inverse-square-root decay, dropout;
    the epoch with the lowest dev loss is kept, with early stopping after ``patience``
    epochs without improvement. BPE vocabularies (one per side) are learnt on the training
    pairs; training pairs longer than ``max_train_len`` subwords on either side are dropped.
    Afterwards ``metrics.json`` holds dev/test loss and perplexity, BLEU of greedy decoding
    on ``bleu_split`` (None: skipped) and the per-epoch history. ``max_steps`` caps the
    optimiser steps (the epoch in which it is reached ends there), so a run fits a time
    budget deterministically.

    Like ``train``: a finished run with the same config is loaded, not retrained, and a
    killed run resumes after its last finished epoch.

    ``arch``: ``nmt`` (our :class:`~attnaudit.models.seq2seq.Seq2SeqTransformer`) or a Hugging Face
    configuration trained from scratch with the same sizes, loop and hooks (``marian``, ``bart``:
    :func:`train_hf_nmt`).
    """
    cfg = _nmt_config(options, bleu_split)
    bounds.bpe_vocabulary(cfg.source_vocab, cfg.d_model, "--source-vocab")  # before the data: the trainer reserves its tables at once
    bounds.bpe_vocabulary(cfg.target_vocab, cfg.d_model, "--target-vocab")
    if arch != "nmt":
        from attnaudit.models.hf import FRESH_ARCHITECTURES as ARCHITECTURES

        if arch not in ARCHITECTURES:
            raise AttnAuditError(f"unknown --arch {arch!r}; choose one of nmt, {', '.join(ARCHITECTURES)}")
    data = task if isinstance(task, TaskData) else load_task(task, data_dir=data_dir, seed=split_seed)
    if data.task_type != "seq2seq":
        raise AttnAuditError(f"train_nmt needs a seq2seq task, {data.name!r} is {data.task_type}")
    if not data.train or not data.dev:
        raise AttnAuditError(f"task {data.name!r} needs non-empty train and dev splits")
    spec = TaskSpec(
        spec=task if isinstance(task, str) else data.name, task_type="seq2seq", labels=[],
        data_dir=absolute_dir(data_dir), seed=split_seed,
    )
    out = Path(out)
    if arch != "nmt":
        return train_hf_nmt(data, spec, out, cfg, arch, device, resume, bleu_split)
    source = SubwordTokenizer.train((ex.tokens for ex in data.train), cfg.source_vocab)
    target = SubwordTokenizer.train((ex.target or [] for ex in data.train), cfg.target_vocab)
    config = ModelConfig(
        model="nmt", task_type="seq2seq", vocab_size=len(source), num_labels=len(target), embed_dim=cfg.d_model,
        attention=cfg.attention, layers=cfg.layers, heads=cfg.heads, d_model=cfg.d_model, d_ff=cfg.d_ff,
        dropout=cfg.dropout, max_len=cfg.max_len, pad_id=PAD_ID,
    )
    run_config: dict[str, Any] = {
        "kind": "nmt", "version": __version__, "train": asdict(cfg), "task": spec.to_dict(), "model": config.to_dict(),
    }
    config_hash = digest({k: v for k, v in run_config.items() if k != "version"})
    run_config["hash"] = config_hash
    if finished_run(out, config_hash, resume):
        return load_nmt_run(out, device=device, data_dir=data_dir)

    dev_device = resolve_device(device)
    net = seeded(cfg.seed, lambda: Seq2SeqTransformer(config)).to(dev_device)
    collate = Seq2SeqCollator(source, target, max_len=cfg.max_len)
    run = Run(model=net, collate=collate, task=spec, path=out, device=dev_device, info=run_config, _data=data)
    train_pairs = [ex for ex in data.train if fits_length(collate, ex, cfg.max_train_len)]

    def save_bpe(directory: Path) -> None:
        source.save(directory / SOURCE_BPE)
        target.save(directory / TARGET_BPE)

    loop = nmt_loop(cfg)
    with staged(out) as stage:  # the run appears in `out` whole, or not at all
        state = fit(net, run, train_pairs, loop, nmt_hooks(run, data.dev, cfg), Checkpoint(stage, run_config, save_bpe, resume))
        metrics = {**_final_metrics(run, data, state, cfg, train_pairs, bleu_split), "training": notes(loop, state)}
        atomic_write_json(stage / METRICS, metrics)
        shutil.rmtree(stage / "checkpoint", ignore_errors=True)  # the run is complete: no resume needed
    status(f"[green]done[/]: dev loss {metrics['dev']['loss']:.4f}"
           + (f", {bleu_split} BLEU {metrics[f'{bleu_split}_bleu']:.2f}" if bleu_split else ""))
    return run


def train_hf_nmt(
    data: TaskData, spec: TaskSpec, out: Path, cfg: NMTConfig, arch: str, device: str, resume: bool, bleu_split: str | None
) -> Run:
    """``train_nmt`` for a Hugging Face encoder-decoder built from scratch (:func:`~attnaudit.models.hf.fresh.fresh_seq2seq`).

    One joint BPE vocabulary of ``source_vocab`` entries is learnt on both sides of the training pairs
    (Marian and BART share embeddings between encoder, decoder and LM head). The loop, its hooks and
    ``metrics.json`` are :func:`train_nmt`'s; the selected epoch is saved as an ``hf`` run directory
    (``save_pretrained``), which ``load_run`` and every test read like any Hugging Face model. No per-epoch
    checkpoint: a killed run starts again.
    """
    from dataclasses import replace

    from attnaudit.hf import load_hf_run, save_hf_run
    from attnaudit.models.hf import fresh_seq2seq, fresh_tokenizer
    from attnaudit.models.hf import seq2seq_collator as collator

    settings = {"kind": "hf", "arch": arch, "train": asdict(cfg), "task": spec.to_dict()}
    config_hash = digest(settings)
    if finished_run(out, config_hash, resume):
        return load_hf_run(out, device=device, data_dir=spec.data_dir)
    joint = SubwordTokenizer.train((words for ex in data.train for words in (ex.tokens, ex.target or [])), cfg.source_vocab)
    tokenizer = fresh_tokenizer(joint)
    net = seeded(cfg.seed, lambda: fresh_seq2seq(arch, tokenizer, cfg.layers, cfg.heads, cfg.d_model, cfg.d_ff, cfg.dropout, cfg.max_len))
    dev_device = resolve_device(device)
    net.config.extra["source"] = f"attnaudit train-nmt --arch {arch}"
    run = Run(model=net.to(dev_device), collate=collator(net), task=spec, path=out, device=dev_device, _data=data)
    train_pairs = [ex for ex in data.train if fits_length(run.collate, ex, cfg.max_train_len)]
    extra = {"hash": config_hash, "train_nmt": {"arch": arch, **asdict(cfg)}}
    loop = nmt_loop(cfg)

    with staged(out) as stage:  # the run appears in `out` whole, or not at all
        def save_best() -> None:
            save_hf_run(run, stage, extra)

        hooks = replace(nmt_hooks(run, data.dev, cfg), save_best=save_best)
        state = fit(net, run, train_pairs, loop, hooks)
        best = load_hf_run(stage, device=device, data_dir=spec.data_dir)
        best._data = data
        metrics = {**_final_metrics(best, data, state, cfg, train_pairs, bleu_split), "training": notes(loop, state)}
        atomic_write_json(stage / METRICS, metrics)
    best = load_hf_run(out, device=device, data_dir=spec.data_dir)  # from where it now lies
    best._data = data
    status(f"[green]done[/]: dev loss {metrics['dev']['loss']:.4f}"
           + (f", {bleu_split} BLEU {metrics[f'{bleu_split}_bleu']:.2f}" if bleu_split else ""))
    return best


def _nmt_config(options: dict[str, Any], bleu_split: str | None) -> NMTConfig:
    """The :class:`NMTConfig` of ``options`` (None: the default), refusing unknown or inconsistent settings."""
    known = {f.name for f in fields(NMTConfig)}
    unknown = set(options) - known
    if unknown:
        raise AttnAuditError(f"unknown NMT training option(s): {', '.join(sorted(unknown))}")
    cfg = NMTConfig(**{k: v for k, v in options.items() if v is not None})
    for name in ("layers", "heads", "d_model", "d_ff", "epochs", "batch_size", "max_train_len", "warmup", "max_steps"):
        value = getattr(cfg, name)
        if value is not None and value < 1:  # --d-ff 0 trained silently; --warmup 0 divided by zero in the schedule
            raise AttnAuditError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if not 0 < cfg.lr < math.inf:
        raise AttnAuditError(f"--lr must be a finite number above 0, got {cfg.lr}")
    if cfg.max_steps is None:  # --max-steps caps the work whatever the epochs
        bounds.epochs(cfg.epochs)
    else:
        bounds.check_time("--max-steps", cfg.max_steps, cfg.max_steps, "one per optimiser step", "give fewer steps")
    # Encoder and decoder layers (attention: 4 d², cross-attention too, feed-forward: 2 d d_ff), 16 bytes a parameter in training.
    per_layer = 2 * (8 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * cfg.d_ff)
    bounds.check_memory("--layers/--d-model/--d-ff", f"{cfg.layers}/{cfg.d_model}/{cfg.d_ff}", float(bounds.TRAINING_BYTES) * cfg.layers * per_layer,
                        "the encoder's and decoder's layers in training", "give fewer layers or smaller widths")
    if cfg.max_train_len > cfg.max_len:
        raise AttnAuditError(f"max_train_len={cfg.max_train_len} exceeds max_len={cfg.max_len}")
    if bleu_split not in (None, "dev", "test"):
        raise AttnAuditError(f"bleu_split must be dev, test or None, got {bleu_split!r}")
    check_normaliser(cfg.attention)
    return cfg


def fits_length(collate: Any, example: Example, limit: int) -> bool:
    """Whether a pair is shorter than ``limit`` subwords on both sides (the pairs NMT trains on)."""
    return len(collate.source.encode(example.tokens)[0]) < limit and len(collate.target.encode(example.target or [])[0]) < limit


def nmt_loop(cfg: NMTConfig) -> LoopConfig:
    """Adam (0.9, 0.98) with Vaswani et al.'s schedule (linear warm-up, then ``∝ 1/√step``),
    clipping, the lowest dev loss kept, early stopping after ``patience`` epochs, ``max_steps``."""
    optimiser = Optimiser("adam", cfg.lr, betas=(0.9, 0.98), eps=1e-9, clip=cfg.clip, schedule="inverse-sqrt", warmup=cfg.warmup)
    selection = Selection("dev.loss", "min", patience=cfg.patience)
    return LoopConfig(cfg.epochs, cfg.batch_size, cfg.seed, optimiser, selection, cfg.max_steps)


def nmt_hooks(run: Run, dev_pairs: list[Example], cfg: NMTConfig) -> Hooks:
    """Teacher forcing with label-smoothed cross-entropy (the epoch's mean is per subword);
    teacher-forced dev scores (:func:`evaluate_nmt`) at the end of every epoch."""
    loss_fn = nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=cfg.label_smoothing)

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        logits = model(batch).logits
        return loss_fn(logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1))

    def weight(batch: Batch) -> float:
        assert batch.labels is not None  # training pairs have targets
        return int((batch.labels != -100).sum())

    return Hooks(loss=loss, evaluate=lambda: {"dev": evaluate_nmt(run, dev_pairs)}, weight=weight)


def _final_metrics(
    run: Run, data: TaskData, state: dict[str, Any], cfg: NMTConfig, train_pairs: list[Example], bleu_split: str | None
) -> dict[str, Any]:
    """``metrics.json`` of the selected model: dev/test scores, the training history and BLEU on ``bleu_split``."""
    dropped = len(data.train) - len(train_pairs)
    metrics: dict[str, Any] = {
        "dev": evaluate_nmt(run, data.dev),
        "test": evaluate_nmt(run, data.test) if data.test else {},
        "epochs": state["epoch"],
        "steps": state["step"],
        "best_dev_loss": state["best"],
        "train_seconds": state["seconds"],
        "train_pairs": len(train_pairs),
        "dropped_long_pairs": dropped,
        "history": state["history"],
        "selection": "lowest dev cross-entropy (teacher-forced, no label smoothing)",
        "notes": [*data.notes, f"dropped {dropped} training pair(s) longer than {cfg.max_train_len} subwords"],
    }
    if bleu_split is not None:
        examples = data.split(bleu_split)
        start = time.perf_counter()
        metrics[f"{bleu_split}_bleu"] = bleu_score(run, examples, desc=f"BLEU {bleu_split}")
        metrics["bleu_seconds"] = time.perf_counter() - start
        metrics["bleu"] = f"greedy decoding, sacrebleu 13a, cased, on {bleu_split} ({len(examples)} sentences)"
    return metrics


# --- loading -------------------------------------------------------------------------


def load_nmt_run(path: str | Path, device: str | None = "auto", data_dir: str | Path | None = None) -> Run:
    """Load a run directory written by :func:`train_nmt` (kind ``nmt``; safetensors + JSON only)."""
    path = Path(path)
    raw = read_config(path)
    try:
        config = ModelConfig.from_dict(raw["model"])
        task = TaskSpec(**raw["task"])
    except TypeError as exc:
        raise InputError(path / CONFIG, f"malformed NMT run config: {exc}") from None
    source, target = SubwordTokenizer.load(path / SOURCE_BPE), SubwordTokenizer.load(path / TARGET_BPE)
    for name, tokenizer, size in ((SOURCE_BPE, source, config.vocab_size), (TARGET_BPE, target, config.num_labels)):
        if len(tokenizer) != size:
            raise InputError(path / name, f"BPE vocabulary has {len(tokenizer)} entries but the model expects {size}")
    model = Seq2SeqTransformer(config)
    load_state_into(model, path / WEIGHTS)
    dev = resolve_device(device)
    model.to(dev).eval()
    if data_dir is not None:
        task.data_dir = absolute_dir(data_dir)
    collate = Seq2SeqCollator(source, target, max_len=config.max_len)
    return Run(model=model, collate=collate, task=task, path=path, device=dev, info=raw)
