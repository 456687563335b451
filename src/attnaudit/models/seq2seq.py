"""A small encoder-decoder Transformer for NMT, its training (``train_nmt``) and greedy decoding.

Post-LN blocks as in Vaswani et al. (2017), built from the encoder layer and the
:func:`~attnaudit.models.transformer.multi_head_attention` of ``transformer.py``:
the encoder stacks :class:`~attnaudit.models.transformer.EncoderLayer`; each decoder block
runs causal self-attention, cross-attention over the encoder output, then the feed-forward
block. Target embeddings are tied to the output projection.

The trace lists every attention computation in order — ``enc0..enc{L-1}`` (encoder
self-attention), then per decoder block ``self{l}`` and ``cross{l}`` — so trace index
``L + 2l + 1`` is the cross-attention of block ``l`` (:attr:`Seq2SeqTransformer.cross_layers`).
A cross-attention record has weights ``(B,H,T_tgt,T_src)``, ``mask`` the source mask,
``query_mask`` the target mask and ``inputs`` the encoder output (the vectors that are
weighted), and ``value_output_maps(i)`` gives that layer's ``W_V``/``W_O``, so the
norm analysis of Kobayashi et al. (2020) works on it unchanged.

``ModelConfig`` use: ``vocab_size`` = source BPE vocabulary, ``num_labels`` = target BPE
vocabulary, ``layers`` = blocks per stack (encoder and decoder), ``embed_dim == d_model``.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.io import writes_folder
from attnaudit.models.attention import check_normaliser
from attnaudit.models.base import (
    AttentionLayer,
    AttentionModel,
    AttentionTrace,
    Cache,
    Intervention,
    ModelConfig,
    ModelOutput,
    evaluation,
    interventions_for,
)
from attnaudit.models.transformer import (
    EncoderLayer,
    multi_head_attention,
    sinusoidal_positions,
)
from attnaudit.run import Run

SOURCE_BPE = "source_bpe.json"
TARGET_BPE = "target_bpe.json"


class CrossAttention(nn.Module):
    """The projections of one encoder-decoder attention (queries: decoder, keys/values: encoder)."""

    def __init__(self, d_model: int, heads: int, normaliser: str) -> None:
        super().__init__()
        self.heads = heads
        self.normaliser = normaliser
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)


class DecoderLayer(EncoderLayer):
    """Post-LN decoder block: causal self-attention (the inherited projections and
    ``attention_norm``), cross-attention (``cross``, ``cross_norm``), feed-forward (inherited)."""

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float, normaliser: str) -> None:
        super().__init__(d_model, heads, d_ff, dropout, normaliser)
        self.cross = CrossAttention(d_model, heads, normaliser)
        self.cross_norm = nn.LayerNorm(d_model)

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        mask: Tensor,
        memory: Tensor,
        memory_mask: Tensor,
        self_interventions: Sequence[Intervention],
        cross_interventions: Sequence[Intervention],
        index: int,
    ) -> tuple[Tensor, AttentionLayer, AttentionLayer]:
        """New decoder states and the self- and cross-attention records of block ``index``."""
        attended, self_record = multi_head_attention(self, x, mask, self_interventions, f"self{index}", causal=True)
        h = self.attention_norm(x + self.dropout(attended))
        crossed, cross_record = multi_head_attention(
            self.cross, h, mask, cross_interventions, f"cross{index}", memory=memory, memory_mask=memory_mask
        )
        h = self.cross_norm(h + self.dropout(crossed))
        return self.ffn_norm(h + self.dropout(self.ffn(h))), self_record, cross_record


class Seq2SeqTransformer(AttentionModel):
    """Encoder-decoder Transformer; ``forward(batch)`` is teacher-forced on ``batch.target``.

    Logits are ``(B, T_tgt, V_tgt)``: position ``p`` predicts ``batch.labels[:, p]``.
    ``explained_layer`` is the last cross-attention layer.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.task_type != "seq2seq":
            raise AttnAuditError(f"Seq2SeqTransformer needs task_type seq2seq, got {config.task_type}")
        if config.d_model % config.heads:
            raise AttnAuditError(f"d_model={config.d_model} is not divisible by heads={config.heads}")
        if config.layers < 1:
            raise AttnAuditError(f"a Transformer needs at least one layer, got layers={config.layers}")
        check_normaliser(config.attention)
        d = config.d_model
        self.source_embedding = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_id)
        self.target_embedding = nn.Embedding(config.num_labels, d, padding_idx=config.pad_id)
        for table in (self.source_embedding, self.target_embedding):
            nn.init.normal_(table.weight, std=d**-0.5)
            with torch.no_grad():
                table.weight[config.pad_id].zero_()
        self.output_bias = nn.Parameter(torch.zeros(config.num_labels))
        self.scale = math.sqrt(d)
        self.register_buffer("positions", sinusoidal_positions(config.max_len, d), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        args = (d, config.heads, config.d_ff, config.dropout, config.attention)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(config.layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args) for _ in range(config.layers))
        self.explained_layer = 3 * config.layers - 1

    @property
    def num_attention_layers(self) -> int:
        return 3 * len(self.encoder)

    @property
    def cross_layers(self) -> list[int]:
        """Trace indices of the cross-attention layers, decoder block 0 first."""
        n = len(self.encoder)
        return [n + 2 * block + 1 for block in range(n)]

    def layer_name(self, index: int) -> str:
        """``enc{l}``, ``self{l}`` or ``cross{l}`` for trace index ``index``."""
        n = len(self.encoder)
        index = self._resolve(index)
        if index < n:
            return f"enc{index}"
        block, kind = divmod(index - n, 2)
        return f"{'cross' if kind else 'self'}{block}"

    def _resolve(self, index: int) -> int:
        total = self.num_attention_layers
        if not -total <= index < total:
            raise AttnAuditError(f"attention layer {index} out of range for a model with {total} attention layers")
        return index % total

    has_value_output = True

    def value_output_maps(self, layer: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """``(W_V, b_V, W_O, heads)`` of trace layer ``layer`` (right-multiplied maps, as in
        :meth:`~attnaudit.models.transformer.TransformerEncoderModel.value_output_maps`)."""
        n = len(self.encoder)
        index = self._resolve(layer)
        if index < n:
            block: nn.Module = self.encoder[index]
        else:
            number, kind = divmod(index - n, 2)
            block = self.decoder[number].cross if kind else self.decoder[number]
        return block.v_proj.weight.t(), block.v_proj.bias, block.out_proj.weight.t(), self.config.heads

    # --- embeddings ------------------------------------------------------------------

    def _check(self, ids: Tensor, size: int, what: str) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise AttnAuditError(f"{what} ids must lie in [0, {size}); got {int(ids.min())}..{int(ids.max())}")
        if ids.shape[-1] > self.config.max_len:
            raise AttnAuditError(f"{what} sequence of length {ids.shape[-1]} exceeds max_len={self.config.max_len}")

    def embed(self, batch: Batch) -> Tensor:
        """Source token embeddings ``(B,S,d)`` (the gradient target)."""
        self._check(batch.tokens, self.config.vocab_size, "source")
        return self.source_embedding(batch.tokens)

    def _positioned(self, embeddings: Tensor) -> Tensor:
        return self.dropout(embeddings * self.scale + self.positions[: embeddings.shape[1]])

    def embed_target(self, target: Tensor) -> Tensor:
        """Decoder input states ``(B,T,d)`` from target ids (scaled embeddings + positions)."""
        self._check(target, self.config.num_labels, "target")
        return self._positioned(self.target_embedding(target))

    def encode(self, batch: Batch, embeddings: Tensor | None = None) -> Cache:
        """Source states entering encoder layer 0; the embedded decoder input rides in ``extra``."""
        emb = self.embed(batch) if embeddings is None else embeddings
        extra: dict[str, Any] = {}
        if batch.target is not None:
            if batch.target_mask is None:
                raise AttnAuditError("a seq2seq batch with target needs target_mask")
            extra = {"target_states": self.embed_target(batch.target), "target_mask": batch.target_mask.bool()}
        return Cache(states=self._positioned(emb), mask=batch.mask.bool(), layer=0, extra=extra)

    # --- attention stacks ------------------------------------------------------------

    def _interventions(self, interventions: Sequence[Intervention], layer: int) -> list[Intervention]:
        return interventions_for(interventions, layer, self.num_attention_layers)

    def run_encoder(
        self, states: Tensor, mask: Tensor, interventions: Sequence[Intervention] = (), start: int = 0,
        trace: AttentionTrace | None = None,
    ) -> Tensor:
        """Encoder layers ``start``..L-1; records are appended to ``trace`` when given."""
        for index in range(start, len(self.encoder)):
            states, record = self.encoder[index](states, mask, self._interventions(interventions, index), f"enc{index}")
            if trace is not None:
                trace.layers.append(record)
        return states

    def run_decoder(
        self, states: Tensor, mask: Tensor, memory: Tensor, memory_mask: Tensor,
        interventions: Sequence[Intervention] = (), first_block: int = 0, trace: AttentionTrace | None = None,
    ) -> Tensor:
        """Decoder blocks ``first_block``..L-1: final decoder states ``(B,T,d)``."""
        n = len(self.encoder)
        for block in range(first_block, n):
            self_index = n + 2 * block
            states, self_record, cross_record = self.decoder[block](
                states, mask, memory, memory_mask,
                self._interventions(interventions, self_index), self._interventions(interventions, self_index + 1), block,
            )
            if trace is not None:
                trace.layers += [self_record, cross_record]
        return states

    def project(self, states: Tensor) -> Tensor:
        """Logits ``(..., V_tgt)`` from decoder states: the output layer tied to the target embeddings."""
        return states @ self.target_embedding.weight.t() + self.output_bias

    def decode(
        self, cache: Cache, interventions: Sequence[Intervention] = (), start_layer: int | None = None
    ) -> ModelOutput:
        """Attention layer ``start_layer`` (an encoder layer or a decoder ``self{l}``) onwards.

        Restarting at a ``cross{l}`` layer is refused: its queries are an intermediate state
        of the decoder block that the trace does not record.
        """
        n = len(self.encoder)
        start = self._resolve(cache.layer if start_layer is None else start_layer)
        trace = AttentionTrace()
        if start < n:
            if "target_states" not in cache.extra:
                raise AttnAuditError("the NMT model's forward is teacher-forced: the batch needs a target")
            memory_mask = cache.mask.bool()
            memory = self.run_encoder(cache.states, memory_mask, interventions, start, trace)
            states, mask, first = cache.extra["target_states"], cache.extra["target_mask"], 0
        else:
            first, kind = divmod(start - n, 2)
            if kind:
                raise AttnAuditError(
                    f"cannot restart at cross-attention layer {start} ({self.layer_name(start)}); "
                    f"restart at {self.layer_name(start - 1)} (layer {start - 1})"
                )
            memory, memory_mask = cache.extra["memory"], cache.extra["memory_mask"]
            states, mask = cache.states, cache.mask.bool()
        states = self.run_decoder(states, mask, memory, memory_mask, interventions, first, trace)
        return ModelOutput(logits=self.project(states), trace=trace)

    def cache_at(self, trace: AttentionTrace, layer: int, base: Cache) -> Cache:
        """Restart at encoder layer ``layer`` or decoder ``self{l}`` of a full trace."""
        n = len(self.encoder)
        layer = self._resolve(layer)
        if len(trace) != self.num_attention_layers:
            raise AttnAuditError("cache_at needs the full trace of a forward pass")
        entry = trace[layer]
        if layer < n:
            return Cache(states=entry.inputs, mask=entry.mask, layer=layer, extra=dict(base.extra))
        if (layer - n) % 2:
            raise AttnAuditError(f"cannot restart at cross-attention layer {layer}; restart at layer {layer - 1}")
        cross = trace[layer + 1]
        extra = {**base.extra, "memory": cross.inputs, "memory_mask": cross.mask}
        return Cache(states=entry.inputs, mask=entry.query_mask, layer=layer, extra=extra)

    @torch.no_grad()
    def greedy(self, batch: Batch, max_len_a: float = 1.5, max_len_b: int = 10) -> list[list[int]]:
        """Greedy decoding: target subword ids per example (no ``<s>``/``</s>``).

        At most ``max_len_a * source_length + max_len_b`` steps (capped by ``max_len``);
        the decoder is rerun on the whole prefix each step (no key/value cache: these models
        are small and decoding is not the bottleneck of the alignment study).
        """
        from attnaudit.data.alignment import BOS_ID, EOS_ID

        was_training = self.training
        self.eval()
        memory_mask = batch.mask.bool()
        memory = self.run_encoder(self._positioned(self.embed(batch)), memory_mask)
        b = batch.tokens.shape[0]
        steps = min(int(max_len_a * int(memory_mask.sum(1).max()) + max_len_b), self.config.max_len - 1)
        ids = torch.full((b, 1), BOS_ID, dtype=torch.long, device=batch.tokens.device)
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        for _ in range(steps):
            mask = torch.ones_like(ids, dtype=torch.bool)
            logits = self.project(self.run_decoder(self.embed_target(ids), mask, memory, memory_mask)[:, -1])
            token = logits.argmax(-1).masked_fill(done, EOS_ID)
            ids = torch.cat([ids, token[:, None]], dim=1)
            done |= token == EOS_ID
            if bool(done.all()):
                break
        self.train(was_training)
        out = []
        for row in ids[:, 1:].tolist():
            out.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
        return out


# --- training ------------------------------------------------------------------------


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


def translate(run: Run, examples: list[Example], batch_size: int = 64, desc: str | None = None) -> list[list[str]]:
    """Greedy translations (target words) of ``examples``, in order."""
    from attnaudit.progress import track

    model = run.model
    if not isinstance(model, Seq2SeqTransformer):
        raise AttnAuditError(f"translate needs an NMT run, got a {run.family} model")
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
            real = labels != -100
            total += float(nn.functional.cross_entropy(logits[real], labels[real], reduction="sum"))
            correct += int((logits.argmax(-1)[real] == labels[real]).sum())
            count += int(real.sum())
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "token_accuracy": correct / max(count, 1)}


def bleu_score(run: Run, examples: list[Example], batch_size: int = 64, desc: str | None = None) -> float:
    """Corpus BLEU (sacrebleu 13a) of greedy translations against the examples' targets
    (both space-joined words; the targets are 13a-tokenised, re-tokenising them is a no-op)."""
    from attnaudit.metrics import bleu

    hypotheses = translate(run, examples, batch_size, desc)
    return bleu([" ".join(h) for h in hypotheses], [" ".join(ex.target or []) for ex in examples])


def _fits(collate: Any, example: Example, limit: int) -> bool:
    return len(collate.source.encode(example.tokens)[0]) < limit and len(collate.target.encode(example.target or [])[0]) < limit


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
    """
    from attnaudit import __version__
    from attnaudit.data.alignment import PAD_ID, Seq2SeqCollator, SubwordTokenizer
    from attnaudit.io import atomic_write_json, digest, read_json_object
    from attnaudit.progress import status, track
    from attnaudit.run import TaskSpec
    from attnaudit.seed import resolve_device, set_seed
    from attnaudit.training.checkpoint import (
        CONFIG,
        METRICS,
        WEIGHTS,
        load_state_into,
        refuse_other_run,
        save_epoch,
        save_model,
        start_or_resume,
    )

    known = {f.name for f in fields(NMTConfig)}
    unknown = set(options) - known
    if unknown:
        raise AttnAuditError(f"unknown NMT training option(s): {', '.join(sorted(unknown))}")
    cfg = NMTConfig(**{k: v for k, v in options.items() if v is not None})
    if cfg.max_train_len > cfg.max_len:
        raise AttnAuditError(f"max_train_len={cfg.max_train_len} exceeds max_len={cfg.max_len}")
    if bleu_split not in (None, "dev", "test"):
        raise AttnAuditError(f"bleu_split must be dev, test or None, got {bleu_split!r}")
    check_normaliser(cfg.attention)
    if isinstance(task, TaskData):
        data = task
    else:
        from attnaudit.data.tasks import load_task

        data = load_task(task, data_dir=data_dir, seed=split_seed)
    if data.task_type != "seq2seq":
        raise AttnAuditError(f"train_nmt needs a seq2seq task, {data.name!r} is {data.task_type}")
    if not data.train or not data.dev:
        raise AttnAuditError(f"task {data.name!r} needs non-empty train and dev splits")
    spec = TaskSpec(
        spec=task if isinstance(task, str) else data.name, task_type="seq2seq", labels=[],
        data_dir=str(data_dir) if data_dir else None, seed=split_seed,
    )
    run_config: dict[str, Any] = {"kind": "nmt", "version": __version__, "train": asdict(cfg), "task": spec.to_dict()}
    out = Path(out)
    set_seed(cfg.seed)
    source = SubwordTokenizer.train((ex.tokens for ex in data.train), cfg.source_vocab)
    target = SubwordTokenizer.train((ex.target or [] for ex in data.train), cfg.target_vocab)
    config = ModelConfig(
        model="nmt", task_type="seq2seq", vocab_size=len(source), num_labels=len(target), embed_dim=cfg.d_model,
        attention=cfg.attention, layers=cfg.layers, heads=cfg.heads, d_model=cfg.d_model, d_ff=cfg.d_ff,
        dropout=cfg.dropout, max_len=cfg.max_len, pad_id=PAD_ID,
    )
    run_config["model"] = config.to_dict()
    config_hash = digest({k: v for k, v in run_config.items() if k != "version"})
    run_config["hash"] = config_hash
    if resume and (out / METRICS).exists() and (out / CONFIG).exists() and read_json_object(out / CONFIG, optional={"hash": str}).get("hash") == config_hash:
        status(f"[green]{out}[/]: already trained with this config, loading it")
        return load_nmt_run(out, device=device, data_dir=data_dir)
    refuse_other_run(out, config_hash)

    dev_device = resolve_device(device)
    net = Seq2SeqTransformer(config).to(dev_device)
    collate = Seq2SeqCollator(source, target, max_len=cfg.max_len)
    run = Run(model=net, collate=collate, task=spec, path=out, device=dev_device, info=run_config, _data=data)
    train_pairs = [ex for ex in data.train if _fits(collate, ex, cfg.max_train_len)]
    dropped = len(data.train) - len(train_pairs)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)

    def save_bpe(directory: Path) -> None:
        source.save(directory / SOURCE_BPE)
        target.save(directory / TARGET_BPE)

    fresh = {"epoch": 0, "step": 0, "best": float("inf"), "bad": 0, "history": [], "seconds": 0.0}
    state = start_or_resume(out, net, optimizer, run_config, fresh, save_bpe, resume)

    loss_fn = nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=cfg.label_smoothing)
    n_batches = -(-len(train_pairs) // cfg.batch_size)
    def steps_left() -> bool:
        return cfg.max_steps is None or state["step"] < cfg.max_steps

    while state["epoch"] < cfg.epochs and state["bad"] < cfg.patience and steps_left():
        epoch = state["epoch"] + 1
        start = time.perf_counter()
        net.train()
        total, count = 0.0, 0
        batches = run.batches(train_pairs, cfg.batch_size, shuffle=True, seed=cfg.seed * 1000 + epoch)
        for batch in track(batches, f"epoch {epoch}/{cfg.epochs}", total=n_batches):
            if not steps_left():
                break  # the step budget ends this (last) epoch early
            state["step"] += 1
            # Vaswani et al.'s schedule: linear warm-up to lr, then decay with 1/sqrt(step).
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * min(state["step"] / cfg.warmup, math.sqrt(cfg.warmup / state["step"]))
            logits = net(batch).logits
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), cfg.clip)
            optimizer.step()
            tokens = int((batch.labels != -100).sum())
            total += float(loss.detach()) * tokens
            count += tokens
        dev = evaluate_nmt(run, data.dev)
        improved = dev["loss"] < state["best"]
        if improved:
            state["best"], state["bad"] = dev["loss"], 0
            save_model(out, net)
        else:
            state["bad"] += 1
        state["seconds"] += time.perf_counter() - start
        state["epoch"] = epoch
        state["history"].append({"epoch": epoch, "train_loss": total / max(count, 1), "dev": dev})
        status(f"epoch {epoch}: train loss {total / max(count, 1):.4f} (smoothed), dev loss {dev['loss']:.4f}"
               f"{' *' if improved else ''}")
        save_epoch(out, net, optimizer, state, config_hash)

    load_state_into(net, out / WEIGHTS)
    net.eval()
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
    atomic_write_json(out / METRICS, metrics)
    shutil.rmtree(out / "checkpoint", ignore_errors=True)  # the run is complete: no resume needed
    status(f"[green]done[/]: dev loss {metrics['dev']['loss']:.4f}"
           + (f", {bleu_split} BLEU {metrics[f'{bleu_split}_bleu']:.2f}" if bleu_split else ""))
    return run


def load_nmt_run(path: str | Path, device: str | None = "auto", data_dir: str | Path | None = None) -> Run:
    """Load a run directory written by :func:`train_nmt` (safetensors + JSON only)."""
    from attnaudit.data.alignment import Seq2SeqCollator, SubwordTokenizer
    from attnaudit.errors import InputError
    from attnaudit.run import TaskSpec
    from attnaudit.seed import resolve_device
    from attnaudit.training.checkpoint import WEIGHTS, load_state_into, read_config

    path = Path(path)
    raw = read_config(path)
    try:
        config = ModelConfig.from_dict(raw["model"])
        task = TaskSpec(**raw["task"])
    except TypeError as exc:
        raise InputError(path / "config.json", f"malformed NMT run config: {exc}") from None
    source, target = SubwordTokenizer.load(path / SOURCE_BPE), SubwordTokenizer.load(path / TARGET_BPE)
    for name, tokenizer, size in ((SOURCE_BPE, source, config.vocab_size), (TARGET_BPE, target, config.num_labels)):
        if len(tokenizer) != size:
            raise InputError(path / name, f"BPE vocabulary has {len(tokenizer)} entries but the model expects {size}")
    model = Seq2SeqTransformer(config)
    load_state_into(model, path / WEIGHTS)
    dev = resolve_device(device)
    model.to(dev).eval()
    if data_dir is not None:
        task.data_dir = str(data_dir)
    collate = Seq2SeqCollator(source, target, max_len=config.max_len)
    return Run(model=model, collate=collate, task=task, path=path, device=dev, info=raw)
