"""The ``attnaudit`` command line: each command mirrors a Python API function.

Errors caused by input or arguments print one line and exit with code 2 (no traceback).
"""

from __future__ import annotations

import inspect
import sys
import typing
import warnings
from dataclasses import MISSING, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer
from rich.console import Console
from rich.table import Table

from attnaudit.errors import AttnAuditError, AttnAuditWarning
from attnaudit.options import SEED_MAX, parse_text, sequence_item
from attnaudit.progress import set_quiet

if TYPE_CHECKING:
    from attnaudit.explain.generation import Generated

app = typer.Typer(
    help="Is this model's attention a faithful explanation of its predictions?\n\n"
    "Train attention models (or load a Hugging Face encoder), run the published faithfulness "
    "tests, and report tables, figures and an HTML report.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
_DEBUG = {"on": False}
"""``attnaudit --debug COMMAND``: an unexpected failure shows its traceback instead of one line."""


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an unexpected failure (to report it).")] = False) -> None:
    _DEBUG["on"] = debug


run_app = typer.Typer(help="Run one faithfulness test on a trained run (see `attnaudit tests`).", no_args_is_help=True)
app.add_typer(run_app, name="run")
out_console = Console()

DataDir = Annotated[
    Path | None, typer.Option("--data-dir", envvar="ATTNAUDIT_DATA", file_okay=False, help="Folder with the named datasets.")
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or status lines.")]
Segments = Annotated[
    str | None,
    typer.Option(help="The features explanations and erasures work with: token (default), word, sentence, line or paragraph of "
                 "each text as written (spans given in a JSONL row's spans field take precedence).")
]
LimitOrder = Annotated[
    str,
    typer.Option(
        help="How --limit chooses: stratified (a seeded sample, each label keeping its share of the split) "
        "or first (the first N, as the files list them)."
    ),
]
Prompt = Annotated[str | None, typer.Option(help="--hf causal LM, zero-shot: prompt with {text}, e.g. 'Review: {text}\\nSentiment:'.")]
Verbalizer = Annotated[
    str | None, typer.Option(help="--hf causal LM, zero-shot: LABEL=\"WORD\",... e.g. positive=\" positive\",negative=\" negative\".")
]
MaxLength = Annotated[int | None, typer.Option(help="--hf: keep at most N tokens of each text (special tokens and a prompt's template stay).")]
Dtype = Annotated[str | None, typer.Option(help="--hf decoder LLM parameter dtype: float32 (default, the reference) or bfloat16.")]
Chat = Annotated[bool, typer.Option("--chat", help="--hf causal LM: apply the tokenizer's own chat template "
                                     "(the text, or the prompt with it, is the user's message; the assistant answers).")]
System = Annotated[str | None, typer.Option(help="With --chat: the system message's text (default: none, or the template's own).")]
Items = Annotated[str | None, typer.Option(
    help="With --chat: the explained items, user (the user's text, default) or all (system prompt and template tokens too).")]
DeviceMap = Annotated[str | None, typer.Option(
    help="--hf model larger than one device: auto (or balanced, sequential) or a .json file of module -> cpu/disk/cuda:N; "
         "accelerate places the layers (--device is then not used).")]
MaxMemory = Annotated[str | None, typer.Option(help="With --device-map: memory per device, e.g. cpu=2GiB,0=20GiB; what does not fit goes to disk.")]


class _Range(TypedDict):
    """An integer option's bounds, spread into ``typer.Option`` (typed, so the spread type-checks)."""

    min: int
    max: int


SEED_RANGE: _Range = {"min": 0, "max": SEED_MAX}


def _print_table(title: str, rows: list[dict[str, Any]]) -> None:
    table = Table(title=title)
    if not rows:
        out_console.print(f"{title}: (empty)")
        return
    for key in rows[0]:
        table.add_column(str(key))
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()))
    out_console.print(table)


@app.command()
def train(
    task: Annotated[str, typer.Option(help="Named dataset, 'synthetic', 'synthetic-tagging', hf:NAME or FORMAT:PATH.")],
    model: Annotated[str, typer.Option(help="bilstm, cnn, average, han, flat or transformer.")],
    out: Annotated[Path, typer.Option(help="Run directory to write.")],
    attention: Annotated[str, typer.Option(help="Normaliser: softmax, entmax15, sparsemax or entmax:<alpha>.")] = "softmax",
    scorer: Annotated[str, typer.Option(help="Attention scorer of the RNN family: tanh or dot.")] = "tanh",
    layers: Annotated[int | None, typer.Option(help="Transformer layers.")] = None,
    heads: Annotated[int | None, typer.Option(help="Transformer heads.")] = None,
    d_model: Annotated[int | None, typer.Option(help="Transformer width.")] = None,
    hidden_dim: Annotated[int | None, typer.Option(help="RNN/CNN hidden size.")] = None,
    embed_dim: Annotated[int | None, typer.Option(help="Word embedding size.")] = None,
    preset: Annotated[
        str | None, typer.Option(
            help="Named option set: jain-wallace (Jain & Wallace 2019's protocol), madsen2022-sst / madsen2022-babi "
            "(Madsen et al. 2022's Recursive-ROAR BiLSTM protocol); explicit options override it."
        )
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="Maximum epochs (early stopping on dev).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size.")] = None,
    lr: Annotated[float | None, typer.Option(help="Learning rate.")] = None,
    optimizer: Annotated[str | None, typer.Option(help="adam, amsgrad, adamw or sgd.")] = None,
    weight_decay: Annotated[float | None, typer.Option(help="Weight decay.")] = None,
    no_decay: Annotated[str | None, typer.Option(help="Parameter-name patterns without weight decay, comma-separated (e.g. 'scorer.*').")] = None,
    dropout: Annotated[float | None, typer.Option(help="Dropout probability (embeddings; Transformer layers).")] = None,
    loss: Annotated[str | None, typer.Option(help="Cross-entropy over a batch: mean or sum.")] = None,
    select: Annotated[
        str | None, typer.Option(help="Dev score the kept epoch is chosen on: dev-accuracy, dev-roc-auc, dev-macro-f1, dev-f1...")
    ] = None,
    min_epoch: Annotated[int | None, typer.Option(help="Epochs before this one are never kept.")] = None,
    patience: Annotated[str | None, typer.Option(help="Epochs without dev improvement before stopping; none: train every epoch.")] = None,
    warmup: Annotated[int | None, typer.Option(help="Linear lr warmup steps, then linear decay (0: constant lr).")] = None,
    word_dropout: Annotated[float | None, typer.Option(help="Probability of replacing a training word by <unk>.")] = None,
    clip: Annotated[str | None, typer.Option(help="Gradient-norm clipping threshold; none or 0: no clipping.")] = None,
    wrap: Annotated[
        bool | None, typer.Option("--wrap/--no-wrap", help="Read each sentence between <s> and </s> (never attended to or explained).")
    ] = None,
    min_length: Annotated[int | None, typer.Option(help="Drop examples with fewer tokens from every split.")] = None,
    mask_special: Annotated[
        bool | None, typer.Option("--mask-special/--no-mask-special", help="Add a [MASK] word to the vocabulary; roar masks with it, not <unk>.")
    ] = None,
    zero_specials: Annotated[
        bool | None, typer.Option("--zero-specials/--no-zero-specials", help="Start the embedding rows of <unk>, [MASK], <s>, </s> at zero.")
    ] = None,
    seed: Annotated[int, typer.Option(**SEED_RANGE, help="Random seed (initialisation, shuffling, dropout).")] = 0,
    vectors: Annotated[str | None, typer.Option(help="Pretrained word vectors (word2vec/GloVe text file).")] = None,
    features: Annotated[bool, typer.Option(help="Use the per-token feature column (CoNLL POS tags).")] = False,
    max_vocab: Annotated[int | None, typer.Option(help="Keep at most this many words.")] = None,
    min_freq: Annotated[int | None, typer.Option(help="Drop words seen fewer times.")] = None,
    dev: Annotated[str | None, typer.Option(help="Dev file as FORMAT:PATH (default: split off train).")] = None,
    test: Annotated[str | None, typer.Option(help="Test file as FORMAT:PATH (default: split off train).")] = None,
    data_dir: DataDir = None,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Train a model and write a run directory (model.safetensors, config.json, vocab, metrics.json).

    Examples:

    attnaudit train --task sst --model bilstm --out runs/sst --data-dir ../shared/data

    attnaudit train --task sst2 --model transformer --out runs/sst2-transformer --data-dir ../shared/data

    attnaudit train --task conll2000 --model transformer --layers 1 --heads 4 --features --out runs/conll --data-dir ../shared/data

    attnaudit train --task synthetic --model bilstm --out runs/syn

    attnaudit train --task sst --model bilstm --preset jain-wallace --out runs/sst-jw --data-dir ../shared/data

    attnaudit train --task sst --model bilstm --preset jain-wallace --patience 2 --select dev-accuracy --clip none --out runs/sst-jw-acc --data-dir ../shared/data
    """  # noqa: E501 (example commands stay on one line)
    from attnaudit.training.trainer import train as train_fn

    set_quiet(quiet)
    stop = None if patience is None else parse_text(patience, int | None, "--patience")
    clip_value = None if clip is None else parse_text(clip, float | None, "--clip") or 0.0
    run = train_fn(
        task,
        model,
        out,
        data_dir=data_dir,
        dev=dev,
        test=test,
        device=device,
        attention=attention,
        scorer=scorer,
        layers=layers,
        heads=heads,
        d_model=d_model,
        hidden_dim=hidden_dim,
        embed_dim=embed_dim,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        preset=preset,
        optimizer=optimizer,
        weight_decay=weight_decay,
        no_decay=None if no_decay is None else parse_text(no_decay, list[str], "--no-decay"),
        dropout=dropout,
        loss=loss,
        select=select,
        min_epoch=min_epoch,
        patience=stop,
        early_stop=None if patience is None else stop is not None,
        warmup=warmup,
        word_dropout=word_dropout,
        clip=clip_value,
        wrap=wrap,
        min_length=min_length,
        mask_special=mask_special,
        zero_specials=zero_specials,
        seed=seed,
        vectors=vectors,
        features=features or None,
        max_vocab=max_vocab,
        min_freq=min_freq,
    )
    out_console.print(f"run written to [bold]{run.path}[/]")


@app.command()
def evaluate(
    run: Annotated[Path, typer.Argument(help="Run directory.")],
    split: Annotated[str, typer.Option(help="train, dev, test or all.")] = "test",
    data_dir: DataDir = None,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Score a trained run on a split (accuracy, macro-F1, ROC-AUC, or chunk F1).

    Example: attnaudit evaluate runs/sst --split dev --data-dir ../shared/data
    """
    from attnaudit.run import load_run
    from attnaudit.training.trainer import evaluate as evaluate_fn

    set_quiet(quiet)
    scores = evaluate_fn(load_run(run, device=device, data_dir=data_dir), split, data_dir=data_dir)
    _print_table(f"{run} ({split})", [scores])


@app.command()
def datasets(data_dir: DataDir = None) -> None:
    """List the named datasets (with --data-dir: whether each one's folder is there) and the input formats.

    Example: attnaudit datasets --data-dir ../shared/data
    """
    from attnaudit.data.tasks import list_tasks, task_folder

    rows = []
    for name, description in list_tasks():
        folder = task_folder(name)
        row = {"name": name, "description": description, "folder": folder or "(built in)"}
        if data_dir is not None:
            row["found"] = "yes" if folder is None or (data_dir / folder).is_dir() else "no"
        rows.append(row)
    _print_table("datasets", rows)
    out_console.print("Your own files: conll:PATH, csv:PATH, tsv:PATH, jsonl:PATH, sst-trees:PATH, babi:PATH, snli:DIR, hf:NAME")


@app.command()
def models() -> None:
    """List the model families.

    Example: attnaudit models
    """
    from attnaudit.models import MODELS

    _print_table("models", [{"name": n, "description": d} for n, (_, _, d) in MODELS.items()])


@app.command()
def tests(
    hf: Annotated[str | None, typer.Option(help="List which tests run on this Hugging Face model (smollm2, minilm, a path or hub name).")] = None,
    run: Annotated[Path | None, typer.Option("--run", help="List which tests run on this run directory.")] = None,
    task: Annotated[str | None, typer.Option(help="With --hf: the task (labels, zero-shot defaults).")] = None,
    prompt: Prompt = None,
    verbalizer: Verbalizer = None,
    chat: Chat = False,
    system: System = None,
    items: Items = None,
    data_dir: DataDir = None,
    device: Device = "auto",
) -> None:
    """List the faithfulness tests (`attnaudit run <test> --help` for each one's options); with --hf or --run,
    whether each runs on that model and, if not, why (with --chat: the model as its chat template renders it).

    Examples:

    attnaudit tests

    attnaudit tests --hf minilm

    attnaudit tests --run runs/sst
    """
    from attnaudit.experiments import discover

    if hf is None and run is None:
        if task or prompt or verbalizer or chat or system is not None or items is not None:
            raise AttnAuditError("--task/--prompt/--verbalizer/--chat/--system/--items apply with --hf only")
        rows = [
            {"name": n, "paper": c.paper, "description": c.description, "explanations": ", ".join(c.explanation_choices())}
            for n, c in discover().items()
        ]
        _print_table("tests", rows)
        return
    from attnaudit.experiments.experiment import applicability

    target = _load_model(hf, run, task, prompt, verbalizer, data_dir, device, chat=chat or None, system=system, items=items)
    rendering = target.model.config.extra.get("chat")
    if isinstance(rendering, dict):  # the listing is of the model as its chat template renders each prompt
        system_text = "none given" if rendering.get("system") is None else repr(rendering["system"])
        print(f"chat: each prompt is the user's message in the tokenizer's chat template (system: {system_text}; items: {rendering.get('items')})")
    for line in applicability_lines(applicability(target)):
        print(line)


def applicability_lines(reasons: dict[str, str | None]) -> list[str]:
    """The tests that run on one line, then one line per reason naming the tests it stops (each reason said once)."""
    runs = [name for name, reason in reasons.items() if reason is None]
    grouped: dict[str, list[str]] = {}
    for name, reason in reasons.items():
        if reason is not None:
            grouped.setdefault(reason, []).append(name)
    lines = [f"runs ({len(runs)}): {', '.join(runs) or 'none'}"]
    lines += [f"does not apply ({len(names)}: {', '.join(names)}): {reason}" for reason, names in grouped.items()]
    return lines


def _load_model(
    hf: str | None, run: Path | None, task: str | None, prompt: str | None, verbalizer: str | None,
    data_dir: Path | None, device: str, **chat: Any,
) -> Any:
    """The Run named by exactly one of ``--hf`` and ``--run`` (a one-line error otherwise); ``chat``: ``--chat``,
    ``--system``, ``--items`` as :func:`attnaudit.hf.load_hf` takes them."""
    from attnaudit.resolve import load_model

    return load_model(hf, run, device=device, data_dir=data_dir, task=task or None, prompt=prompt or None, verbalizer=verbalizer or None,
                      **chat)


@app.command()
def explain(
    text: Annotated[str, typer.Option(help="The text whose decision is explained.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for explanation.json, explanation.csv and explanation.png/.svg; with --generate/--target generation.json, "
                     ".csv, .html (a page to browse the steps) and a heatmap per method (without it: a table here, nothing written)."),
    ] = None,
    hf: Annotated[str | None, typer.Option(help="Hugging Face model: smollm2 (next token), minilm, a path or a hub name.")] = None,
    run: Annotated[Path | None, typer.Option("--run", help="Run directory (explains its predicted class).")] = None,
    method: Annotated[
        list[str] | None,
        typer.Option("--method", help="Explanation method(s), repeatable or comma-separated (default: the registry's default methods that apply)."),
    ] = None,
    max_length: Annotated[int | None, typer.Option(help="Truncate the input to N tokens.")] = None,
    steps: Annotated[int, typer.Option(min=1, help="Integrated-gradients steps.")] = 50,
    seed: Annotated[int, typer.Option(**SEED_RANGE, help="Random seed (random baselines).")] = 0,
    prompt: Prompt = None,
    verbalizer: Verbalizer = None,
    chat: Chat = False,
    system: System = None,
    items: Items = None,
    dtype: Dtype = None,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    generate: Annotated[
        int | None, typer.Option(help="Generate N tokens after the text (a decoder or encoder-decoder) and explain each one.")
    ] = None,
    target: Annotated[
        str | None, typer.Option(help="A continuation forced on the model (decoder or encoder-decoder): each of its tokens is explained.")
    ] = None,
    contrast: Annotated[
        str | None, typer.Option(help="A continuation of as many tokens: each step explains p(token) - p(contrast token).")
    ] = None,
    sample: Annotated[
        bool, typer.Option("--sample", help="With --generate: draw each token (seeded by --seed) instead of the most probable.")
    ] = False,
    aggregate: Annotated[
        str | None, typer.Option(help="With --generate/--target: also merge each word's subword scores by sum, mean or max (generation-words.csv).")
    ] = None,
    reduction: Annotated[
        str | None,
        typer.Option(help="Gradient methods: a token's score from its per-dimension values: abs_sum, l2 or sum (signed); default: each method's."),
    ] = None,
    score: Annotated[
        str | None, typer.Option(help="Gradient methods: differentiate the probability or the logit (default: each method's own).")
    ] = None,
    attention: Annotated[
        str | None, typer.Option(help="gradient: detached (Jain & Wallace's, the default) or live, through the attention weights too "
                                 "(the plain input × gradient).")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="What stands in for an item: ig: zero (default) or the embedding of the unk, pad, mask or eos token; "
                                 "loo and the perturbation methods: delete (their default) or that token in place of each removed token "
                                 "(the perturbation methods also zero).")
    ] = None,
    segments: Annotated[
        str | None, typer.Option(help="The features: token (default), word, sentence, line, paragraph, or a JSON list of [start, end) "
                                 "character spans; one score per segment (gradient methods sum their token scores; loo removes it whole).")
    ] = None,
    replace: Annotated[
        str | None, typer.Option(help="loo's counterfactuals: SEGMENT=TEXT pairs, comma-separated (\"Dave=Sarah\"): that segment's tokens "
                                 "replaced by TEXT's tokens instead of removed.")
    ] = None,
    samples: Annotated[
        int | None, typer.Option(help="Perturbation methods: shapley's random orders (default 25), kernel_shap's and lime's coalitions (200).")
    ] = None,
    window: Annotated[int | None, typer.Option(help="occlusion: features perturbed together (default 3).")] = None,
    stride: Annotated[int | None, typer.Option(help="occlusion: features between window starts (default 1, at most the window).")] = None,
    data_dir: DataDir = None,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Explain one text's decision (a causal LM's next token, a classifier's class; without a head, attention
    only) or a generated sequence token by token (--generate N or --target TEXT, decoders and encoder-decoders)
    with every chosen explanation method, plus per-layer/head attention and rollout. A causal LM reads --text
    as written; \\n in it is a newline.

    Examples:

    attnaudit explain --hf smollm2 --text "a gripping , funny film" --prompt "Review: {text}\\nSentiment:" --verbalizer 'negative=" negative",positive=" positive"' --method attention,gradient --out explanations/zero-shot

    attnaudit explain --run runs/sst --text "a gripping , funny film" --out explanations/sst

    attnaudit explain --hf minilm --text "a gripping , funny film"

    attnaudit explain --hf smollm2 --text "The capital of France is" --generate 5 --method attention,input_gradient --out explanations/generated

    attnaudit explain --hf smollm2 --text "The capital of France is" --target " Paris" --contrast " Lyon" --method gradient

    attnaudit explain --hf smollm2 --text "The capital of France is" --target " Paris" --method input_gradient,ig --steps 4 --score probability --reduction l2 --baseline unk

    attnaudit explain --hf smollm2 --text "Dave lives in Paris. He met Sarah there. Where does Dave live? In" --segments sentence --method gradient,loo
    attnaudit explain --hf smollm2 --text "The capital of France is" --method shapley,kernel_shap,lime,occlusion --samples 4 --window 2
    """  # noqa: E501 (example commands stay on one line)
    from attnaudit.explain.generation import Generated
    from attnaudit.explain.text import decision_line, explain_text
    from attnaudit.resolve import name_model

    set_quiet(quiet)
    named = name_model(hf, run, prompt=prompt or None, verbalizer=verbalizer or None, chat=chat or None, system=system, items=items)
    if named.run is not None:
        _run_dir(run)
    result = explain_text(
        named, text.replace("\\n", "\n"), _names(method), out, prompt=prompt, verbalizer=verbalizer, chat=chat, system=system, items=items,
        max_length=max_length, seed=seed, steps=steps, device=device, data_dir=data_dir, dtype=dtype, target=target,
        device_map=device_map, max_memory=max_memory,
        generate=generate, contrast=contrast, sample=sample, aggregate=aggregate,
        options={k: v for k, v in {"reduction": reduction, "score": score, "attention": attention, "baseline": baseline, "replace": replace,
                                   "samples": samples,
                                   "window": window, "stride": stride}.items() if v is not None},
        segments=segments,
    )
    if isinstance(result, Generated):
        _print_generated(result, quiet, out, aggregate)
        return
    if not quiet:
        print(decision_line(result))
        if result.decision["kind"] == "next_token":
            print("most probable next tokens: " + ", ".join(f"{t['token']!r} {t['probability']:.4f}" for t in result.decision["top"]))
        for name, reason in result.skipped.items():
            print(f"skipped: {name}: {reason}")
        print(result.frame().to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if out is not None:
        out_console.print(f"explanation: {out / 'explanation.json'} (+ .csv, .png, .svg)", markup=False, highlight=False)


def _print_generated(result: Generated, quiet: bool, out: Path | None, aggregate: str | None) -> None:
    """The terminal view of a generated sequence: what was generated, the skipped methods, a row per step."""
    if not quiet:
        print(f"{result.meta['mode']}: {result.meta['generated_text']!r} ({len(result.target)} tokens; explained: {result.meta['explained']})")
        for name, reason in result.skipped.items():
            print(f"skipped: {name}: {reason}")
        print(result.table(aggregate).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if out is not None:
        also = "generation.csv, generation.html, a heatmap per method"
        out_console.print(f"explanation: {out / 'generation.json'} (+ {also})", markup=False, highlight=False)


def _run_dir(path: Path | None) -> Path:
    """``--run``: an attnaudit run directory (one-line error otherwise)."""
    from attnaudit.io import is_run_dir

    if path is None or not is_run_dir(path):
        raise AttnAuditError(f"--run {path}: not an attnaudit run directory (no config.json with model and task)")
    return path


@app.command()
def explanations(
    run: Annotated[Path | None, typer.Argument(help="Run directory: list only the methods that apply to its model.")] = None,
    hf: Annotated[
        str | None, typer.Option(help="List the methods that apply to this Hugging Face model (smollm2, minilm, a path or hub name).")
    ] = None,
    task: Annotated[str | None, typer.Option(help="With --hf: the task (labels, zero-shot defaults).")] = None,
    prompt: Prompt = None,
    verbalizer: Verbalizer = None,
    data_dir: DataDir = None,
    device: Device = "auto",
) -> None:
    """List the explanation methods the tests can compare (with RUN or --hf: those that apply to its model, and why not the rest).

    Examples:

    attnaudit explanations

    attnaudit explanations runs/sst

    attnaudit explanations --hf minilm
    """
    from attnaudit.explain import EXPLANATIONS, NEEDS, list_explanations

    model = None
    if run is not None or hf is not None:
        model = _load_model(hf, run, task, prompt, verbalizer, data_dir, device).model
    elif task or prompt or verbalizer:
        raise AttnAuditError("--task/--prompt/--verbalizer apply with --hf only")
    shown = list(EXPLANATIONS.values()) if model is None else list_explanations(model)
    rows = [
        {"name": m.name, "default": "yes" if m.default else "", "needs": "; ".join(NEEDS[n][0] for n in m.needs), "description": m.about}
        for m in shown
    ]
    _print_table("explanations" if model is None else f"explanations for {run or hf}", rows)
    if model is not None:
        for method in EXPLANATIONS.values():
            reason = method.applies(model)
            if reason:
                out_console.print(f"not for this model: {method.name}: {reason}", markup=False, highlight=False)


@app.command()
def finetune(
    task: Annotated[str, typer.Option(help="Classification or pair dataset (e.g. sst2, snli, csv:PATH).")],
    out: Annotated[Path, typer.Option(help="Run directory to write.")],
    hf: Annotated[
        str, typer.Option(help="Hugging Face encoder or decoder: minilm, smollm2 (embedded), a local directory, .gguf file or hub name.")
    ] = "minilm",
    epochs: Annotated[int, typer.Option(help="Epochs (the best dev-accuracy epoch is kept).")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW peak learning rate (linear warm-up and decay).")] = 2e-5,
    batch_size: Annotated[int, typer.Option(help="Batch size.")] = 16,
    limit: Annotated[int | None, typer.Option(help="Train on a seeded random sample of N training examples.")] = None,
    max_len: Annotated[int | None, typer.Option(help="Truncate inputs to N wordpieces.")] = None,
    train_layers: Annotated[int | None, typer.Option(help="Train only the head and the last N layers (default: all parameters).")] = None,
    masking: Annotated[bool, typer.Option(help="Masked fine-tuning (Madsen et al. 2024): half of each batch masked at a ratio drawn "
                                          "from U[0, 1), so that erased inputs are in distribution (needs a mask token).")] = False,
    seed: Annotated[int, typer.Option(**SEED_RANGE, help="Random seed (head initialisation, sampling, shuffling, dropout).")] = 0,
    data_dir: DataDir = None,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Fine-tune a Hugging Face encoder or decoder-only LLM with a classification head (decoders: at the last real token); the run directory works with every test.

    Examples:

    attnaudit finetune --task sst2 --out runs/minilm-sst2 --limit 2000 --data-dir ../shared/data

    attnaudit finetune --hf smollm2 --task sst2 --out runs/smollm2-sst2 --limit 200 --train-layers 2 --lr 3e-4 --max-len 64 --data-dir ../shared/data

    attnaudit finetune --task sst2 --out runs/minilm-sst2-masked --limit 2000 --masking --data-dir ../shared/data
    """  # noqa: E501 (the --help summary line and example commands stay unwrapped)
    from attnaudit.training.finetune import finetune as finetune_fn

    set_quiet(quiet)
    run = finetune_fn(
        task, out, hf=hf, epochs=epochs, lr=lr, batch_size=batch_size, limit=limit, seed=seed,
        data_dir=data_dir, device=device, max_len=max_len, train_layers=train_layers, masking=masking,
    )
    out_console.print(f"run written to [bold]{run.path}[/]")


@app.command()
def audit(
    out: Annotated[Path, typer.Option(help="Folder for results/, summary.csv and report.html.")],
    task: Annotated[str | None, typer.Option(help="Task to train on (with --model) or to run --hf on.")] = None,
    model: Annotated[str | None, typer.Option(help="Model family to train: bilstm, cnn, average, han, flat, transformer.")] = None,
    run: Annotated[Path | None, typer.Option("--run", help="Audit an existing run directory.")] = None,
    hf: Annotated[str | None, typer.Option(help="Hugging Face model: minilm, a local path or a hub name (needs --task).")] = None,
    only: Annotated[list[str] | None, typer.Option(help="Run only these tests (repeatable or comma-separated).")] = None,
    skip: Annotated[list[str] | None, typer.Option(help="Leave these tests out (repeatable or comma-separated).")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Test option TEST.OPTION=VALUE, e.g. permutation.permutations=20 (repeatable).")
    ] = None,
    split: Annotated[str, typer.Option(help="Split to test on: train, dev, test or all (every instance: for a model not trained on them).")] = "test",
    limit: Annotated[int | None, typer.Option(help="Test N instances of the split: a seeded sample stratified by label (see --limit-order).")] = None,
    limit_order: LimitOrder = "stratified",
    heatmaps: Annotated[int, typer.Option(help="Most and least faithful instances shown as heatmaps (each).")] = 3,
    explore: Annotated[int, typer.Option(help="Instances in the report's interactive explorer (0: none).")] = 50,
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Draw each test's figures (slow on a busy CPU).")] = True,
    engine: Annotated[
        str, typer.Option(help="local (this process) or ray: tests on Ray workers, per-instance tests in checkpointed shards.")
    ] = "local",
    workers: Annotated[int | None, typer.Option(help="Ray workers, each loading the model once (default: one per Ray CPU).")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address for --engine ray (default: start a local Ray).")] = None,
    attention: Annotated[str | None, typer.Option(help="Training: softmax, entmax15, sparsemax or entmax:<alpha>.")] = None,
    scorer: Annotated[str | None, typer.Option(help="Training: RNN attention scorer, tanh or dot.")] = None,
    layers: Annotated[int | None, typer.Option(help="Training: Transformer layers.")] = None,
    heads: Annotated[int | None, typer.Option(help="Training: Transformer heads.")] = None,
    d_model: Annotated[int | None, typer.Option(help="Training: Transformer width.")] = None,
    hidden_dim: Annotated[int | None, typer.Option(help="Training: RNN/CNN hidden size.")] = None,
    embed_dim: Annotated[int | None, typer.Option(help="Training: word embedding size.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Training: maximum epochs.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Training: batch size.")] = None,
    lr: Annotated[float | None, typer.Option(help="Training: Adam learning rate.")] = None,
    patience: Annotated[int | None, typer.Option(help="Training: epochs without dev improvement before stopping.")] = None,
    vectors: Annotated[str | None, typer.Option(help="Training: pretrained word vectors file.")] = None,
    max_vocab: Annotated[int | None, typer.Option(help="Training: keep at most this many words.")] = None,
    min_freq: Annotated[int | None, typer.Option(help="Training: drop words seen fewer times.")] = None,
    seed: Annotated[int, typer.Option(**SEED_RANGE, help="Random seed (training and tests).")] = 0,
    prompt: Prompt = None,
    verbalizer: Verbalizer = None,
    chat: Chat = False,
    system: System = None,
    items: Items = None,
    max_length: MaxLength = None,
    dtype: Dtype = None,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    data_dir: DataDir = None,
    device: Device = "auto",
    segments: Segments = None,
    quiet: Quiet = False,
) -> None:
    """Run every applicable faithfulness test and write OUT/report.html (resumable; trains first if needed).

    Example: attnaudit audit --task synthetic --model bilstm --out audits/bilstm --limit 100
    """
    from attnaudit.audit import audit as audit_fn
    from attnaudit.audit import parse_settings

    set_quiet(quiet)
    result = audit_fn(
        out, task=task, model=model, run=run, hf=hf, only=_names(only), skip=_names(skip), split=split,
        limit=limit, seed=seed, data_dir=data_dir, device=device, test_options=parse_settings(set_ or []), strict_options=True,
        heatmap_instances=heatmaps, explore=explore, figures=figures, attention=attention, scorer=scorer, layers=layers, heads=heads,
        d_model=d_model, hidden_dim=hidden_dim, embed_dim=embed_dim, epochs=epochs, batch_size=batch_size,
        lr=lr, patience=patience, vectors=vectors, max_vocab=max_vocab, min_freq=min_freq,
        prompt=prompt, verbalizer=verbalizer, max_length=max_length, dtype=dtype, limit_order=limit_order,
        device_map=device_map, max_memory=max_memory, chat=chat or None, system=system, items=items,
        engine=engine, workers=workers, address=address, segments=segments,
    )
    out_console.print(f"summary: {out / 'summary.csv'}\nreport: [bold]{result.report}[/]")
    if result.failed:
        raise AttnAuditError(f"{len(result.failed)} test(s) failed: {', '.join(result.failed)} (details in the report)")


@app.command()
def report(
    directory: Annotated[Path, typer.Argument(help="Audit folder, a run directory with results/, or an `attnaudit run --out` folder.")],
    heatmaps: Annotated[int, typer.Option(help="Most and least faithful instances shown as heatmaps (each).")] = 3,
    explore: Annotated[int, typer.Option(help="Instances in the report's interactive explorer (0: none).")] = 50,
    data_dir: DataDir = None,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Write DIRECTORY/report.html from DIRECTORY/results or the result files in DIRECTORY (self-contained HTML).

    Example: attnaudit report audits/sst
    """
    from attnaudit.report import build_report

    set_quiet(quiet)
    out_console.print(f"report: [bold]{build_report(directory, data_dir=data_dir, instances=heatmaps, device=device, explore=explore)}[/]")


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Folder for the demo's runs, audits and report.")] = Path("demo-output"),
    quick: Annotated[bool, typer.Option(help="Tiny sizes (seconds; for tests).")] = False,
    seed: Annotated[int, typer.Option(**SEED_RANGE, help="Seed of training and of every test.")] = 0,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Train a BiLSTM and a Transformer on the synthetic task, audit both (and MiniLM), write one report.

    Example: attnaudit demo --out /tmp/demo --quick
    """
    from attnaudit.demo import demo as demo_fn

    set_quiet(quiet)
    out_console.print(f"demo report: [bold]{demo_fn(out, quick=quick, seed=seed, device=device)}[/]")


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="Sweep YAML file (format: examples/sweep.yaml; over Hugging Face models: examples/study.yaml).")],
    engine: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray address for --engine ray (default: start a local Ray).")] = None,
    workers: Annotated[int | None, typer.Option(help="Jobs run at once (default: one per CPU core).")] = None,
    out: Annotated[Path | None, typer.Option(help="Sweep folder (default: the file's `out`).")] = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", file_okay=False, help="Datasets folder (default: the file's `data_dir`, else $ATTNAUDIT_DATA).")
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Train and audit a grid (datasets x models or Hugging Face models x their settings x seeds x lambda);
    one table OUT/sweep.csv and one page comparing the models, OUT/study.html.

    Example: attnaudit sweep examples/sweep.yaml --workers 2
    """
    from attnaudit.sweep import sweep as sweep_fn

    set_quiet(quiet)
    result = sweep_fn(config, engine=engine, address=address, workers=workers, out=out, data_dir=data_dir)
    for job in result.failed:
        print(f"failed: {job['id']}: {job['error']}")
    out_console.print(f"{len(result.jobs)} job(s), {len(result.skipped)} already finished; table: [bold]{result.csv}[/]")
    out_console.print(f"study: [bold]{result.study}[/]")
    if result.failed:
        raise AttnAuditError(f"{len(result.failed)} of {len(result.jobs)} sweep job(s) failed (see {result.csv})")


@app.command("train-nmt")
def train_nmt_command(
    out: Annotated[Path, typer.Option(help="Run directory to write.")],
    task: Annotated[str, typer.Option(help="Seq2seq task: europarl-deen or synthetic-translation.")] = "europarl-deen",
    arch: Annotated[str, typer.Option(help="nmt (our Transformer) or a Hugging Face encoder-decoder trained from scratch: marian, bart.")] = "nmt",
    layers: Annotated[int | None, typer.Option(help="Encoder and decoder layers (each).")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    d_model: Annotated[int | None, typer.Option(help="Model width.")] = None,
    d_ff: Annotated[int | None, typer.Option(help="Feed-forward width.")] = None,
    source_vocab: Annotated[int | None, typer.Option(help="Source BPE vocabulary size (--arch marian|bart: the one joint vocabulary).")] = None,
    target_vocab: Annotated[int | None, typer.Option(help="Target BPE vocabulary size.")] = None,
    epochs: Annotated[int | None, typer.Option(help="Maximum epochs (best dev loss kept).")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many optimiser steps.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sentence pairs per batch.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak Adam learning rate (after warm-up).")] = None,
    warmup: Annotated[int | None, typer.Option(help="Warm-up steps.")] = None,
    max_train_len: Annotated[int | None, typer.Option(help="Drop training pairs longer than N subwords.")] = None,
    seed: Annotated[int, typer.Option(**SEED_RANGE, help="Random seed.")] = 0,
    data_dir: DataDir = None,
    device: Device = "auto",
    quiet: Quiet = False,
) -> None:
    """Train the encoder-decoder Transformer (NMT) used by `attnaudit run alignment`; --arch marian|bart trains a
    Hugging Face encoder-decoder of the same size instead (saved with save_pretrained, loads like any --hf model).

    Examples:

    attnaudit train-nmt --out runs/nmt-deen --data-dir ../shared/data

    attnaudit train-nmt --arch marian --out runs/marian-deen --epochs 1 --data-dir ../shared/data
    """
    from attnaudit.training.nmt import train_nmt

    set_quiet(quiet)
    run = train_nmt(
        task, out, data_dir=data_dir, device=device, arch=arch, layers=layers, heads=heads, d_model=d_model, d_ff=d_ff,
        source_vocab=source_vocab, target_vocab=target_vocab, epochs=epochs, max_steps=max_steps,
        batch_size=batch_size, lr=lr, warmup=warmup, max_train_len=max_train_len, seed=seed,
    )
    out_console.print(f"run written to [bold]{run.path}[/]")


def _cli_type(hint: Any) -> Any:
    """The CLI type of an Options field: sequences are typed as comma-separated text, read by
    :func:`attnaudit.options.parse_text` (one reader for the CLI, ``--set`` and sweeps)."""
    return str | None if sequence_item(hint) is not None else hint


def _options_parameters(experiment: Any) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """The CLI parameters of a test's Options, and the sequence-typed ones among them (read as text)."""
    hints = typing.get_type_hints(experiment.Options)
    own: list[inspect.Parameter] = []
    sequences: dict[str, Any] = {}
    for f in fields(experiment.Options):
        if f.default is not MISSING:
            default = f.default
        else:
            assert f.default_factory is not MISSING  # every Options field has a default
            default = f.default_factory()
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if sequence_item(hints[f.name]) is not None:
            # Left out, the option is not passed at all, so the test's own default applies: the CLI
            # keeps no second copy of it (that copy once turned an empty default into "").
            sequences[f.name] = hints[f.name]
            if default:  # shown as text: rich would take "[default: ...]" for markup
                help_text = f"{help_text} Default: {','.join(str(v) for v in default)}.".strip()
            default = None
        if hints[f.name] is bool:  # a switch on by default must be able to go off: --per-layer/--no-per-layer
            flag = f"{flag}/--no-{flag[2:]}"
        option = typer.Option(flag, help=help_text)
        own.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[_cli_type(hints[f.name]), option]))

    return own, sequences


def _common_run_parameters() -> list[inspect.Parameter]:
    """The options every ``attnaudit run <test>`` takes, before the test's own."""
    return [
        inspect.Parameter("run_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                          annotation=Annotated[Path | None, typer.Argument(help="Run directory (from `attnaudit train`).")]),
        inspect.Parameter("split", inspect.Parameter.KEYWORD_ONLY, default="test",
                          annotation=Annotated[str, typer.Option(help="Split to test on: train, dev, test or all.")]),
        inspect.Parameter("limit", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[
                              int | None, typer.Option(help="Test N instances of the split: a seeded sample stratified by label (see --limit-order).")
                          ]),
        inspect.Parameter("limit_order", inspect.Parameter.KEYWORD_ONLY, default="stratified", annotation=LimitOrder),
        inspect.Parameter("seed", inspect.Parameter.KEYWORD_ONLY, default=0,
                          annotation=Annotated[int, typer.Option(**SEED_RANGE, help="Random seed.")]),
        inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[Path | None, typer.Option(help="Results folder (default RUN/results).")]),
        inspect.Parameter("hf", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[str | None, typer.Option(help="Hugging Face model: minilm, a local path or a hub name.")]),
        inspect.Parameter("task", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[str | None, typer.Option(help="Data for --hf models.")]),
        inspect.Parameter("prompt", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Prompt),
        inspect.Parameter("verbalizer", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Verbalizer),
        inspect.Parameter("chat", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Chat),
        inspect.Parameter("system", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=System),
        inspect.Parameter("items", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Items),
        inspect.Parameter("max_length", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=MaxLength),
        inspect.Parameter("dtype", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Dtype),
        inspect.Parameter("device_map", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DeviceMap),
        inspect.Parameter("max_memory", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=MaxMemory),
        inspect.Parameter("data_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DataDir),
        inspect.Parameter("device", inspect.Parameter.KEYWORD_ONLY, default="auto", annotation=Device),
        inspect.Parameter("segments", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Segments),
        inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Quiet),
    ]


def _run_target(name: str, run_dir: Path | None, hf: str | None, task: str | None, common: dict[str, Any],
                kwargs: dict[str, Any], zero_shot: dict[str, Any]) -> Any:
    """What ``attnaudit run <name>`` tests: the run directory, or the --hf model loaded for --task."""
    if hf:
        from attnaudit.experiments.experiment import get_experiment
        from attnaudit.resolve import load_model

        own = get_experiment(name).own_inputs
        if not task and not (own and kwargs.get(own)):
            raise AttnAuditError("--hf needs --task (the data to run the test on)" + (f" or --{own.replace('_', '-')}" if own else ""))
        if not common["out"]:
            raise AttnAuditError("--hf needs --out (where to write results)")
        return load_model(hf, device=common["device"], data_dir=common["data_dir"], task=task, **zero_shot)
    if run_dir is None:
        raise AttnAuditError("give a run directory, or --hf MODEL --task T --out DIR")
    if task:
        raise AttnAuditError("--task applies with --hf; a run directory tests the task it was trained on")
    return run_dir


def _make_run_command(name: str, experiment: Any) -> None:
    """Register ``attnaudit run <name>`` with the common options plus the test's Options."""
    own, sequences = _options_parameters(experiment)

    def command(**kwargs: Any) -> None:
        from attnaudit.experiments import run_test

        set_quiet(kwargs.pop("quiet"))
        run_dir, hf, task = kwargs.pop("run_dir"), kwargs.pop("hf"), kwargs.pop("task")
        zero_shot = {k: kwargs.pop(k) for k in ("prompt", "verbalizer", "max_length", "dtype", "device_map", "max_memory", "chat", "system", "items")}
        zero_shot = {k: v for k, v in zero_shot.items() if v is not None and v is not False}
        if zero_shot and not hf:
            raise AttnAuditError("--prompt/--verbalizer/--max-length/--dtype/--device-map/--max-memory/--chat/--system/--items apply with --hf only")
        common = {k: kwargs.pop(k) for k in ("split", "limit", "limit_order", "seed", "out", "data_dir", "device", "segments")}
        if common["segments"] is not None:
            from attnaudit.data.segments import check_unit

            check_unit(common["segments"])  # before any model loads
        for key, annotation in sequences.items():
            if kwargs[key] is None:
                del kwargs[key]
            else:
                kwargs[key] = parse_text(kwargs[key], annotation, "--" + key.replace("_", "-"))
        target = _run_target(name, run_dir, hf, task, common, kwargs, zero_shot)
        result = run_test(name, target, **common, **kwargs)
        _print_table(f"{name}: summary", [{"statistic": k, "value": v} for k, v in result.summary.items()])
        where = Path(common["out"]) if common["out"] else Path(result.meta.get("run") or ".") / "results"
        out_console.print(f"results: {where / (name + '.json')}" + (f"; figures: {len(result.figures)}" if result.figures else ""))

    command.__signature__ = inspect.Signature(_common_run_parameters() + own)  # type: ignore[attr-defined]
    about = f"{experiment.description} ({experiment.paper})" if experiment.paper else experiment.description
    examples = "\n\n".join(f"attnaudit run {name} {arguments}" for arguments in experiment.examples)
    command.__doc__ = f"{about}\n\nExamples:\n\n{examples}"
    run_app.command(name=name)(command)
    if "-" in name:  # names take - and _ alike: `run global_adversary` too (one spelling shown)
        run_app.command(name=name.replace("-", "_"), hidden=True)(command)


def register_run_commands() -> None:
    """Add ``attnaudit run <test>`` for every registered test (once per process)."""
    from attnaudit.experiments import discover

    known = {info.name for info in run_app.registered_commands}
    for name, cls in discover().items():
        if name not in known:
            _make_run_command(name, cls)


_shown_warnings: set[str] = set()
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in [*range(32), *range(127, 160)]}
_UNPRINTABLE |= {c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]}  # bidirectional overrides


def printable(message: object) -> str:
    """``message`` as one line that cannot drive the terminal: control characters (a newline, an escape
    sequence echoed from an argument) and bidirectional overrides are shown as escapes."""
    return str(message).translate(_UNPRINTABLE)


def _show_warning(message: Any, category: type[Warning], *_: Any, **__: Any) -> None:
    # Each message once per command: Python's own de-duplication is reset whenever a library
    # enters warnings.catch_warnings (sklearn does, every evaluation), so a truncation warning
    # would otherwise repeat every epoch.
    if issubclass(category, AttnAuditWarning) and str(message) not in _shown_warnings:
        _shown_warnings.add(str(message))
        print(f"warning: {printable(message)}", file=sys.stderr)


def _names(values: list[str] | None) -> list[str] | None:
    """Test names from repeated and/or comma-separated options (None when none were given)."""
    names = [name.strip() for value in values or [] for name in value.split(",") if name.strip()]
    return names or None


INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""


def main() -> None:
    """Console entry point: one-line errors with exit code 2, one-line warnings."""
    warnings.showwarning = _show_warning
    try:
        if "run" in sys.argv[1:]:  # the tests' commands import every test (torch, transformers): only `run` needs them
            register_run_commands()
        # Not standalone, typer *returns* an exit code instead of exiting: Ctrl-C arrives as 130, typer.Exit as its code.
        code = app(standalone_mode=False)
        if code == INTERRUPTED:
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            sys.exit(code)
    except AttnAuditError as exc:
        print(f"error: {printable(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except OSError as exc:  # an I/O fault (permissions, a full disk, a read-only folder): one line naming the file
        from attnaudit.errors import os_error_line

        print(f"error: {printable(os_error_line(exc))}", file=sys.stderr)
        sys.exit(2)
    except (typer.Exit, SystemExit) as exc:
        code = getattr(exc, "exit_code", getattr(exc, "code", 0))
        sys.exit(code)
    except KeyboardInterrupt:
        print("error: interrupted (resume with the same command)", file=sys.stderr)
        sys.exit(INTERRUPTED)
    except MemoryError as exc:  # a size no bound foresaw: the machine's limit, not a bug to report
        print(f"error: out of memory: {printable(exc) or 'an allocation failed'}; give smaller sizes (--batch-size, --limit, ...)",
              file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # usage errors arrive here in standalone_mode=False
        # typer 0.29 raises the exceptions of its vendored click copy, not the click package's;
        # the public typer API has no name for their base class.
        from typer._click.exceptions import ClickException

        if isinstance(exc, ClickException):
            print(f"error: {printable(exc.format_message())}", file=sys.stderr)
            sys.exit(2)
        if _DEBUG["on"]:
            raise
        # The last resort: a failure no check foresaw is still one line, and says how to see and report it.
        command = " ".join(word for word in sys.argv[1:3] if not word.startswith("-")) or "attnaudit"
        message = str(exc).strip().splitlines()
        print(f"error: attnaudit {printable(command)} failed unexpectedly: {type(exc).__name__}: {printable(message[0]) if message else ''} "
              "(run it again with `attnaudit --debug ...` for the traceback, and please report it)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
