"""Explain one text's decision (``attnaudit explain``): the registry's methods, the explained
position's attention per layer and head, and attention rollout, as JSON, CSV and a figure.

The decision explained, through the one model interface (:class:`~attnaudit.models.interface.AttentionModel`):

* a classifier (a trained run, a fine-tuned Hugging Face model, a causal LM classifying zero-shot
  with a prompt and verbalizer): its predicted class;
* a causal LM without a head or verbalizer: the predicted **next token** at the last position.
  Its output already is the next-token logits over the whole vocabulary, so the whole vocabulary
  is taken as the classes (:meth:`attnaudit.models.interface.LanguageModel.next_token_decision`, the zero-shot
  mechanism without restricting the ids; not a top-k, which would renormalise ŷ): ŷ is the real
  next-token probability, and gradient, input × gradient, IG, leave-one-out (TVD over the
  vocabulary), ... apply unchanged, interventions included;
* a generated or forced sequence (``generate`` / ``target``; decoders and encoder-decoders): each of
  its tokens as one next-token decision (:mod:`attnaudit.explain.generation`; an encoder-decoder's
  through :meth:`attnaudit.models.interface.LanguageModel.forced_decision`);
* a headless encoder (``--hf minilm``): no decision; only the attention-based methods apply, and
  the defaults that do not are listed under ``skipped`` with the reason.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnaudit.bounds import check_method_options, ig_steps
from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError, unknown, warn
from attnaudit.explain import EXPLANATIONS, choose, item_mask, item_names, item_roles, item_values
from attnaudit.explain.generation import AGGREGATIONS, Generated, decoder_rows, encode_exactly, explain_generated
from attnaudit.explain.helpers.attention import attention_per_head
from attnaudit.explain.helpers.segments import check_replaced, replacements, segment_spans, segment_text, text_segments
from attnaudit.explain.registry import CHOICES, choice, item_groups, methods_for
from attnaudit.io import (
    atomic_write,
    atomic_write_json,
    check_output_dir,
    locked,
    refuse_inside,
)
from attnaudit.models.hf import check_chat_options
from attnaudit.models.interface import LanguageModel, evaluation, language_model
from attnaudit.resolve import Named, name_model
from attnaudit.run import Run

TOP_TOKENS = 5
"""How many most probable next tokens the explanation lists."""
ROLLOUT_TOKENS = 1024
"""Longer texts get ``rollout`` only when it is asked for (``--method rollout``): it folds every layer's full ``(T, T)``
weights into a ``(T, T)`` product (T³ per layer), while the rest of the explanation reads one row per layer."""
FILES = ("explanation.json", "explanation.csv", "explanation.png", "explanation.svg")


@dataclass
class Explained:
    """One text's explanation: ``tokens`` (the explained items), the ``decision``, per-method
    ``scores`` (one per token), ``skipped`` default methods with the reason, ``attention``
    (layers × heads × tokens: the explained position's row), ``rollout`` (None when it does
    not apply, or the text is longer than :data:`ROLLOUT_TOKENS` and it was not asked for) and ``meta`` (model, text, explained position, options)."""

    tokens: list[str]
    token_ids: list[int]
    decision: dict[str, Any]
    scores: dict[str, list[float]]
    skipped: dict[str, str]
    attention: list[list[list[float]]]
    rollout: list[float] | None
    meta: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    roles: list[str] | None = None

    def frame(self) -> pd.DataFrame:
        """Tokens × methods: one row per token (``position``, ``token``; with segments ``segment``, its text; with a chat
        template its ``role``: system, user, template or assistant), one column per method."""
        named = "segment" if self.meta.get("segments") else "token"
        roles = {"role": self.roles} if self.roles is not None else {}
        columns = {"position": list(range(len(self.tokens))), named: self.tokens, **roles, **self.scores}
        return pd.DataFrame(columns)

    def to_json(self) -> dict[str, Any]:
        """Everything, as a JSON-able dict (what ``explanation.json`` holds)."""
        return asdict(self)

    def save(self, out: str | Path) -> list[Path]:
        """Write ``explanation.{json,csv,png,svg}`` into ``out`` (each file atomically)."""
        out = Path(out)
        frame = self.frame()
        paths = [out / name for name in FILES]
        self.files = [str(p) for p in paths]
        atomic_write_json(paths[0], self.to_json())
        atomic_write(paths[1], lambda tmp: frame.to_csv(tmp, index=False))
        plot_explanation(self, out / "explanation")
        return paths


def explain_text(
    source: Named | Run | str | Path,
    text: str,
    methods: Sequence[str] | None = None,
    out: str | Path | None = None,
    *,
    prompt: str | None = None,
    verbalizer: str | dict[str, str] | None = None,
    max_length: int | None = None,
    seed: int = 0,
    steps: int = 50,
    device: str = "auto",
    data_dir: str | Path | None = None,
    dtype: str | None = None,
    device_map: str | None = None,
    max_memory: str | None = None,
    target: str | None = None,
    generate: int | None = None,
    contrast: str | None = None,
    sample: bool = False,
    aggregate: str | None = None,
    options: dict[str, Any] | None = None,
    segments: str | Sequence[Sequence[int]] | None = None,
    chat: bool = False,
    system: str | None = None,
    items: str | None = None,
) -> Explained | Generated:
    """Explain ``text``'s decision by ``source``: a :class:`Run`, a run directory, or a Hugging Face
    model (``smollm2``, ``minilm``, a folder, a ``.gguf`` file or a hub name), or what the CLI named
    (:func:`attnaudit.resolve.name_model`).

    ``methods``: names from the registry, a list or comma-separated (default: its default methods that apply; the others are
    recorded under ``skipped`` with the reason); a named method that does not apply is a one-line
    error. ``prompt``/``verbalizer`` (a causal LM only) explain the zero-shot decision instead of
    the next token. ``max_length`` truncates the input to that many tokens (the last kept one is
    then the explained position of a decoder). ``seed`` seeds every random method; ``steps`` is
    IG's. ``dtype`` (a Hugging Face decoder): ``float32`` (default) or ``bfloat16`` parameters; ``device_map`` and
    ``max_memory``: a model spread over devices, the CPU and disk (:func:`attnaudit.hf.load_hf`).
    ``generate`` (N tokens made by the model, greedy or with ``sample`` seeded by ``seed``) or ``target``
    (a continuation forced on the model): a decoder's or encoder-decoder's sequence explained token by
    token (a :class:`~attnaudit.explain.generation.Generated`); ``contrast``: a continuation of as many
    tokens, each step then explaining ``p(token) − p(contrast token)``; ``aggregate`` (``sum``, ``mean``, ``max``):
    also write the scores with each word's subword pieces merged so (``generation-words.csv``). A causal LM reads ``text`` as
    written (newlines, tabs, repeated spaces: the tokenizer's own encoding).
    ``options``: further keyword options offered to every method, each taking those in its signature
    (``{"reduction": "l2", "score": "probability", "baseline": "unk"}``: the gradient family's definitions;
    an unknown name or value is a one-line error). ``meta["definitions"]`` records, per method computed,
    the value of each of its options that was used.
    ``segments``: the features explained, ``token`` (the default) or groups of tokens, a ``word``, ``sentence``,
    ``line`` or ``paragraph`` of the text as written, or ``[start, end)`` character spans (a list or a JSON list):
    every method then gives one score per segment (gradient-type methods sum their token scores within it;
    leave-one-out removes, or with ``options["baseline"]``/``options["replace"]`` replaces, the segment as one
    unit), named by its text.
    ``chat`` (a causal LM whose tokenizer has a chat template): the text (or the zero-shot prompt holding it) is the
    user's message after the ``system`` message, rendered by the tokenizer's own template up to the assistant's turn
    (:mod:`attnaudit.models.hf.chat`); each item's role is recorded; ``items``: ``user`` (the user's text, default) or ``all``.
    With ``out`` the JSON, CSV and figures are written there (checked before any work).
    """
    from attnaudit.seed import set_seed

    if not text.strip():
        raise AttnAuditError("--text is empty; give the text to explain")
    if isinstance(methods, str):
        methods = [name.strip() for name in methods.split(",") if name.strip()]
    if methods is not None:
        choose(methods, option="--method")  # unknown names fail before the model is loaded
    if max_length is not None and max_length < 1:
        raise AttnAuditError(f"--max-length must be at least 1, got {max_length}")
    sequence = _check_sequence(generate, target, contrast, max_length)
    if sample and generate is None:  # refused like --aggregate: a forced --target, or one decision, draws nothing
        raise AttnAuditError("--sample applies with --generate N (a --target is forced, not drawn)")
    if aggregate is not None and (not sequence or aggregate not in AGGREGATIONS):
        choices = ", ".join(AGGREGATIONS)
        raise AttnAuditError(f"--aggregate must be one of {choices}" if sequence else "--aggregate applies with --generate or --target")
    ig_steps(steps)
    unit, spans = text_segments(text, segments)
    offered = {"seed": seed, "steps": steps, **method_options(options)}
    if offered.get("replace") is not None:
        replacements(str(offered["replace"]))  # its form checked before the model loads
    folder = check_output_dir(out) if out is not None else None
    check_chat_options(chat, system, items)
    named = name_model(source=source, prompt=prompt, verbalizer=verbalizer, dtype=dtype, device_map=device_map, max_memory=max_memory,
                       chat=chat or None, system=system, items=items)
    if out is not None:  # before loading: nothing is written inside what was named
        folder_of = named.run.path if isinstance(named.run, Run) else named.run if named.run is not None else named.hf
        if folder_of is not None and Path(folder_of).is_dir():
            refuse_inside(out, folder_of, "the run folder" if named.run is not None else "the model folder")
    run = named.load(device, data_dir)
    set_seed(seed)
    explained: Explained | Generated
    with _decision(run, sequence) as kind:
        if sequence:
            explained = explain_generated(
                run, text, methods_for(run, methods, offered), generate=generate, target=target, contrast=contrast, sample=sample, seed=seed,
                offered=offered, segments=(unit, spans),
            )
        else:
            explained = _explain(run, text, kind, methods, max_length, offered, (unit, spans))
    explained.meta.update(seed=seed, max_length=max_length, steps=steps, source=_describe(named, run),
                          definitions=definitions(list(explained.scores), offered, options or {}))
    if folder is not None:  # everything computed first: a failure above writes nothing
        with locked(folder):
            if isinstance(explained, Generated):
                explained.save(folder, aggregate)
            else:
                explained.save(folder)
    return explained


OWN_PARAMETERS = ("seed", "steps")
"""Options :func:`explain_text` takes as parameters of its own, not in ``options``."""


def method_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` checked: each name an option some registered method takes (not ``seed``/``steps``, which
    are parameters of their own), each named value one of its choices (:data:`~attnaudit.explain.registry.CHOICES`,
    spelled as registered); a one-line error otherwise."""
    valid = sorted({name for method in EXPLANATIONS.values() for name in method.options} - set(OWN_PARAMETERS))
    checked = {}
    for name, value in (options or {}).items():
        if name in OWN_PARAMETERS:
            raise AttnAuditError(f"options: give {name} as its own parameter ({name}=...), not in options")
        if name not in valid:
            raise AttnAuditError(f"options: {unknown('option', name, valid)}")
        checked[name] = choice(name, value) if name in CHOICES else value
    check_method_options(checked)
    return checked


def definitions(methods: Sequence[str], offered: dict[str, Any], given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method computed, the value of each of its options that was used (offered, else its default);
    a warning names each option in ``given`` that none of them takes."""
    used = {name: EXPLANATIONS[name].settings(offered) for name in methods if name in EXPLANATIONS}
    for option in given:
        if not any(option in settings for settings in used.values()):
            takers = [m.name for m in EXPLANATIONS.values() if option in m.options]
            warn(f"option {option!r} is taken by none of the methods computed ({', '.join(used) or 'none'}); it applies to {', '.join(takers)}")
    return used


def _describe(named: Named, run: Run) -> str:
    return str(run.path) if isinstance(named.run, Run) and run.path else str(run.info.get("source") or named.describe())


def _check_sequence(generate: int | None, target: str | None, contrast: str | None, max_length: int | None) -> bool:
    """Whether a sequence is explained (``--generate`` or ``--target``); one-line errors for combinations that mean nothing."""
    if generate is not None and target is not None:
        raise AttnAuditError("give --generate N or --target TEXT, not both")
    if contrast is not None and generate is None and target is None:
        raise AttnAuditError("--contrast needs --generate N or --target TEXT (the sequence it is contrasted with)")
    if generate is not None and generate < 1:
        raise AttnAuditError(f"--generate must be at least 1, got {generate}")
    if target is not None and not target.strip():
        raise AttnAuditError("--target is empty; give the continuation to explain (or --generate N)")
    if max_length is not None and (generate is not None or target is not None):
        raise AttnAuditError("--max-length applies to one decision; a generated sequence reads the whole prompt")
    return generate is not None or target is not None


@contextlib.contextmanager
def _decision(run: Run, sequence: bool = False) -> Iterator[str]:
    """``next_token`` (a causal LM, or an encoder-decoder explaining a ``sequence``, for the block),
    ``class`` (a trained head) or ``none``."""
    model = run.model
    encoder_decoder = isinstance(model, LanguageModel) and model.kind == "encoder-decoder"
    if encoder_decoder and not sequence:
        raise AttnAuditError("an encoder-decoder explains the sequence it generates: give --generate N or --target TEXT")
    if sequence and not encoder_decoder and model.config.extra.get("output") != "next_token":
        zero_shot = model.config.extra.get("output") == "verbalizer"
        raise AttnAuditError(
            "--generate/--target explain the tokens a language model generates; this model "
            + ("classifies zero-shot (drop --prompt/--verbalizer)" if zero_shot else "makes no next-token prediction")
        )
    if encoder_decoder:
        with language_model(model, "an encoder-decoder's decision").forced_decision():
            yield "next_token"
    elif model.config.extra.get("output") == "next_token":
        with language_model(model, "a next-token decision").next_token_decision():
            yield "next_token"
    else:
        yield "class" if model.trained_head else "none"


def _batch(run: Run, text: str, max_length: int | None, kind: str) -> Batch:
    """The one-example batch of ``text`` on the run's device (truncated to ``max_length`` tokens); a causal
    LM's next-token decision reads the text as written (the tokenizer's own encoding)."""
    if kind == "next_token" and run.model.config.extra.get("chat"):  # the chat template's rendering, as the collator makes it
        return _collated(run, text, max_length)
    if kind == "next_token":
        model = language_model(run.model, "a next-token decision")
        ids = encode_exactly(model.tokenizer, text)
        limit = min(max_length or model.config.max_len, model.config.max_len)
        if max_length is None and len(ids) > limit:
            raise AttnAuditError(f"--text has {len(ids)} tokens; this model reads at most {limit}: shorten it, or give --max-length {limit} "
                                 f"to explain its first {limit}")
        if len(ids) > limit:
            warn(f"--text is longer than {limit} wordpieces; truncated to its first {limit}")
            ids = ids[:limit]
        return decoder_rows(model, ids, [], 1).to(run.device)
    if run.task.task_type not in ("classification", "pair"):
        raise AttnAuditError(f"explain explains one decision per text; a {run.task.task_type} model makes one per token")
    if run.task.task_type == "pair":
        raise AttnAuditError("explain takes one text; this pair/QA model needs a second text (not supported yet)")
    return _collated(run, text, max_length)


def _collated(run: Run, text: str, max_length: int | None) -> Batch:
    """``text`` through the run's own collator (truncated to ``max_length`` tokens of the text)."""
    collate = run.collate
    if max_length is not None:
        if not hasattr(collate, "max_len"):
            raise AttnAuditError(f"--max-length: the {run.family} model's input cannot be truncated here")
        collate = copy.copy(collate)
        collate.max_len = min(max_length, collate.max_len or max_length)
    return collate([Example(tokens=text.split(), meta={"text": text})]).to(run.device)  # a tokenizer reads the text as written


def _explain(
    run: Run, text: str, kind: str, names: Sequence[str] | None, max_length: int | None, offered: dict[str, Any],
    segmented: tuple[str, list[tuple[int, int]] | None] = ("token", None),
) -> Explained:
    """Everything for one text, computed before anything is written."""
    model = run.model
    methods, skipped = methods_for(run, names, offered)
    batch = _batch(run, text, max_length, kind)
    unit, spans = segmented
    if spans is not None:
        batch = segment_text(model, batch, text, unit, spans, getattr(run.collate, "prompt", None) if kind != "next_token" else None)
    mask = item_mask(model, batch)[0]
    _refuse_unknown_words(run, batch, mask)
    groups = item_groups(model, batch)
    if offered.get("replace"):
        check_replaced(item_names(run, batch)[0], offered["replace"])
    with evaluation(model), torch.no_grad():
        first = model.rows_forward(batch)  # the explained row's weights alone: no (T, T) per layer and head
    probs = first.probs[0]
    items = mask[None]
    scores = {name: item_values(method(run, batch, **offered), items, groups)[0] for name, method in methods.items()}
    rollout = EXPLANATIONS.get("rollout")
    rolled = None
    if rollout is not None and rollout.applies(model) is None and ("rollout" in scores or batch.tokens.shape[-1] <= ROLLOUT_TOKENS):
        rolled = scores["rollout"] if "rollout" in scores else item_values(rollout(run, batch), items, groups)[0]
    heads = attention_per_head(model, batch, first.trace)[0]
    if groups is not None:  # each segment's attention: the sum over its tokens, as every method's scores
        row = groups[0].to(heads.device)
        heads = torch.stack([heads[..., : len(row)][..., row == g].sum(-1) for g in range(int(row.max()) + 1)], -1)
    else:
        heads = heads[..., mask]
    position = model.explanation_rows(batch.mask)
    ids = batch.tokens[0][mask].tolist() if batch.tokens.dim() == 2 else []
    return Explained(
        roles=item_roles(batch, items)[0] if batch.roles is not None else None,
        tokens=item_names(run, batch)[0],
        token_ids=ids,
        decision=_decision_record(run, kind, probs),
        scores=scores,
        skipped=skipped,
        attention=heads.tolist(),
        rollout=rolled,
        meta={
            "text": text,
            "model": run.family,
            "explained_position": int(position[0]) if isinstance(position, torch.Tensor) else position,
            "explained_position_note": _position_note(model),
            **({"segments": {"unit": unit, "spans": [list(s) for s in (segment_spans(batch.examples[0]) or [])]}} if groups is not None else {}),
        },
    )


def _refuse_unknown_words(run: Run, batch: Batch, items: torch.Tensor) -> None:
    """A text whose every word is unknown to a word-level vocabulary reaches the model as ``<unk>`` alone: any
    decision it makes says nothing about the text, so it is refused (subword tokenizers have no such case)."""
    probe = run.collate([Example(tokens=["\u2603unseen\u2603"])])  # a word no vocabulary holds
    if probe.tokens.dim() != 2:
        return
    unknown_ids = probe.tokens[0][probe.mask[0].bool()]
    real = probe.mask[0].bool() & ~torch.isin(probe.tokens[0], torch.tensor(sorted(_special_ids(run))))
    if int(real.sum()) != 1 or batch.tokens.dim() != 2:
        return  # split into several pieces: not a word-level vocabulary
    unk = unknown_ids[real[probe.mask[0].bool()]]
    words = batch.tokens[0][items.to(batch.tokens.device)]
    if words.numel() and bool((words == unk.to(words.device)).all()):
        raise AttnAuditError("none of the words of --text is in the model's vocabulary (all read as unknown): nothing to explain")


def _special_ids(run: Run) -> set[int]:
    """Ids a tokenizer adds around a text (none for word-level vocabularies)."""
    tokenizer = run.model.tokenizer
    return set(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer is not None else set()


def _position_note(model: Any) -> str:
    if model.causal:
        return "the last (real) token: the position whose state makes the prediction"
    if model.explanation_query is not None:
        return f"query row {model.explanation_query} ([CLS])"
    return "mean over the real query rows"


def _decision_record(run: Run, kind: str, probs: torch.Tensor) -> dict[str, Any]:
    """What was predicted, with its probability (next token: also the most probable tokens)."""
    if kind == "none":
        from attnaudit.explain.registry import NEEDS

        return {"kind": "none", "reason": NEEDS["prediction"][1](run.model)}
    top = probs.topk(min(TOP_TOKENS, probs.numel()))
    index = int(top.indices[0])
    if kind == "next_token":
        decode = language_model(run.model, "a next-token decision").tokenizer.decode
        ranked = [{"token": decode([int(i)]), "id": int(i), "probability": float(p)} for p, i in zip(top.values, top.indices)]
        return {"kind": "next_token", "token": ranked[0]["token"], "id": index, "probability": float(top.values[0]), "top": ranked}
    labels = run.labels or [str(i) for i in range(probs.numel())]
    return {
        "kind": "class", "label": labels[index], "id": index, "probability": float(top.values[0]),
        "probabilities": {labels[i]: float(p) for i, p in enumerate(probs.tolist())},
    }


def decision_line(explained: Explained) -> str:
    """One line saying what was explained."""
    d = explained.decision
    if d["kind"] == "next_token":
        return f"explained: next token {d['token']!r} (p = {d['probability']:.4f})"
    if d["kind"] == "class":
        return f"explained: class {d['label']!r} (p = {d['probability']:.4f})"
    return f"nothing predicted: {d['reason']}; explained by the attention-based methods only"


def plot_explanation(explained: Explained, stem: Path) -> list[Path]:
    """``stem.png`` + ``stem.svg``: tokens × methods heat rows (each row scaled to its largest
    magnitude) above a layers × heads panel of the explained position's attention to the first token."""
    import numpy as np

    from attnaudit.plotting import pyplot, save_figure

    plt = pyplot()
    names = list(explained.scores) + (["rollout (row)"] if explained.rollout is not None and "rollout" not in explained.scores else [])
    rows = [explained.scores[n] for n in explained.scores] + ([explained.rollout] if len(names) > len(explained.scores) else [])
    matrix = np.abs(np.array(rows, dtype=float).reshape(len(rows), len(explained.tokens)))
    scale = np.nanmax(np.where(np.isfinite(matrix), matrix, np.nan), axis=1, keepdims=True) if matrix.size else matrix
    matrix = matrix / np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    sink = np.array(explained.attention, dtype=float)[..., 0]
    k = len(explained.tokens)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(6.0, 0.55 * k + 2.5), 1.6 + 0.4 * len(rows) + 0.22 * sink.shape[0] + 1.5),
        gridspec_kw={"height_ratios": [max(len(rows), 1) + 1.5, max(sink.shape[0], 2)]},
    )
    template = np.array([role == "template" for role in explained.roles or [""] * k], dtype=bool)
    cmap = plt.get_cmap("Reds").with_extremes(bad="#d9d9d9")  # a chat template's own tokens are greyed: scored, not the user's text
    image = top.imshow(np.where(template[None, :], np.nan, matrix), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    top.set_xticks(range(k), [repr(t)[1:-1] for t in explained.tokens], rotation=45, ha="right", fontsize=8)
    for label, grey in zip(top.get_xticklabels(), template):
        label.set_color("#888888" if grey else "black")
    top.set_yticks(range(len(names)), names, fontsize=8)
    top.set_title(f"{decision_line(explained).removeprefix('explained: ')}; |score| / row max", fontsize=9)
    fig.colorbar(image, ax=top, fraction=0.03)
    panel = bottom.imshow(sink, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    bottom.set_xlabel("head", fontsize=8)
    bottom.set_ylabel("layer", fontsize=8)
    first = "segment (summed over its tokens)" if explained.meta.get("segments") else "token"
    bottom.set_title(f"attention of the explained position to the first {first} {explained.tokens[0]!r}", fontsize=9)
    fig.colorbar(panel, ax=bottom, fraction=0.03)
    fig.tight_layout()
    return save_figure(fig, stem.parent, stem.name)
