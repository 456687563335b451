"""ROAR and Recursive ROAR (Hooker et al. 2019; Madsen et al. 2022): remove the allegedly important
items, retrain, and see how much the score drops compared with removing random items.

Erasure on the unchanged model mixes faithfulness with distribution shift: an input with tokens
erased is out of distribution. ROAR retrains on inputs masked alike, so the retrained model is
scored in distribution. For each explanation method, masking ratio ``k`` (percent) and seed:

* the top ``floor(k/100 · n)`` items of every instance (``n`` its items: tokens; a pair/QA model's
  passage tokens; HAN's sentences, all of whose words are masked) are replaced by the vocabulary's
  mask token in train, dev **and** test; ties in the scores go to the earlier item. ``floor`` is
  Madsen et al.'s ``quantile`` strategy (``int(k/100 · n)``), computed here in exact integers;
* the model is retrained from scratch with the base run's own config and that seed (a checkpointed
  sub-run ``subruns/roar/seed-<s>/<method>/ratio-<k>``: a killed run resumes, a finished one is
  loaded), its epoch chosen on the masked dev split, and scored on the masked test split.

Non-recursive (Hooker et al.): the scores are the seed's 0 % model's on the unmasked data.
``--recursive`` (Madsen et al.): the scores at ``k`` are those of the model retrained at the previous
ratio (``k − 10`` with the default ratios; the 0 % model first), computed on that ratio's masked
data, with the items masked there kept masked. The ``random`` baseline draws its scores once per
seed (it has no model to recompute them with: the same curve either way, as in the authors' code).
The 0 % point is the seed's model on the unmasked data (the base run for its own seed, a retrained
one for the others), the 100 % point a model retrained with every item masked; both are shared by
every method's curve. Per method and seed, RACU (:mod:`attnaudit.algorithms.racu`) is the relative
area between the random curve and the method's; the summary is its mean over seeds with a seeded
bootstrap 95 % interval, in percent as Madsen et al. report it.

Each method explains the instance's predicted class, or its gold label with ``--explain gold`` (Madsen et al.'s
choice); ``--method-options METHOD.OPTION=VALUE`` sets a method's options (``gradient.attention=live``: the plain
input × gradient). A method so defined has a curve folder of its own (:func:`curve_name`), its options and class in
its sub-runs' keys; a method with its defaults keeps its plain name and keys.

The items a sub-run masked are kept beside it (``ratio-<k>.masks.json``), so a resumed run
rebuilds the masked data without recomputing the explanations.

A Hugging Face run made by ``attnaudit finetune`` is retrained by fine-tuning its source again with the
settings it recorded (:func:`~attnaudit.training.finetune.finetune`, the sub-run's key in its settings hash); its
items are the example's words (a word's pieces' scores summed), masked by the tokenizer's mask token in the text
as written.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from attnaudit.algorithms.racu import mean_interval, racu
from attnaudit.bounds import check_method_options, check_time, ig_steps
from attnaudit.cluster import check_engine, map_tasks, ray_session
from attnaudit.data.batching import split_sentences
from attnaudit.data.types import Example, TaskData, word_spans
from attnaudit.data.vocab import UNK
from attnaudit.errors import AttnAuditError, error_line, warn
from attnaudit.experiments.common.rows import batch_labels
from attnaudit.experiments.common.units import hf_word_ids
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.explain.registry import CHOICES, EXPLANATIONS, Explanation, applying, choice, hierarchical, item_mask
from attnaudit.io import atomic_write_json, digest, read_json, read_json_object
from attnaudit.models.interface import AttentionModel, evaluation, language_model
from attnaudit.plotting import save_figure
from attnaudit.progress import status
from attnaudit.run import Run
from attnaudit.training.adversary import (
    SubRun,
    Variant,
    base_scores,
    base_seed,
    finished_variant,
    stored_subruns,
    subrun_dir,
    subrun_root,
    train_standard,
    train_variant,
    trainable_reason,
    variant_config,
)
from attnaudit.training.finetune import finetune
from attnaudit.training.together import Job, family_reason, together_reason, train_together
from attnaudit.training.trainer import MASK, METRICS, score_key

if TYPE_CHECKING:
    from attnaudit.data.batching import Collator

DEFAULT_METHODS = ("attention", "gradient", "input_gradient", "ig", "loo")
"""The measured methods by default (those that apply); ``random`` is always trained as the baseline."""
BASELINE = "random"
MASK_TOKENS = (MASK, "<mask>")
"""A vocabulary special taken as the mask token when the vocabulary has one; else ``<unk>``."""
SPLITS = ("train", "dev", "test")
EXPLAIN_BATCH = 32
EXPLAINED = ("predicted", "gold")
"""The class the explanations explain (option ``explain``): each instance's predicted one, or its gold label."""
Masks = dict[str, list[list[int]]]
"""Per split, per instance: the items masked (positions, ascending)."""


# --------------------------------------------------------------------------- masking (pure)


def masked_count(ratio: int, n: int) -> int:
    """``floor(ratio/100 · n)`` in exact arithmetic: the items masked at ``ratio`` percent of ``n``."""
    return math.floor(Fraction(ratio, 100) * n)


def top_items(scores: np.ndarray, count: int, keep: Sequence[int] = ()) -> list[int]:
    """The ``count`` highest-scoring positions of ``scores`` (ascending), ``keep`` first (items masked
    earlier stay masked), ties to the earlier position; NaN scores rank last."""
    ranked = np.nan_to_num(np.asarray(scores, dtype=float), nan=-np.inf)
    ranked[list(keep)] = np.inf
    order = np.argsort(-ranked, kind="stable")
    return sorted(int(i) for i in order[:count])


def item_groups(example: Example, sentences: bool) -> list[list[str]]:
    """The items of ``example`` as token lists: one token each, or HAN's sentences (as the collator splits them)."""
    if sentences:
        return [list(s) for s in (example.sentences or split_sentences(example.tokens)) if s]
    return [[t] for t in example.tokens]


def mask_example(example: Example, items: Sequence[int], token: str, sentences: bool = False) -> Example:
    """``example`` with every token of items ``items`` replaced by ``token`` (tokens, or HAN's sentences); the text as
    written (``meta["text"]``, what a subword tokenizer reads) gets ``token`` in place of each masked word."""
    chosen = set(items)
    groups = [[token] * len(g) if i in chosen else g for i, g in enumerate(item_groups(example, sentences))]
    tokens = [t for g in groups for t in g]
    masked_words = [w for w, t in enumerate(tokens) if t == token and example.tokens[w] != token]
    return replace(example, tokens=tokens, sentences=groups if sentences else example.sentences,
                   meta=_masked_meta(example, masked_words, token))


def masked_positions(example: Example, items: Sequence[int], sentences: bool = False) -> set[int]:
    """The token positions that masking ``items`` masks: the items themselves, or every word of HAN's sentences."""
    if not sentences:
        return set(items)
    chosen, start = set(items), 0
    out: set[int] = set()
    for i, group in enumerate(item_groups(example, True)):
        if i in chosen:
            out.update(range(start, start + len(group)))
        start += len(group)
    return out


def rationale_hit(examples: Sequence[Example], masks: Sequence[Sequence[int]], sentences: bool = False) -> float | None:
    """Of ``examples`` with a gold rationale (``Example.rationale``: bAbI's supporting facts, e-SNLI's highlights, a
    synthetic task's cue words), the share whose masked ``items`` take at least one of its tokens (None: none has one).
    A retrain cannot read what is masked: on bAbI, a story whose supporting fact lost its answer word is a guess."""
    shares = [bool(set(ex.rationale) & masked_positions(ex, m, sentences)) for ex, m in zip(examples, masks) if ex.rationale]
    return sum(shares) / len(shares) if shares else None


def _masked_meta(example: Example, words: Sequence[int], token: str) -> dict[str, Any]:
    """``example.meta`` with ``token`` in place of ``words`` in its written text (the text dropped, so that the
    masked words are read, where the words cannot be found in it)."""
    if not isinstance(example.meta.get("text"), str) or not words:
        return example.meta
    meta, spans = dict(example.meta), word_spans(example)
    if spans is None:
        meta.pop("text")
        return meta
    text, parts, last = meta["text"], [], 0
    for w in sorted(words):
        start, end = spans[w]
        parts += [text[last:start], token]
        last = end
    meta["text"] = "".join(parts) + text[last:]
    return meta


def masked_data(data: TaskData, masks: Masks, token: str, sentences: bool) -> TaskData:
    """``data`` with each split's instances masked at the items ``masks`` names."""
    def split(name: str) -> list[Example]:
        return [mask_example(ex, m, token, sentences) for ex, m in zip(data.split(name), masks[name])]

    return replace(data, train=split("train"), dev=split("dev"), test=split("test"))


# --------------------------------------------------------------------------- scores, sub-runs


def finetuned(run: Run) -> dict[str, Any] | None:
    """The ``attnaudit finetune`` settings of a Hugging Face run (None: not a Hugging Face run, or not fine-tuned here)."""
    settings = run.info.get("finetune") if run.info.get("kind") == "hf" else None
    return settings if isinstance(settings, dict) else None


def base_seed_of(run: Run) -> int:
    """The seed the base run was trained (or fine-tuned) with."""
    settings = finetuned(run)
    return int(settings.get("seed", 0)) if settings is not None else base_seed(run)


def run_hash(run: Run) -> str:
    """The config hash of a run: a native run's, or the settings hash of a fine-tuned one."""
    settings = finetuned(run)
    return str(settings.get("hash", "")) if settings is not None else str(run.info.get("hash", ""))


def retrain_reason(run: Run) -> str | None:
    """Why ``run`` cannot be retrained on masked data (None when it can): native runs from their training config,
    Hugging Face runs by fine-tuning their source again with the settings ``attnaudit finetune`` recorded."""
    if run.info.get("kind") != "hf":
        return trainable_reason(run)
    if finetuned(run) is None:
        return ("ROAR retrains the model on masked data, and this Hugging Face model was not fine-tuned by `attnaudit finetune` "
                "(a pretrained or zero-shot model has no training to repeat): fine-tune it with `attnaudit finetune` and test that run")
    return None


def mask_token(run: Run) -> str:
    """The token masked items become: a Hugging Face tokenizer's mask token (else its unknown token); a native
    vocabulary's mask special, else ``<unk>``."""
    if run.info.get("kind") == "hf":
        tokenizer = language_model(run.model, "ROAR's mask token").tokenizer
        return str(tokenizer.mask_token or tokenizer.unk_token)
    vocab = cast("Collator", run.collate).vocab
    return next((t for t in MASK_TOKENS if t in vocab.specials), UNK)


def item_scores(
    run: Run, model: AttentionModel, examples: list[Example], method: Explanation, seed: int,
    settings: dict[str, Any] | None = None, gold: bool = False,
) -> list[np.ndarray]:
    """``method``'s scores (with its ``settings``) of each instance's items by ``model`` (eval mode), batches in
    order, explaining each instance's gold label with ``gold`` (else its prediction); the random baseline's draws are
    seeded per batch (``seed``, batch number). A Hugging Face model's items are the example's words: the scores of a
    word's pieces summed (NaN, ranked last, for a word it never read)."""
    source = replace(run, model=model)
    out: list[np.ndarray] = []
    unaligned = 0
    with evaluation(model):
        for number, batch in enumerate(source.batches(examples, EXPLAIN_BATCH)):
            if gold:
                batch = replace(batch, explained=batch_labels(batch))
            scores = method(source, batch, seed=seed * 1_000_003 + number, **(settings or {})).float().cpu().numpy()
            counts = item_mask(model, batch).sum(1).tolist()
            for row, n in enumerate(counts):
                if run.info.get("kind") != "hf":
                    out.append(scores[row][:n])
                    continue
                words = _word_scores(source, batch.examples[row], batch.tokens[row, :n].tolist(), scores[row][:n])
                unaligned += words is None
                out.append(np.full(len(batch.examples[row].tokens), np.nan) if words is None else words)
    if unaligned:
        warn(f"roar: {unaligned} of {len(examples)} instances' pieces could not be aligned with their words; their words are masked in order")
    return out


def _word_scores(run: Run, example: Example, ids: list[int], scores: np.ndarray) -> np.ndarray | None:
    """Per word of ``example``: the sum of its pieces' ``scores`` (NaN where it has none); None when unaligned."""
    word_of = hf_word_ids(run, example, ids)
    if word_of is None:
        return None
    out = np.zeros(len(example.tokens))
    keep = word_of >= 0
    np.add.at(out, word_of[keep], scores[keep])
    read = np.zeros(len(example.tokens), dtype=bool)
    read[word_of[keep]] = True
    return np.where(read, out, np.nan)


def chosen_items(scores: list[np.ndarray], ratio: int, before: list[list[int]] | None) -> list[list[int]]:
    """Each instance's masked items at ``ratio``: the top ``floor(ratio·n)`` of its scores, ``before`` kept."""
    keep = before or [[] for _ in scores]
    return [top_items(s, masked_count(ratio, len(s)), k) for s, k in zip(scores, keep)]


def method_settings(entries: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--method-options`` (``METHOD.OPTION=VALUE`` each) as per-method settings, each value as its option takes it
    (a name of :data:`~attnaudit.explain.registry.CHOICES` as registered; a number as a number); a one-line error for
    a malformed entry, a method not measured, an option the method does not take (or ``seed``, the test's own) or a
    value it cannot take."""
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        head, equals, value = entry.partition("=")
        name, dot, option = head.partition(".")
        if not (equals and dot and name and option and value):
            raise AttnAuditError(f"--method-options: {entry!r} is not METHOD.OPTION=VALUE (e.g. ig.score=logit)")
        if name not in methods:
            raise AttnAuditError(f"--method-options: {name!r} is not among the methods measured ({', '.join(methods)})")
        taken = [o for o in EXPLANATIONS[name].options if o != "seed"]
        if option not in taken:
            raise AttnAuditError(f"--method-options: {name} takes {', '.join(taken) or 'no option'}, not {option!r}")
        default = inspect.signature(EXPLANATIONS[name].fn).parameters[option].default
        out.setdefault(name, {})[option] = _option_value(f"{name}.{option}", option, value, default)
    for name, given in out.items():  # resources bounded before any work, as the same options elsewhere
        check_method_options(given)
        if isinstance(given.get("steps"), int):
            if given["steps"] < 1:
                raise AttnAuditError(f"--method-options: {name}.steps must be at least 1, got {given['steps']}")
            ig_steps(given["steps"], option=f"--method-options {name}.steps")
    return out


def _option_value(label: str, option: str, value: str, default: Any) -> Any:
    """``value`` of ``option`` converted like its ``default`` (a name checked against its choices); one line otherwise."""
    if option in CHOICES:
        return choice(option, value)
    kind = type(default)
    try:
        if kind is bool:
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if default is None:  # an optional number (attention's layer, head): a whole number
            kind = int
        return kind(value) if kind in (int, float) else value
    except ValueError:
        raise AttnAuditError(f"--method-options: {label} takes a {kind.__name__}, got {value!r}") from None


def explains_class(method: Explanation) -> bool:
    """Whether ``method``'s scores depend on the class explained (``--explain gold`` changes them)."""
    return "prediction" in method.needs


def curve_name(method: Explanation, settings: dict[str, Any], gold: bool, recursive: bool) -> str:
    """The folder of ``method``'s curve per seed: its name, each option set (``-OPTION-VALUE``, sorted), ``-gold`` when
    it explains the gold label, ``-recursive``; a method run with its defaults keeps its plain name."""
    parts = [method.name, *(f"{k}-{v}" for k, v in sorted(settings.items()))]
    parts += ["gold"] if gold and explains_class(method) else []
    return "-".join(parts) + ("-recursive" if recursive else "")


@dataclass
class Zero:
    """A seed's 0 % model: the model, its test score, its name, its config hash, whether it was trained now."""

    model: AttentionModel
    score: float
    name: str
    hash: str
    trained: bool


@dataclass
class Step:
    """One retrained point of a curve: its ``ratio``, sub-run, masks, and the model its scores came from."""

    ratio: int
    sub: SubRun
    masks: Masks | None
    """None: a step known by its scores alone (restored), which no later step may need."""
    explained_by: str


@dataclass
class Request:
    """A retrain a curve asks for: ``seed``, curve ``name``, ``ratio``, its ``key``, and its masks (given) or how to
    compute them (``build()``, called only when none are stored)."""

    seed: int
    name: str
    ratio: int
    key: dict[str, Any]
    masks: Masks | None = None
    build: Callable[[], Masks] | None = None


@dataclass
class Prepared:
    """A request made ready: its folder, full key and masks; ``done`` the sub-run when it is finished."""

    request: Request
    out: Path
    key: dict[str, Any]
    masks: Masks | None
    done: SubRun | None

    @property
    def label(self) -> str:
        return f"seed-{self.request.seed}/{self.request.name}/ratio-{self.request.ratio}"


T = TypeVar("T")
Steps = Generator[Request, tuple[SubRun, "Masks | None"], T]
"""A walk through a curve's retrains: yields each :class:`Request`, is sent the sub-run and masks, returns its result."""


def drive(walk: Steps[T], retrain: Callable[[Request], tuple[SubRun, Masks | None]]) -> T:
    """Run ``walk`` to its end, each request answered by ``retrain`` (one at a time)."""
    try:
        request = next(walk)
        while True:
            request = walk.send(retrain(request))
    except StopIteration as end:
        return cast(T, end.value)


class Roarer:
    """The sub-runs of one ROAR test on ``run`` (see the module docstring)."""

    def __init__(self, run: Run, options: Any, metric: str) -> None:
        self.run, self.options, self.metric = run, options, metric
        self.data = run.data()
        self.token = mask_token(run)
        self.sentences = hierarchical(run.model)
        self.finetuned = finetuned(run)
        self.gold = choice_of_class(options.explain) == "gold"
        self.settings = method_settings(options.method_options, [*options.methods, BASELINE])

    def folder(self, seed: int, name: str) -> str:
        return f"seed-{seed}/{name}"

    def zero(self, seed: int) -> Zero:
        """The seed's 0 % model: the base run, or the base retrained with ``seed``."""
        if seed == base_seed_of(self.run):
            score = float(base_scores(self.run)["test"][self.metric])
            return Zero(self.run.model, score, "base", run_hash(self.run), False)
        status(f"roar: seed {seed}, 0 % model")
        out = subrun_dir(self.run, "roar", self.folder(seed, "unmasked"))
        if self.finetuned is not None:
            sub = self._finetune(out, self.data, seed, {"kind": "roar", "unmasked": True, "seed": seed})
        else:
            sub = train_standard(self.run, out, seed=seed, epochs=self.options.epochs)
        return Zero(sub.model, float(sub.metrics["test"][self.metric]), self.folder(seed, "unmasked"), sub.hash, sub.trained)

    def prepared(self, request: Request) -> Prepared:
        """Where ``request``'s sub-run goes and its masks (stored, given, or computed now by ``build()`` and stored
        beside it); with ``done`` when it is finished. A finished sub-run known by its scores alone (no weights: a
        curve restored from a ledger, ``benchmarks/reproduce_roar.py``) counts as finished, its masks None unless stored."""
        where = f"{self.folder(request.seed, request.name)}/ratio-{request.ratio}"
        out = subrun_dir(self.run, "roar", where)
        key = {"kind": "roar", "mask": self.token, **request.key}
        stamp = digest(key)
        masks = request.masks or self._stored_masks(out, stamp)
        scored = (None if self.finetuned is not None else
                  finished_variant(self.run, out, Variant(key=key), epochs=self.options.epochs, seed=request.seed))
        if scored is not None and (masks is not None or not scored.weights):  # finished: loaded once, not retrained
            status(f"roar: seed {request.seed}, {request.name} at {request.ratio} %" + ("" if scored.weights else " (scores only)"))
            return Prepared(request, out, key, masks, scored)
        if masks is None:
            assert request.build is not None, "a request without masks says how to compute them"
            masks = request.build()
            atomic_write_json(out.with_name(out.name + ".masks.json"), {"key": stamp, **masks})
        return Prepared(request, out, key, masks, None)

    def retrain(self, request: Request) -> tuple[SubRun, Masks | None]:
        """``request``'s sub-run (trained, or loaded when finished) and its masks."""
        ready = self.prepared(request)
        if ready.done is not None:
            return ready.done, ready.masks
        status(f"roar: seed {request.seed}, {request.name} at {request.ratio} %")
        data = self.masked(ready)
        if self.finetuned is not None:
            return self._finetune(ready.out, data, request.seed, ready.key), ready.masks
        sub = train_variant(self.run, ready.out, Variant(key=ready.key), epochs=self.options.epochs, seed=request.seed,
                            label=f"roar {ready.label}", data=data)
        return sub, ready.masks

    def masked(self, ready: Prepared) -> TaskData:
        assert ready.masks is not None
        return masked_data(self.data, ready.masks, self.token, self.sentences)

    def _finetune(self, out: Path, data: TaskData, seed: int, key: dict[str, Any]) -> SubRun:
        """A Hugging Face run's retrain: its source fine-tuned again on ``data`` with the recorded settings and
        ``seed`` (``--epochs`` overrides theirs); a finished one with the same settings and key is loaded."""
        settings = self.finetuned or {}
        before = (out / METRICS).stat().st_mtime_ns if (out / METRICS).exists() else None
        sub = finetune(
            data, out, hf=str(settings["source"]), epochs=self.options.epochs or int(settings["epochs"]), lr=float(settings["lr"]),
            batch_size=int(settings["batch_size"]), limit=settings.get("limit"), seed=seed, data_dir=self.run.task.data_dir,
            device=str(self.run.device), warmup=float(settings.get("warmup", 0.1)), weight_decay=float(settings.get("weight_decay", 0.01)),
            max_len=settings.get("max_len"), train_layers=settings.get("train_layers"), masking=bool(settings.get("masking")),
            variant=digest(key),
        )
        sub.info["hash"] = run_hash(sub)
        return SubRun(sub, read_json(out / METRICS), None, trained=before != (out / METRICS).stat().st_mtime_ns)

    def _stored_masks(self, out: Path, stamp: str) -> Masks | None:
        for place in stored_subruns(self.run, out):
            path = place.with_name(place.name + ".masks.json")
            if path.is_file():
                stored = read_json_object(path, optional={"key": str, **{s: list for s in SPLITS}})
                if stored.get("key") == stamp and all(s in stored for s in SPLITS):
                    return {s: stored[s] for s in SPLITS}
        return None

    def all_masked(self, seed: int) -> SubRun:
        """The 100 % model of ``seed``: every item masked."""
        return drive(self.all_masked_steps(seed), self.retrain)

    def all_masked_steps(self, seed: int) -> Steps[SubRun]:
        masks = {s: [list(range(len(item_groups(ex, self.sentences)))) for ex in self.data.split(s)] for s in SPLITS}
        sub, _ = yield Request(seed, "all", 100, {"method": "all", "ratio": 100, "seed": seed}, masks)
        return sub

    def curve(self, seed: int, method: Explanation, zero: Zero, recursive: bool) -> list[Step]:
        """The retrained steps of ``method`` at every ratio for ``seed``."""
        return drive(self.curve_steps(seed, method, zero, recursive), self.retrain)

    def curve_steps(self, seed: int, method: Explanation, zero: Zero, recursive: bool) -> Steps[list[Step]]:
        """:meth:`curve` as the retrains it asks for, ratio by ratio (each sent back trained); each one's key names
        the model its scores come from (its folder and config hash: a retrained source re-masks and retrains what follows)."""
        settings = self.settings.get(method.name, {})
        gold = self.gold and explains_class(method)
        name = curve_name(method, settings, gold, recursive)
        defined = {**({"options": settings} if settings else {}), **({"explain": "gold"} if gold else {})}  # defaults: keys as before
        steps: list[Step] = []
        cached: dict[str, list[np.ndarray]] = {}
        for ratio in self.options.ratios:
            previous = steps[-1] if recursive and steps else None
            source = f"{self.folder(seed, name)}/ratio-{previous.ratio}" if previous else zero.name
            chain = [s.ratio for s in steps] if recursive else []
            key = {"method": method.name, "ratio": ratio, "seed": seed, "recursive": recursive, "chain": chain, "source": source,
                   "source_hash": previous.sub.hash if previous else zero.hash, **defined}

            def build(previous: Step | None = previous, ratio: int = ratio) -> Masks:
                model = previous.sub.model if previous else zero.model  # a step without weights says so here
                before = previous.masks if previous else None
                if previous is not None and before is None:
                    raise AttnAuditError(f"roar: the next ratio needs the masks of {previous.sub.run.path}, which are missing: "
                                         "delete it to retrain it")
                data = masked_data(self.data, before, self.token, self.sentences) if before else self.data
                if before or not cached:  # the non-recursive scores are the 0 % model's, computed once
                    cached.update({s: item_scores(self.run, model, data.split(s), method, seed, settings, gold) for s in SPLITS})
                return {s: chosen_items(cached[s], ratio, before[s] if before else None) for s in SPLITS}

            sub, masks = yield Request(seed, name, ratio, key, None, build)
            steps.append(Step(ratio, sub, masks, source))
        return steps

    def in_lockstep(self, seeds: Sequence[int], methods: dict[str, Explanation]) -> None:
        """``--together``: train every sub-run of the test, each round's retrains (every seed's and method's next
        ratio, and the 100 % models with the first) as one stacked model (:func:`~attnaudit.training.together.
        train_together`); the test's own loop then loads them finished. The 0 % models train one at a time."""
        zeros = {s: self.zero(s) for s in seeds}
        walks: list[Steps[Any]] = [self.all_masked_steps(s) for s in seeds]
        walks += [self.curve_steps(s, m, zeros[s], self.options.recursive and n != BASELINE) for s in seeds for n, m in methods.items()]
        waiting = [(walk, self._advance(walk, None)) for walk in walks]
        while pending := [(walk, ready) for walk, ready in waiting if ready is not None]:
            status(f"roar: {len(pending)} retrains together ({', '.join(sorted({r.label for _, r in pending}))})")
            jobs = [Job(r.out, Variant(key=r.key), r.request.seed, self.masked(r), f"roar {r.label}") for _, r in pending]
            subs = train_together(self.run, jobs, epochs=self.options.epochs)
            waiting = [(walk, self._advance(walk, (sub, ready.masks))) for (walk, ready), sub in zip(pending, subs, strict=True)]

    def _advance(self, walk: Steps[Any], answer: tuple[SubRun, Masks | None] | None) -> Prepared | None:
        """Send ``answer`` into ``walk`` and go on while its requests are finished: its next retrain to train, or None."""
        while True:
            try:
                request = walk.send(answer)  # type: ignore[arg-type]  # None starts a walk
            except StopIteration:
                return None
            ready = self.prepared(request)
            if ready.done is None:
                return ready
            answer = (ready.done, ready.masks)


# --------------------------------------------------------------------------- the test


def choice_of_class(value: str) -> str:
    """``--explain`` checked: predicted or gold; one line otherwise."""
    if value not in EXPLAINED:
        raise AttnAuditError(f"--explain must be {' or '.join(EXPLAINED)}, got {value!r}")
    return value


def check_ratios(ratios: Sequence[int]) -> list[int]:
    """The masking ratios, sorted and distinct; a one-line error unless each is a percent strictly between 0 and 100."""
    bad = [r for r in ratios if not 0 < r < 100]
    if bad or not ratios:
        raise AttnAuditError(
            f"--ratios must be percents strictly between 0 and 100 (0 % and 100 % anchor every curve), got {', '.join(map(str, bad or ratios))}"
        )
    return sorted(set(ratios))


def check_together(run: Run, options: Any) -> None:
    """``--together`` applies: the local engine and a model whose retrains can be stacked (one line otherwise)."""
    if options.engine != "local":
        raise AttnAuditError("--together trains the retrains in this process: leave --engine at local")
    reason = family_reason(run)
    if reason is None:
        cfg, config, _ = variant_config(run, Variant({}), options.epochs, None)
        reason = together_reason(run, cfg, config, Variant({}))
    if reason is not None:
        raise AttnAuditError(f"--together: {reason}; train without it")


@register
class Roar(Experiment):
    """The test of this module (its docstring says what it measures)."""

    name = "roar"
    retrains = True
    settings = AuditSettings(
        rank=66,
        options={"methods": ["attention", "gradient"], "ratios": [50], "seeds": 1, "epochs": 1},
        demo={"full": {"methods": ["attention", "gradient"], "ratios": [30, 60], "epochs": 1},
              "quick": {"methods": ["attention"], "ratios": [50], "epochs": 1}},
    )
    description = (
        "ROAR / Recursive ROAR: mask each explanation's top k % items in train, dev and test, retrain, score; "
        "RACU against random masking per method with a bootstrap 95% interval over seeds"
    )
    paper = "Hooker et al. 2019 (ROAR); Madsen et al. 2022 (Recursive ROAR, RACU)"
    examples = (
        "runs/syn --methods attention,gradient --ratios 20,50,80 --epochs 1",
        "runs/syn --methods attention --ratios 30,60 --recursive --seeds 2 --epochs 1",
    )

    @dataclass
    class Options:
        methods: list[str] = field(
            default_factory=lambda: list(DEFAULT_METHODS),
            metadata={"help": "Explanations to retrain without their top items (`attnaudit explanations RUN`); default: "
                      "attention, gradient, input_gradient, ig, loo where they apply. random is always the baseline."},
        )
        ratios: list[int] = field(
            default_factory=lambda: list(range(10, 100, 10)),
            metadata={"help": "Masking ratios: percents strictly between 0 and 100 (0 % and 100 % are always added)."},
        )
        recursive: bool = field(
            default=False, metadata={"help": "Recursive ROAR (Madsen et al. 2022): each ratio's scores from the model retrained at the previous one."}
        )
        explain: str = field(
            default="predicted", metadata={"help": "The class the explanations explain: predicted (default) or gold, the label "
                                           "(Madsen et al. 2022's: masking what supports a wrong prediction would help the model)."}
        )
        method_options: list[str] = field(
            default_factory=list,
            metadata={"help": "Options of the methods, METHOD.OPTION=VALUE (e.g. ig.score=logit, gradient.attention=live, "
                      "input_gradient.reduction=l2); each method's options: `attnaudit explanations RUN`."},
        )
        seeds: int = field(default=1, metadata={"help": "Training seeds per point: the base run's seed, then the next ones."})
        epochs: int | None = field(default=None, metadata={"help": "Training epochs per retrain (default: the base run's)."})
        metric: str = field(
            default="", metadata={"help": "Test score of the curves: accuracy, macro_f1, roc_auc... (default: the task's headline one)."}
        )
        engine: str = field(
            default="local", metadata={"help": "local (this process) or ray: every seed's 0 % model, then every method's curve "
                                       "per seed and the 100 % models, as Ray tasks (the workers write into the run's folder: "
                                       "a local Ray or a shared disk)."}
        )
        workers: int | None = field(default=None, metadata={"help": "Ray workers for --engine ray (default: one per Ray CPU)."})
        address: str = field(default="", metadata={"help": "Ray cluster address for --engine ray (default: start a local Ray)."})
        together: bool = field(
            default=False, metadata={"help": "Train each round's retrains (every seed's and method's next ratio) as one stacked "
                                     "model in this process: the same sub-runs as one at a time, faster on a GPU (bilstm, cnn and "
                                     "average models of classification or pair tasks, without dropout or clipping)."}
        )

    @classmethod
    def explanation_choices(cls) -> list[str]:
        return list(EXPLANATIONS)

    def applies(self, run: Run) -> str | None:
        reason = retrain_reason(run)
        if reason is None and run.task.task_type == "tagging":
            return "ROAR masks the items an explanation ranks for one decision per instance; a tagger makes one per token"
        return reason

    def _check(self, run: Run, options: Any) -> tuple[list[int], dict[str, Explanation], dict[str, str], str]:
        ratios = check_ratios(options.ratios)
        if options.seeds < 1:
            raise AttnAuditError(f"--seeds must be at least 1, got {options.seeds}")
        if options.epochs is not None and options.epochs < 1:
            raise AttnAuditError(f"--epochs must be at least 1, got {options.epochs}")
        check_engine(options.engine, options.workers, options.address or None)
        if options.together:
            check_together(run, options)
        names = [m for m in options.methods if m != BASELINE]
        defaults = [m for m in DEFAULT_METHODS]
        chosen, dropped = applying(names, run, "--methods", defaults) if names else ({}, {})
        # the baseline first: each method's RACU can be read as soon as its own curve is trained beside it
        chosen = {BASELINE: EXPLANATIONS[BASELINE], **chosen}
        choice_of_class(options.explain)
        method_settings(options.method_options, list(chosen))
        retrains = options.seeds * (2 + len(ratios) * len(chosen))  # per seed: its 0 % and 100 % models, then every curve
        check_time("--seeds", options.seeds, retrains * max(1, len(run.data().train)),
                   "a retrain per seed, method and ratio, each one pass over the training split at the least", "give fewer seeds or ratios")
        scores = base_scores(run)["test"]
        metric = options.metric or score_key(run.task.task_type)
        if metric not in scores or metric == "n":
            raise AttnAuditError(f"--metric: the test split has no score {metric!r}; choose {', '.join(k for k in scores if k != 'n')}")
        return ratios, chosen, dropped, metric

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        ratios, methods, dropped, metric = self._check(run, options)
        options = replace(options, ratios=ratios)
        roarer = Roarer(run, options, metric)
        seeds = [base_seed_of(run) + i for i in range(options.seeds)]
        if options.engine == "ray":
            on_ray(run, options, list(methods), seeds, metric)  # the retrains; the loop below loads them finished
        if options.together:
            roarer.in_lockstep(seeds, methods)  # likewise
        curves: list[dict[str, Any]] = []
        test = roarer.data.test
        hits = RationaleHits(test, roarer.sentences)
        for s in seeds:
            zero = roarer.zero(s)
            full = roarer.all_masked(s)
            for name, method in methods.items():
                recursive = options.recursive and name != BASELINE
                steps = roarer.curve(s, method, zero, recursive)
                curves.append(hits.add(point(name, 0, s, zero.score, zero.name, "", zero.trained), hits.none))
                curves.extend(
                    hits.add(point(name, st.ratio, s, st.sub.metrics["test"][metric], _name(st.sub), st.explained_by, st.sub.trained),
                             None if st.masks is None else rationale_hit(test, st.masks["test"], roarer.sentences))
                    for st in steps
                )
                curves.append(hits.add(point(name, 100, s, full.metrics["test"][metric], _name(full), "", full.trained), hits.all))
        notes = [
            f"test {metric} of models retrained with each method's top k % of every instance's items masked by {roarer.token!r} "
            "in train, dev and test (k = floor(k/100 · n) items, ties to the earlier item), epoch chosen on the masked dev split",
            ("recursive: each ratio's scores from the model retrained at the previous ratio, on its masked data"
             if options.recursive else "not recursive: every ratio's scores from the seed's 0 % model on the unmasked data"),
            "0 % = the seed's model on the unmasked data; 100 % = retrained with every item masked; random is the baseline",
            "the whole splits are masked and scored (--limit does not apply)",
            *[f"{name} left out: {why}" for name, why in dropped.items()],
            *[f"{name} with {', '.join(f'{k}={v}' for k, v in given.items())}" for name, given in roarer.settings.items()],
            *(["the explanations explain each instance's gold label (not its prediction)"] if roarer.gold else []),
            *([f"rationale_hit: of the {hits.with_rationale} test instances with a gold rationale, the share whose masked "
               "items take at least one of its tokens (empty: a step known by its scores alone)"] if hits.with_rationale else []),
        ]
        return summarise_curves(curves, [m for m in methods if m != BASELINE], metric, seed, options.recursive, notes)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        return plot_curves(result, directory)

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        rows = []
        for row in result.tables.get("racu_summary", []):
            value, low, high = row["racu"], row["low"], row["high"]
            spread = f"95 % interval {low:.1f} to {high:.1f} over {row['seeds']} seeds" if row["seeds"] > 1 else "one seed: no interval"
            meaning = (
                f"removing {row['method']}'s top items hurts the retrained model "
                + ("more than random removal" if value > 0 else "no more than random removal")
                + f" (RACU {value:.1f} %, {spread}); 100 % would be as bad as removing everything at once"
            )
            if not math.isfinite(value):
                meaning = "no RACU: masking at random did not change the retrained model's score, so there is no area to compare"
            rows.append({"statistic": f"racu_{row['method']}", "value": value, "published": "", "interpretation": meaning})
        return rows


# --------------------------------------------------------------------------- on Ray


@dataclass(frozen=True)
class RoarTask:
    """What a Ray worker needs to retrain part of a ROAR test: the run's folder, where its sub-runs go, the data
    folder and device, the test's options (engine local) and metric, and the run's data itself (a run trained on
    data given in memory, e.g. a cut-down split, would read the whole task from its spec)."""

    run: str
    subruns: str
    data_dir: str | None
    device: str
    options: Any
    metric: str
    data: TaskData


def roar_task(item: tuple[RoarTask, int, str]) -> str:
    """One Ray task: seed ``seed``'s 0 % model (``part`` ``zero``), its 100 % model (``all``), or a method's whole
    curve (``part`` = the method: Recursive ROAR's ratios depend on each other, so one task trains them in order).
    Sub-runs are checkpointed as in one process, so a killed task's work resumes."""
    from attnaudit.resolve import load_model  # here: the worker loads the run itself (resolve sits above the tests)

    task, seed, part = item
    run = replace(load_model(None, task.run, device=task.device, data_dir=task.data_dir), subruns=Path(task.subruns), _data=task.data)
    roarer = Roarer(run, task.options, task.metric)
    if part == "zero":
        roarer.zero(seed)
    elif part == "all":
        roarer.all_masked(seed)
    else:
        roarer.curve(seed, EXPLANATIONS[part], roarer.zero(seed), task.options.recursive and part != BASELINE)
    return part


def on_ray(run: Run, options: Any, methods: list[str], seeds: list[int], metric: str) -> None:
    """Train the test's sub-runs as Ray tasks (one CPU each): first every seed's 0 % model (each curve starts from it),
    then every (seed, method) curve and, behind them, every seed's 100 % model (which no curve needs: one retrain, so it
    fills a worker a curve has left). A failed task is reported in one line and left to the driver, which then trains
    (or loads) every sub-run in order as without Ray."""
    data_dir = run.task.data_dir
    task = RoarTask(str(run.path), str(subrun_root(run)), None if data_dir is None else str(data_dir), str(run.device),
                    replace(options, engine="local", workers=None, address=""), metric, run.data())
    stages = {"0 % models": [(task, s, "zero") for s in seeds],
              "curves and 100 % models": [(task, s, m) for s in seeds for m in methods] + [(task, s, "all") for s in seeds]}
    with ray_session(options.address or None, options.workers) as ray:
        for stage, items in stages.items():
            for done, (item, _, error) in enumerate(map_tasks(ray, roar_task, items), 1):
                failed = "" if error is None else f": failed ({error_line(error)}); trained here afterwards"
                status(f"roar on Ray: {stage} {done}/{len(items)} (seed {item[1]}, {item[2]}){failed}")


def _name(sub: SubRun) -> str:
    """A sub-run's folder relative to the ROAR sub-runs' root."""
    path = Path(sub.run.path or "")
    return path.as_posix().split("/roar/", 1)[-1]


class RationaleHits:
    """The curves' ``rationale_hit`` column (:func:`rationale_hit` on the test split) where the test split has gold
    rationales, and no column where it has none: nothing masked at 0 %, every item at 100 %."""

    def __init__(self, test: list[Example], sentences: bool) -> None:
        self.with_rationale = sum(1 for ex in test if ex.rationale)
        self.none = rationale_hit(test, [[] for _ in test], sentences)
        self.all = rationale_hit(test, [range(len(item_groups(ex, sentences))) for ex in test], sentences)

    def add(self, row: dict[str, Any], hit: float | None) -> dict[str, Any]:
        return {**row, "rationale_hit": hit} if self.with_rationale else row


def point(method: str, ratio: int, seed: int, score: float, model: str, explained_by: str, trained: bool) -> dict[str, Any]:
    """One row of the curves table."""
    return {"method": method, "ratio": ratio, "seed": seed, "score": float(score), "model": model,
            "explained_by": explained_by, "trained_now": trained}


def summarise_curves(
    curves: list[dict[str, Any]], methods: list[str], metric: str, seed: int, recursive: bool, notes: list[str]
) -> Result:
    """The result of the test from its curves: RACU per method and seed, mean with a bootstrap interval."""
    table: dict[tuple[str, int], dict[int, float]] = {}
    for row in curves:
        table.setdefault((row["method"], row["seed"]), {})[row["ratio"]] = row["score"]
    per_seed, summary_rows = [], []
    summary: dict[str, Any] = {"metric": metric, "recursive": recursive}
    for method in methods:
        values = []
        for (name, s), points in table.items():
            if name != method:
                continue
            ratios = sorted(points)
            baseline = table[(BASELINE, s)]
            value = racu(ratios, [points[r] for r in ratios], [baseline[r] for r in ratios])
            values.append(value)
            per_seed.append({"method": method, "seed": s, "racu": 100 * value})
        ci = mean_interval(values, seed=seed)
        summary_rows.append({"method": method, "racu": 100 * ci["mean"], "low": 100 * ci["low"], "high": 100 * ci["high"], "seeds": ci["n"]})
        summary.update({f"racu_{method}": 100 * ci["mean"], f"racu_{method}_low": 100 * ci["low"], f"racu_{method}_high": 100 * ci["high"]})
    summary["seeds"] = len({row["seed"] for row in curves})
    meta = {
        "notes": [*notes, "RACU in percent: mean over seeds, 95 % BCa bootstrap interval (scipy.stats.bootstrap, seeded); "
                  "one seed gives no interval"],
        "csv_tables": ["curves", "racu"],
        "published": {"claim": "Madsen et al. 2022, Recursive ROAR, BiLSTM-attention RACU %: SST attention 15.7, gradient 7.6, "
                      "x*gradient 28.0, IG 37.8; bAbI-1 66.5 / 66.1 / 71.2 / 59.1"},
    }
    return Result("roar", summary, [], {"curves": curves, "racu": per_seed, "racu_summary": summary_rows}, meta)


def plot_curves(result: Result, directory: Path) -> list[Path]:
    """Each method's curve (mean over seeds, band: lowest to highest seed) beside random's."""
    from attnaudit.plotting import pyplot

    plt = pyplot()
    frame = result.frame("curves")
    fig, ax = plt.subplots(figsize=(5.2, 3.6), layout="constrained")
    for method, rows in frame.groupby("method", sort=False):
        stats = rows.groupby("ratio")["score"].agg(["mean", "min", "max"])
        style = {"linestyle": "--", "color": "black"} if method == BASELINE else {}
        line = ax.plot(stats.index, stats["mean"], marker="o", markersize=3, label=str(method), **style)[0]
        ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.15, color=line.get_color())
    ax.set_xlabel("items masked (%)")
    ax.set_ylabel(f"test {result.summary.get('metric', 'score')} after retraining")
    ax.set_title("Recursive ROAR" if result.summary.get("recursive") else "ROAR")
    ax.legend(fontsize=7)
    return save_figure(fig, directory, "roar_curves")
