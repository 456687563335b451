"""``context``: is attention a faithful context tracer? (``attnaudit run context``)

Each instance is a context of sentences and a question (bAbI tasks 1–3: the story so far and its question),
rendered as one user message with the tokenizer's own chat template (:func:`~attnaudit.experiments.common.chat.chat_prompt`)::

    Context:
    Mary moved to the bathroom.
    John went to the hallway.

    Question: Where is Mary?
    Answer with one word.

The model generates its answer greedily (at most ``generate`` tokens, up to end of sequence or a line break); the answer is correct
when the gold answer is one of its words. Each context sentence is then scored for that answer ``a`` (its tokens
teacher-forced, ``log p(a | prompt)`` summed over them) by

* ``attention``: the answer tokens' attention to the sentence's tokens (summed over the sentence, averaged over the
  answer tokens, every head and every layer);
* ``attention_top_heads``: the same averaged over the ``heads`` (layer, head) pairs only whose answer-token attention
  puts the most mass on the whole context, chosen per prompt from the attention alone, never from the labels
  (AttnTrace, Wang et al. 2025, reads a top-K of heads);
* ``input_x_gradient``: ``Σ_d e · ∂ log p(a) / ∂e`` summed over the sentence's tokens (signed);
* ``loo``: leave one sentence out: ``log p(a | prompt) − log p(a | the prompt rendered without it)``;
* ``contextcite`` (Cohen-Wang et al. 2024): a Lasso (``alpha``) fit of ``log p(a)`` on ``ablations`` random
  ablations (each sentence kept with probability 1/2, seeded by the seed and the instance's position); its weights.

The ablated prompts (each rendered anew without its sentences) share their first tokens with the full prompt: each
continues the full pass's keys and values from where it differs and is run in batched logits-only passes read at
the rows that predict the answer's tokens (:func:`ablated_logprobs`, equal to one teacher-forced pass per prompt to
float precision); the gradient's one pass gives ``log p(a | prompt)`` itself.

The sentences are the features: ``Batch.segments`` marks each token's sentence and
:func:`~attnaudit.explain.helpers.features.feature_groups` groups the tokens, as for every grouped explanation.
Against the ground truth each method gets the top-1 hit (its top sentence is a supporting fact), the recall at k
(k = the number of supporting facts) and Spearman's ρ with the measured leave-one-out effect (not for ``loo``
itself), and how often its top sentence is the first of the context (``first``: a position bias); ``chance`` is what
a random ranking scores on average. Summaries: means with seeded bootstrap 95 % CIs
over the prompts, on all prompts and on the correctly answered ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnaudit.algorithms.context_attribution import (
    ablation_masks,
    rank_correlation,
    ranking,
    recall_at_k,
    surrogate_weights,
    top1_hit,
    top_heads,
)
from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.chat import chat_prompt, has_chat_template
from attnaudit.experiments.eraser_metrics import describe
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, joined, register, where
from attnaudit.explain.generation import generate_tokens, pad_id
from attnaudit.explain.helpers.features import feature_groups
from attnaudit.models.interface import AttentionTrace, LanguageModel, evaluation, language_model
from attnaudit.progress import track
from attnaudit.run import Run

METHODS = ("attention", "attention_top_heads", "input_x_gradient", "loo", "contextcite")
"""The sentence scores, in the order the summary lists them."""
LIMITS = {"generate": 64, "ablations": 4096, "heads": 100_000}
"""Upper bounds of the options that size the work per prompt."""
INSTRUCTION = "Answer with one word."


@dataclass
class Story:
    """One instance: its sentences and question as written, the supporting facts' indices and the gold answer."""

    sentences: list[str]
    question: str
    supporting: list[int]
    answer: str


def story_of(example: Example) -> Story:
    """The context, question and supporting facts of a bAbI-style example (one-line errors where they are missing)."""
    supporting = example.meta.get("supporting")
    if not isinstance(supporting, list) or not supporting:
        raise AttnAuditError("the context test needs supporting facts (bAbI tasks: --task babi1, babi2 or babi3); these examples have none")
    written = example.meta.get("sentence_texts")
    sentences = [str(s) for s in written] if isinstance(written, list) else [" ".join(s) for s in example.sentences or []]
    if not sentences or not all(s.strip() for s in sentences):
        raise AttnAuditError("an example has an empty context (or an empty sentence); the context test needs sentences to score")
    if any(not 0 <= int(i) < len(sentences) for i in supporting):
        raise AttnAuditError("a supporting fact names no sentence of its context")
    question = str(example.meta.get("question") or " ".join(example.query or []))
    return Story(sentences, question.strip(), sorted({int(i) for i in supporting}), str(example.label or ""))


def user_message(sentences: list[str], question: str) -> tuple[str, list[tuple[int, int]]]:
    """The user's message and each sentence's character span in it (the layout in the module docstring)."""
    text, spans = "Context:\n", []
    for sentence in sentences:
        spans.append((len(text), len(text) + len(sentence)))
        text += sentence + "\n"
    return text + f"\nQuestion: {question}\n{INSTRUCTION}", spans


def render(model: LanguageModel, sentences: list[str], question: str) -> tuple[list[int], list[int]]:
    """The chat prompt's token ids and each token's sentence (-1: template, instruction or question). A token belongs
    to the sentence its last character lies in, the line break after a sentence counting as the sentence's."""
    user, spans = user_message(sentences, question)
    rendered = chat_prompt(model.tokenizer, user)
    base = rendered.index(user)
    encoded = model.tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    ends = [base + (spans[j + 1][0] if j + 1 < len(spans) else end + 1) for j, (_, end) in enumerate(spans)]
    segments = []
    for start, stop in encoded["offset_mapping"]:
        last = stop - 1
        owner = next((j for j, (s, _) in enumerate(spans) if stop > start and base + s <= last < ends[j]), -1)
        segments.append(owner)
    return list(encoded["input_ids"]), segments


def padded(model: LanguageModel, rows: list[list[int]], segments: list[list[int]] | None = None) -> Batch:
    """Right-padded rows of ids (and their segments, -1 at padding) on the model's input device."""
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad_id(model), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), True
    batch = Batch(tokens=tokens, mask=mask)
    if segments is not None:
        batch.segments = torch.full((len(rows), width), -1, dtype=torch.long)
        for i, row in enumerate(segments):
            batch.segments[i, : len(row)] = torch.tensor(row)
    return batch.to(model.input_device)


def answer_logprobs(model: LanguageModel, prompts: list[list[int]], answer: list[int]) -> np.ndarray:
    """``log p(answer | prompt)`` for each prompt: the answer teacher-forced, one pass per prompt
    (:meth:`~attnaudit.models.interface.LanguageModel.forced_distributions`). The reference of :func:`ablated_logprobs`."""
    out = np.zeros(len(prompts))
    targets = torch.tensor(answer)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            probs = model.forced_distributions(prompt, answer).double()
        out[i] = float(probs.gather(1, targets[:, None].to(probs.device)).clamp_min(1e-300).log().sum())
    return out


def shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    differs = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differs[0]) if differs.size else n


PASS_TOKENS = 512
"""About this many tokens (padding included) per batched pass of ablated prompts."""


def ablated_logprobs(model: LanguageModel, full: AttentionTrace | None, prompt: list[int], prompts: list[list[int]],
                     answer: list[int]) -> np.ndarray:
    """``log p(answer | p)`` for each ablated prompt ``p``, as :func:`answer_logprobs` but lean: ``full`` is the trace of
    ``prompt`` (and the answer) with its keys and values, and each ablated prompt reruns only its tokens after those it
    shares with ``prompt`` (under a causal mask their keys and values are the full pass's:
    :meth:`~attnaudit.models.interface.LanguageModel.prefix_from`), its answer teacher-forced and read at the rows that
    predict the answer's tokens (:meth:`~attnaudit.models.interface.LanguageModel.rows_logits`), in logits-only passes
    of about :data:`PASS_TOKENS` tokens, prompts of similar length together. Without ``full``, or for a model that
    cannot continue a key/value prefix, each prompt runs whole the same way."""
    device = model.input_device
    continues = full is not None and model.continues_prefix
    starts = [min(shared_length(p, prompt), len(p) - 1) if continues else 0 for p in prompts]
    rests = [p[start:] + answer[:-1] for p, start in zip(prompts, starts)]
    order = sorted(range(len(prompts)), key=lambda i: -len(rests[i]))
    out = np.zeros(len(prompts))
    with evaluation(model), torch.no_grad():
        while order:
            size = max(1, PASS_TOKENS // len(rests[order[0]]))
            part, order = order[:size], order[size:]
            cache = model.encode(padded(model, [rests[i] for i in part]))
            if full is not None and max(starts[i] for i in part):
                cache.extra["prefix"] = model.prefix_from(full, torch.zeros(len(part), dtype=torch.long, device=device),
                                                          torch.tensor([starts[i] for i in part], device=device))
            rows = torch.tensor([list(range(len(rests[i]) - len(answer), len(rests[i]))) for i in part], device=device)
            logits = model.rows_logits(cache, rows).double().log_softmax(-1)  # (part × answer tokens, vocabulary)
            targets = torch.tensor(answer * len(part), device=logits.device)
            out[part] = logits.gather(1, targets[:, None]).view(len(part), len(answer)).sum(1).cpu().numpy()
    return out


def per_sentence(values: Tensor, groups: Tensor, count: int) -> np.ndarray:
    """``values`` ``(..., P)`` summed over each group of ``groups`` ``(P,)`` (-1: none) into ``(..., count)``."""
    keep = groups >= 0
    out = values.new_zeros((*values.shape[:-1], count))
    out.index_add_(-1, groups[keep], values[..., keep])
    return out.detach().cpu().double().numpy()


def attention_scores(model: LanguageModel, prompt: list[int], answer: list[int], groups: Tensor, count: int,
                     heads: int) -> tuple[dict[str, np.ndarray], AttentionTrace]:
    """``attention`` and ``attention_top_heads`` per sentence: one pass over the prompt and the answer (its last token
    not read), the rows that predict the answer tokens; and that pass's trace (its keys and values: the prefix every
    ablated prompt continues, :func:`ablated_logprobs`)."""
    size = len(prompt)
    with evaluation(model), torch.no_grad():
        trace = model(padded(model, [prompt + answer[:-1]])).trace
    rows = torch.stack([layer.weights[0, :, size - 1 : size - 1 + len(answer), :size].float() for layer in trace])
    mass = per_sentence(rows.mean(2), groups.to(rows.device), count)  # (L, H, sentences)
    chosen = top_heads(mass.sum(-1), heads)
    return {"attention": mass.mean((0, 1)), "attention_top_heads": mass[chosen[:, 0], chosen[:, 1]].mean(0)}, trace


def gradient_scores(model: LanguageModel, prompt: list[int], answer: list[int], groups: Tensor, count: int) -> tuple[np.ndarray, float]:
    """``input_x_gradient`` per sentence: ``Σ_d e · ∂ log p(answer)/∂e`` of the prompt's tokens, summed per sentence; and
    ``log p(answer | prompt)`` itself. The answer's steps (the prompt and ``answer[:t]``) are prefixes of one sequence:
    one pass over it read at each step's row where the model allows
    (:meth:`~attnaudit.models.interface.AttentionModel.prefix_gradient_forward`), else a batch of the steps."""
    batch = padded(model, [prompt + answer[:t] for t in range(len(answer))])
    with evaluation(model), torch.enable_grad():
        shared = model.prefix_gradient_forward(batch)
        if shared is not None:
            embeddings, _, output = shared
        else:
            embeddings = model.embed(batch).detach().requires_grad_(True)
            output = model.logits_forward(batch, embeddings=embeddings)
        logits = output.logits.float()
        targets = torch.tensor(answer, device=logits.device)
        total = logits.log_softmax(-1).gather(1, targets[:, None]).sum()
        (grad,) = torch.autograd.grad(total, embeddings)
    tokens = (embeddings * grad).sum(-1)[:, : len(prompt)].sum(0)
    return per_sentence(tokens.detach(), groups.to(tokens.device), count), float(total.detach())


def answer_of(model: LanguageModel, generated: list[int]) -> list[int]:
    """The generated answer's tokens: up to end of sequence or the first line break (at least one token)."""
    eos = model.tokenizer.eos_token_id
    kept: list[int] = []
    for token in generated:
        if token == eos or (kept and "\n" in model.tokenizer.decode([token])):
            break
        kept.append(token)
    return kept or list(generated[:1])


def is_correct(text: str, gold: str) -> bool:
    """Whether the gold answer is one of the generated answer's words (case and punctuation ignored)."""
    return gold.lower() in re.findall(r"[a-z0-9]+", text.lower())


def sentence_groups(model: LanguageModel, prompt: list[int], segments: list[int], count: int) -> Tensor:
    """``(P,)`` each prompt token's sentence as :func:`feature_groups` numbers the groups of ``Batch.segments``."""
    groups = feature_groups(model, padded(model, [prompt], [segments]))[0]
    if int(groups.max()) + 1 != count:
        raise AttnAuditError("a context sentence has no token of its own in the rendered prompt")
    return groups.cpu()


def ablation_scores(model: LanguageModel, story: Story, prompt: list[int], answer: list[int], full: tuple[AttentionTrace, float],
                    options: Any, seed: int, index: int) -> dict[str, Any]:
    """Leave-one-out effects and ContextCite weights (masks seeded by (seed, index)) from ``full``: the full prompt's
    trace and ``log p(answer | prompt)`` (:func:`ablated_logprobs`)."""
    n = len(story.sentences)
    masks = ablation_masks(n, options.ablations, np.random.default_rng([seed, index]))
    kept = [*(~np.eye(n, dtype=bool)), *masks]
    prompts = [render(model, [s for s, k in zip(story.sentences, keep) if k], story.question)[0] for keep in kept]
    trace, whole = full
    logp = np.concatenate([[whole], ablated_logprobs(model, trace, prompt, prompts, answer)])
    weights = surrogate_weights(masks, logp[1 + n :], options.alpha, seed) if options.ablations else np.full(n, math.nan)
    return {"logp": float(logp[0]), "loo": logp[0] - logp[1 : 1 + n], "contextcite": weights}


def prompt_rows(model: LanguageModel, example: Example, index: int, options: Any, seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One prompt's row (answer, its correctness, each method's hits and correlation) and its sentences' scores."""
    story = story_of(example)
    n = len(story.sentences)
    prompt, segments = render(model, story.sentences, story.question)
    generated, _ = generate_tokens(model, prompt, options.generate, False, seed)
    answer = answer_of(model, generated)
    text = model.tokenizer.decode(answer)
    groups = sentence_groups(model, prompt, segments, n)
    scores, trace = attention_scores(model, prompt, answer, groups, n, options.heads)
    scores["input_x_gradient"], whole = gradient_scores(model, prompt, answer, groups, n)
    ablated = ablation_scores(model, story, prompt, answer, (trace, whole), options, seed, index)
    scores.update(loo=ablated["loo"], contextcite=ablated["contextcite"])
    k = len(story.supporting)
    row: dict[str, Any] = {
        "index": index, "source": example.meta.get("source", ""), "sentences": n, "supporting": ",".join(map(str, story.supporting)),
        "gold": story.answer, "answer": text.strip(), "correct": float(is_correct(text, story.answer)), "answer_tokens": len(answer),
        "prompt_tokens": len(prompt), "answer_logp": ablated["logp"], "chance_top1": k / n, "chance_recall": min(k, n) / n,
        "chance_first": 1 / n,
    }
    for method in METHODS:
        row[f"{method}_top"] = int(ranking(scores[method])[0])
        row[f"{method}_first"] = float(row[f"{method}_top"] == 0)
        row[f"{method}_top1"] = top1_hit(scores[method], story.supporting)
        row[f"{method}_recall"] = recall_at_k(scores[method], story.supporting)
        row[f"{method}_spearman"] = math.nan if method == "loo" else rank_correlation(scores[method], ablated["loo"])
    table = [{"index": index, "sentence": j, "text": story.sentences[j], "supporting": j in story.supporting,
              **{method: float(scores[method][j]) for method in METHODS}} for j in range(n)]
    return row, table


def summarise(rows: list[dict[str, Any]], seed: int, resamples: int) -> dict[str, Any]:
    """Accuracy, and per method and measure the mean with its bootstrap 95 % CI over all prompts and the correct ones."""
    summary: dict[str, Any] = {"prompts": len(rows), "correct_prompts": int(sum(r["correct"] for r in rows))}
    accuracy = describe([r["correct"] for r in rows], seed, resamples)
    summary["accuracy"], summary["accuracy_ci"] = accuracy["mean"], [accuracy["ci_low"], accuracy["ci_high"]]
    for subset in ("all", "correct"):
        chosen = [r for r in rows if subset == "all" or r["correct"]]
        for method in ("chance", *METHODS):
            for measure in ("top1", "recall", "spearman", "first"):
                column = f"{method}_{measure}"
                if not chosen or column not in chosen[0] or (method == "loo" and measure == "spearman"):
                    continue
                described = describe([r[column] for r in chosen], seed, resamples)
                summary[f"{column}_{subset}"] = described["mean"]
                summary[f"{column}_{subset}_ci"] = [described["ci_low"], described["ci_high"]]
    return summary


def _check(options: Any) -> None:
    for name, top in LIMITS.items():
        value = getattr(options, name)
        if not (name == "ablations" and value == 0) and not 1 <= value <= top:
            lowest = 0 if name == "ablations" else 1
            raise AttnAuditError(f"--{name} must be between {lowest} and {top}, got {value}")
    if not (math.isfinite(options.alpha) and options.alpha > 0):
        raise AttnAuditError(f"--alpha must be a positive number, got {options.alpha}")
    if options.resamples < 1:
        raise AttnAuditError(f"--resamples must be at least 1, got {options.resamples}")


@register
class ContextTracing(Experiment):
    """Attention, gradients, leave-one-out and ContextCite as tracers of an answer's supporting sentences (see the module docstring)."""

    name = "context"
    description = "Is attention a faithful context tracer? Sentence scores against bAbI's supporting facts and the measured ablation effect"
    paper = "AttnTrace (Wang et al. 2025); ContextCite (Cohen-Wang et al. 2024); bAbI (Weston et al. 2015)"
    needs_prediction = False
    shardable = True
    examples = ("--hf smollm2 --task babi1 --data-dir ../shared/data --limit 1 --generate 2 --ablations 2 --resamples 20 --out context/smollm2",)
    settings = AuditSettings(rank=62, options={"ablations": 16}, demo={"quick": {"ablations": 4, "resamples": 100}})

    @dataclass
    class Options:
        generate: int = field(default=8, metadata={"help": "Tokens generated (greedy) for the answer; it ends at end of sequence or a line break."})
        ablations: int = field(default=32, metadata={"help": "ContextCite: random sentence ablations per prompt (0: no surrogate)."})
        alpha: float = field(default=0.01, metadata={"help": "ContextCite: the Lasso's L1 penalty."})
        heads: int = field(default=8, metadata={
            "help": "attention_top_heads: the (layer, head) pairs read, those with the most answer attention on the context."
        })
        resamples: int = field(default=1000, metadata={"help": "Bootstrap resamples of the 95% CIs."})

    def applies(self, run: Run) -> str | None:
        model = run.model
        if not isinstance(model, LanguageModel) or model.kind != "decoder":
            return "the context test needs a Hugging Face causal language model (it generates the answer)"
        if model.config.extra.get("output") not in ("next_token", "verbalizer"):
            return "this model does not generate text (a classifier with a trained head)"
        if "babi" not in str(getattr(run.task, "spec", "")).lower():
            return "the context test needs supporting facts as ground truth: a bAbI task (--task babi1, babi2 or babi3)"
        if not has_chat_template(model.tokenizer):
            return "this model's tokenizer has no chat template (the prompts are rendered as chats); use an instruction-tuned model"
        return None

    def plan(self, run: Run, examples: list[Example], options: Any) -> list[int]:
        return list(range(len(examples)))

    def part(self, run: Run, examples: list[Example], options: Any, seed: int = 0, indices: Sequence[int] | None = None) -> Result:
        _check(options)
        model = language_model(run.model, "the context test")
        positions = list(where(examples, indices))
        with model.unverbalized(), model.next_token_decision():
            for example in examples:  # every refusal (no supporting facts, empty context, too long) before any work
                story = story_of(example)
                size = len(render(model, story.sentences, story.question)[0])
                if size + options.generate > model.config.max_len:
                    raise AttnAuditError(f"a prompt has {size} tokens; with --generate {options.generate} that is more than the "
                                         f"{model.config.max_len} this model reads")
            rows, tables = [], []
            for position, example in track(list(zip(positions, examples)), "context", total=len(examples)):
                row, table = prompt_rows(model, example, position, options, seed)
                rows.append(row)
                tables += table
        return Result(test=self.name, instances=rows, tables={"sentences": tables}, meta={"prompts": len(rows)})

    def merge(self, run: Run, parts: list[Result], options: Any, seed: int = 0) -> Result:
        rows = joined(parts)
        notes = [
            f"{len(rows)} prompts rendered with the tokenizer's chat template; the answer generated greedily (at most {options.generate} tokens)",
            "top1: the method's top sentence is a supporting fact; recall: supporting facts among its top k (k = their number); "
            "spearman: rank correlation with the leave-one-out effect on log p(answer); first: the top sentence is the context's first; "
            "chance: a random ranking's expectation",
            f"attention_top_heads reads the {options.heads} heads with the most answer attention on the context (chosen per prompt, no labels); "
            f"contextcite: Lasso (alpha {options.alpha}) on {options.ablations} seeded random ablations",
        ]
        return Result(test=self.name, summary=summarise(rows, seed, options.resamples), instances=rows,
                      tables={"sentences": joined(parts, "sentences")}, meta={"notes": notes})

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot, save_figure

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.2))
        names = ["chance", *METHODS]
        for offset, subset in ((-0.2, "all"), (0.2, "correct")):
            means = [result.summary.get(f"{m}_top1_{subset}", math.nan) for m in names]
            cis = [result.summary.get(f"{m}_top1_{subset}_ci", [math.nan, math.nan]) for m in names]
            errors = np.abs(np.array([[mean - ci[0], ci[1] - mean] for mean, ci in zip(means, cis)]).T)
            ax.bar(np.arange(len(names)) + offset, means, width=0.4, yerr=errors, capsize=2, label=f"{subset} prompts")
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
        ax.set_ylabel("top-1 hit rate (supporting fact)")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8)
        fig.tight_layout()
        return save_figure(fig, directory, "context_top1")
