"""``generation``: the attention tests asked of every generated token (``attnaudit run generation``).

For each prompt the model generates ``generate`` tokens (greedy; or the prompt file's forced ``target``)
and each step ``t`` — the decision that made token ``y_t`` — is one instance of the tests below, run
through the one model interface as in :mod:`attnaudit.explain.generation` (a decoder: the rows
``prompt + y_<t``; an encoder-decoder: the source with ``[start] + y_<t`` forced on its decoder):

* **permutation** (Jain & Wallace 2019): the generating position's attention row is permuted over its
  real keys in every layer (decoders; the cross-attention layers of an encoder-decoder), ``permutations``
  times with a seeded generator: the median total-variation change of the next-token distribution and
  the share of permutations that change the predicted token;
* **erasure** (Serrano & Smith 2019): at the explained layer the item the generating position attends to
  most (heads averaged) is zeroed and the row renormalised, against a random other item: the
  distribution's change and whether the token changes, top against random;
  **Erase until the token changes** (Serrano & Smith's decision flip): the generating row's items erased
  one more at a time, most attended first or in a seeded random order, until the predicted token
  changes: the share of the items erased then (over the steps where it changes) and the share of
  steps where it never changes with one item left;
* **adversarial attention** (Jain & Wallace 2019, §4.2.2): ``adversaries`` distributions for the
  generating row at the explained layer, searched as far (JSD) from it as possible while the next-token
  distribution moves at most ``epsilon`` (TVD; 0.05, J&W's bound for their pair tasks, as a vocabulary
  is far larger than their two classes), ``adversary_steps`` Adam steps from seeded starts: the largest
  JSD among those within ``epsilon`` (NaN when none is) and how many are;
* **normaliser swap** (Drozdyuk et al.): every attention layer computed with another normaliser
  (``sparsemax``, ``entmax15``): the change and whether the token changes;
* **ERASER** (DeYoung et al. 2020): each method's top ``top_percent`` % of the step's items (prompt and
  earlier generated tokens; an encoder-decoder's source tokens; special tokens never) removed
  (comprehensiveness ``p(y_t) − p(y_t | without them)``) or kept alone (sufficiency).

A decoder's items are every token of the prompt and the earlier generated tokens; with ``--chat`` they are, as
for ``attnaudit explain --generate``, the prompt's items (``--items user``, the default: the user's text only;
``--items all``: the system prompt and the template's tokens too) and the earlier generated tokens
(:func:`attnaudit.explain.generation.chat_steps`). Erasures and ERASER choose among the items (the other positions
stay); permutation, adversaries and the normaliser swap act on the whole attention row, as the audit's tests do.

A step's predicted token is compared with the unperturbed model's most probable one, which is ``y_t``
itself under greedy generation. Summaries are means over every step of every prompt with seeded
bootstrap 95 % CIs over steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.algorithms.metrics import tvd
from attnaudit.data.readers import read_prompts
from attnaudit.data.types import Batch, Example, text_of
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.attention_search import Search, max_valid_jsd, search_explained
from attnaudit.experiments.common.passes import Explained, prepare, take_rows
from attnaudit.experiments.eraser_metrics import describe, removable_items, top_count
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.explain import applying, item_mask
from attnaudit.explain.generation import forced_row, generate_tokens, id_rows, prompt_of, step_batches, target_ids
from attnaudit.models.hf import Rendered
from attnaudit.models.interface import Intervention, LanguageModel, evaluation, language_model
from attnaudit.models.normalisers import check_normaliser
from attnaudit.progress import track
from attnaudit.run import Run


def generating_rows(weights: Tensor, query_index: Tensor) -> Tensor:
    """``(B, H, K)``: each row's attention at its generating query (``query_index`` ``(B,)``)."""
    index = query_index.to(weights.device)[:, None, None, None].expand(-1, weights.shape[1], 1, weights.shape[3])
    return weights.gather(2, index).squeeze(2)


def replace_rows(weights: Tensor, query_index: Tensor, rows: Tensor) -> Tensor:
    """``weights`` with each row's generating query set to ``rows`` ``(B, H, K)``."""
    index = query_index.to(weights.device)[:, None, None, None].expand(-1, weights.shape[1], 1, weights.shape[3])
    return weights.scatter(2, index, rows[:, :, None, :].to(weights.dtype))


class Steps:
    """One prompt's steps on the model: the step batches, the unperturbed distributions, and passes under
    interventions at the generating position (``layers``: where they apply; ``query``: that position)."""

    def __init__(self, run: Run, source: list[int], target: list[int], every_layer: bool = False, rendered: Rendered | None = None) -> None:
        self.run, self.model = run, language_model(run.model, "generation")
        self.device = self.model.input_device
        self.source, self.target = source, target
        self.batches = [b.to(self.device) for b in step_batches(self.model, source, target, rendered=rendered)]
        self.seq2seq = self.model.kind == "encoder-decoder"
        with evaluation(self.model), torch.no_grad():
            outputs = [self.model(b) for b in self.batches]
        self.probs = torch.cat([o.probs.float() for o in outputs])
        self.tokens = self.probs.argmax(-1)
        self.explained_ids = torch.tensor(target, device=self.probs.device)
        generating = list(self.model.cross_layers) if self.seq2seq else list(range(self.model.num_attention_layers))
        layer = self.model.explained_layer % len(outputs[0].trace)
        self.explained_layer = layer if layer in generating else generating[-1]
        self.explained = [o.trace[self.explained_layer].weights for o in outputs]
        self.layers: list[int | None] = list(generating) if every_layer else [self.explained_layer]

    def query(self, batch: Batch, weights: Tensor) -> Tensor:
        """The generating query per row: a decoder's last real token, an encoder-decoder's last target position."""
        if self.seq2seq:
            return torch.full((weights.shape[0],), weights.shape[2] - 1, dtype=torch.long)
        return batch.mask.sum(1).long() - 1

    def run_with(self, make: Any) -> Tensor:
        """Next-token distributions ``(steps, V)`` with ``make(index, batch) -> interventions`` applied to each batch."""
        with evaluation(self.model), torch.no_grad():
            return torch.cat([self.model(b, make(i, b)).probs.float() for i, b in enumerate(self.batches)])

    def effect(self, probs: Tensor) -> tuple[Tensor, Tensor]:
        """``(TVD from the unperturbed distribution, token changed)`` per step."""
        return tvd(probs, self.probs), (probs.argmax(-1) != self.tokens).float()


def permuted(steps: Steps, generator: torch.Generator) -> Any:
    """Interventions permuting each row's generating attention over its real keys (one draw per layer call)."""

    def make(_index: int, batch: Batch) -> list[Intervention]:
        def permute(weights: Tensor, mask: Tensor) -> Tensor:
            query = steps.query(batch, weights)
            rows = generating_rows(weights, query)
            out = rows.clone()
            for b in range(rows.shape[0]):
                real = mask[b].bool().nonzero().flatten().cpu()
                order = real[torch.randperm(len(real), generator=generator)]
                out[b][:, real.to(out.device)] = rows[b][:, order.to(out.device)]
            return replace_rows(weights, query, out)

        return [Intervention(layer=layer, weights=permute) for layer in steps.layers]

    return make


def erased(steps: Steps, keys: list[Tensor]) -> Any:
    """Interventions zeroing key ``keys[batch index][row]`` of the generating row at the explained layer, renormalised."""

    def make(index: int, batch: Batch) -> list[Intervention]:
        chosen = keys[index]

        def erase(weights: Tensor, _mask: Tensor) -> Tensor:
            query = steps.query(batch, weights)
            rows = generating_rows(weights, query).clone()
            rows.scatter_(2, chosen.to(rows.device)[:, None, None].expand(-1, rows.shape[1], 1), 0.0)
            rows = rows / rows.sum(-1, keepdim=True).clamp_min(1e-12)
            return replace_rows(weights, query, rows)

        return [Intervention(layer=steps.explained_layer, weights=erase)]

    return make


def erasure_keys(steps: Steps, generator: torch.Generator) -> tuple[list[Tensor], list[Tensor]]:
    """Per batch, the most attended item of each row's generating query (heads averaged) and a random other one (a
    decoder's items: :func:`~attnaudit.explain.item_mask`, with ``--chat`` as ``--items`` says; an encoder-decoder's:
    its real source keys)."""
    tops, randoms = [], []
    for batch, weights in zip(steps.batches, steps.explained):
        rows = generating_rows(weights, steps.query(batch, weights)).mean(1)
        key_mask = item_mask(steps.model, batch).to(rows.device) if not steps.seq2seq else torch.ones_like(rows, dtype=torch.bool)
        top = rows.masked_fill(~key_mask, -1.0).argmax(-1)
        other = []
        for b in range(rows.shape[0]):
            real = [k for k in key_mask[b].nonzero().flatten().tolist() if k != int(top[b])]
            other.append(real[int(torch.randint(len(real), (1,), generator=generator))] if real else int(top[b]))
        tops.append(top)
        randoms.append(torch.tensor(other, device=top.device))
    return tops, randoms


DEFAULT_METHODS = "attention,input_gradient"
"""The methods ERASER scores by default; one that does not apply to the model is left out with a note."""
STEP_SEEDS = 100_000
"""A step's adversarial search starts from the generator seeded by (seed, prompt index × this + step)."""

VARIANTS = 256
"""Erased variants rerun together (bounds the memory of a vocabulary-sized output per variant)."""


def generating_query(explained: Explained) -> Tensor:
    """``(B,)`` the generating query row of each example in ``explained``'s weights: its last real query row."""
    rows = explained.query_rows.long()
    index = torch.arange(rows.shape[1], device=rows.device)
    return (index * rows).argmax(1)


def prepared(model: LanguageModel, batch: Batch, layer: int) -> Explained:
    """``batch`` ready for reruns that change ``layer``'s generating query row only: restarted at the first attention
    layer of ``layer``'s block (a decoder at its generating token alone; an encoder-decoder's cross-attention
    follows the block's self-attention) and with that row as the only query row changed."""
    first = model.block_first_layer(layer)
    explained = prepare(model, batch, sorted({first, layer}))
    if explained.positions is not None:
        return explained
    query = generating_query(explained)
    rows = torch.nn.functional.one_hot(query, explained.query_rows.shape[1]).bool() & explained.query_rows
    return replace(explained, query_rows=rows)


def erase_until_change(model: LanguageModel, batch: Batch, layer: int, order: str, generator: torch.Generator) -> Tensor:
    """Per row, the share of its real keys erased (``order``: most attended first, or ``random``) at ``layer``'s generating
    query before the predicted token changes; NaN when it never does with one key left (Serrano & Smith's erase until flip).

    Every count of erased keys of every row goes in reruns from ``layer``'s block (:func:`prepared`)."""
    explained = prepared(model, batch, layer)
    weights, keys = explained.reported, explained.key_mask
    if model.kind != "encoder-decoder":  # a decoder's items (with --chat, as --items says); its other keys are never erased
        keys = keys & item_mask(model, batch).to(keys.device)
    size, heads, q, k = weights.shape
    query = generating_query(explained)
    rows = generating_rows(weights, query)
    attended = rows.mean(1).masked_fill(~keys, -1.0)
    if order == "random":
        attended = torch.rand(attended.shape, generator=generator).to(attended.device).masked_fill(~keys, -1.0)
    ranked = attended.argsort(-1, descending=True)
    real = keys.sum(1)
    counts = torch.arange(1, k, device=weights.device)  # erase 1 .. K-1 keys (never all of them)
    which = torch.arange(size, device=weights.device).repeat_interleave(len(counts))
    erased = torch.arange(k, device=weights.device)[None, :] < counts.repeat(size)[:, None]  # (N*C, K) in ranked order
    drop = torch.zeros_like(erased).scatter(1, ranked[which], erased)
    variants = rows[which].masked_fill(drop[:, None, :], 0.0)
    variants = variants / variants.sum(-1, keepdim=True).clamp_min(1e-12)
    full = replace_rows(weights[which], query[which], variants)
    predicted = torch.cat([
        model.decode(take_rows(explained.cache, which[part], size), [Intervention(layer=layer, weights=full[part])]).probs.argmax(-1)
        for part in torch.arange(len(which), device=which.device).split(VARIANTS)
    ])
    changed = (predicted != explained.probs.argmax(-1)[which]).view(size, len(counts))
    changed &= counts[None, :] < real[:, None]
    first = torch.where(changed.any(1), changed.float().argmax(1) + 1, torch.zeros_like(real)).float()
    return torch.where(first > 0, first / real.float(), torch.full_like(first, math.nan))


def adversarial_steps(model: LanguageModel, batch: Batch, layer: int, search: Search, seed: int, indices: list[int]) -> tuple[Tensor, Tensor]:
    """Per row, the largest JSD from the generating attention among adversaries whose next-token distribution
    stays within ``search.report_epsilon`` (TVD; NaN when none does) and how many do."""
    outcome = search_explained(model, prepared(model, batch, layer), layer, search, seed, indices)
    return max_valid_jsd(outcome.jsd, outcome.change, search.report_epsilon)


def kept_rows(steps: Steps, keep: list[list[int]]) -> Tensor:
    """Distributions ``(steps, V)`` when step ``t`` keeps only the item positions ``keep[t]`` of its input."""
    model = steps.model
    with evaluation(model), torch.no_grad():
        if not steps.seq2seq:
            rows = [[(steps.source + steps.target)[p] for p in positions] for positions in keep]
            return model(id_rows(model, rows).to(steps.device)).probs.float()
        return torch.cat([
            model(forced_row(model, [steps.source[p] for p in positions], steps.target[:t]).to(steps.device)).probs.float()
            for t, positions in enumerate(keep)
        ])


def eraser(steps: Steps, scores: list[Tensor], percent: float) -> tuple[np.ndarray, np.ndarray]:
    """Comprehensiveness and sufficiency per step of one method's scores (one ``(B, K)`` tensor per batch)."""
    without, only = [], []
    for batch, values in zip(steps.batches, scores):
        allowed = removable_items(steps.model, batch)  # the real items without the tokenizer's special tokens
        for b in range(len(batch)):
            n = int(batch.mask[b].sum()) if not steps.seq2seq else len(steps.source)
            positions = list(range(n))
            removable = allowed[b, :n].nonzero().flatten().tolist()
            k = int(top_count(torch.tensor([len(removable)]), percent)[0])
            ranked = sorted(removable, key=lambda p: (-abs(float(values[b, p])), p))[:k]
            without.append([p for p in positions if p not in ranked])
            only.append([p for p in positions if p in ranked or p not in removable])
    token = steps.explained_ids[:, None]
    p = steps.probs.gather(1, token).squeeze(1)
    p_without = kept_rows(steps, without).gather(1, token).squeeze(1)
    p_only = kept_rows(steps, only).gather(1, token).squeeze(1)
    return (p - p_without).cpu().numpy(), (p - p_only).cpu().numpy()


@register
class GenerationTests(Experiment):
    """Permutation, erasure, adversarial attention, normaliser swap and ERASER at every generated token (see the module docstring)."""

    name = "generation"
    description = "The attention tests at every generated token: permutation, erasure, adversaries, normaliser swap, ERASER"
    # The prompts file ships with the repository (examples/prompts.jsonl); small sizes keep the example quick.
    paper = "Jain & Wallace 2019; Serrano & Smith 2019; Drozdyuk et al.; DeYoung et al. 2020 — asked of each generated token"
    needs_prediction = False
    examples = ("--hf smollm2 --prompts examples/prompts.jsonl --generate 2 --permutations 5 --adversary-steps 20 --out generation/smollm2",)
    own_inputs = "prompts"
    settings = AuditSettings(rank=60, options={"permutations": 10}, demo={"quick": {"permutations": 2, "generate": 2}})

    @dataclass
    class Options:
        prompts: str = field(default="", metadata={
            "help": "Prompts file: .jsonl with 'prompt' (and optional 'target'), or one prompt a line (default: the split's texts)."
        })
        generate: int = field(default=5, metadata={"help": "Tokens generated (greedy) after each prompt without a target."})
        permutations: int = field(default=20, metadata={"help": "Permutations of the generating attention per step."})
        layers: str = field(default="explained", metadata={
            "help": "Where permutation acts: 'explained' (the explained layer, as in the single-attention studies) or 'all'."
        })
        normalisers: str = field(
            default="sparsemax,entmax15", metadata={"help": "Normalisers swapped in for softmax (comma-separated; empty: none)."}
        )
        adversaries: int = field(default=3, metadata={"help": "Adversarial attention distributions searched per step (0: no search)."})
        adversary_steps: int = field(default=100, metadata={"help": "Adam steps of the adversarial search."})
        epsilon: float = field(default=0.05, metadata={
            "help": "Adversaries count when the next-token distribution moves at most this far (TVD)."
        })
        methods: str = field(default=DEFAULT_METHODS, metadata={"help": "Explanation methods scored by ERASER (comma-separated)."})
        top_percent: float = field(default=20.0, metadata={"help": "ERASER: the share of a step's items removed or kept (percent)."})
        resamples: int = field(default=1000, metadata={"help": "Bootstrap resamples of the 95% CIs."})

    def applies(self, run: Run) -> str | None:
        model = run.model
        if not isinstance(model, LanguageModel):
            return "generation needs a Hugging Face decoder or encoder-decoder"
        if model.kind == "encoder-decoder":
            return None
        if model.config.extra.get("output") not in ("next_token", "verbalizer"):  # zero-shot (--task): its LM generates
            return "this model does not generate text (an encoder, or a classifier with a trained head)"
        return None

    def inputs(self, run: Run, options: Any) -> list[Example] | None:
        return read_prompts(options.prompts) if options.prompts else None

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        _check(options)
        model = language_model(run.model, "generation")
        generator = torch.Generator().manual_seed(seed)
        rows: list[dict[str, Any]] = []
        names = [m.strip() for m in options.methods.split(",") if m.strip()]
        decision = model.forced_decision if model.kind == "encoder-decoder" else model.next_token_decision
        with model.unverbalized(), decision():  # a decoder loaded with --task generates from the task's texts
            methods, dropped = applying(names, model, "--methods", DEFAULT_METHODS.split(",")) if names else ({}, {})
            for index, example in track(list(enumerate(examples)), "generation", total=len(examples)):
                rows += self.prompt_rows(run, index, example, options, methods, generator, seed)
        notes = [f"{len(examples)} prompts, {len(rows)} generated tokens; each token is one instance",
                 *(f"{name} not scored: it does not apply to this model: {reason}" for name, reason in dropped.items())]
        return Result(test=self.name, summary=summarise(rows, options, seed), instances=rows, meta={"notes": notes})

    def prompt_rows(
        self, run: Run, index: int, example: Example, options: Any, methods: dict[str, Any], generator: torch.Generator, seed: int
    ) -> list[dict[str, Any]]:
        """Every test at every step of one prompt: one row per generated token."""
        model = language_model(run.model, "generation")
        text = text_of(example)
        source, rendered = prompt_of(model, text)  # with --chat, the user's message in the chat template
        forced = example.meta.get("target")
        target = target_ids(model, forced, "target") if forced else generate_tokens(model, source, options.generate, False, seed)[0]
        steps = Steps(run, source, target, every_layer=options.layers == "all", rendered=rendered)
        decode = model.tokenizer.decode
        columns: dict[str, Any] = {}
        perms = [steps.effect(steps.run_with(permuted(steps, generator))) for _ in range(options.permutations)]
        if perms:
            columns["permutation_median_tvd"] = torch.stack([p[0] for p in perms]).median(0).values
            columns["permutation_token_change"] = torch.stack([p[1] for p in perms]).mean(0)
        tops, randoms = erasure_keys(steps, generator)
        for name, keys in (("top", tops), ("random", randoms)):
            change, flip = steps.effect(steps.run_with(erased(steps, keys)))
            columns[f"erase_{name}_tvd"], columns[f"erase_{name}_token_change"] = change, flip
        for order in ("top", "random"):
            share = torch.cat([erase_until_change(model, batch, steps.explained_layer, order, generator) for batch in steps.batches])
            columns[f"erase_until_change_{order}"], columns[f"erase_never_changes_{order}"] = share, share.isnan().float()
        if options.adversaries:
            search = Search(adversaries=options.adversaries, steps=options.adversary_steps, epsilon=options.epsilon,
                            report_epsilon=options.epsilon)
            found = [adversarial_steps(model, batch, steps.explained_layer, search, seed,
                                       [index * STEP_SEEDS + t for t in range(offset, offset + len(batch))])
                     for batch, offset in zip(steps.batches, np.cumsum([0] + [len(b) for b in steps.batches]).tolist())]
            columns["adversary_max_jsd"] = torch.cat([f[0] for f in found])
            columns["adversaries_within_epsilon"] = torch.cat([f[1] for f in found]).float()
        for normaliser in _normalisers(options):
            change, flip = steps.effect(steps.run_with(lambda _i, _b, n=normaliser: [Intervention(normaliser=n)]))
            columns[f"{normaliser}_tvd"], columns[f"{normaliser}_token_change"] = change, flip
        for name, method in methods.items():
            scores = [method(run, batch, seed=seed).float() for batch in steps.batches]
            columns[f"comprehensiveness_{name}"], columns[f"sufficiency_{name}"] = eraser(steps, scores, options.top_percent)
        probs = steps.probs.gather(1, torch.tensor(target, device=steps.probs.device)[:, None]).squeeze(1)
        return [
            {"index": index, "step": t, "token": decode([token]), "probability": float(probs[t]),
             "greedy_token": bool(int(steps.tokens[t]) == token),
             **{k: float(v[t]) for k, v in columns.items()}}
            for t, token in enumerate(target)
        ]

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        rows = []
        for key, value in result.summary.items():
            if key.endswith("_ci") or not isinstance(value, float):
                continue
            low, high = result.summary.get(f"{key}_ci", [math.nan, math.nan])
            rows.append({"statistic": key, "value": f"{value:.3f} [{low:.3f}, {high:.3f}]", "published": "", "interpretation": _meaning(key, value)})
        return rows

    def plot(self, result: Result, directory: Path) -> list[Path]:
        return []

    def token_measures(self, result: Result) -> dict[str, str]:
        """The report's view of each prompt: its generated tokens shaded by their probability, the permutation,
        erasure, adversary and normaliser-swap changes and each method's ERASER scores."""
        columns = list(dict.fromkeys(key for row in result.instances for key in row))
        about = {
            "probability": "the model's probability of the generated token",
            "permutation_token_change": "share of the attention permutations that change the token",
            "erase_top_tvd": "change of the next-token distribution (TVD) when the most attended key is erased",
            "erase_random_tvd": "the same when a random other key is erased",
            "adversary_max_jsd": "largest JSD from the model's attention of an adversary within epsilon",
        }
        for column in columns:
            head, _, tail = column.partition("_")
            if head in ("comprehensiveness", "sufficiency"):
                about[column] = f"ERASER {head} of {tail}'s top items"
            elif tail == "tvd":  # <normaliser>_tvd
                about[column] = f"change of the next-token distribution (TVD) with {head} in place of softmax"
        return {column: about[column] for column in columns if column in about}


def _normalisers(options: Any) -> list[str]:
    return [check_normaliser(n.strip()) for n in options.normalisers.split(",") if n.strip()]


def _check(options: Any) -> None:
    if options.generate < 1 or options.permutations < 0 or options.resamples < 1 or options.adversaries < 0 or options.adversary_steps < 1:
        raise AttnAuditError("--generate, --adversary-steps and --resamples must be at least 1, --permutations and --adversaries non-negative")
    if options.generate > STEP_SEEDS:
        raise AttnAuditError(f"--generate must be at most {STEP_SEEDS}")
    if not 0 < options.epsilon < 1:
        raise AttnAuditError(f"--epsilon must be between 0 and 1, got {options.epsilon}")
    if options.layers not in ("explained", "all"):
        raise AttnAuditError(f"--layers must be 'explained' or 'all', got {options.layers!r}")
    if not 0 < options.top_percent < 100:
        raise AttnAuditError(f"--top-percent must be between 0 and 100, got {options.top_percent}")
    _normalisers(options)


def summarise(rows: list[dict[str, Any]], options: Any, seed: int) -> dict[str, Any]:
    """Mean and bootstrap 95 % CI over every generated token of each per-step measure; top against random erasure."""
    summary: dict[str, Any] = {"tokens": len(rows), "prompts": len({r["index"] for r in rows})}
    skip = {"index", "step", "token", "greedy_token"}
    columns = {key: [r[key] for r in rows] for key in (rows[0] if rows else {}) if key not in skip}
    if rows:
        columns["erase_top_beats_random"] = [float(r["erase_top_tvd"] > r["erase_random_tvd"]) for r in rows]
    for key, values in columns.items():
        described = describe(values, seed, options.resamples)
        summary[key], summary[f"{key}_ci"] = described["mean"], [described["ci_low"], described["ci_high"]]
    return summary


def _meaning(key: str, mean: float) -> str:
    """A short reading of one summary measure (its mean over generated tokens)."""
    if key == "permutation_token_change":
        return f"permuting the generating attention changes the token in {mean:.0%} of permutations"
    if key == "adversary_max_jsd":
        return f"attention this far (JSD, ln 2 at most) from the model's gives (nearly) the same next token at {mean:.2f} on average"
    if key.startswith("erase_until_change_"):
        return f"{mean:.0%} of the keys erased before the token changes (where it does)"
    if key.startswith("erase_never_changes_"):
        return f"the token never changes at {mean:.0%} of steps"
    if key == "erase_top_beats_random":
        return f"erasing the most attended key moves the distribution more than a random key at {mean:.0%} of tokens"
    if key.endswith("_token_change"):
        return f"the token changes at {mean:.0%} of steps"
    if key.startswith("comprehensiveness_"):
        return "higher: the method's top items matter more to the token"
    if key.startswith("sufficiency_"):
        return "lower: the method's top items alone keep the token"
    return ""
