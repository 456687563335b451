"""Training new models beside a base run: frozen attention, adversaries, probes, extra seeds.

The training-based tests (Wiegreffe & Pinter 2019; the CoNLL-2000 tagging study) train new
models *next to* a trained base run and compare them with it. Every such sub-run uses the
base's data and vocabulary (its collate function, so both models see identical batches),
its model config and its optimisation settings (Adam, lr, weight decay, clipping, batch
size, patience, epochs) and selects its epoch on the dev split; one trained from scratch beside a run trained from
pretrained word vectors starts from those vectors, as the run did (:func:`base_vectors`). What differs is a
:class:`Variant`:

* ``interventions(batch)`` applied in every forward, training and evaluation alike
  (attention frozen to uniform, or to another model's attention on the same batch);
* ``loss(batch, output)`` replacing cross-entropy on the gold labels (adversaries); a
  custom loss also selects the epoch by the lowest dev loss rather than the task score;
* ``model`` changes to the base config (W&P's diagnostic ``average`` encoder) and ``build``
  (a model that ``build_model`` does not make, e.g. the probe without a query/key path);
* ``start`` a model whose weights the new one starts from instead of a fresh initialisation
  (an adversary fine-tuned away from the base).

Sub-runs are idempotent like :func:`attnaudit.training.trainer.train`: a directory whose
``metrics.json`` exists with the same config hash is loaded, never retrained; ``metrics.json``
is written (atomically) last, and a killed sub-run resumes from its last finished epoch (the
one training loop, :mod:`attnaudit.training.loop`, checkpoints every epoch).
Extra seeds are plain :func:`~attnaudit.training.trainer.train` calls (:func:`train_standard`).

Where they live: new sub-runs are written under :func:`subrun_root` — ``run.subruns`` when set
(``OUT/subruns`` of an audit or of ``attnaudit run TEST RUN --out OUT``), else ``RUN/subruns``.
The base run directory is then only read: a finished sub-run already under ``RUN/subruns``
(from an earlier ``attnaudit run``) is reused from there when its config matches
(:func:`stored_subruns`) rather than retrained; a seed model is copied into the sub-run root
first, where :func:`train` checks its config, so nothing is ever written under ``RUN``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from attnaudit import __version__
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.io import atomic_write_json, digest, read_json_object
from attnaudit.models import ModelConfig, build_model, with_vectors
from attnaudit.models.interface import (
    AttentionModel,
    Intervention,
    ModelOutput,
    evaluation,
    freeze_to,
    freeze_uniform,
)
from attnaudit.run import CONFIG, Run
from attnaudit.training.checkpoint import (
    FEATURE_VOCAB,
    METRICS,
    VOCAB,
    WEIGHTS,
    load_state_into,
)
from attnaudit.training.loop import Checkpoint, Hooks, fit, seeded
from attnaudit.training.trainer import (
    InterventionsFn,
    TrainConfig,
    classifier_hooks,
    evaluate_examples,
    run_summary,
    train,
)

if TYPE_CHECKING:
    from attnaudit.data.batching import Collator

LossFn = Callable[[Batch, ModelOutput], Tensor]
"""``loss(batch, output) -> scalar``: the mean loss of one batch given the model's output on it."""

EVAL_BATCH = 64
_DERIVED_MODEL_FIELDS = ("model", "task_type", "vocab_size", "num_labels")


@dataclass
class Variant:
    """How a sub-run differs from standard training of the base model (see the module docstring).

    ``key`` identifies the variant (kind, λ, the source model's hash...) and enters the
    sub-run's config hash, so a changed source or λ retrains it.
    """

    key: dict[str, Any]
    interventions: InterventionsFn | None = None
    loss: LossFn | None = None
    model: dict[str, Any] = field(default_factory=dict)
    build: Callable[[ModelConfig], AttentionModel] | None = None
    start: AttentionModel | None = None


@dataclass
class SubRun:
    """A model trained beside the base: ``run`` (base collate and task), its ``metrics``, and
    the ``interventions`` it must always be run with. ``trained`` is False when it was loaded.
    """

    run: Run
    metrics: dict[str, Any]
    interventions: InterventionsFn | None = None
    trained: bool = True
    weights: bool = True
    """False: a finished sub-run known by its config and scores alone (:func:`finished_variant`), no model."""

    @property
    def model(self) -> AttentionModel:
        if not self.weights:
            raise AttnAuditError(
                f"{self.run.path} holds a finished sub-run's config and scores but not its weights (restored from a ledger "
                "of scores), and its model is needed: delete that folder to retrain it"
            )
        return self.run.model

    @property
    def hash(self) -> str:
        return str(self.run.info.get("hash", ""))


def trainable_reason(run: Run) -> str | None:
    """Why new models cannot be trained beside ``run`` (None when they can)."""
    kind = run.info.get("kind")
    if kind == "hf":
        count = sum(p.numel() for p in run.model.parameters())
        size = f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count:,}"
        return (
            "this test trains new models of the audited kind from its attnaudit training config; for this pretrained "
            f"Hugging Face model ({size} parameters) that would mean retraining or fine-tuning it, which the test "
            "does not do: skipped"
        )
    if kind != "attnaudit" or "train" not in run.info:
        return (
            f"these tests retrain the model from its attnaudit training config, which this run ({kind or 'unknown kind'}) "
            "does not have (Hugging Face and translation models are not retrained)"
        )
    if run.path is None:
        return "the run has no directory to hold the retrained sub-runs"
    if run.task.task_type not in ("classification", "pair", "tagging"):
        return f"retraining is supported for classification, pair and tagging tasks, not {run.task.task_type}"
    return None


def subrun_root(run: Run) -> Path:
    """Where new sub-runs of ``run`` are written: ``run.subruns``, else ``RUN/subruns`` (module docstring)."""
    if run.subruns is not None:
        return Path(run.subruns)
    if run.path is None:
        raise AttnAuditError("the run has no directory to hold sub-runs")
    return Path(run.path) / "subruns"


def subrun_dir(run: Run, test: str, key: str) -> Path:
    """``<sub-run root>/<test>/<key>``: where one sub-run (one seed, one λ...) of a test is written."""
    return subrun_root(run) / test / key


def stored_subruns(run: Run, out: Path) -> list[Path]:
    """``out`` and, when sub-runs are written elsewhere, the same sub-run under ``RUN/subruns``
    (read only): the places a finished sub-run may already be found, in that order."""
    places = [Path(out)]
    own = Path(run.path) / "subruns" if run.path is not None else None
    if own is not None and run.subruns is not None and Path(out).is_relative_to(run.subruns):
        places.append(own / Path(out).relative_to(run.subruns))
    return list(dict.fromkeys(places))


def base_seed(run: Run) -> int:
    """The training seed the base run was trained with."""
    return int(run.info["train"].get("seed", 0))


def train_settings(run: Run, epochs: int | None = None, seed: int | None = None) -> dict[str, Any]:
    """The base run's :class:`TrainConfig` as a dict, with ``epochs`` / ``seed`` overridden when given."""
    if epochs is not None and epochs < 1:
        raise AttnAuditError(f"--epochs must be at least 1, got {epochs}")
    known = {f.name for f in fields(TrainConfig)}
    settings = {k: v for k, v in run.info["train"].items() if k in known}
    settings = TrainConfig(**settings).to_dict()
    if epochs is not None:
        settings["epochs"] = epochs
    if seed is not None:
        settings["seed"] = seed
    return settings


def standard_options(run: Run, **changes: Any) -> dict[str, Any]:
    """Keyword options that make :func:`train` rebuild the base run's model and settings.

    With no changes (and the base's own data) the resulting config hash is the base's.
    ``changes`` whose value is None are ignored.
    """
    model = {k: v for k, v in run.info["model"].items() if k not in _DERIVED_MODEL_FIELDS}
    extra = dict(model.pop("extra", {}) or {})
    extra.pop("feature_vocab_size", None)  # train() derives it from the feature vocabulary
    options = {**model, "extra": extra, **train_settings(run)}
    options.update({k: v for k, v in changes.items() if v is not None})
    return options


def check_same_inputs(base: Run, other: Run) -> None:
    """Two runs must share vocabulary and labels to be fed the same batches."""
    mine, theirs = cast("Collator", base.collate), cast("Collator", other.collate)  # word-level runs
    if mine.vocab.itos != theirs.vocab.itos or list(base.labels) != list(other.labels):
        raise AttnAuditError(
            f"{other.path} does not share the base run's vocabulary and labels, so the two cannot be compared "
            "instance by instance; retrain it from the base run's data"
        )


def train_standard(base: Run, out: Path, *, seed: int, epochs: int | None = None) -> SubRun:
    """The base model retrained with another seed by :func:`train` (idempotent, resumable).

    A finished one under ``RUN/subruns`` is copied to ``out`` (when ``out`` is new), where
    :func:`train` loads it if its config matches and retrains over the copy otherwise."""
    earlier = [p for p in stored_subruns(base, out)[1:] if (p / METRICS).exists() and (p / CONFIG).exists()]
    if earlier and not Path(out).exists():  # copied beside its place, then renamed: never half there
        partial = Path(out).with_name(f".{Path(out).name}.copy")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(earlier[0], partial, ignore=shutil.ignore_patterns("checkpoint", ".*.tmp"))
        partial.rename(out)
    existed = (Path(out) / METRICS).exists()
    before = (Path(out) / METRICS).stat().st_mtime_ns if existed else None
    options = standard_options(base, seed=seed, epochs=epochs)
    run = train(base.data(), base.family, out, device=str(base.device), quiet_eval=True, **options)
    check_same_inputs(base, run)
    after = (Path(out) / METRICS).stat().st_mtime_ns
    return SubRun(run, read_metrics(Path(out) / METRICS), None, trained=before != after)


def attention_of(source: AttentionModel, layers: Sequence[int] | None = None) -> InterventionsFn:
    """Interventions freezing attention to ``source``'s attention on the same batch.

    ``layers`` (default: every layer of the source) are frozen to the source's layer of the
    same index. The source is put in eval mode and run without gradient: it is fixed, so
    its distributions are exactly those one would save per instance beforehand, without
    holding a ``T×T`` tensor per sentence in memory.
    """
    source.eval()

    def interventions(batch: Batch) -> list[Intervention]:
        with torch.no_grad():
            trace = source(batch).trace
        chosen = range(len(trace)) if layers is None else layers
        return [freeze_to(trace[i].weights, layer=i) for i in chosen]

    return interventions


def config_hash(config: dict[str, Any]) -> str:
    """Hash of a sub-run config (the version excluded), as the trainer hashes runs."""
    body = {k: v for k, v in config.items() if k not in ("version", "hash")}
    return digest(body)


def finished(out: Path, digest: str) -> bool:
    """A sub-run directory holds a finished run with config hash ``digest``."""
    return (out / METRICS).exists() and (out / CONFIG).exists() and read_json_object(out / CONFIG, optional={"hash": str}).get("hash") == digest


def read_metrics(path: Path) -> dict[str, Any]:
    """A sub-run's ``metrics.json``, checked to hold the dev and test scores the tests read."""
    return read_json_object(path, {"dev": dict, "test": dict}, {"epochs": int})


def base_scores(run: Run) -> dict[str, Any]:
    """The base run's dev and test scores: from its ``metrics.json``, else evaluated now."""
    path = Path(run.path) / METRICS if run.path else None
    if path is not None and path.exists():
        metrics = read_json_object(path, optional={"dev": dict, "test": dict})
        if "dev" in metrics and "test" in metrics:
            return {"dev": metrics["dev"], "test": metrics["test"]}
    data = run.data()
    return {"dev": evaluate_examples(run, data.dev), "test": evaluate_examples(run, data.test)}


def _forward(model: AttentionModel, batch: Batch, interventions: InterventionsFn | None) -> ModelOutput:
    return model(batch, interventions(batch) if interventions else ())


def mean_loss(model: AttentionModel, run: Run, examples: list[Example], variant: Variant) -> float:
    """The variant's loss averaged over ``examples`` (eval mode, no gradient), batches weighted by size."""
    assert variant.loss is not None
    total, count = 0.0, 0
    with evaluation(model), torch.no_grad():
        for batch in run.batches(examples, EVAL_BATCH):
            total += float(variant.loss(batch, _forward(model, batch, variant.interventions))) * len(batch)
            count += len(batch)
    return total / max(count, 1)


def variant_config(base: Run, variant: Variant, epochs: int | None, seed: int | None) -> tuple[TrainConfig, ModelConfig, dict[str, Any]]:
    """The training settings, model config and run config (with its hash) of ``variant``'s sub-run of ``base``."""
    settings = train_settings(base, epochs, seed)
    config = ModelConfig.from_dict(base.info["model"]).with_(**variant.model)
    run_config: dict[str, Any] = {
        "kind": "attnaudit", "version": __version__, "model": config.to_dict(), "train": settings,
        "task": base.task.to_dict(), "variant": variant.key, "base": base.info.get("hash"),
    }
    if settings.get("vectors") and variant.start is None:
        run_config["start"] = "vectors"  # before this key, such sub-runs started random: they are trained again
    run_config["hash"] = config_hash(run_config)
    return TrainConfig(**settings), config, run_config


def base_vectors(base: Run, cfg: TrainConfig) -> Tensor:
    """The pretrained word vectors ``base`` was trained from (``train --vectors``), over its vocabulary, the rows of
    words they lack drawn from ``cfg.seed`` as :func:`~attnaudit.training.trainer.train` draws them."""
    from attnaudit.data.vocab import load_vectors, model_vectors

    vocab = getattr(base.collate, "vocab", None)
    if vocab is None or cfg.vectors is None:
        raise AttnAuditError(f"{base.path}: a run trained from word vectors needs its word vocabulary to start a sub-run from them")
    if not (model_vectors(cfg.vectors) or Path(cfg.vectors).exists()):
        raise AttnAuditError(f"{base.path} was trained from the word vectors {cfg.vectors}, which are not there now: "
                             "put the file back at that path to train models beside this run")
    return load_vectors(cfg.vectors, vocab, seed=cfg.seed)


def finished_variant(base: Run, out: str | Path, variant: Variant, *, epochs: int | None = None, seed: int | None = None) -> SubRun | None:
    """The finished sub-run of ``variant`` with this config at ``out`` (or under ``RUN/subruns``), loaded; None when
    there is none. One whose folder holds its config and ``metrics.json`` but no weights (a curve restored from a ledger
    of scores) comes back with ``weights=False``: its scores can be read, its model cannot."""
    cfg, config, run_config = variant_config(base, variant, epochs, seed)
    places = [place for place in stored_subruns(base, Path(out)) if finished(place, run_config["hash"])]
    if not places:
        return None
    place = next((p for p in places if (p / WEIGHTS).exists()), places[0])
    net = seeded(cfg.seed, lambda: (variant.build or build_model)(config).to(base.device))
    weights = (place / WEIGHTS).exists()
    if weights:
        load_state_into(net, place / WEIGHTS)
    net.eval()
    sub = Run(model=net, collate=base.collate, task=base.task, path=place, device=base.device, info=run_config)
    return SubRun(sub, read_metrics(place / METRICS), variant.interventions, trained=False, weights=weights)


def train_variant(
    base: Run, out: str | Path, variant: Variant, *, epochs: int | None = None, seed: int | None = None, label: str = "",
    data: TaskData | None = None,
) -> SubRun:
    """Train (or load, when finished with the same config) one sub-run of ``variant`` into ``out``.

    Standard training (:func:`~attnaudit.training.loop.fit` with the base's settings: optimiser,
    learning-rate schedule, clipping, per-epoch shuffles, dev selection with the base's
    patience) with the variant's interventions and loss, but no word dropout. A killed sub-run
    resumes from its last epoch. The selected weights are scored on dev and test (with the
    interventions); ``metrics.json`` is written last. A finished one without weights is trained again.
    """
    out = Path(out)
    done = finished_variant(base, out, variant, epochs=epochs, seed=seed)
    if done is not None and done.weights:
        return done
    cfg, config, run_config = variant_config(base, variant, epochs, seed)
    net = seeded(cfg.seed, lambda: (variant.build or build_model)(config).to(base.device))
    if variant.start is not None:
        net.load_state_dict(variant.start.state_dict())
    elif cfg.vectors:  # started as the base was: from its pretrained vectors (the unknown words' rows drawn from this seed)
        with_vectors(net, config, base_vectors(base, cfg).to(base.device))
    sub = Run(model=net, collate=base.collate, task=base.task, path=out, device=base.device, info=run_config)
    if out.exists() and not resumable(out, run_config["hash"]):
        shutil.rmtree(out)
    data = base.data() if data is None else data
    loop = cfg.loop(base.task.task_type)
    hooks = _variant_hooks(sub, cfg, variant, data.dev, f"{label or out.name} ")
    if variant.loss is not None:
        loop.selection = replace(loop.selection, metric="dev_loss", mode="min")
    state = fit(net, sub, data.train, loop, hooks, Checkpoint(out, run_config, lambda folder: save_vocabs_of(base, folder)))
    metrics: dict[str, Any] = {
        "dev": evaluate_examples(sub, data.dev, interventions=variant.interventions),
        "test": evaluate_examples(sub, data.test, interventions=variant.interventions),
        **run_summary(cfg, loop, state, base.task.task_type),
        "variant": variant.key,
    }
    if variant.loss is not None:  # selected on the loss, recorded as a score (higher is better)
        metrics.update(best_dev=-state["best"], selection="lowest dev loss")
    atomic_write_json(out / METRICS, metrics)
    shutil.rmtree(out / "checkpoint", ignore_errors=True)
    return SubRun(sub, metrics, variant.interventions, trained=True)


def resumable(out: Path, digest: str) -> bool:
    """``out`` holds the checkpoint of a killed sub-run of this very config (an unreadable one is
    not trusted: the sub-run starts afresh, as one of another config does)."""
    state = out / "checkpoint" / "state.json"
    try:
        return state.is_file() and read_json_object(state, optional={"hash": str}).get("hash") == digest
    except AttnAuditError:
        return False


def save_vocabs_of(base: Run, folder: Path) -> None:
    """``base``'s vocabularies (words, features) written into a sub-run's ``folder``."""
    collate = cast("Collator", base.collate)  # a word-level run's
    collate.vocab.save(folder / VOCAB)
    if collate.feature_vocab is not None:
        collate.feature_vocab.save(folder / FEATURE_VOCAB)


def _variant_hooks(sub: Run, cfg: TrainConfig, variant: Variant, dev: list[Example], label: str) -> Hooks:
    """Standard hooks, or the variant's own loss with selection on its mean dev loss."""
    if variant.loss is None:
        return classifier_hooks(sub, cfg, dev, variant.interventions, label, word_dropout=False)
    loss_fn = variant.loss

    def loss(model: nn.Module, batch: Batch) -> Tensor:
        return loss_fn(batch, _forward(model, batch, variant.interventions))  # type: ignore[arg-type]

    def evaluate() -> dict[str, Any]:
        return {"dev_loss": mean_loss(sub.model, sub, dev, variant)}

    return Hooks(loss=loss, evaluate=evaluate, label=label)


def frozen_uniform(_batch: Batch) -> list[Intervention]:
    """Every attention layer frozen to uniform over the real tokens."""
    return [freeze_uniform()]
