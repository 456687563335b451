"""Parallel corpora and gold word alignments for the seq2seq (NMT) model.

* Readers: line-aligned parallel files (raw text, tokenised with sacrebleu's 13a tokenizer
  so that punctuation is split the way the RWTH gold sentences are), the RWTH German-English
  gold alignments (Vilar et al. 2006) in both their formats — ``alignmentDeEn.talp``
  (``i-j`` sure, ``ipj`` possible, 1-based) and the ``SENT:``/``S i j``/``P i j`` file
  (0-based) — and the named task ``europarl-deen`` (the 20k-pair Europarl sample, minus the
  gold sentences it contains).
* :class:`SubwordTokenizer`: a BPE model trained with the ``tokenizers`` library on one side
  of the training corpus; encodes pre-tokenised words and keeps the word <-> subword map.
* Conventions (both sides): ids ``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3. The source
  is ``subwords + </s>``; the decoder input (``Batch.target``) is ``<s> + subwords`` and the
  labels (``Batch.labels``) are ``subwords + </s>``, so position ``p`` reads target subword
  ``p-1`` and predicts subword ``p``.
* :class:`Seq2SeqCollator` builds those batches; :func:`synthetic_translation` is a task with
  known alignments (a lexicon and a deterministic reordering).

Alignment links are ``(source word, target word)`` pairs, 0-based; an example carries them in
``meta["sure"]`` and ``meta["possible"]`` (lists of pairs).
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import cast

import torch

from attnaudit.data.batching import IGNORE_INDEX, _pad
from attnaudit.data.tasks import register_task, split_off
from attnaudit.data.types import Batch, Example, TaskData
from attnaudit.errors import AttnAuditError, InputError, warn
from attnaudit.io import read_input

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIALS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)
CONTINUATION = "##"  # prefix of a subword that continues the previous one inside a word
Link = tuple[int, int]


# --- text files --------------------------------------------------------------------------


def read_lines(path: str | Path) -> list[str]:
    """Lines of a text file without their newline; trailing empty lines dropped.

    UTF-8 when the file decodes as UTF-8, else Latin-1 (the RWTH ``de``/``en`` files are
    Latin-1: ``daß``, ``Abhängiger``); every byte is valid Latin-1, so this never fails.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(path, "file not found")
    raw = read_input(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    lines = text.split("\n")
    lines = [line.rstrip("\r") for line in lines]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def tokenize(text: str) -> list[str]:
    """Split raw text into words with sacrebleu's 13a (mteval) tokenizer: punctuation apart,
    hyphenated words and numbers kept, as in the RWTH gold sentences."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()(text.strip()).split()


def normalise_text(text: str) -> str:
    """Lower-cased letters and digits only: matches one sentence across tokenisations."""
    return "".join(c for c in unicodedata.normalize("NFC", text).lower() if c.isalnum())


def read_parallel(source: str | Path, target: str | Path) -> list[Example]:
    """Line-aligned parallel files as examples (``tokens`` source words, ``target`` words).

    Raw text is tokenised with :func:`tokenize`. Pairs with an empty side are skipped (one warning with the count); different line
    counts are an error.
    """
    src_lines, tgt_lines = read_lines(source), read_lines(target)
    if len(src_lines) != len(tgt_lines):
        raise InputError(
            target, f"has {len(tgt_lines)} lines but {source} has {len(src_lines)}; parallel files must align"
        )
    examples: list[Example] = []
    empty = 0
    for number, (src, tgt) in enumerate(zip(src_lines, tgt_lines), start=1):
        src_words, tgt_words = tokenize(src), tokenize(tgt)
        if not src_words or not tgt_words:
            empty += 1
            continue
        examples.append(Example(tokens=src_words, target=tgt_words, meta={"source": f"{source}:{number}"}))
    if empty:
        warn(f"{source}: skipped {empty} sentence pair(s) with an empty side")
    return examples


# --- RWTH gold alignments ----------------------------------------------------------------


def read_talp(path: str | Path) -> list[tuple[set[Link], set[Link]]]:
    """``(sure, possible)`` 0-based ``(source, target)`` link sets per line of a ``.talp`` file.

    Each line holds links ``i-j`` (sure) and ``ipj`` (possible), 1-based, source index first.
    """
    out: list[tuple[set[Link], set[Link]]] = []
    for number, line in enumerate(read_lines(path), start=1):
        sure: set[Link] = set()
        possible: set[Link] = set()
        for item in line.split():
            kind, parts = ("sure", item.split("-")) if "-" in item else ("possible", item.split("p"))
            if len(parts) != 2 or not all(p.isdigit() for p in parts) or min(int(p) for p in parts) < 1:
                raise InputError(path, f"bad link {item!r}: expected i-j (sure) or ipj (possible), 1-based", number)
            link = (int(parts[0]) - 1, int(parts[1]) - 1)
            (sure if kind == "sure" else possible).add(link)
        out.append((sure, possible))
    return out


def read_sp_alignments(path: str | Path) -> list[tuple[set[Link], set[Link]]]:
    """``(sure, possible)`` link sets per sentence of the RWTH ``SENT: n`` / ``S i j`` / ``P i j``
    file (0-based, source index first); sentences must be numbered 0, 1, 2, ... in order."""
    out: list[tuple[set[Link], set[Link]]] = []
    negative: list[str] = []
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "SENT:":
            if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) != len(out):
                raise InputError(path, f"expected 'SENT: {len(out)}', got {line.strip()!r}", number)
            out.append((set(), set()))
        elif fields[0] in ("S", "P") and len(fields) == 3 and all(_is_int(f) for f in fields[1:]) and out:
            link = (int(fields[1]), int(fields[2]))
            if min(link) < 0:
                negative.append(f"line {number}")
                continue
            out[-1][0 if fields[0] == "S" else 1].add(link)
        else:
            raise InputError(path, f"expected 'SENT: n', 'S i j' or 'P i j', got {line.strip()!r}", number)
    if negative:
        # The RWTH S/P file has one "S 21 -100" (sentence 178) where the .talp file has 22-1.
        warn(f"{path}: skipped {len(negative)} link(s) with a negative index ({', '.join(negative[:3])})")
    return out


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def read_rwth(directory: str | Path, source: str = "de", target: str = "en") -> list[Example]:
    """The RWTH gold set: tokenised sentence pairs with ``meta["sure"]``/``meta["possible"]``.

    Links come from ``alignment<Src><Tgt>.talp`` (else the S/P file ``alignment<Src><Tgt>``);
    every link must lie inside its sentence pair.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise AttnAuditError(f"gold alignment directory not found: {directory}")
    stem = f"alignment{source.capitalize()}{target.capitalize()}"
    talp, sp = directory / f"{stem}.talp", directory / stem
    if talp.is_file():
        links, links_path = read_talp(talp), talp
    elif sp.is_file():
        links, links_path = read_sp_alignments(sp), sp
    else:
        raise AttnAuditError(f"{directory}: no {talp.name} or {sp.name} (RWTH gold alignments)")
    src_lines, tgt_lines = read_lines(directory / source), read_lines(directory / target)
    if not len(src_lines) == len(tgt_lines) == len(links):
        raise InputError(
            links_path,
            f"{len(links)} alignments for {len(src_lines)} {source} and {len(tgt_lines)} {target} sentences",
        )
    examples = []
    for number, (src, tgt, (sure, possible)) in enumerate(zip(src_lines, tgt_lines, links), start=1):
        src_words, tgt_words = src.split(), tgt.split()
        for s, t in sure | possible:
            if s >= len(src_words) or t >= len(tgt_words):
                raise InputError(
                    links_path,
                    f"link ({s + 1}, {t + 1}) outside a pair of {len(src_words)} x {len(tgt_words)} words",
                    number,
                )
        examples.append(
            Example(
                tokens=src_words,
                target=tgt_words,
                meta={"source": f"{directory / source}:{number}", "sure": sorted(sure), "possible": sorted(possible - sure)},
            )
        )
    return examples


def remove_overlap(train: list[Example], held_out: Sequence[Example]) -> tuple[list[Example], int, int]:
    """``train`` without the pairs whose source sentence occurs in ``held_out``; also the
    number of pairs dropped and of ``held_out`` sentences found.

    Sentences are compared with :func:`normalise_text`, so tokenisation does not matter. The
    source side decides: a model that saw a gold source sentence in training has been
    fitted to it, whatever its translation there (the Europarl sample repeats formulas such
    as "Gibt es Einwände ?" with varying English).
    """
    gold = {normalise_text(" ".join(ex.tokens)) for ex in held_out}
    kept, found = [], set()
    for ex in train:
        key = normalise_text(" ".join(ex.tokens))
        if key in gold:
            found.add(key)
        else:
            kept.append(ex)
    return kept, len(train) - len(kept), len(found)


def _existing(directory: Path | None, *parts: str) -> Path:
    if directory is None:
        raise AttnAuditError("no data directory: pass --data-dir or set ATTNAUDIT_DATA (needed for europarl-deen)")
    path = directory.joinpath(*parts)
    if not path.exists():
        raise AttnAuditError(f"{path}: not found (task europarl-deen reads {'/'.join(parts)} from the data directory)")
    return path


EUROPARL_DEV = 1000  # held-out Europarl pairs: in-domain model selection for the Europarl gold set


@register_task(
    "europarl-deen",
    "Europarl v7 German->English, 20k pairs (seq2seq; RWTH gold sentences removed); dev: 1,000 held-out "
    "Europarl pairs; test: newstest2015",
    "europarl-deen-20k",
)
def europarl_deen(data_dir: Path | None, seed: int) -> TaskData:
    """``europarl-deen-20k`` train minus the RWTH gold pairs, with ``EUROPARL_DEV`` seeded pairs
    held out as dev; test is newstest2015.

    The dev split is Europarl because the alignment test scores Europarl sentences: selecting
    on out-of-domain news stops training early (dev loss there bottoms out while the
    in-domain fit still improves).
    """
    root = _existing(data_dir, "europarl-deen-20k")
    train = read_parallel(root / "train.de", root / "train.en")
    test = read_parallel(root / "test.de", root / "test.en")
    held_out = min(EUROPARL_DEV, max(1, len(train) // 10))  # a smaller copy of the corpus holds out 10%
    notes = [
        f"dev: {held_out} Europarl pairs held out of train with seed {seed}; "
        "test: newstest2015 (news, out of domain for a Europarl-trained model)"
    ]
    gold = data_dir / "deen-alignment" / "DeEn" if data_dir is not None else None
    if gold is not None and gold.is_dir():
        train, dropped, found = remove_overlap(train, read_rwth(gold))
        notes.append(
            f"dropped {dropped} training pair(s) whose German sentence is one of {found} RWTH gold sentences"
        )
    else:
        warn("deen-alignment/DeEn not found: RWTH gold sentences were not removed from europarl-deen train")
        notes.append("RWTH gold sentences NOT removed from train (deen-alignment/DeEn missing)")
    train, dev, _ = split_off(train, seed, held_out, 0, "europarl-deen train")
    return TaskData("europarl-deen", "seq2seq", train, dev, test, [], notes)


# --- synthetic translation -------------------------------------------------------------


_SOURCE_SYLLABLES = ("ka", "to", "ri", "mu", "se", "no", "pa", "li", "gu", "fe")
_TARGET_SYLLABLES = ("blo", "tri", "ska", "dwe", "gor", "vin", "pla", "mek", "zu", "rho")


def _lexicon(rng: random.Random, size: int, two_word: float) -> list[tuple[str, list[str]]]:
    """``size`` distinct source pseudo-words (2-3 syllables), each with one target word or,
    with probability ``two_word``, two (a one-to-many translation)."""
    def words(syllables: Sequence[str], n: int) -> list[str]:
        seen: set[str] = set()
        while len(seen) < n:
            seen.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 3))))
        return sorted(seen)

    sources = words(_SOURCE_SYLLABLES, size)
    targets = words(_TARGET_SYLLABLES, 2 * size)
    rng.shuffle(targets)
    lexicon = []
    for i, word in enumerate(sources):
        lexicon.append((word, [targets[2 * i], targets[2 * i + 1]] if rng.random() < two_word else [targets[2 * i]]))
    return lexicon


def swap_pairs(length: int) -> list[int]:
    """The reordering of the synthetic task: source positions in target order, each adjacent
    pair swapped (``0 1 2 3 4`` -> ``1 0 3 2 4``)."""
    order = list(range(length))
    for i in range(0, length - 1, 2):
        order[i], order[i + 1] = order[i + 1], order[i]
    return order


def synthetic_translation(
    seed: int = 0,
    n_train: int = 3000,
    n_dev: int = 200,
    n_test: int = 200,
    lexicon_size: int = 40,
    min_len: int = 3,
    max_len: int = 8,
    two_word: float = 0.2,
) -> TaskData:
    """A translation task whose word alignment is known exactly.

    A random lexicon maps each source pseudo-word to one target word (or two, with
    probability ``two_word``); a sentence of ``min_len..max_len`` uniform source words is
    translated by reordering it with :func:`swap_pairs` and replacing each word by its
    translation. ``meta["sure"]`` holds every (source word, target word) link; no link is
    only possible. Pseudo-words are made of syllables, so BPE splits them into subwords.
    """
    if not 1 <= min_len <= max_len or lexicon_size < 2:
        raise AttnAuditError("synthetic translation needs 1 <= min_len <= max_len and lexicon_size >= 2")
    rng = random.Random(seed)
    lexicon = _lexicon(rng, lexicon_size, two_word)

    def make(n: int, split: str) -> list[Example]:
        examples = []
        for index in range(n):
            source = [rng.randrange(lexicon_size) for _ in range(rng.randint(min_len, max_len))]
            target: list[str] = []
            links: list[Link] = []
            for position in swap_pairs(len(source)):
                for word in lexicon[source[position]][1]:
                    links.append((position, len(target)))
                    target.append(word)
            examples.append(
                Example(
                    tokens=[lexicon[w][0] for w in source],
                    target=target,
                    meta={"source": f"synthetic-translation:{split}:{index}", "sure": links, "possible": []},
                )
            )
        return examples

    notes = [f"synthetic translation: lexicon of {lexicon_size} words, adjacent pairs swapped, seed {seed}"]
    return TaskData(
        "synthetic-translation", "seq2seq", make(n_train, "train"), make(n_dev, "dev"), make(n_test, "test"), [], notes
    )


@register_task("synthetic-translation", "synthetic translation: lexicon + swapped word pairs (alignment known)")
def _synthetic_translation_task(data_dir: Path | None, seed: int) -> TaskData:
    return synthetic_translation(seed)


# --- subwords ----------------------------------------------------------------------------


class SubwordTokenizer:
    """A BPE model (``tokenizers``) over pre-tokenised words with the word <-> subword map.

    A subword that continues a word starts with ``##``; specials are ``<pad>`` 0, ``<unk>`` 1,
    ``<s>`` 2, ``</s>`` 3.
    """

    def __init__(self, tokenizer: object) -> None:
        from tokenizers import Tokenizer

        if not isinstance(tokenizer, Tokenizer):
            raise AttnAuditError("SubwordTokenizer wraps a tokenizers.Tokenizer")
        for expected, special in enumerate(SPECIALS):
            if tokenizer.token_to_id(special) != expected:
                raise AttnAuditError(f"BPE tokenizer must have {special} at id {expected}")
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, sentences: Iterable[Sequence[str]], vocab_size: int, min_frequency: int = 2) -> SubwordTokenizer:
        """Learn BPE merges on word lists until ``vocab_size`` entries (specials included)."""
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        if vocab_size < len(SPECIALS) + 1:
            raise AttnAuditError(f"BPE vocabulary size must exceed {len(SPECIALS)}, got {vocab_size}")
        tokenizer = Tokenizer(models.BPE(unk_token=UNK, continuing_subword_prefix=CONTINUATION))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIALS),
            continuing_subword_prefix=CONTINUATION,
            show_progress=False,
        )
        tokenizer.train_from_iterator((" ".join(words) for words in sentences), trainer)
        return cls(tokenizer)

    @classmethod
    def load(cls, path: str | Path) -> SubwordTokenizer:
        """Read a tokenizer saved by :meth:`save` (JSON)."""
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise InputError(path, "BPE tokenizer file not found")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON
            raise InputError(path, f"not a tokenizers JSON file ({str(exc).splitlines()[0][:100]})") from None

    def save(self, path: str | Path) -> Path:
        from attnaudit.io import atomic_write_text

        return atomic_write_text(path, self.tokenizer.to_str())

    def __len__(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, words: Sequence[str]) -> tuple[list[int], list[int]]:
        """Subword ids of ``words`` and, per subword, the index of the word it belongs to."""
        if not words:
            return [], []
        encoding = self.tokenizer.encode(list(words), is_pretokenized=True, add_special_tokens=False)
        word_of = cast("list[int]", encoding.word_ids)  # no special tokens added: every subword is in a word
        return list(encoding.ids), [int(w) for w in word_of]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.tokenizer.id_to_token(int(i)) or UNK for i in ids]

    def words(self, ids: Sequence[int]) -> list[str]:
        """Words from subword ids (specials dropped); a ``##`` piece joins the word before it.

        Hand-written because the ``tokenizers`` decoders return one string, and callers need
        the word list (BLEU input, word-level alignment).
        """
        out: list[str] = []
        for piece in self.pieces([i for i in ids if int(i) >= len(SPECIALS) or int(i) == UNK_ID]):
            if piece.startswith(CONTINUATION) and out:
                out[-1] += piece[len(CONTINUATION) :]
            else:
                out.append(piece.removeprefix(CONTINUATION))
        return out


def word_groups(word_ids: Sequence[int], n_words: int) -> torch.Tensor:
    """``(n_words, n_subwords)`` averaging matrix: row ``w`` is ``1/k`` on the ``k`` subwords
    of word ``w``, so ``groups @ x`` is the mean over each word's subwords."""
    groups = torch.zeros(n_words, len(word_ids))
    for position, word in enumerate(word_ids):
        groups[word, position] = 1.0
    return groups / groups.sum(1, keepdim=True).clamp_min(1.0)


class Seq2SeqCollator:
    """Batches for the NMT model: source ``subwords + </s>``, ``target`` = ``<s> + subwords``,
    ``labels`` = ``subwords + </s>`` (``-100`` at padding).

    ``max_len`` caps each side at ``max_len`` positions (subwords + one special), with one
    warning per call. Examples without ``target`` give a batch without target and labels
    (for generation).
    """

    def __init__(self, source: SubwordTokenizer, target: SubwordTokenizer, max_len: int | None = None) -> None:
        if max_len is not None and max_len < 2:
            raise AttnAuditError(f"max_len must be at least 2 for seq2seq, got {max_len}")
        self.source = source
        self.target = target
        self.max_len = max_len

    def _cut(self, ids: list[int]) -> tuple[list[int], bool]:
        if self.max_len is not None and len(ids) > self.max_len - 1:
            return ids[: self.max_len - 1], True
        return ids, False

    def __call__(self, examples: Sequence[Example]) -> Batch:
        if not examples:
            raise AttnAuditError("cannot build a batch from no examples")
        sources, inputs, outputs = [], [], []
        truncated = 0
        with_target = [ex.target is not None for ex in examples]
        if any(with_target) and not all(with_target):
            raise AttnAuditError("a seq2seq batch mixes examples with and without a target")
        for ex in examples:
            if not ex.tokens:
                raise InputError(str(ex.meta.get("source", "<example>")), "example has no source words")
            ids, cut = self._cut(self.source.encode(ex.tokens)[0])
            truncated += cut
            sources.append(ids + [EOS_ID])
            if ex.target is not None:
                target_ids, cut = self._cut(self.target.encode(ex.target)[0])
                truncated += cut
                inputs.append([BOS_ID] + target_ids)
                outputs.append(target_ids + [EOS_ID])
        tokens, mask = _pad(sources, PAD_ID)
        batch = Batch(tokens=tokens, mask=mask, examples=list(examples))
        if inputs:
            batch.target, batch.target_mask = _pad(inputs, PAD_ID)
            batch.labels, _ = _pad(outputs, IGNORE_INDEX)
        if truncated:
            warn(f"{truncated} sequence(s) in a batch of {len(examples)} exceeded max_len={self.max_len}; truncated")
        return batch
