"""Several sub-runs of one model trained together, as one stacked model (issue #44: ROAR's retrains on a GPU).

One small BiLSTM leaves a GPU idle: a retrain's step launches hundreds of small kernels. Sub-runs that share the
base's model config and training settings (each with its own seed and its own data, e.g. the retrains of one
Recursive-ROAR ratio) are trained here in one :func:`~attnaudit.training.loop.fit`: their weights are stacked along
a new first axis (``torch.func.stack_module_state``) and the model's own code runs over all of them at once under
``torch.func.vmap`` (the recurrence step by step, :func:`~attnaudit.models.rnn.stacked_copies`), so each kernel
serves every model. Each model still sees its own training split in its own seed's order (``seed·1000 + epoch``),
starts from its own seed's weights, keeps its own best dev epoch (and, with patience, stops counting where it would
have stopped alone), and is written, scored and hashed exactly as :func:`~attnaudit.training.adversary.
train_variant` writes it alone: Adam and AMSGrad work element by element, so the stacked step is each model's own
step (tested equal to training them one at a time, to float tolerance).

What cannot be stacked trains one at a time (:func:`together_reason`): dropout and word dropout (their random
draws would differ from a model's own), gradient clipping (its norm would span every model), a variant with its
own loss, interventions, start or builder, and families other than :data:`FAMILIES`.

A killed group resumes from its last finished epoch (the stacked weights and optimiser through the loop's checkpoint,
each model's selection and best weights through :class:`Keeper`), in a folder ``.together-<hash>`` beside the
sub-runs, removed once they are written; on a CPU stacking does not
pay (``benchmarks/bench_batched_lstm.py``), on a GPU it does (``benchmarks/bench_together.py``).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from attnaudit.algorithms.metrics import score_classification
from attnaudit.data.batching import Collator, iterate_batches
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.io import atomic_write_json, digest, read_json_object
from attnaudit.models import ModelConfig, build_model, with_vectors
from attnaudit.models.interface import evaluation
from attnaudit.models.rnn import check_ids, stacked_copies
from attnaudit.progress import status
from attnaudit.run import Run, write_config
from attnaudit.training.adversary import (
    EVAL_BATCH,
    SubRun,
    Variant,
    base_vectors,
    finished_variant,
    resumable,
    save_vocabs_of,
    train_variant,
    variant_config,
)
from attnaudit.training.checkpoint import METRICS, save_model
from attnaudit.training.loop import Checkpoint, Hooks, Selection, fit, metric_value, seeded
from attnaudit.training.trainer import TrainConfig, cross_entropy, run_summary
from attnaudit.weights import load_tensors, save_tensors

KEEPER = "keeper.json"
"""A round's per-model selection state in its folder (:class:`Keeper`)."""
FAMILIES = ("bilstm", "cnn", "average")
"""Model families that train stacked (their code runs under ``vmap``; tested equal to one at a time)."""
TASK_TYPES = ("classification", "pair")
"""Tasks whose models train stacked: classification, and pairs (NLI, bAbI QA: a passage and a question)."""


@dataclass
class Job:
    """One sub-run to train: ``variant`` of the base with ``seed`` on ``data`` into ``out``."""

    out: Path
    variant: Variant
    seed: int
    data: TaskData
    label: str = ""


def family_reason(base: Run) -> str | None:
    """Why ``base``'s family cannot train stacked (None: it can)."""
    if base.family not in FAMILIES or base.task.task_type not in TASK_TYPES:
        return (f"only {', '.join(FAMILIES)} models of {' or '.join(TASK_TYPES)} tasks train together, not a {base.family} "
                f"{base.task.task_type} model")
    return None


def together_reason(base: Run, cfg: TrainConfig, config: ModelConfig, variant: Variant) -> str | None:
    """Why ``variant``'s sub-run of ``base`` (settings ``cfg``, model ``config``) cannot train stacked with others
    (None: it can)."""
    reason = family_reason(base)
    if reason is not None:
        return reason
    if variant.loss is not None or variant.interventions is not None or variant.build is not None or variant.start is not None:
        return "a sub-run with its own loss, interventions, builder or start trains alone"
    if config.dropout > 0 or cfg.word_dropout > 0:
        return "dropout draws from one random stream per model, which stacked models would not reproduce"
    if cfg.clip:
        return "gradient clipping takes one norm over every stacked model"
    return None


def train_together(base: Run, jobs: Sequence[Job], *, epochs: int | None = None) -> list[SubRun]:
    """The sub-runs of ``jobs``, in order: finished ones loaded, the others trained, stacked where they share the
    model config, the settings (apart from the seed) and the size of the training split and :func:`together_reason`
    allows, one at a time otherwise."""
    done: dict[int, SubRun] = {}
    groups: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        found = finished_variant(base, job.out, job.variant, epochs=epochs, seed=job.seed)
        if found is not None and found.weights:
            done[i] = found
            continue
        cfg, config, _ = variant_config(base, job.variant, epochs, job.seed)
        reason = together_reason(base, cfg, config, job.variant)
        shared = {**cfg.to_dict(), "seed": None, "model": config.to_dict(), "variant": job.variant.model, "size": len(job.data.train)}
        groups.setdefault(f"alone-{i}" if reason else repr(sorted(shared.items())), []).append(i)
    for members in groups.values():
        if len(members) == 1:
            job = jobs[members[0]]
            done[members[0]] = train_variant(base, job.out, job.variant, epochs=epochs, seed=job.seed, label=job.label, data=job.data)
        else:
            done.update(zip(members, _train_group(base, [jobs[i] for i in members], epochs), strict=True))
    return [done[i] for i in range(len(jobs))]


# --------------------------------------------------------------------------- a stacked group


@dataclass
class Stacked:
    """The models' batches of one step, padded to the longest and the largest and stacked: ids and mask ``(K,B,T)``,
    labels ``(K,B)``, a pair model's question and its mask ``(K,B,Q)``; ``sizes[k]`` of model ``k``'s rows are its
    own (seeds shuffle the short batch to different steps)."""

    tokens: Tensor
    mask: Tensor
    labels: Tensor
    sizes: list[int]
    query: Tensor | None = None
    query_mask: Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[1])

    def to(self, device: torch.device) -> Stacked:
        question = [None if t is None else t.to(device) for t in (self.query, self.query_mask)]
        return Stacked(self.tokens.to(device), self.mask.to(device), self.labels.to(device), self.sizes, *question)

    def check_ids(self, vocab_size: int) -> None:
        """The ids index the embedding table (:func:`~attnaudit.models.rnn.check_ids`, which ``vmap`` cannot run)."""
        check_ids(self.tokens, vocab_size, "token")
        if self.query is not None:
            check_ids(self.query, vocab_size, "query token")


class Feeder:
    """What :func:`fit` batches from: each model's training split in its own seed's order, stacked step by step.

    ``fit`` shuffles with ``seed·1000 + epoch`` for its one seed; here model ``k`` is shuffled with ``seeds[k]·1000 +
    epoch`` as it would be alone (``start(epoch)`` is the loop's ``epoch_start`` hook)."""

    def __init__(self, collate: Collator, splits: Sequence[list[Example]], seeds: Sequence[int], device: torch.device) -> None:
        if len({len(split) for split in splits}) != 1:
            raise AttnAuditError("models trained together need training splits of one size")
        self.collate, self.splits, self.seeds, self.device = collate, splits, seeds, device
        self.epoch = 0

    def start(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self, examples: list[Example], batch_size: int = 64, shuffle: bool = False, seed: int = 0) -> Iterator[Stacked]:
        del examples, seed  # each model's own split and seed
        streams = [iterate_batches(split, self.collate, batch_size, shuffle=shuffle, seed=s * 1000 + self.epoch)
                   for split, s in zip(self.splits, self.seeds, strict=True)]
        for parts in zip(*streams, strict=True):
            yield stack_batches(list(parts), self.collate.vocab.pad_id).to(self.device)


def stack_batches(parts: list[Batch], pad_id: int) -> Stacked:
    """One batch per model, stacked. A padded position changes no model's output; a padded row reads one padding
    token (a row with none would give NaN, whose gradient reaches the weights even at zero loss) and is left out of
    the loss."""
    rows = max(len(part) for part in parts)
    if any(part.labels is None for part in parts):
        raise AttnAuditError("training needs labelled examples")

    def stack(ids: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, Tensor]:
        width = max(int(t.shape[1]) for t in ids)
        padded = [F.pad(mask, (0, width - mask.shape[1], 0, rows - mask.shape[0]), value=0) for mask in masks]
        for mask, part in zip(padded, parts, strict=True):
            mask[len(part):, 0] = True
        return (torch.stack([F.pad(t, (0, width - t.shape[1], 0, rows - t.shape[0]), value=pad_id) for t in ids]),
                torch.stack(padded))

    tokens, mask = stack([p.tokens for p in parts], [p.mask for p in parts])
    query = query_mask = None
    if parts[0].query is not None:
        query, query_mask = stack([cast(Tensor, p.query) for p in parts], [cast(Tensor, p.query_mask) for p in parts])
    return Stacked(tokens, mask, torch.stack([F.pad(cast(Tensor, p.labels), (0, rows - len(p))) for p in parts]),
                   [len(p) for p in parts], query, query_mask)


def stacked_logits(template: nn.Module, params: dict[str, Tensor], batch: Stacked) -> Tensor:
    """Every model's logits ``(K,B,C)``: ``template``'s own forward under ``vmap`` over the stacked ``params``."""

    def one(p: dict[str, Tensor], ids: Tensor, rows: Tensor, *question: Tensor) -> Tensor:
        query, query_mask = question or (None, None)
        return functional_call(template, p, (Batch(tokens=ids, mask=rows, query=query, query_mask=query_mask),)).logits

    question = () if batch.query is None else (batch.query, batch.query_mask)
    with stacked_copies():
        return cast(Tensor, vmap(one)(params, batch.tokens, batch.mask, *question))


def stack_models(nets: Sequence[nn.Module]) -> nn.Module:
    """A copy of ``nets[0]`` whose every parameter is the ``nets``' parameters stacked (same names, so the loop's
    optimiser groups and weight-decay patterns apply unchanged)."""
    params, buffers = stack_module_state(list(nets))
    if buffers:
        raise AttnAuditError("models with buffers do not train together")
    stacked = copy.deepcopy(nets[0])
    for name, value in params.items():
        owner, _, leaf = name.rpartition(".")
        setattr(stacked.get_submodule(owner), leaf, nn.Parameter(value.detach().clone()))
    return stacked


def _train_group(base: Run, jobs: list[Job], epochs: int | None) -> list[SubRun]:
    """Train ``jobs`` (one config, one size of data) as one stacked model; write each as :func:`train_variant` would."""
    setups = [variant_config(base, job.variant, epochs, job.seed) for job in jobs]
    nets = [_start(base, cfg, config) for cfg, config, _ in setups]
    template, stacked = nets[0], stack_models(nets)
    cfg0, task_type = setups[0][0], base.task.task_type
    loop = cfg0.loop(task_type)
    hashes = [run_config["hash"] for _, _, run_config in setups]
    folder = Path(os.path.commonpath([job.out for job in jobs])) / f".together-{digest(hashes)[:16]}"
    checkpoint = Checkpoint(folder, {"hash": digest(hashes), "kind": "together", "runs": hashes})
    if not resumable(folder, digest(hashes)):
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    keep = Keeper(loop.selection, len(jobs), folder)
    stacked_loop = replace(loop, selection=Selection(None))  # every epoch "kept" by the loop; each model's own choice in `keep`
    feeder = Feeder(cast(Collator, base.collate), [job.data.train for job in jobs], [cfg.seed for cfg, _, _ in setups], base.device)
    hooks = _group_hooks(base, template, stacked, jobs, setups, feeder, keep)
    status(f"training {len(jobs)} models together: {', '.join(job.label or job.out.name for job in jobs)}")
    start = time.perf_counter()
    state = fit(stacked, feeder, jobs[0].data.train, stacked_loop, hooks, checkpoint)
    seconds = time.perf_counter() - start
    best = [{n: t.to(base.device) for n, t in (keep.best[k] or _slice(stacked, k)).items()} for k in range(len(jobs))]
    params = {name: torch.stack([b[name] for b in best]) for name in best[0]}
    scores = {split: stacked_scores(base, template, params, [job.data.split(split) for job in jobs]) for split in ("dev", "test")}
    subs = []
    for k, (job, (cfg, _, run_config), net) in enumerate(zip(jobs, setups, nets, strict=True)):
        net.load_state_dict(best[k])
        metrics = {"dev": scores["dev"][k], "test": scores["test"][k], **run_summary(cfg, replace(loop, seed=cfg.seed),
                   keep.state(k, state, seconds, len(jobs)), task_type)}
        subs.append(_write(base, job, run_config, net, metrics, len(jobs)))
    shutil.rmtree(folder, ignore_errors=True)  # every sub-run is written: nothing left to resume
    return subs


def stacked_scores(base: Run, template: nn.Module, params: dict[str, Tensor], splits: Sequence[list[Example]]) -> list[dict[str, float]]:
    """Each model's scores on its own split (the same sentences in the same order, masked differently), as
    :func:`~attnaudit.training.trainer.evaluate_examples` gives them, from stacked forward passes."""
    collate = cast(Collator, base.collate)
    out: list[dict[str, list[Any]]] = [{"gold": [], "pred": [], "probs": []} for _ in splits]
    streams = [iterate_batches(split, collate, EVAL_BATCH) for split in splits]
    with evaluation(template), torch.no_grad():
        for parts in zip(*streams, strict=True):
            batch = stack_batches(list(parts), collate.vocab.pad_id).to(base.device)
            batch.check_ids(len(collate.vocab))
            probs = stacked_logits(template, params, batch).softmax(-1).cpu()
            for k, part in enumerate(parts):
                rows = probs[k, : len(part)]
                out[k]["pred"].extend(base.labels[j] for j in rows.argmax(-1).tolist())
                out[k]["gold"].extend(ex.label for ex in part.examples)
                out[k]["probs"].extend(rows.tolist())
    return [score_classification(o["gold"], o["pred"], o["probs"], base.labels) for o in out]


def _start(base: Run, cfg: TrainConfig, config: ModelConfig) -> nn.Module:
    """A model as :func:`train_variant` starts it: seeded, and from the base's vectors where the base was."""
    net = seeded(cfg.seed, lambda: build_model(config).to(base.device))
    if cfg.vectors:
        with_vectors(net, config, base_vectors(base, cfg).to(base.device))
    return net


def _slice(stacked: nn.Module, k: int) -> dict[str, Tensor]:
    return {name: value[k].detach().clone() for name, value in stacked.state_dict().items()}


class Keeper:
    """Each stacked model's own epoch selection (the loop's :class:`Selection` applied per model), history and best
    weights, kept in ``folder`` after every epoch (``keeper.json``, then ``best-<k>-e<epoch>.safetensors``) so that a
    killed round resumes with them (:meth:`commit`)."""

    def __init__(self, selection: Selection, count: int, folder: Path) -> None:
        self.selection, self.folder = selection, folder
        self.best_value = [selection.start()] * count
        self.selected = [0] * count
        self.bad = [0] * count
        self.best: list[dict[str, Tensor] | None] = [None] * count
        self.history: list[list[dict[str, Any]]] = [[] for _ in range(count)]
        self._restore()

    def _restore(self) -> None:
        """The state of a killed round, when ``folder`` holds one. It may be an epoch ahead of the loop's checkpoint (a
        kill between the two writes): the loop then trains that epoch again and :meth:`record` skips it."""
        path = self.folder / KEEPER
        if not path.is_file():
            return
        saved = read_json_object(path, {"best_value": list, "selected": list, "bad": list, "history": list, "files": list})
        start = self.selection.start()
        self.best_value = [start if v is None else float(v) for v in saved["best_value"]]  # JSON has no infinity
        self.selected, self.bad, self.history = saved["selected"], saved["bad"], saved["history"]
        self.best = [None if name is None else load_tensors(self.folder / name) for name in saved["files"]]

    def stopped(self, k: int) -> bool:
        """Whether model ``k`` would have stopped by now alone (patience, or its kept score at the ceiling): later
        epochs no longer count for it."""
        patience = self.selection.patience
        return (patience is not None and self.bad[k] >= patience) or self.selection.reached(self.best_value[k])

    def all_stopped(self) -> bool:
        """Every model has stopped: no later epoch of the stacked model counts (the loop ends there)."""
        return all(self.stopped(k) for k in range(len(self.best)))

    def record(self, k: int, record: dict[str, Any], weights: Callable[[], dict[str, Tensor]]) -> None:
        """Model ``k``'s epoch ``record``; ``weights()`` are kept when the epoch is its best so far."""
        done = self.history[k][-1]["epoch"] if self.history[k] else 0
        if self.stopped(k) or record["epoch"] <= done:  # stopped alone by now, or an epoch recorded before a kill
            return
        self.history[k].append(record)
        selection, epoch = self.selection, record["epoch"]
        if epoch < selection.min_epoch:
            return
        value = metric_value(record, selection.metric) if selection.metric else 0.0
        if selection.metric is None or selection.better(value, self.best_value[k]):
            self.best_value[k], self.selected[k], self.bad[k], self.best[k] = value, epoch, 0, weights()
            save_tensors(self.folder / self._file(k, epoch), cast(dict[str, Tensor], self.best[k]))
        else:
            self.bad[k] += 1

    def _file(self, k: int, epoch: int) -> str:
        return f"best-{k}-e{epoch}.safetensors"

    def commit(self) -> None:
        """Write the state after an epoch's records (the best weights were written as they came), then remove the
        best weights it no longer names."""
        files = [None if self.best[k] is None else self._file(k, self.selected[k]) for k in range(len(self.best))]
        atomic_write_json(self.folder / KEEPER, {
            "best_value": [v if math.isfinite(v) else None for v in self.best_value], "selected": self.selected,
            "bad": self.bad, "history": self.history, "files": files})
        for stale in self.folder.glob("best-*.safetensors"):
            if stale.name not in files:
                stale.unlink()

    def state(self, k: int, loop_state: dict[str, Any], seconds: float, count: int) -> dict[str, Any]:
        """Model ``k``'s training state as the loop would have returned it alone (``seconds``: the group's wall time
        shared out evenly)."""
        epochs = len(self.history[k])
        per_epoch = loop_state["step"] // max(loop_state["epoch"], 1)
        return {"epoch": epochs, "step": per_epoch * epochs, "best": self.best_value[k], "selected": self.selected[k],
                "bad": self.bad[k], "history": self.history[k], "seconds": seconds / count}


def _group_hooks(base: Run, template: nn.Module, stacked: nn.Module, jobs: list[Job], setups: list[Any], feeder: Feeder,
                 keep: Keeper) -> Hooks:
    """The loss of every model on its own batch (summed: each model's gradient is its own loss's) and, after every
    epoch, each model scored on its own dev split and its epoch recorded as it would be alone."""
    loss_fn = cross_entropy(setups[0][0].loss)
    vocab_size = len(cast(Collator, base.collate).vocab)
    sums, counts = torch.zeros(len(jobs)), torch.zeros(len(jobs))  # each model's loss × rows and rows this epoch
    epoch_now = [0]

    def epoch_start(epoch: int) -> None:
        feeder.start(epoch)
        sums.zero_()
        counts.zero_()
        epoch_now[0] = epoch

    def loss(model: nn.Module, batch: Stacked) -> Tensor:
        batch.check_ids(vocab_size)
        template.train()
        logits = stacked_logits(template, dict(model.named_parameters()), batch)
        losses = torch.stack([loss_fn(logits[k, :n], batch.labels[k, :n]) for k, n in enumerate(batch.sizes)])
        sums.add_(losses.detach().cpu() * torch.tensor(batch.sizes))
        counts.add_(torch.tensor(batch.sizes))
        return losses.sum()

    def evaluate() -> dict[str, Any]:
        scores = stacked_scores(base, template, dict(stacked.named_parameters()), [job.data.dev for job in jobs])
        for k, dev in enumerate(scores):
            record = {"epoch": epoch_now[0], "train_loss": float(sums[k] / counts[k].clamp_min(1)), "dev": dev}
            keep.record(k, record, partial(_slice, stacked, k))
        keep.commit()
        return {"models": scores}

    return Hooks(loss=loss, evaluate=evaluate, epoch_start=epoch_start, label=f"{len(jobs)} models ", done=keep.all_stopped)


def _write(base: Run, job: Job, run_config: dict[str, Any], net: nn.Module, metrics: dict[str, Any], together: int) -> SubRun:
    """Model ``net`` (its selected weights) written into ``job.out`` as :func:`train_variant` writes a sub-run:
    config and vocabularies, weights, then ``metrics.json`` last."""
    out = job.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    write_config(out, run_config)
    save_vocabs_of(base, out)
    save_model(out, net)
    net.eval()
    metrics = {**metrics, "variant": job.variant.key, "together": {
        "models": together, "note": "trained stacked with other sub-runs; train_seconds is the group's wall time shared out evenly"}}
    atomic_write_json(out / METRICS, metrics)
    sub = Run(model=cast(Any, net), collate=base.collate, task=base.task, path=out, device=base.device, info=run_config)
    return SubRun(sub, metrics, None, trained=True)
