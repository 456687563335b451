"""Synthetic tasks with a known rationale: the ground truth attention should find.

Both generators are deterministic functions of their seed (a private ``random.Random``),
so a run can be repeated exactly and the rationale checked token by token.
"""

from __future__ import annotations

import random

from attnaudit.data.types import Example, TaskData
from attnaudit.errors import AttnAuditError


def _filler(count: int) -> list[str]:
    return [f"w{i:03d}" for i in range(count)]


def make_classification(
    n: int,
    seed: int,
    vocab_size: int = 200,
    min_len: int = 8,
    max_len: int = 30,
    signal_words: int = 5,
    max_signal: int = 3,
) -> list[Example]:
    """A binary task decided by planted signal words among filler words.

    Each polarity has ``signal_words`` words (``pos0``.., ``neg0``..). An example gets
    1..``max_signal`` words of its own polarity and strictly fewer of the other, so the
    label ("positive"/"negative") is the majority polarity and there are no ties. The
    remaining positions are uniform filler words (``vocab_size`` words in all).
    ``rationale`` is the sorted positions of all signal words; ``meta["signal_counts"]``
    is ``(n_positive, n_negative)``.
    """
    fillers = _filler(vocab_size - 2 * signal_words)
    if len(fillers) < 1 or not 2 * max_signal - 1 <= min_len <= max_len or max_signal < 1:
        raise AttnAuditError(
            "synthetic classification needs vocab_size > 2*signal_words, "
            "max_signal >= 1 and 2*max_signal-1 <= min_len <= max_len"
        )
    signal = {
        "positive": [f"pos{i}" for i in range(signal_words)],
        "negative": [f"neg{i}" for i in range(signal_words)],
    }
    rng = random.Random(seed)
    examples = []
    for index in range(n):
        length = rng.randint(min_len, max_len)
        label = rng.choice(("negative", "positive"))
        other = "negative" if label == "positive" else "positive"
        n_major = rng.randint(1, max_signal)
        n_minor = rng.randint(0, n_major - 1)
        tokens = [rng.choice(fillers) for _ in range(length)]
        positions = sorted(rng.sample(range(length), n_major + n_minor))
        kinds = [label] * n_major + [other] * n_minor
        rng.shuffle(kinds)
        for pos, kind in zip(positions, kinds):
            tokens[pos] = rng.choice(signal[kind])
        counts = (kinds.count("positive"), kinds.count("negative"))
        examples.append(
            Example(
                tokens=tokens,
                label=label,
                rationale=positions,
                meta={
                    "source": f"synthetic-classification(seed={seed}):{index + 1}",
                    "signal_counts": counts,
                },
            )
        )
    return examples


def make_tagging(
    n: int,
    seed: int,
    vocab_size: int = 100,
    min_len: int = 8,
    max_len: int = 30,
    classes: tuple[str, ...] = ("A", "B", "C"),
    markers_per_class: int = 2,
    max_markers: int = 3,
    min_gap: int = 4,
    span: int | None = 3,
) -> list[Example]:
    """A tagging task where a token's tag is set by an earlier token (its chunk's marker).

    Marker words (``mA0``, ``mA1``, ``mB0``...) each belong to a class. A marker is tagged
    ``B-<class>`` and the next ``span`` tokens ``I-<class>`` (the chunk stops early at the
    next marker); all other tokens are ``O``, so the tags form chunks seqeval can score.
    ``span=None`` lets a chunk run to the next marker. The default bounded span keeps the
    task learnable by a 1-layer Transformer with either learned or sinusoidal positions
    (unbounded chunks need "most recent marker" attention, which it learns only to
    ~0.9 chunk F1). Each sentence has 1..``max_markers`` markers, ``min_gap`` apart.

    ``meta["rationale_per_token"][i]`` is the position of the marker deciding tag ``i``
    (itself for a marker, -1 for ``O`` tokens, which no single token decides);
    ``rationale`` is the marker positions.
    """
    fillers = _filler(vocab_size - len(classes) * markers_per_class)
    if len(fillers) < 1 or not 1 <= min_len <= max_len or max_markers < 1 or min_gap < 1:
        raise AttnAuditError(
            "synthetic tagging needs vocab_size > classes*markers_per_class, "
            "1 <= min_len <= max_len, max_markers >= 1 and min_gap >= 1"
        )
    markers = {c: [f"m{c}{i}" for i in range(markers_per_class)] for c in classes}
    rng = random.Random(seed)
    examples = []
    for index in range(n):
        length = rng.randint(min_len, max_len)
        count = rng.randint(1, min(max_markers, 1 + (length - 1) // min_gap))
        # Positions at least min_gap apart: sample from the shrunken range, then spread.
        slots = sorted(rng.sample(range(length - (count - 1) * (min_gap - 1)), count))
        positions = [slot + k * (min_gap - 1) for k, slot in enumerate(slots)]
        tokens = [rng.choice(fillers) for _ in range(length)]
        tags = ["O"] * length
        source = [-1] * length
        for k, pos in enumerate(positions):
            cls = rng.choice(classes)
            tokens[pos] = rng.choice(markers[cls])
            end = positions[k + 1] if k + 1 < count else length
            if span is not None:
                end = min(end, pos + 1 + span)
            tags[pos:end] = [f"B-{cls}"] + [f"I-{cls}"] * (end - pos - 1)
            source[pos:end] = [pos] * (end - pos)
        examples.append(
            Example(
                tokens=tokens,
                tags=tags,
                rationale=positions,
                meta={
                    "source": f"synthetic-tagging(seed={seed}):{index + 1}",
                    "rationale_per_token": source,
                },
            )
        )
    return examples


def synthetic_task(
    kind: str, seed: int, n_train: int = 2000, n_dev: int = 300, n_test: int = 300
) -> TaskData:
    """A synthetic ``classification`` or ``tagging`` task; splits come from one seeded stream."""
    total = n_train + n_dev + n_test
    if kind == "classification":
        examples = make_classification(total, seed)
        name, task_type = "synthetic", "classification"
        labels = ["negative", "positive"]
        note = "synthetic: label = majority polarity of planted signal words; rationale = their positions"
    elif kind == "tagging":
        examples = make_tagging(total, seed)
        name, task_type = "synthetic-tagging", "tagging"
        labels = sorted(["O"] + [f"{p}-{c}" for c in ("A", "B", "C") for p in ("B", "I")])
        note = (
            "synthetic-tagging: a marker starts a chunk of its class covering it and the next "
            "3 tokens; rationale = marker positions"
        )
    else:
        raise AttnAuditError(f"unknown synthetic task {kind!r}; choose classification or tagging")
    return TaskData(
        name=name,
        task_type=task_type,  # type: ignore[arg-type]
        train=examples[:n_train],
        dev=examples[n_train : n_train + n_dev],
        test=examples[n_train + n_dev :],
        labels=labels,
        notes=[note, f"seed {seed}: {n_train}/{n_dev}/{n_test} examples"],
    )
