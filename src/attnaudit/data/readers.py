"""Readers for the dataset formats the attention-faithfulness literature uses.

Every reader returns :class:`Example` objects whose ``meta["source"]`` is ``"path:line"``,
so a later problem (an unknown label, an empty sentence) can name the offending line.
Malformed input raises :class:`InputError` with the file and line; recoverable oddities
(a Latin-1 file) only :func:`warn`.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal
from pathlib import Path
from typing import Any

from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError, InputError, os_reason, unknown, warn
from attnaudit.io import open_input

# Words (keeping inner apostrophes, "don't"), English clitics ("'s", "'re") or single
# punctuation marks. A regex is enough: the inputs are English research corpora, most of
# them already tokenised, and the models learn their own embeddings.
# Control characters never become tokens (they are removed when files are read; this covers
# text from JSON escapes and Hugging Face datasets too).
_TOKEN_RE = re.compile(r"\w+(?:'\w+)*|'(?:s|re|ve|ll|d|m|t)\b|[^\w\s\x00-\x1f\x7f-\x9f]")
# Control characters but the tab (a TSV delimiter): C0, DEL and C1.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")

MAX_LINE_BYTES = 64 << 20
"""The longest line read from a data file."""

SST_FINE_LABELS = ("very negative", "negative", "neutral", "positive", "very positive")


def tokenize(text: str) -> list[str]:
    """Lower-case ``text`` and split it into words and single punctuation marks."""
    return _TOKEN_RE.findall(text.lower())


_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NOT_NUMBERS = {f"{sign}{word}" for sign in ("", "+", "-") for word in ("nan", "inf", "infinity")}
# Integers up to this many digits are written out in full; longer ones in scientific notation.
_MAX_DIGITS = 100


def _number_name(number: Decimal) -> str:
    """One spelling per numeric value: ``1``, ``1.0`` and ``1e0`` are all ``"1"``, ``0.50`` is ``"0.5"``."""
    if number == number.to_integral_value() and number.adjusted() < _MAX_DIGITS:
        return str(int(number))
    # normalize() strips trailing zeros; the precision keeps every digit the label was written with
    context = Context(prec=max(len(number.as_tuple().digits), 1), Emax=MAX_EMAX, Emin=MIN_EMIN)
    return str(number.normalize(context))


def normalise_label(value: Any, path: str | Path, line: int | None = None, what: str = "label") -> str:
    """The class name of a label as a file writes it, the same for every spelling of one class.

    Numbers are compared by value (``1``, ``1.0``, ``"1"`` and JSON ``1.0`` are class ``"1"``);
    ``true``/``false`` in any case, JSON booleans included, are the classes ``"true"``/``"false"``;
    other text is kept as written, stripped. NaN, infinity, empty labels and JSON null, arrays or
    objects are refused with ``path:line``: they name no class, and their text (``"nan"``) would
    silently become one. Every reader calls this, so labels of train and test files always match.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, Decimal)):
        text = repr(value) if isinstance(value, float) else str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise InputError(path, f"{what!r} must be a string or a number", line)
    if not text:
        raise InputError(path, f"empty {what!r}", line)
    if text.lower() in _NOT_NUMBERS:
        raise InputError(path, f"{what} {text!r} is not a class (NaN and infinity name none)", line)
    if text.lower() in ("true", "false"):
        return text.lower()
    if _NUMBER_RE.fullmatch(text):
        try:
            return _number_name(Decimal(text))
        except ArithmeticError:  # an exponent beyond what decimal handles: keep the spelling
            return text
    return text


def strip_controls(text: str) -> tuple[str, int]:
    """``text`` without control characters (NUL, escape codes...; tabs kept) and how many there were.

    Whitespace-like ones (form feed, vertical tab...) become a space so that words stay apart.
    """
    if _CONTROL_RE.search(text) is None:
        return text, 0
    return _CONTROL_RE.subn(lambda m: " " if m.group().isspace() else "", text)


def _warn_controls(path: str | Path, count: int) -> None:
    """The one warning for a file whose text held control characters."""
    if count:
        warn(f"{path}: removed {count} control character{'s' if count > 1 else ''} (such as NUL) from the text")


def _source(path: str | Path, line: int) -> dict[str, Any]:
    return {"source": f"{path}:{line}"}


def iter_text_lines(path: str | Path) -> Iterator[str]:
    """Yield the lines of a text file (``.gz`` transparently), without line endings.

    Lines are decoded as UTF-8; a line that is not valid UTF-8 is decoded as Latin-1
    (every byte string is valid Latin-1) and the file is reported once with :func:`warn`.
    Streaming keeps large files such as word-vector tables out of memory. Only regular files
    are read (:func:`~attnaudit.io.open_input`), and a line longer than :data:`MAX_LINE_BYTES`
    is refused rather than read into memory (a gzip of zeros is endless).
    """
    path = Path(path)
    if not path.exists():
        raise InputError(path, "is a symbolic link that leads nowhere (or in a loop)" if path.is_symlink() else "file not found")
    wide = _wide_encoding(path)
    if wide is not None:  # UTF-16/UTF-32 (Excel's "Unicode text"): no line is a byte string of its own
        yield from _wide_lines(path, wide)
        return
    warned = False
    with open_input(path) as raw_handle:
        handle = gzip.GzipFile(fileobj=raw_handle) if path.suffix == ".gz" else raw_handle
        try:
            for number, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
                if len(raw) > MAX_LINE_BYTES:
                    raise InputError(path, f"line longer than {MAX_LINE_BYTES >> 20} MiB; not a text data file", number)
                raw = raw.rstrip(b"\n").rstrip(b"\r")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    if not warned:
                        warn(f"{path}: not UTF-8, read as Latin-1")
                        warned = True
                    text = raw.decode("latin-1")
                if number == 1:
                    text = text.removeprefix("\ufeff")
                yield text
        except (gzip.BadGzipFile, zlib.error, EOFError) as exc:
            raise InputError(path, f"not a valid gzip file ({exc})") from None
        except OSError as exc:  # a read error (EIO), not a format problem
            raise InputError(path, os_reason(exc)) from None


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
"""Byte-order marks of the wide encodings, UTF-32 first (its little-endian mark begins with UTF-16's)."""


def _wide_encoding(path: Path) -> str | None:
    """``utf-16``/``utf-32`` when the file starts with that byte-order mark (not in a ``.gz``), else None."""
    if path.suffix == ".gz":
        return None
    with open_input(path) as handle:
        start = handle.read(4)
    return next((name for bom, name in _BOMS if start.startswith(bom)), None)


def _wide_lines(path: Path, encoding: str) -> Iterator[str]:
    """The lines of a UTF-16/UTF-32 file (read whole: such files are written by hand, not streamed)."""
    with open_input(path) as handle:
        data = handle.read(MAX_LINE_BYTES * 64)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InputError(path, f"starts as {encoding.upper()} but is not ({exc.reason}); re-save it as UTF-8") from None
    yield from text.splitlines()


def _clean_lines(path: str | Path) -> tuple[list[str], int]:
    """All lines of a text file without control characters, and how many were removed."""
    lines, removed = [], 0
    for line in iter_text_lines(path):
        line, count = strip_controls(line)
        lines.append(line)
        removed += count
    if not any(line.strip() for line in lines):
        raise InputError(path, "empty file")
    return lines, removed


def read_text_lines(path: str | Path) -> list[str]:
    """All lines of a text file (see :func:`iter_text_lines`); an empty file is an error.

    Control characters (a NUL byte...) are removed, with one warning saying how many, so
    that they never become tokens or labels.
    """
    lines, removed = _clean_lines(path)
    _warn_controls(path, removed)
    return lines


def read_conll(
    path: str | Path, word_col: int = 0, tag_col: int = -1, feature_col: int | None = 1
) -> list[Example]:
    """CoNLL column format: one token per line, a blank line between sentences.

    For CoNLL-2000 (``word POS chunk``) the defaults give chunk tags as ``tags`` and the
    POS tags as ``meta["features"]``. Every token line must have as many columns as the
    first one. ``-DOCSTART-`` lines (CoNLL-2003) separate sentences like blank lines.
    """
    lines = read_text_lines(path)
    examples: list[Example] = []
    width: int | None = None
    words: list[str] = []
    tags: list[str] = []
    features: list[str] = []
    start = 0

    def flush() -> None:
        if words:
            meta = _source(path, start)
            if feature_col is not None:
                meta["features"] = list(features)
            examples.append(Example(tokens=list(words), tags=list(tags), meta=meta))
        words.clear()
        tags.clear()
        features.clear()

    for number, line in enumerate(lines, start=1):
        cols = line.split()
        if not cols or cols[0] == "-DOCSTART-":
            flush()
            continue
        if width is None:
            width = len(cols)
            needed = [word_col, tag_col] + ([feature_col] if feature_col is not None else [])
            if any(not -width <= c < width for c in needed):
                raise InputError(
                    path, f"{width} columns, but columns {needed} were asked for", number
                )
        if len(cols) != width:
            raise InputError(path, f"expected {width} columns, found {len(cols)}", number)
        if not words:
            start = number
        words.append(cols[word_col])
        tags.append(cols[tag_col])
        if feature_col is not None:
            features.append(cols[feature_col])
    flush()
    return examples


def _parse_tree(text: str, path: str | Path, line: int) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Parse one PTB tree with integer labels into leaves and labelled spans (pre-order).

    Hand-written because it is a few lines and gives errors with the file line; nltk's
    Tree.fromstring is not a dependency.
    """
    parts = re.findall(r"\(|\)|[^\s()]+", text)
    leaves: list[str] = []
    spans: list[tuple[int, int, int]] = []
    # Each open node: [label, start token index, slot in ``spans``].
    stack: list[list[int]] = []
    i = 0
    while i < len(parts):
        part = parts[i]
        if part == "(":
            if i + 1 >= len(parts) or parts[i + 1] in ("(", ")"):
                raise InputError(path, "malformed tree: '(' without a label", line)
            label = parts[i + 1]
            if label not in {"0", "1", "2", "3", "4"}:
                raise InputError(path, f"malformed tree: label {label!r} is not 0-4", line)
            if not stack and spans:
                raise InputError(path, "malformed tree: more than one root", line)
            stack.append([int(label), len(leaves), len(spans)])
            spans.append((0, 0, 0))
            i += 2
        elif part == ")":
            if not stack:
                raise InputError(path, "malformed tree: unbalanced ')'", line)
            label, start, slot = stack.pop()
            if len(leaves) == start:
                raise InputError(path, "malformed tree: node without words", line)
            spans[slot] = (start, len(leaves), label)
            i += 1
        else:
            if not stack:
                raise InputError(path, f"malformed tree: word {part!r} outside a node", line)
            leaves.append(part)
            i += 1
    if stack:
        raise InputError(path, "malformed tree: unbalanced '(' (missing ')')", line)
    if not spans:
        raise InputError(path, "malformed tree: no tree on this line", line)
    return leaves, spans


def read_sst_trees(path: str | Path, binary: bool = True) -> list[Example]:
    """Stanford Sentiment Treebank trees, one ``(label (label word) ...)`` per line.

    Labels: binary maps root 0-1 to "negative", 3-4 to "positive" and drops neutral (2)
    roots; otherwise the five names in ``SST_FINE_LABELS``. ``tokens`` are the leaves
    as written (cased, ``-LRB-`` for parentheses). ``meta["phrases"]`` lists every
    labelled node, single words included, as ``(start, end_exclusive, label)`` in pre-order
    (root first); ``meta["root_label"]`` is the root's 0-4 label.

    Rationale rule: for a negative root (0-1) the tokens covered by phrases labelled 0,
    for a positive root (3-4) those covered by phrases labelled 4, counting only phrases
    shorter than the whole sentence. These are the parts annotators marked as strongly
    polar in the sentence's own direction. It may be empty; it is None for neutral roots.
    """
    examples: list[Example] = []
    for number, line in enumerate(read_text_lines(path), start=1):
        if not line.strip():
            continue
        tokens, spans = _parse_tree(line, path, number)
        root = spans[0][2]
        if binary:
            if root == 2:
                continue
            label = "negative" if root < 2 else "positive"
        else:
            label = SST_FINE_LABELS[root]
        rationale: list[int] | None = None
        if root != 2:
            strong = 0 if root < 2 else 4
            covered = {
                t
                for start, end, lab in spans
                if lab == strong and end - start < len(tokens)
                for t in range(start, end)
            }
            rationale = sorted(covered)
        meta = _source(path, number) | {"phrases": spans, "root_label": root}
        examples.append(Example(tokens=tokens, label=label, rationale=rationale, meta=meta))
    return examples


def _csv_rows(path: str | Path, delimiter: str, quoting: bool) -> Iterator[tuple[int, list[str]]]:
    """Rows of a CSV/TSV file with the physical line each row starts on; blank rows skipped."""
    lines = read_text_lines(path)
    reader = csv.reader(
        (line + "\n" for line in lines),
        delimiter=delimiter,
        quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE,
        strict=True,
    )
    start = 1
    try:
        for row in reader:
            if row and any(cell.strip() for cell in row):
                yield start, row
            start = reader.line_num + 1
    except csv.Error as exc:
        if reader.line_num >= len(lines):  # the file ended inside a quoted cell: name the line the row began on
            raise InputError(path, f"malformed CSV: a quote opened in this row is never closed ({exc})", start) from None
        raise InputError(path, f"malformed CSV: {exc}", reader.line_num) from None


def _cell_missing(cell: str) -> bool:
    return cell.strip().lower() in {"", "nan"}


def read_jw_sst_csv(path: str | Path) -> dict[str, list[Example]]:
    """Jain & Wallace's ``sst_dataset.csv`` (``text,label,exp_split``) split by ``exp_split``.

    The text is already lower-cased and tokenised, so it is split on whitespace only.
    """
    splits: dict[str, list[Example]] = {"train": [], "dev": [], "test": []}
    rows = _csv_rows(path, ",", quoting=True)
    first = next(rows, None)
    if first is None or [c.strip() for c in first[1]] != ["text", "label", "exp_split"]:
        raise InputError(path, "expected the header text,label,exp_split", 1)
    for number, row in rows:
        if len(row) != 3:
            raise InputError(path, f"expected 3 columns, found {len(row)}", number)
        text, label, split = (c.strip() for c in row)
        label = normalise_label(label, path, number)
        if label not in {"0", "1"}:
            raise InputError(path, f"label {label!r} is not 0 or 1", number)
        if split not in splits:
            raise InputError(path, f"exp_split {split!r} is not train, dev or test", number)
        tokens = text.split()
        if not tokens:
            raise InputError(path, "empty text", number)
        name = "negative" if label == "0" else "positive"
        splits[split].append(Example(tokens=tokens, label=name, meta=_source(path, number)))
    return splits


def _column_index(
    path: str | Path, col: str | int, header: list[str] | None, what: str
) -> int:
    if isinstance(col, int):
        return col
    if header is None:
        raise AttnAuditError(f"{path}: {what} column {col!r} given by name but the file has no header")
    names = [h.strip() for h in header]
    if col not in names:
        raise InputError(path, f"no {what} column: {unknown('column', str(col), names)} (?{what}=NAME picks another)", 1)
    return names.index(col)


def _label_kind(name: str) -> str:
    """``number``, ``boolean`` or ``text``: what a normalised label looks like."""
    if _NUMBER_RE.fullmatch(name):
        return "number"
    return "boolean" if name in ("true", "false") else "text"


def _sniff_header(
    rows: list[tuple[int, list[str]]], text_col: str | int | None, label_col: str | int | None
) -> tuple[bool, str]:
    """Whether the first row of a table holds column names, and why (for the run's notes).

    Column names given by name need a header; a first row naming a ``text``/``label`` column or
    numbering the columns (pandas' default names) is one. Otherwise its label cell decides: a
    label the other rows also have, or of the same kind (number, true/false) as all of theirs,
    makes the row data; ``sentence<TAB>0`` over ``sentence<TAB>1`` rows is read as data.
    """
    first = [cell.strip() for cell in rows[0][1]]
    if isinstance(text_col, str) or isinstance(label_col, str):
        return True, "the columns are given by name"
    if "text" in first or "label" in first:
        return True, "it names a text or label column"
    if first == [str(i) for i in range(len(first))]:
        return True, "it numbers the columns"
    index = label_col if label_col is not None else (1 if len(first) == 2 else None)
    if index is None or not -len(first) <= index < len(first):
        return True, "there is no label column to compare it by"

    def name(cell: str) -> str | None:
        try:
            return None if _cell_missing(cell) else normalise_label(cell, "")
        except InputError:
            return None

    label = name(first[index])
    named = (name(row[index]) for _, row in rows[1:] if -len(row) <= index < len(row))
    others = {other for other in named if other is not None}
    if label is None:
        return False, "its label cell is empty"
    if label in others:
        return False, f"its label {label!r} is also another row's label"
    kind = _label_kind(label)
    if kind != "text" and {_label_kind(other) for other in others} <= {kind}:
        return False, f"its label {label!r} is a {kind} like the other rows' labels"
    return True, f"its label cell {label!r} is unlike the other rows' labels"


def _table_columns(
    path: str | Path,
    head: list[str] | None,
    width: int,
    wanted: dict[str, str | int | None],
) -> dict[str, int]:
    """Column indices of ``wanted`` (text, label, query; None: the default). A two-column file
    without a header is ``text,label``; with a header the defaults are the names text and label."""
    if head is None and wanted["text"] is None and wanted["label"] is None:
        if width != 2:
            raise InputError(
                path, f"no header row and {width} columns: give the text and label columns by number (?text=0&label=1)"
            )
        wanted = {**wanted, "text": 0, "label": 1}
    return {
        what: _column_index(path, what if col is None else col, head, what)
        for what, col in wanted.items()
        if col is not None or what != "query"
    }


_DELIMITERS = {";": "';'", "\t": "tab"}
"""What a ``.csv`` that holds no comma is tried with (European spreadsheets save ``;``, others tabs)."""


def _delimiter(path: str | Path, sep: str) -> str:
    """``sep``, or for a comma-separated file whose first line has no comma but a ``;`` or a tab, that (said in a warning)."""
    if sep != ",":
        return sep
    first = next((line for line in iter_text_lines(path) if line.strip()), "")
    if "," in first:
        return sep
    found = next((candidate for candidate in _DELIMITERS if candidate in first), None)
    if found is None:
        return sep
    warn(f"{path}: no comma in its first line: read with {_DELIMITERS[found]} as the delimiter")
    return found


def read_table(
    path: str | Path,
    sep: str = ",",
    text_col: str | int | None = None,
    label_col: str | int | None = None,
    header: bool | None = None,
    query_col: str | int | None = None,
    notes: list[str] | None = None,
) -> list[Example]:
    """A CSV/TSV file with a text column, a label column and optionally a query column.

    Columns are chosen by header name or 0-based index (default: the columns named text and
    label, or the two columns of a headerless two-column file). ``header=None`` sniffs
    whether the first row is a header (:func:`_sniff_header`) and appends what was assumed
    to ``notes``. Text is tokenised with :func:`tokenize`. With ``sep="\\t"`` quotes are
    ordinary characters (the TSV convention, e.g. GLUE); otherwise the CSV quoting rules apply.
    """
    sep = _delimiter(path, sep)
    rows = list(_csv_rows(path, sep, quoting=sep != "\t"))
    if not rows:
        raise InputError(path, "empty file")
    if header is None:
        header, why = _sniff_header(rows, text_col, label_col)
        if notes is not None:
            taken = "the header" if header else "data (no header)"
            notes.append(f"{path}: first row read as {taken}: {why} (?header={int(not header)} to override)")
    head = rows.pop(0)[1] if header else None
    width = len(head) if head is not None else len(rows[0][1]) if rows else 0
    cols = _table_columns(path, head, width, {"text": text_col, "label": label_col, "query": query_col})
    examples: list[Example] = []
    for number, row in rows:
        if len(row) != width:
            raise InputError(path, f"expected {width} columns, found {len(row)}", number)
        values: dict[str, str] = {}
        for what, index in cols.items():
            if not -width <= index < width:
                raise InputError(path, f"no column {index} ({width} columns)", number)
            if _cell_missing(row[index]):
                raise InputError(path, f"empty {what} cell", number)
            values[what] = row[index].strip()
        tokens = tokenize(values["text"])
        if not tokens:
            raise InputError(path, "text has no words", number)
        query = tokenize(values["query"]) if "query" in values else None
        label = normalise_label(values["label"], path, number)
        examples.append(Example(tokens=tokens, label=label, query=query, meta=_source(path, number) | _written(values)))
    if not examples:
        raise InputError(path, "no data rows")
    return examples


def _written(values: dict[str, Any]) -> dict[str, str]:
    """``meta`` entries keeping a row's text (and second text) as written, for tokenizers that read text, not
    words (:func:`~attnaudit.data.types.text_of`); a JSON list of tokens is no written text."""
    keys = {"text": "text", "query": "query_text"}
    return {keys[k]: v.strip() for k, v in values.items() if k in keys and isinstance(v, str) and v.strip()}


def _clean_ag_news(text: str) -> str:
    """Undo the AG News dump's escapes: ``\\`` stands for a line break, ``#36;`` for ``&#36;``."""
    text = text.replace("\\", " ")
    return re.sub(r"#(\d+);", lambda m: chr(int(m.group(1))), text)


def read_ag_news(path: str | Path, classes: list[str] | None = None) -> list[Example]:
    """AG News CSV rows ``"class","title","description"`` (class 1-based, no header).

    The text is title and description tokenised together; ``classes`` (the lines of
    ``classes.txt``) name the labels, otherwise the class number is the label.
    """
    examples: list[Example] = []
    for number, row in _csv_rows(path, ",", quoting=True):
        if len(row) != 3:
            raise InputError(
                path, f"expected 3 columns (class, title, description), found {len(row)}", number
            )
        cls, title, description = (c.strip() for c in row)
        cls = normalise_label(cls, path, number, "class")
        if not cls.isdigit() or (classes is not None and not 1 <= int(cls) <= len(classes)):
            known = f"1-{len(classes)}" if classes is not None else "a number"
            raise InputError(path, f"class {cls!r} is not {known}", number)
        text = _clean_ag_news(f"{title} {description}")
        tokens = tokenize(text)
        if not tokens:
            raise InputError(path, "empty title and description", number)
        label = classes[int(cls) - 1] if classes is not None else cls
        examples.append(Example(tokens=tokens, label=label, meta=_source(path, number) | _written({"text": text})))
    return examples


def _json_text(value: Any, path: str | Path, number: int, key: str) -> tuple[list[str], int]:
    """A JSON field as tokens (a string is tokenised, a list of strings taken as tokens) and the
    number of control characters (escaped ones, ``\\u0000``) removed from it."""
    if isinstance(value, str):
        text, removed = strip_controls(value)
        tokens = tokenize(text)
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        cleaned = [strip_controls(v) for v in value]
        # a token that was only control characters is dropped
        tokens = [text if not count else text.strip() for text, count in cleaned]
        tokens = [t for t in tokens if t]
        removed = sum(count for _, count in cleaned)
    else:
        raise InputError(path, f"{key!r} must be a string or a list of strings", number)
    if not tokens:
        raise InputError(path, f"empty {key!r}", number)
    return tokens, removed


def read_jsonl(
    path: str | Path, text_key: str = "text", label_key: str = "label", query_key: str | None = None
) -> list[Example]:
    """JSON Lines: one object per line; text may be a string or a list of tokens.

    Numbers are parsed as decimals, so that a label ``1.0`` is exactly the class ``1``
    (:func:`normalise_label`) however many digits it has.
    """
    examples: list[Example] = []
    lines, removed = _clean_lines(path)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        obj = _json_object(line, path, number, Decimal)
        for key in (text_key, label_key, query_key):
            if key is not None and key not in obj:
                raise InputError(path, f"missing key {key!r}", number)
        label = normalise_label(obj[label_key], path, number, label_key)
        tokens, count = _json_text(obj[text_key], path, number, text_key)
        removed += count
        query = None
        if query_key is not None:
            query, count = _json_text(obj[query_key], path, number, query_key)
            removed += count
        written = {"text": obj[text_key], "query": obj[query_key] if query_key is not None else None}
        meta = _source(path, number) | _written(written)
        if "spans" in obj:  # segments given with the text: [start, end) character spans of it (--segments)
            meta["spans"] = _given_spans(obj["spans"], obj[text_key], meta.get("text", ""), f"{path}:{number}: spans")
        examples.append(Example(tokens=tokens, label=label, query=query, meta=meta))
    _warn_controls(path, removed)
    return examples


def _given_spans(spans: Any, written: Any, kept: str, where: str) -> list[list[int]]:
    """A JSONL row's ``spans`` (``[start, end)`` offsets into its text field as written), checked and moved onto
    the text as kept (its surrounding whitespace stripped); a one-line error naming the row otherwise."""
    from attnaudit.data.segments import check_spans

    if not isinstance(written, str):
        raise AttnAuditError(f"{where}: spans need the text as a string, not a list of tokens")
    checked = check_spans(written, [[int(v) if isinstance(v, Decimal) and v == int(v) else v for v in span] if isinstance(span, list) else span
                                    for span in spans] if isinstance(spans, list) else spans, where)
    shift = len(written) - len(written.lstrip())
    return [[a - shift, b - shift] for a, b in checked]


def read_plain_per_label(files: dict[str, Path]) -> list[Example]:
    """One plain-text file per label (e.g. ``{"pos": rt-polarity.pos, ...}``), one example a line."""
    examples: list[Example] = []
    for given, path in files.items():
        label = normalise_label(given, path)
        for number, line in enumerate(read_text_lines(path), start=1):
            tokens = tokenize(line)
            if tokens:
                examples.append(Example(tokens=tokens, label=label, meta=_source(path, number)))
    return examples


def read_snli(directory: str | Path, split: str) -> list[Example]:
    """SNLI as line-aligned ``s1.<split>`` (premise), ``s2.<split>`` (hypothesis), ``labels.<split>``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(directory, "directory not found")
    premises, hypotheses, labels = (
        read_text_lines(directory / f"{stem}.{split}") for stem in ("s1", "s2", "labels")
    )
    # Trailing blank lines are harmless; any other count mismatch means the files drifted.
    premises, hypotheses, labels = (_trim(lines) for lines in (premises, hypotheses, labels))
    if not len(premises) == len(hypotheses) == len(labels):
        raise InputError(
            directory,
            f"s1.{split}, s2.{split} and labels.{split} are not line-aligned "
            f"({len(premises)}, {len(hypotheses)} and {len(labels)} lines)",
        )
    label_file = directory / f"labels.{split}"
    examples: list[Example] = []
    for number, (premise, hypothesis, label) in enumerate(
        zip(premises, hypotheses, labels), start=1
    ):
        tokens, query = tokenize(premise), tokenize(hypothesis)
        if not tokens or not query or not label.strip():
            raise InputError(label_file, "empty premise, hypothesis or label", number)
        name = normalise_label(label, label_file, number)
        examples.append(Example(tokens=tokens, label=name, query=query, meta=_source(label_file, number)))
    return examples


def _trim(lines: list[str]) -> list[str]:
    """``lines`` without trailing blank lines."""
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines[:end]


def read_babi(path: str | Path) -> list[Example]:
    """bAbI QA tasks in the original numbered format; one example per question.

    ``tokens`` are the story sentences so far (tokenised, concatenated), ``sentences`` the
    same split by sentence, ``query`` the question, ``label`` the answer and ``rationale``
    the token positions of the supporting facts (``meta["supporting"]`` their sentence
    indices; ``meta["sentence_texts"]`` and ``meta["question"]`` the sentences and the question as written).
    Question lines take a line number but add no sentence, as in the format.
    """
    examples: list[Example] = []
    story: list[list[str]] = []
    written: list[str] = []  # the story sentences as the file writes them (a language model reads these)
    line_to_sentence: dict[int, int] = {}
    for number, line in enumerate(read_text_lines(path), start=1):
        if not line.strip():
            continue
        match = re.match(r"\s*(\d+)\s+(.*)$", line)
        if match is None:
            raise InputError(path, "expected a line starting with its number", number)
        index, text = int(match.group(1)), match.group(2)
        if index == 1:
            story, written, line_to_sentence = [], [], {}
        if "\t" not in text:
            tokens = tokenize(text)
            if not tokens:
                raise InputError(path, "empty story sentence", number)
            line_to_sentence[index] = len(story)
            story.append(tokens)
            written.append(text.strip())
            continue
        fields = [f.strip() for f in text.split("\t")]
        if len(fields) < 3 or not fields[0] or not fields[1]:
            raise InputError(path, "expected 'question<TAB>answer<TAB>supporting ids'", number)
        try:
            supporting = [line_to_sentence[int(i)] for i in fields[2].split()]
        except (ValueError, KeyError):
            raise InputError(
                path, f"supporting ids {fields[2]!r} do not name earlier story lines", number
            ) from None
        if not story:
            raise InputError(path, "question before any story sentence", number)
        offsets = [0]
        for sentence in story:
            offsets.append(offsets[-1] + len(sentence))
        rationale = sorted(t for s in set(supporting) for t in range(offsets[s], offsets[s + 1]))
        examples.append(
            Example(
                tokens=[t for sentence in story for t in sentence],
                label=normalise_label(fields[1], path, number, "answer"),
                query=tokenize(fields[0]),
                sentences=[list(s) for s in story],
                rationale=rationale,
                meta=_source(path, number) | {"supporting": supporting, "sentence_texts": list(written), "question": fields[0]},
            )
        )
    return examples


def _hf_name(name: str) -> tuple[str, str | None]:
    """``glue/sst2`` → ("glue", "sst2"); ``owner/data/config`` → ("owner/data", "config");
    ``owner/data/`` → ("owner/data", None); ``imdb`` → ("imdb", None)."""
    parts = name.split("/")
    if len(parts) == 1:
        return name, None
    if len(parts) == 2:
        return parts[0], parts[1] or None
    return "/".join(parts[:-1]), parts[-1] or None


_HF_TEXT_KEYS = ("sentence", "text", "premise", "sentence1", "question1", "content", "review")
_HF_QUERY_KEYS = {"premise": "hypothesis", "sentence1": "sentence2", "question1": "question2"}


def read_hf(
    name: str,
    split: str,
    text_key: str | None = None,
    label_key: str | None = None,
    query_key: str | None = None,
) -> list[Example]:
    """A Hugging Face dataset split via ``datasets.load_dataset`` (``name`` as in :func:`_hf_name`).

    Without keys, the text column is the first of ``sentence``, ``text``, ``premise``,
    ``sentence1``...; pair datasets (premise/hypothesis, sentence1/sentence2) get a query.
    Integer labels become the ``ClassLabel`` names when the dataset has them. Rows labelled
    -1 (the hidden GLUE test labels) are dropped with a warning.
    """
    import datasets

    path, config = _hf_name(name)
    try:
        data = datasets.load_dataset(path, config, split=split)
    except Exception as exc:  # network, hub and format errors all mean "cannot load"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AttnAuditError(f"could not load hf:{name} split {split!r}: {first}") from None
    columns = list(data.column_names)
    text_key = text_key or next((k for k in _HF_TEXT_KEYS if k in columns), None)
    label_key = label_key or ("label" if "label" in columns else None)
    if text_key is None or label_key is None or text_key not in columns or label_key not in columns:
        raise AttnAuditError(
            f"hf:{name}: cannot find the text/label columns among {', '.join(columns)}; "
            "name them explicitly"
        )
    if query_key is None and _HF_QUERY_KEYS.get(text_key) in columns:
        query_key = _HF_QUERY_KEYS[text_key]
    feature = data.features[label_key]
    names = getattr(feature, "names", None)
    source = f"hf:{name}[{split}]"
    examples: list[Example] = []
    dropped = 0
    for row_number, row in enumerate(data, start=1):
        label = row[label_key]
        if label is None or (isinstance(label, int) and label < 0):
            dropped += 1
            continue
        if names is not None and isinstance(label, int):
            label = names[label]
        label = normalise_label(label, source, row_number)
        tokens = tokenize(str(row[text_key]))
        if not tokens:
            raise InputError(source, f"empty {text_key!r}", row_number)
        query = None if query_key is None else tokenize(str(row[query_key]))
        written = {"text": str(row[text_key]), "query": None if query_key is None else str(row[query_key])}
        examples.append(
            Example(tokens=tokens, label=label, query=query, meta=_source(source, row_number) | _written(written))
        )
    if dropped:
        warn(f"hf:{name} split {split!r}: dropped {dropped} unlabelled rows")
    return examples


def read_prompts(path: str | Path) -> list[Example]:
    """Prompts to generate from, each kept as written (``meta["text"]``; ``meta["target"]``: a forced continuation).

    ``.jsonl``: one object a line with a ``prompt`` (or ``text``) string and an optional ``target`` string; any
    other file: one prompt a line, ``\\n`` typed in it a newline. Control characters other than newlines and
    tabs are removed (with one warning), blank lines skipped."""
    examples: list[Example] = []
    lines, removed = _clean_lines(path)
    jsonl = str(path).endswith((".jsonl", ".jsonl.gz"))
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        target = None
        if jsonl:
            obj = _json_object(line, path, number)
            text, target = obj.get("prompt", obj.get("text")), obj.get("target")
            if not isinstance(text, str) or not text.strip():
                raise InputError(path, "expected a non-empty string under 'prompt' (or 'text')", number)
            if target is not None and (not isinstance(target, str) or not target.strip()):
                raise InputError(path, "'target' must be a non-empty string", number)
            parts = [strip_controls(part) for part in text.split("\n")]
            text, removed = "\n".join(part for part, _ in parts), removed + sum(count for _, count in parts)
        else:
            text = line.replace("\\n", "\n")
        examples.append(Example(tokens=text.split(), meta={**_source(path, number), "text": text, "target": target}))
    _warn_controls(path, removed)
    if not examples:
        raise InputError(path, "no prompts (every line is blank)")
    return examples


def _json_object(line: str, path: str | Path, number: int, parse_float: Any = float) -> dict[str, Any]:
    """One JSON Lines object (decimals read by ``parse_float``); a one-line error naming the line otherwise."""
    try:
        obj = json.loads(line, parse_float=parse_float, strict=False)
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise InputError(path, f"invalid JSON: {getattr(exc, 'msg', exc)}", number) from None
    if not isinstance(obj, dict):
        raise InputError(path, "expected a JSON object", number)
    return obj
