"""Tasks by name: the literature's datasets, synthetic tasks, Hugging Face and users' files.

``load_task`` accepts a registered name (``sst``, ``conll2000``...; see ``list_tasks``),
``hf:NAME`` or ``FORMAT:PATH`` for a user's own file, with optional reader options after
``?`` (``csv:reviews.csv?text=review&label=stars``). Splits a dataset lacks are cut off
the training data with a fixed seed, and every such choice is written to ``TaskData.notes``.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import overload
from urllib.parse import parse_qsl

from attnaudit.data import readers
from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Example, TaskData, TaskType
from attnaudit.errors import AttnAuditError, InputError, warn

TaskLoader = Callable[[Path | None, int], TaskData]
_FOLDERS: dict[str, str | None] = {}
_REGISTRY: dict[str, tuple[str, TaskLoader]] = {}

DATA_ENV = "ATTNAUDIT_DATA"
SPLIT_FRACTION = 0.1


def register_task(name: str, description: str, folder: str | None = None) -> Callable[[TaskLoader], TaskLoader]:
    """Register ``loader(data_dir, seed) -> TaskData`` under ``name`` (``data_dir`` may be None).

    ``folder``: the data directory's subfolder the task reads (None: built in, needs no data)."""

    def decorate(loader: TaskLoader) -> TaskLoader:
        if name in _REGISTRY:
            raise ValueError(f"task {name!r} registered twice")
        _REGISTRY[name] = (description, loader)
        _FOLDERS[name] = folder
        return loader

    return decorate


# Modules that register more tasks; imported on first use (they import this module).
_TASK_MODULES = ("attnaudit.data.word_alignments",)


def _discover() -> None:
    from importlib import import_module

    for module in _TASK_MODULES:
        import_module(module)


def task_folder(name: str) -> str | None:
    """The data-directory subfolder a named task reads (None for built-in tasks)."""
    _discover()
    return _FOLDERS.get(name)


def list_tasks() -> list[tuple[str, str]]:
    """``(name, description)`` of every registered task, sorted by name."""
    _discover()
    return sorted((name, desc) for name, (desc, _) in _REGISTRY.items())


def _data_path(data_dir: Path | None, task: str, *parts: str) -> Path:
    """``data_dir/parts...``, with one-line errors for a missing directory or file."""
    if data_dir is None:
        raise AttnAuditError(
            f"no data directory: pass --data-dir or set {DATA_ENV} (needed for task '{task}')"
        )
    if not data_dir.is_dir():
        raise AttnAuditError(f"data directory not found: {data_dir}")
    path = data_dir.joinpath(*parts)
    if not path.exists():
        raise AttnAuditError(
            f"{path}: not found (task '{task}' reads {'/'.join(parts)} from the data directory)"
        )
    return path


def split_off(
    examples: list[Example], seed: int, n_dev: int, n_test: int, what: str
) -> tuple[list[Example], list[Example], list[Example]]:
    """Cut ``n_test`` then ``n_dev`` seeded-random examples off ``examples``; order is kept."""
    if len(examples) - n_dev - n_test < 1:
        raise AttnAuditError(f"{what}: too few examples ({len(examples)}) to split off dev/test")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    test_ids = sorted(order[:n_test])
    dev_ids = sorted(order[n_test : n_test + n_dev])
    held = set(order[: n_test + n_dev])
    return (
        [ex for i, ex in enumerate(examples) if i not in held],
        [examples[i] for i in dev_ids],
        [examples[i] for i in test_ids],
    )


def _tenth(n: int) -> int:
    return max(1, round(n * SPLIT_FRACTION))


def _is_fraction(label: str) -> bool:
    """Whether a label is a number with a fractional part (``0.5``; not ``1`` or ``pos``)."""
    try:
        value = float(label)
    except ValueError:
        return False
    return math.isfinite(value) and not value.is_integer()


def _labels(
    task_type: TaskType, train: list[Example], rest: list[Example], notes: list[str] | None = None
) -> list[str]:
    """Sorted label (or tag) set of all splits.

    Labels never seen in training are reported: with a warning for users' data, as a note
    in ``notes`` for the named datasets (where they are a known property, e.g. CoNLL's I-LST).
    """

    def names(examples: list[Example]) -> set[str]:
        if task_type == "tagging":
            return {t for ex in examples for t in ex.tags or []}
        return {ex.label for ex in examples if ex.label is not None}

    seen, other = names(train), names(rest)
    fractions = sorted(label for label in seen | other if _is_fraction(label))
    if task_type != "tagging" and fractions:  # 0.5, 1.7, 2.25 are scores more often than class names
        warn(f"labels {', '.join(fractions[:5])} are fractional numbers; each distinct value is read as a class "
             "(classification), not as a score to regress")
    if other - seen:
        message = f"labels {', '.join(sorted(other - seen))} occur in dev/test but not in training data"
        if notes is None:
            warn(message)
        else:
            notes.append(message)
    return sorted(seen | other)


def _assemble(
    name: str,
    task_type: TaskType,
    train: list[Example],
    dev: list[Example] | None,
    test: list[Example] | None,
    seed: int,
    notes: list[str],
    what: str,
) -> TaskData:
    """A TaskData whose missing dev/test are 10% each of ``train`` (seeded), noted in ``notes``."""
    n_dev = 0 if dev is not None else _tenth(len(train))
    n_test = 0 if test is not None else _tenth(len(train))
    if n_dev or n_test:
        train, cut_dev, cut_test = split_off(train, seed, n_dev, n_test, what)
        parts = [p for p, n in (("dev", n_dev), ("test", n_test)) if n]
        notes.append(
            f"{' and '.join(parts)} = 10% of {what}{' each' if len(parts) == 2 else ''}, "
            f"split off with seed {seed} (no separate {' or '.join(parts)} data)"
        )
        dev = cut_dev if dev is None else dev
        test = cut_test if test is None else test
    assert dev is not None and test is not None
    return TaskData(name, task_type, train, dev, test, _labels(task_type, train, dev + test), notes)


def _replace_splits(task: TaskData, **changes: list[Example]) -> TaskData:
    """``task`` with some splits replaced by the user's and the labels recomputed."""
    splits = {s: changes.get(s, task.split(s)) for s in ("train", "dev", "test")}
    labels = _labels(task.task_type, splits["train"], splits["dev"] + splits["test"])
    return TaskData(
        task.name, task.task_type, splits["train"], splits["dev"], splits["test"], labels, task.notes
    )


# --- FORMAT:PATH specs ------------------------------------------------------------------

_FORMAT_OPTIONS = {
    "conll": {"word", "tag", "feature"},
    "csv": {"text", "label", "query", "header"},
    "tsv": {"text", "label", "query", "header"},
    "jsonl": {"text", "label", "query"},
    "sst-trees": {"binary"},
    "babi": set(),
    "snli": set(),
    "plain": set(),
    "hf": {"text", "label", "query"},
}


def _column(value: str) -> str | int:
    return int(value) if value.lstrip("-").isdigit() else value


def _int_option(options: dict[str, str], option: str, default: int) -> int:
    value = options.get(option, str(default))
    if not value.lstrip("-").isdigit():
        raise AttnAuditError(f"option {option}={value!r}: expected a column number")
    return int(value)


def _flag(value: str, option: str) -> bool:
    if value.lower() in {"1", "true", "yes"}:
        return True
    if value.lower() in {"0", "false", "no"}:
        return False
    raise AttnAuditError(f"option {option}={value!r}: expected 1/0 or true/false")


def _parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """``FORMAT:PATH?key=value&...`` (or ``hf:NAME?...``) → (format, path, options), checked."""
    fmt, sep, rest = spec.partition(":")
    if not sep or fmt not in _FORMAT_OPTIONS:
        raise AttnAuditError(
            f"unknown task {spec!r}: use a task name ({', '.join(n for n, _ in list_tasks())}), "
            f"hf:NAME, or FORMAT:PATH with FORMAT one of {', '.join(f for f in _FORMAT_OPTIONS if f != 'hf')}"
        )
    path, _, query = rest.partition("?")
    if not path:
        raise AttnAuditError(f"{spec!r}: missing path after '{fmt}:'")
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(options) - _FORMAT_OPTIONS[fmt]
    if unknown:
        allowed = ", ".join(sorted(_FORMAT_OPTIONS[fmt])) or "none"
        raise AttnAuditError(
            f"{spec!r}: unknown option(s) {', '.join(sorted(unknown))}; allowed: {allowed}"
        )
    return fmt, path, options


@overload
def absolute_spec(spec: str) -> str: ...
@overload
def absolute_spec(spec: None) -> None: ...
def absolute_spec(spec: str | None) -> str | None:
    """``FORMAT:PATH`` with its file path(s) made absolute, so a run directory trained from
    one folder still finds its data from another; names and ``hf:`` specs are unchanged."""
    if spec is None or spec in _REGISTRY or spec.startswith("hf:") or ":" not in spec:
        return spec
    fmt, _, rest = spec.partition(":")
    if fmt not in _FORMAT_OPTIONS:
        return spec
    path, sep, query = rest.partition("?")
    if fmt == "plain":
        items = [item.partition("=") for item in path.split(",")]
        path = ",".join(f"{label}={Path(file).expanduser().resolve()}" if eq else label for label, eq, file in items)
    elif path:
        path = str(Path(path).expanduser().resolve())
    return f"{fmt}:{path}{sep}{query}"


def task_files(spec: str, data_dir: Path | str | None = None, dev: str | None = None, test: str | None = None) -> list[Path]:
    """The files ``load_task(spec, data_dir, dev=dev, test=test)`` reads, for fingerprints: a named
    task's data folder, a FORMAT:PATH file (or folder, or plain's files). Built-in (synthetic) and
    ``hf:`` tasks have none here; their spec identifies them."""
    if data_dir is None and os.environ.get(DATA_ENV):
        data_dir = os.environ[DATA_ENV]
    _discover()
    paths: list[Path] = []
    for item in (spec, dev, test):
        if item is None or item.startswith("hf:"):
            continue
        if item in _REGISTRY:
            folder = _FOLDERS.get(item)
            if folder and data_dir is not None:
                paths.append(Path(data_dir).expanduser() / folder)
        elif ":" in item and item.partition(":")[0] in _FORMAT_OPTIONS:
            fmt, path, _ = _parse_spec(item)
            items = [file for _, _, file in (part.partition("=") for part in path.split(","))] if fmt == "plain" else [path]
            paths.extend(Path(file).expanduser() for file in items)
    files = [f for p in paths for f in (sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p])]
    return list(dict.fromkeys(f for f in files if f.is_file()))


def _read_file(
    fmt: str, path: str, options: dict[str, str], split: str, notes: list[str] | None = None
) -> list[Example]:
    """Read one FORMAT:PATH file; ``split`` picks an SNLI directory's files or a hf split.
    What was assumed about the file (a CSV's header row) is appended to ``notes``."""
    if fmt == "conll":
        return readers.read_conll(
            path,
            word_col=_int_option(options, "word", 0),
            tag_col=_int_option(options, "tag", -1),
            feature_col=None
            if options.get("feature", "").lower() == "none"
            else _int_option(options, "feature", 1),
        )
    if fmt in ("csv", "tsv"):
        cols = {key: _column(options[key]) if key in options else None for key in ("text", "label", "query")}
        return readers.read_table(
            path,
            sep="," if fmt == "csv" else "\t",
            text_col=cols["text"],
            label_col=cols["label"],
            header=_flag(options["header"], "header") if "header" in options else None,
            query_col=cols["query"],
            notes=notes,
        )
    if fmt == "jsonl":
        return readers.read_jsonl(
            path, options.get("text", "text"), options.get("label", "label"), options.get("query")
        )
    if fmt == "sst-trees":
        return readers.read_sst_trees(path, binary=_flag(options.get("binary", "1"), "binary"))
    if fmt == "babi":
        return readers.read_babi(path)
    if fmt == "snli":
        return readers.read_snli(path, split)
    if fmt == "hf":
        return readers.read_hf(path, _HF_SPLITS[split], **_hf_keys(options))
    # plain:LABEL=PATH,LABEL=PATH
    files: dict[str, Path] = {}
    for item in path.split(","):
        label, eq, file = item.partition("=")
        if not eq or not label or not file:
            raise AttnAuditError(f"plain:{path!r}: expected plain:LABEL=PATH,LABEL=PATH")
        files[label] = Path(file)
    return readers.read_plain_per_label(files)


_HF_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def _hf_keys(options: dict[str, str]) -> dict[str, str | None]:
    return {key + "_key": options.get(key) for key in ("text", "label", "query")}


def _file_task_type(fmt: str, examples: list[Example]) -> TaskType:
    if fmt == "conll":
        return "tagging"
    if fmt in ("babi", "snli") or any(ex.query is not None for ex in examples):
        return "pair"
    return "classification"


def _task_name(fmt: str, path: str) -> str:
    if fmt == "plain":
        return "plain"
    return Path(path).name.split(".")[0] or fmt


def _extra_split(spec: str, role: str, notes: list[str]) -> list[Example]:
    """A dev or test split given as FORMAT:PATH (``role`` picks an SNLI directory's files)."""
    fmt, path, options = _parse_spec(spec)
    return _read_file(fmt, path, options, role, notes)


def _file_task(spec: str) -> tuple[str, TaskType, list[Example], dict[str, list[Example]], list[str]]:
    """(name, type, train, dev/test found alongside, notes) for a FORMAT:PATH spec."""
    fmt, path, options = _parse_spec(spec)
    notes = [f"data: {spec}"]
    found: dict[str, list[Example]] = {}
    if fmt == "snli":
        directory = Path(path)
        if (directory / "s1.train").exists():
            train = readers.read_snli(directory, "train")
            if (directory / "s1.dev").exists():
                found["dev"] = readers.read_snli(directory, "dev")
        else:
            train = readers.read_snli(directory, "dev")
            notes.append(f"no s1.train in {directory}: training on its dev split")
        if (directory / "s1.test").exists():
            found["test"] = readers.read_snli(directory, "test")
    else:
        train = _read_file(fmt, path, options, "train", notes)
    if not train:
        raise InputError(path, "no examples")
    return _task_name(fmt, path), _file_task_type(fmt, train), train, found, notes


def _hf_task(
    spec: str, given: set[str]
) -> tuple[str, TaskType, list[Example], dict[str, list[Example]], list[str]]:
    """(name, type, train, usable validation/test splits, notes) for ``hf:NAME?options``.

    The ``validation`` and ``test`` splits are tried unless the user gave that split.
    """
    _, name, options = _parse_spec(spec)
    train = _read_file("hf", name, options, "train")
    notes = [f"data: {spec}"]
    found: dict[str, list[Example]] = {}
    for role in ("dev", "test"):
        if role in given:
            continue
        split = _HF_SPLITS[role]
        try:
            examples = _read_file("hf", name, options, role)
        except AttnAuditError as exc:
            notes.append(f"hf:{name} has no usable {split!r} split ({exc})")
            continue
        if examples:
            found[role] = examples
        else:
            notes.append(f"hf:{name} split {split!r} has no labelled rows")
    if not train:
        raise AttnAuditError(f"hf:{name}: the train split has no labelled rows")
    task_type: TaskType = "pair" if any(ex.query is not None for ex in train) else "classification"
    return "hf-" + name.replace("/", "-"), task_type, train, found, notes


def load_task(
    spec: str,
    data_dir: Path | str | None = None,
    seed: int = 0,
    dev: str | None = None,
    test: str | None = None,
    limit: int | None = None,
    min_length: int = 0,
) -> TaskData:
    """Load a task by name, ``hf:NAME`` or ``FORMAT:PATH``.

    ``data_dir`` (else ``$ATTNAUDIT_DATA``) holds the named datasets. ``dev``/``test``
    are FORMAT:PATH specs that replace those splits; missing ones are split off the
    training data (10% each, ``seed``). ``min_length`` drops examples with fewer tokens from
    every split (:func:`drop_short`); ``limit`` then keeps the first N examples of each split
    (for quick runs).
    """
    if data_dir is None and os.environ.get(DATA_ENV):
        data_dir = os.environ[DATA_ENV]
    directory = None if data_dir is None else Path(data_dir).expanduser()
    read_notes: list[str] = []
    given = {role: _extra_split(s, role, read_notes) for role, s in (("dev", dev), ("test", test)) if s is not None}
    if spec not in _REGISTRY:
        _discover()
    if spec in _REGISTRY:
        task = _REGISTRY[spec][1](directory, seed)
        if given:
            task = _replace_splits(task, **given)
            task.notes.extend(f"{role} replaced by {s}" for role, s in (("dev", dev), ("test", test)) if s)
    else:
        if spec.startswith("hf:"):
            name, task_type, train, found, notes = _hf_task(spec, set(given))
        else:
            name, task_type, train, found, notes = _file_task(spec)
        found.update(given)
        task = _assemble(name, task_type, train, found.get("dev"), found.get("test"), seed, notes, spec)
    task.notes.extend(read_notes)
    if min_length:
        task = drop_short(task, min_length)
    if limit is not None:
        if limit < 1:
            raise AttnAuditError(f"limit must be at least 1, got {limit}")
        # The label set stays that of the full data, so a limited run has the same classes.
        task = TaskData(
            task.name,
            task.task_type,
            task.train[:limit],
            task.dev[:limit],
            task.test[:limit],
            task.labels,
            [*task.notes, f"limited to the first {limit} examples of each split"],
        )
    return task


def drop_short(task: TaskData, min_length: int) -> TaskData:
    """``task`` without the examples of fewer than ``min_length`` tokens, in every split
    (Jain & Wallace drop SST sentences under 6 tokens); the counts go into the notes."""
    if min_length < 1:
        raise AttnAuditError(f"--min-length must be at least 1 token, got {min_length}")
    kept = {s: [ex for ex in task.split(s) if len(ex.tokens) >= min_length] for s in ("train", "dev", "test")}
    removed = ", ".join(f"{len(task.split(s)) - len(kept[s])} of {len(task.split(s))} {s}" for s in kept)
    note = f"min_length {min_length}: removed examples with fewer than {min_length} tokens ({removed})"
    if not kept["train"]:
        raise AttnAuditError(f"--min-length {min_length} leaves no training examples of task {task.name!r}")
    return TaskData(task.name, task.task_type, kept["train"], kept["dev"], kept["test"], task.labels, [*task.notes, note])


# --- named tasks --------------------------------------------------------------------------


def _named(
    name: str,
    task_type: TaskType,
    train: list[Example],
    dev: list[Example],
    test: list[Example],
    notes: list[str],
) -> TaskData:
    return TaskData(name, task_type, train, dev, test, _labels(task_type, train, dev + test, notes), notes)


@register_task("synthetic", "synthetic binary classification with planted signal words (rationale known)")
def _synthetic(data_dir: Path | None, seed: int) -> TaskData:
    return synthetic_task("classification", seed)


@register_task(
    "synthetic-tagging", "synthetic tagging: a marker word sets the chunk tags after it (rationale known)"
)
def _synthetic_tagging(data_dir: Path | None, seed: int) -> TaskData:
    return synthetic_task("tagging", seed)


@register_task("conll2000", "CoNLL-2000 chunking (tagging; POS tags as features)", "conll2000")
def _conll2000(data_dir: Path | None, seed: int) -> TaskData:
    train = readers.read_conll(_data_path(data_dir, "conll2000", "conll2000", "train.txt.gz"))
    test = readers.read_conll(_data_path(data_dir, "conll2000", "conll2000", "test.txt.gz"))
    train, dev, _ = split_off(train, seed, _tenth(len(train)), 0, "conll2000 train")
    notes = [f"CoNLL-2000 has no dev set: dev = 10% of train.txt.gz split off with seed {seed}"]
    return _named("conll2000", "tagging", train, dev, test, notes)


@register_task("sst", "binary SST as preprocessed by Jain & Wallace (2019)", "sst")
def _sst(data_dir: Path | None, seed: int) -> TaskData:
    splits = readers.read_jw_sst_csv(_data_path(data_dir, "sst", "sst", "sst_dataset.csv"))
    train, dev, test = splits["train"], splits["dev"], splits["test"]
    notes = ["Jain & Wallace (2019) SST splits (neutral sentences removed)"]
    return _named("sst", "classification", train, dev, test, notes)


@register_task("sst-trees", "binary SST from the treebank, with phrase labels as rationales", "sst/trees")
def _sst_trees(data_dir: Path | None, seed: int) -> TaskData:
    train, dev, test = (
        readers.read_sst_trees(_data_path(data_dir, "sst-trees", "sst", "trees", f"{s}.txt"))
        for s in ("train", "dev", "test")
    )
    notes = ["SST trees, binary (neutral roots dropped); rationale = strongly polar phrases"]
    return _named("sst-trees", "classification", train, dev, test, notes)


_BINARY_NAMES = {"0": "negative", "1": "positive"}


def _named_binary(examples: list[Example]) -> list[Example]:
    """Rename GLUE's 0/1 labels to the negative/positive used by the other SST tasks."""
    for ex in examples:
        if ex.label not in _BINARY_NAMES:
            raise InputError(ex.meta["source"], f"label {ex.label!r} is not 0 or 1")
        ex.label = _BINARY_NAMES[ex.label]
    return examples


@register_task("sst2", "GLUE SST-2: dev split off train.tsv for model selection, test = GLUE dev.tsv", "sst2")
def _sst2(data_dir: Path | None, seed: int) -> TaskData:
    paths = [_data_path(data_dir, "sst2", "sst2", f"{s}.tsv") for s in ("train", "dev")]
    train, test = (
        _named_binary(readers.read_table(p, sep="\t", text_col="sentence")) for p in paths
    )
    # GLUE's test labels are hidden, so GLUE dev is our held-out test set; model selection
    # uses phrases split off train.tsv and never sees it.
    train, dev, _ = split_off(train, seed, len(test), 0, "sst2 train")
    notes = [
        f"GLUE SST-2 has no labelled test set: test = GLUE dev.tsv ({len(test)} sentences, "
        f"never used for selection); dev = {len(dev)} phrases split off train.tsv with seed {seed}"
    ]
    return _named("sst2", "classification", train, dev, test, notes)


@register_task("agnews", "AG News topics (4 classes), only the test split available: 80/10/10", "ag_news")
def _agnews(data_dir: Path | None, seed: int) -> TaskData:
    classes_path = _data_path(data_dir, "agnews", "ag_news", "classes.txt")
    classes = [line.strip() for line in readers.read_text_lines(classes_path) if line.strip()]
    examples = readers.read_ag_news(_data_path(data_dir, "agnews", "ag_news", "test.csv"), classes)
    train, dev, test = split_off(examples, seed, _tenth(len(examples)), _tenth(len(examples)), "agnews")
    notes = [
        f"AG News train split unavailable: its test.csv is split 80/10/10 into "
        f"train/dev/test with seed {seed}"
    ]
    return _named("agnews", "classification", train, dev, test, notes)


@register_task("snli", "SNLI (no train split here: trains on 90% of dev, tests on test)", "snli")
def _snli(data_dir: Path | None, seed: int) -> TaskData:
    directory = _data_path(data_dir, "snli", "snli")
    pool = readers.read_snli(directory, "dev")
    test = readers.read_snli(directory, "test")
    train, dev, _ = split_off(pool, seed, _tenth(len(pool)), 0, "snli dev")
    notes = [
        f"SNLI train is not available: train = 90% of the SNLI dev set, dev = the other "
        f"10% (seed {seed}), test = SNLI test"
    ]
    return _named("snli", "pair", train, dev, test, notes)


_BABI_FILES = {
    1: "qa1_single-supporting-fact",
    2: "qa2_two-supporting-facts",
    3: "qa3_three-supporting-facts",
}


def _babi(number: int) -> TaskLoader:
    task = f"babi{number}"

    def load(data_dir: Path | None, seed: int) -> TaskData:
        stem = _BABI_FILES[number]
        base = _data_path(data_dir, task, "babi")
        folder = "en-10k" if (base / "en-10k" / f"{stem}_train.txt").exists() else "en"
        train = readers.read_babi(_data_path(data_dir, task, "babi", folder, f"{stem}_train.txt"))
        test = readers.read_babi(_data_path(data_dir, task, "babi", folder, f"{stem}_test.txt"))
        train, dev, _ = split_off(train, seed, _tenth(len(train)), 0, f"{task} train")
        notes = [f"bAbI {stem} ({folder}): dev = 10% of train split off with seed {seed}"]
        return _named(task, "pair", train, dev, test, notes)

    return load


for _number in _BABI_FILES:
    register_task(f"babi{_number}", f"bAbI task {_number} ({_BABI_FILES[_number]}), en-10k when present", "babi")(
        _babi(_number)
    )
