"""Training classifiers and taggers (``attnaudit train``) through the one loop
(:mod:`attnaudit.training.loop`): Adam + early stopping on dev by default, every knob of the
loop (optimiser, weight-decay exemptions, clipping, summed loss, selection metric, minimum
epoch, fixed epochs) a :class:`TrainConfig` option, named option sets in :data:`PRESETS`
(``jain-wallace``); resumable per epoch, safetensors + JSON.

``train`` is idempotent: a finished run directory (``metrics.json`` present, same
config) is loaded rather than retrained, and a killed run resumes from its last
finished epoch with the same numbers an uninterrupted run gives (CPU).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from attnaudit import __version__, bounds
from attnaudit.algorithms.metrics import score_classification, score_tagging
from attnaudit.data.tasks import absolute_spec, drop_short, load_task
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError, FolderInUse
from attnaudit.io import (
    atomic_write_json,
    check_output_dir,
    digest,
    locked,
    remove_stray_tmp,
)
from attnaudit.models import MODELS, ModelConfig, build_model, with_vectors
from attnaudit.models.interface import Intervention, evaluation
from attnaudit.progress import status, track
from attnaudit.run import Run, TaskSpec, absolute_dir
from attnaudit.seed import resolve_device
from attnaudit.training.checkpoint import (
    FEATURE_VOCAB,
    METRICS,
    VOCAB,
    finished_run,
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
from attnaudit.training.staging import stage_of, staged

if TYPE_CHECKING:
    from attnaudit.data.batching import Collator
    from attnaudit.data.vocab import Vocab

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
_MADSEN: dict[str, Any] = {
    "hidden_dim": 128, "scorer": "tanh", "dropout": 0.0, "optimizer": "amsgrad", "lr": 1e-3, "weight_decay": 1e-5,
    "no_decay": ["scorer.*"], "clip": 0.0,
}
PRESETS: dict[str, dict[str, Any]] = {
    # Jain & Wallace (2019)'s classifier protocol (their Trainer / Binary_Classification.py):
    # 8 fixed epochs, the best dev ROC-AUC epoch kept (never the first), no dropout, AMSGrad,
    # weight decay 1e-5 on all but the attention scorer, no clipping, summed loss, <s> … </s>
    # around every sentence, sentences under 6 tokens removed.
    "jain-wallace": {
        "epochs": 8, "early_stop": False, "select": "roc_auc", "min_epoch": 2, "dropout": 0.0,
        "optimizer": "amsgrad", "weight_decay": 1e-5, "no_decay": ["scorer.*"], "clip": 0.0, "loss": "sum",
        "wrap": True, "min_length": 6,
    },
    # Madsen et al. (2022)'s BiLSTM-attention protocol (nlp-roar-interpretability: rnn_*_to_class.py,
    # experiments/stanford_sentiment.py, babi.py): 128 units per direction (bAbI: 32), additive tanh attention,
    # Adam with AMSGrad, lr 1e-3, weight decay 1e-5 on all but the attention (bAbI: on all), no dropout, no clipping,
    # every epoch trained and the best dev epoch kept (SST: ROC-AUC, 8 epochs of 32; bAbI: accuracy,
    # 100 epochs of 50, random 50-d embeddings), a [MASK] word to mask with (dataset/_vocab_tokenizer.py).
    # SST (dataset/sst.py): sentences of 5 tokens or fewer dropped, every sentence read between [CLS] and
    # [EOS], which attention never weighs, and the rows of the specials start at zero. Their SST vectors
    # (fastText simple.300d, zero rows for the words it lacks) are not here: ours start random.
    "madsen2022-sst": {
        "epochs": 8, "batch_size": 32, "early_stop": False, "select": "roc_auc", **_MADSEN,
        "wrap": True, "min_length": 6, "mask_special": True, "zero_specials": True,
    },
    # bAbI (experiments/babi.py, _base_multiple_sequence_to_class.py): 32 units per direction, attention and decoder
    # (hidden_size=32), weight decay on every parameter, and their pair model's head (models.rnn.PAIR_HEADS).
    "madsen2022-babi": {
        "epochs": 100, "batch_size": 50, "early_stop": False, "select": "accuracy", "embed_dim": 50, **_MADSEN,
        "hidden_dim": 32, "no_decay": [], "extra": {"pair_head": "madsen2022"}, "mask_special": True,
    },
}
"""Named option sets of ``train`` (``--preset``); explicit options override them."""
DATA_OPTIONS = ("wrap", "min_length")
"""Options of ``train`` that shape the data and model inputs rather than the model or the loop."""
WRAP = ("<s>", "</s>")
"""The sentence ends a wrapping model reads (vocabulary specials, never attention items)."""
WRAPPING_MODELS = ("bilstm", "cnn", "average", "flat")
MASK = "[MASK]"
"""The mask special of ``mask_special`` (:data:`attnaudit.experiments.roar.MASK_TOKENS` takes it as ROAR's mask)."""
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
    """Gradient-norm clipping threshold; 0 = no clipping."""
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
    optimizer: str = "adam"
    """``adam``, ``amsgrad``, ``adamw`` or ``sgd`` (:class:`~attnaudit.training.loop.Optimiser`)."""
    no_decay: list[str] = field(default_factory=list)
    """Parameter-name patterns (``fnmatch``) trained without weight decay, e.g. ``["scorer.*"]``."""
    loss: str = "mean"
    """Cross-entropy over a batch's tokens/instances: ``mean`` or ``sum``."""
    select: str = ""
    """Dev metric the kept epoch is chosen on (``accuracy``, ``roc_auc``, ``f1``...); "" = the task's
    headline score (accuracy; chunk F1 for tagging)."""
    min_epoch: int = 1
    """Epochs before this one are never kept (nor count towards ``patience``)."""
    early_stop: bool = True
    """False trains all ``epochs`` whatever the dev score does (``patience`` is then unused)."""
    preset: str = ""
    """The named option set (:data:`PRESETS`) these settings started from; "" = none."""
    mask_special: bool = False
    """The vocabulary gets a ``[MASK]`` special, the token ROAR masks with (else ``<unk>``, which unknown test words
    share), as in Madsen et al. (2022)'s code."""
    zero_specials: bool = False
    """The embedding rows of the specials (``<unk>``, ``[MASK]``, ``<s>``, ``</s>``; ``<pad>`` always) start at zero,
    as in Madsen et al. (2022)'s SST code, where every word without a fastText vector starts at zero."""

    def check(self) -> None:
        """Reject values that would crash or silently train nothing, before anything is written."""
        bad = [
            (self.epochs < 1, f"--epochs must be at least 1, got {self.epochs}"),
            (self.batch_size < 1, f"--batch-size must be at least 1, got {self.batch_size}"),
            (not 0 < self.lr <= 1, f"--lr must be in (0, 1], got {self.lr}"),
            (not 0 <= self.weight_decay < float("inf"), f"--weight-decay must be a finite number >= 0, got {self.weight_decay}"),
            (self.patience < 1, f"--patience must be at least 1 epoch, got {self.patience}"),
            (not self.clip >= 0, f"--clip must be >= 0 (0: no clipping), got {self.clip}"),
            (self.min_freq < 1, f"--min-freq must be at least 1, got {self.min_freq}"),
            (self.max_vocab is not None and self.max_vocab < 1, f"--max-vocab must be at least 1, got {self.max_vocab}"),
            (self.warmup < 0, f"--warmup must be >= 0, got {self.warmup}"),
            (not 0 <= self.word_dropout < 1, f"--word-dropout must be in [0, 1), got {self.word_dropout}"),
            (self.loss not in ("mean", "sum"), f"--loss must be mean or sum, got {self.loss!r}"),
            (self.min_epoch < 1 or self.min_epoch > self.epochs, f"--min-epoch must be in 1..{self.epochs} (the epochs), got {self.min_epoch}"),
            (self.select not in SELECTABLE, f"--select must be one of {', '.join(s for s in SELECTABLE if s)}, got {self.select!r}"),
            (self.preset not in ("", *PRESETS), f"unknown preset {self.preset!r}; choose {', '.join(PRESETS)}"),
        ]
        for failed, message in bad:
            if failed:
                raise AttnAuditError(message)
        bounds.epochs(self.epochs)
        self.loop("classification")  # an unknown optimiser is refused here too

    def to_dict(self) -> dict[str, Any]:
        """The settings saved with a run: the loop's later options only when set (so runs
        trained before they existed keep their config and its hash)."""
        return {k: v for k, v in asdict(self).items() if _LATER_OPTIONS.get(k, object()) != v}

    def metric(self, task_type: str) -> str:
        """The dev metric the kept epoch is chosen on."""
        return self.select or score_key(task_type)

    def loop(self, task_type: str, seed: int | None = None) -> LoopConfig:
        """The :class:`~attnaudit.training.loop.LoopConfig` of these settings."""
        optimiser = Optimiser(
            name=self.optimizer, lr=self.lr, weight_decay=self.weight_decay, no_decay=tuple(self.no_decay),
            clip=self.clip or None, schedule="linear", warmup=self.warmup,
        )
        selection = Selection(f"dev.{self.metric(task_type)}", "max", self.min_epoch, self.patience if self.early_stop else None,
                              ceiling=1.0)  # every SELECTABLE score is at most 1
        return LoopConfig(self.epochs, self.batch_size, self.seed if seed is None else seed, optimiser, selection)


# Options added after the first release enter the config hash only when set, so run
# directories trained before they existed are still recognised as finished.
# They are also left out of config.json while unset.
_LATER_OPTIONS: dict[str, Any] = {
    "optimizer": "adam", "no_decay": [], "loss": "mean", "select": "", "min_epoch": 1, "early_stop": True, "preset": "",
    "mask_special": False, "zero_specials": False,
}
SELECTABLE = ("", "accuracy", "macro_f1", "roc_auc", "f1", "precision", "recall", "token_accuracy")
"""Dev scores the kept epoch may be chosen on ("" = the task's headline score)."""


def select_name(text: str) -> str:
    """A ``--select`` value as the dev record names it: ``dev-roc-auc`` -> ``roc_auc``."""
    return text.strip().removeprefix("dev-").removeprefix("dev.").replace("-", "_")
_HASH_IF_SET: dict[str, Any] = {"word_dropout": 0.0, **_LATER_OPTIONS}


def score_key(task_type: str) -> str:
    """The headline task score, the one training selects on by default: chunk F1 (tagging) or accuracy."""
    return "f1" if task_type == "tagging" else "accuracy"


def cross_entropy(reduction: str = "mean") -> Callable[[Tensor, Tensor], Tensor]:
    """Cross-entropy of ``(…, C)`` logits with gold ids (``-100``: padding, ignored), mean or summed."""

    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        return nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction=reduction
        )

    return loss


def check_model_options(options: dict[str, Any]) -> None:
    """Model sizes must be positive and dropout a probability; checked before anything is written."""
    for name in ("embed_dim", "hidden_dim", "layers", "heads", "d_model", "d_ff", "max_len"):
        value = options.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise AttnAuditError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    dropout = options.get("dropout")
    if dropout is not None and not 0 <= dropout < 1:
        raise AttnAuditError(f"--dropout must be in [0, 1), got {dropout}")


def drop_words(batch: Batch, p: float, unk_id: int, first_word_id: int, generator: torch.Generator) -> Batch:
    """``batch`` with each real word id (>= ``first_word_id``, so specials stay) replaced by
    ``unk_id`` with probability ``p``, in tokens and query alike."""

    def drop(ids: Tensor | None, mask: Tensor | None) -> Tensor | None:
        if ids is None or mask is None or p <= 0:
            return ids
        hit = (torch.rand(ids.shape, generator=generator) < p).to(ids.device) & mask & (ids >= first_word_id)
        return ids.masked_fill(hit, unk_id)

    tokens = drop(batch.tokens, batch.mask)
    assert tokens is not None  # a batch always has tokens
    return replace(batch, tokens=tokens, query=drop(batch.query, batch.query_mask))


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


def _build_vocabs(data: TaskData, cfg: TrainConfig, wrap: bool = False) -> tuple[Any, Any]:
    from attnaudit.data.vocab import Vocab

    token_lists = [ex.tokens for ex in data.train] + [ex.query for ex in data.train if ex.query]
    specials = (*(WRAP if wrap else ()), *((MASK,) if cfg.mask_special else ()))
    vocab = Vocab.build(token_lists, min_freq=cfg.min_freq, max_size=cfg.max_vocab, specials=specials)
    features = None
    if cfg.features:
        feats = [ex.meta["features"] for ex in data.train if "features" in ex.meta]
        if not feats:
            raise AttnAuditError(f"--features asked for, but task {data.name!r} has no per-token features")
        features = Vocab.build(feats)
    return vocab, features


def _settings(model: str, options: dict[str, Any]) -> tuple[TrainConfig, dict[str, Any]]:
    """The checked :class:`TrainConfig` and the merged model + training options of ``train``."""
    from attnaudit.models.normalisers import check_normaliser

    if model not in MODELS:
        raise AttnAuditError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    options = {k: v for k, v in options.items() if v is not None}
    train_fields = {f.name for f in fields(TrainConfig)}
    unknown = set(options) - _MODEL_FIELDS - train_fields - set(DATA_OPTIONS)
    if unknown:
        raise AttnAuditError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    preset = options.get("preset", "")
    if preset not in ("", *PRESETS):
        raise AttnAuditError(f"unknown preset {preset!r}; choose {', '.join(PRESETS)}")
    merged = {**FAMILY_DEFAULTS[model], **PRESETS.get(preset, {}), **options}
    merged["select"] = select_name(str(merged.get("select", "")))
    cfg = TrainConfig(**{k: v for k, v in merged.items() if k in train_fields})
    cfg.check()
    check_model_options(merged)
    check_normaliser(merged.get("attention", "softmax"))
    if merged.get("wrap") and model not in WRAPPING_MODELS:
        raise AttnAuditError(f"--wrap applies to the {', '.join(WRAPPING_MODELS)} models, not {model}")
    if not isinstance(merged.get("min_length", 0), int) or merged.get("min_length", 0) < 0:
        raise AttnAuditError(f"--min-length must be a whole number of tokens >= 0, got {merged.get('min_length')!r}")
    return cfg, merged


def preset_note(preset: str, options: dict[str, Any]) -> list[str]:
    """What a preset set, and which of its settings explicit options overrode (for the run's notes)."""
    if not preset:
        return []
    settings = ", ".join(f"{k}={v}" for k, v in PRESETS[preset].items())
    given = {k: v for k, v in options.items() if v is not None and k != "preset"}
    changed = ", ".join(f"{k}={given[k]}" for k in PRESETS[preset] if k in given and given[k] != PRESETS[preset][k])
    return [f"preset {preset}: {settings}" + (f"; overridden: {changed}" if changed else "")]


def _task_data(
    task: str | TaskData, data_dir: str | Path | None, split_seed: int, dev: str | None, test: str | None,
    min_length: int = 0,
) -> tuple[TaskData, TaskSpec]:
    """The task's data (at least two labels; examples under ``min_length`` tokens dropped) and
    the spec saved with the run."""
    if isinstance(task, TaskData):
        data = drop_short(task, min_length) if min_length else task
    else:
        data = load_task(task, data_dir=data_dir, seed=split_seed, dev=dev, test=test, min_length=min_length)
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
        min_length=min_length,
    )
    return data, spec


def _model_config(model: str, merged: dict[str, Any], data: TaskData, vocab: Any, features: Any, vectors: Any) -> ModelConfig:
    """The model's config: the merged options, sized by the vocabularies and the task's labels."""
    if vectors is not None:
        merged = {**merged, "embed_dim": vectors.shape[1]}  # the vectors decide the embedding size
    extra = dict(merged.get("extra", {}))
    if merged.get("zero_specials"):
        extra["zero_rows"] = vocab.encode(vocab.specials)
    if merged.get("wrap"):
        if data.task_type != "classification":
            raise AttnAuditError(f"--wrap applies to classification tasks, not {data.task_type} ({data.name})")
        extra["wrap"] = vocab.encode(WRAP)
    if features is not None:
        extra["feature_vocab_size"] = len(features)
    derived = ("model", "task_type", "vocab_size", "num_labels", "extra")
    return ModelConfig(
        model=model,
        task_type=data.task_type,
        vocab_size=len(vocab),
        num_labels=len(data.labels),
        extra=extra,
        **{k: v for k, v in merged.items() if k in _MODEL_FIELDS and k not in derived},
    )


def classifier_hooks(
    run: Run, cfg: TrainConfig, dev: list[Example], interventions: InterventionsFn | None = None, label: str = "",
    word_dropout: bool = True,
) -> Hooks:
    """Standard training of a classifier or tagger: cross-entropy on the gold labels (with the
    settings' word dropout unless ``word_dropout`` is False), scores on ``dev`` at the end of
    every epoch; ``interventions(batch)`` are applied in every forward, training and evaluation."""
    loss_fn = cross_entropy(cfg.loss)
    vocab = cast("Collator", run.collate).vocab  # a word-level run's
    words = [torch.Generator()]

    def epoch_start(epoch: int) -> None:  # seeded like the shuffle: a resumed run drops the same words
        words[0] = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)

    def loss(model: nn.Module, batch: Batch) -> Tensor:
        if word_dropout and cfg.word_dropout > 0:
            batch = drop_words(batch, cfg.word_dropout, vocab.unk_id, len(vocab.specials), words[0])
        if batch.labels is None:
            raise AttnAuditError("training needs labelled examples")
        return loss_fn(model(batch, interventions(batch) if interventions else ()).logits, batch.labels)

    def evaluate() -> dict[str, Any]:
        return {"dev": evaluate_examples(run, dev, interventions=interventions)}

    return Hooks(loss=loss, evaluate=evaluate, epoch_start=epoch_start, label=label)


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
    keep_epochs: bool = False,
    **options: Any,
) -> Run:
    """Train ``model`` on ``task`` into run directory ``out`` and return the loaded run.

    ``options`` are ModelConfig fields (``attention``, ``scorer``, ``layers``, ``heads``,
    ``d_model``, ``hidden_dim``, ``embed_dim``, ``dropout``, ``max_len``, ``extra``) and
    TrainConfig fields (``epochs``, ``batch_size``, ``lr``, ``patience``, ``seed``, ...);
    ``None`` values fall back to the family defaults; ``preset`` names a :data:`PRESETS` entry
    that explicit options override; ``wrap`` and ``min_length`` are :data:`DATA_OPTIONS`.
    ``keep_epochs`` also keeps every epoch's weights as ``epochs/epoch<N>.safetensors`` (to
    study the unselected epochs); it does not change the run's config.

    ``out`` is checked before any work (:func:`~attnaudit.io.check_output_dir`). A finished run of this config is
    loaded without taking the folder's lock, so processes that read one run (Ray workers sharing a seed's 0 % model)
    never exclude each other; training holds the lock (:func:`~attnaudit.io.locked`), a second writer fails at once.
    """
    from attnaudit.data.vocab import load_vectors
    from attnaudit.run import load_run

    cfg, merged = _settings(model, options)
    out = check_output_dir(out)
    data, spec = _task_data(task, data_dir, split_seed, dev, test, merged.get("min_length", 0))
    if cfg.select == "roc_auc" and (data.task_type == "tagging" or len(data.labels) != 2):
        raise AttnAuditError(f"--select dev-roc-auc needs a binary classification task; {data.name} has {len(data.labels)} labels")
    vocab, feature_vocab = _build_vocabs(data, cfg, bool(merged.get("wrap")))
    vectors = load_vectors(cfg.vectors, vocab, seed=cfg.seed) if cfg.vectors else None
    config = _model_config(model, merged, data, vocab, feature_vocab, vectors)
    run_config: dict[str, Any] = {
        "kind": "attnaudit", "version": __version__, "model": config.to_dict(), "train": cfg.to_dict(), "task": spec.to_dict()
    }
    run_config["hash"] = _config_hash({k: v for k, v in run_config.items() if k != "version"})

    if finished_run(out, run_config["hash"], resume):
        with suppress(FolderInUse), locked(out):  # tidied only when no other process is at work in it
            _remove_strays(out)
        return load_run(out, device=device, data_dir=data_dir)
    with locked(out):
        _remove_strays(out)
        if finished_run(out, run_config["hash"], resume):  # by another process while this one waited for the lock
            return load_run(out, device=device, data_dir=data_dir)
        return _train_new(out, model, data, spec, cfg, options, config, run_config, vocab, feature_vocab, vectors,
                          device=device, resume=resume, quiet_eval=quiet_eval, keep_epochs=keep_epochs)


def _remove_strays(out: Path) -> None:
    """What a killed earlier training left half-written in ``out`` and its stage."""
    for folder in (out, stage_of(out)):
        remove_stray_tmp(folder, recursive=folder != out)


def _train_new(
    out: Path, model: str, data: TaskData, spec: TaskSpec, cfg: TrainConfig, options: dict[str, Any], config: ModelConfig,
    run_config: dict[str, Any], vocab: Vocab, feature_vocab: Vocab | None, vectors: Tensor | None, *, device: str,
    resume: bool, quiet_eval: bool, keep_epochs: bool,
) -> Run:
    """Train the run :func:`train` prepared into ``out`` (its lock held), staged so that it appears whole."""
    from attnaudit.data.batching import Collator

    for line in preset_note(cfg.preset, options):
        status(line)
    net = seeded(cfg.seed, lambda: build_model(config))
    if vectors is not None:
        with_vectors(net, config, vectors)
    net.to(resolve_device(device))
    collate = Collator(
        vocab, data.labels, data.task_type, hierarchical=model == "han", max_len=config.max_len, feature_vocab=feature_vocab
    )
    run = Run(model=net, collate=collate, task=spec, path=out, device=resolve_device(device), info=run_config, _data=data)

    def save_vocabs(directory: Path) -> None:
        vocab.save(directory / VOCAB)
        if feature_vocab is not None:
            feature_vocab.save(directory / FEATURE_VOCAB)

    loop = cfg.loop(data.task_type)
    hooks = classifier_hooks(run, cfg, data.dev)
    with staged(out) as stage:  # the run appears in `out` whole, or not at all (a full disk, a kill)
        if keep_epochs:
            hooks = epoch_keeping(hooks, net, stage / EPOCHS)
        state = fit(net, run, data.train, loop, hooks, Checkpoint(stage, run_config, save_vocabs, resume))
        metrics = {
            "dev": evaluate_examples(run, data.dev),
            "test": evaluate_examples(run, data.test),
            **run_summary(cfg, loop, state, data.task_type),
            "notes": [*data.notes, *preset_note(cfg.preset, options)],
        }
        atomic_write_json(stage / METRICS, metrics)
        shutil.rmtree(stage / "checkpoint", ignore_errors=True)  # the run is complete: no resume needed
    if not quiet_eval:
        status(f"[green]done[/]: dev {metrics['dev']}, test {metrics['test']}")
    return run


EPOCHS = "epochs"
"""Sub-folder of a run with every epoch's weights (``train(..., keep_epochs=True)``)."""


def epoch_keeping(hooks: Hooks, model: nn.Module, folder: Path) -> Hooks:
    """``hooks`` that also save ``model``'s weights after every epoch as ``folder/epoch<N>.safetensors``."""
    from attnaudit.weights import save_tensors

    current = [0]
    start = hooks.epoch_start

    def epoch_start(epoch: int) -> None:
        current[0] = epoch
        if start is not None:
            start(epoch)

    def evaluate() -> dict[str, Any]:
        folder.mkdir(parents=True, exist_ok=True)
        save_tensors(folder / f"epoch{current[0]}.safetensors", model.state_dict())
        return hooks.evaluate() if hooks.evaluate is not None else {}

    return replace(hooks, epoch_start=epoch_start, evaluate=evaluate)


def run_summary(cfg: TrainConfig, loop: LoopConfig, state: dict[str, Any], task_type: str) -> dict[str, Any]:
    """The training part of a run's ``metrics.json``: epochs, the kept epoch's dev score, the
    history, how the epoch was selected and what the loop did (:func:`~attnaudit.training.loop.notes`)."""
    metric = cfg.metric(task_type)
    name = {"accuracy": "accuracy", "f1": "chunk F1"}.get(metric, metric) if not cfg.select else metric
    selection = f"best dev {name}" + (f" from epoch {cfg.min_epoch} on" if cfg.min_epoch > 1 else "")
    return {
        "epochs": state["epoch"],
        "best_dev": state["best"],
        "train_seconds": state["seconds"],
        "history": state["history"],
        "selection": selection,
        "training": notes(loop, state),
    }
