"""A tiny stand-in for ``../shared/data``: every named dataset in its real file format, a few
dozen rows each, generated from a seed (no third-party text). Documented commands that name
real datasets run on it in seconds (tests/reliability/test_documented_commands.py).
"""

from __future__ import annotations

import csv
import gzip
import random
from pathlib import Path

POSITIVE = ["good", "great", "fine", "lovely", "superb", "best"]
NEGATIVE = ["bad", "awful", "poor", "dull", "worst", "weak"]
FILLER = ["the", "film", "a", "story", "with", "acting", "and", "plot", "is", "very", "this", "cast", "music", "of"]


def _sentence(rng: random.Random, label: int, length: int = 8) -> list[str]:
    """Filler words plus one or two polar words of the label's side."""
    words = [rng.choice(FILLER) for _ in range(length)]
    for _ in range(rng.randint(1, 2)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
    return words


def _labelled(rng: random.Random, n: int) -> list[tuple[list[str], int]]:
    return [(_sentence(rng, i % 2), i % 2) for i in range(n)]


def _sst(root: Path, rng: random.Random) -> None:
    (root / "sst" / "trees").mkdir(parents=True)
    with (root / "sst" / "sst_dataset.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label", "exp_split"])
        for split, n in (("train", 60), ("dev", 16), ("test", 16)):
            for words, label in _labelled(rng, n):
                writer.writerow([" ".join(words), label, split])
    for split, n in (("train", 40), ("dev", 12), ("test", 12)):
        lines = []
        for words, label in _labelled(rng, n):
            leaves = " ".join(f"({4 if w in POSITIVE else 0 if w in NEGATIVE else 2} {w})" for w in words)
            lines.append(f"({4 if label else 0} {leaves})")
        (root / "sst" / "trees" / f"{split}.txt").write_text("\n".join(lines) + "\n")


def _sst2(root: Path, rng: random.Random) -> None:
    (root / "sst2").mkdir()
    for split, n in (("train", 80), ("dev", 8)):
        rows = ["sentence\tlabel"] + [f"{' '.join(w)}\t{label}" for w, label in _labelled(rng, n)]
        (root / "sst2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")


def _conll(root: Path, rng: random.Random) -> None:
    (root / "conll2000").mkdir()
    chunks = [("the", "DT", "NP"), ("film", "NN", "NP"), ("is", "VBZ", "VP"), ("in", "IN", "PP"), ("good", "JJ", "ADJP")]
    for split, n in (("train", 50), ("test", 12)):
        sentences = []
        for _ in range(n):
            lines, previous = [], None
            for _ in range(rng.randint(4, 9)):
                word, pos, chunk = rng.choice(chunks)
                tag = f"I-{chunk}" if previous == chunk else f"B-{chunk}"
                lines.append(f"{word} {pos} {tag}")
                previous = chunk
            sentences.append("\n".join(lines))
        with gzip.open(root / "conll2000" / f"{split}.txt.gz", "wt") as fh:
            fh.write("\n\n".join(sentences) + "\n\n")


def _agnews(root: Path, rng: random.Random) -> None:
    (root / "ag_news").mkdir()
    (root / "ag_news" / "classes.txt").write_text("World\nSports\nBusiness\nSci/Tech\n")
    topics = [["war", "state"], ["match", "goal"], ["market", "stock"], ["chip", "space"]]
    with (root / "ag_news" / "test.csv").open("w", newline="") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        for i in range(80):
            topic = i % 4
            title = " ".join(rng.choice(topics[topic]) for _ in range(3))
            body = " ".join([rng.choice(FILLER) for _ in range(6)] + [rng.choice(topics[topic])]) + ". " + " ".join(
                [rng.choice(FILLER) for _ in range(5)] + [rng.choice(topics[topic])]
            ) + "."
            writer.writerow([topic + 1, title, body])


def _snli(root: Path, rng: random.Random) -> None:
    (root / "snli").mkdir()
    labels = ["entailment", "neutral", "contradiction"]
    for split, n in (("dev", 60), ("test", 15)):
        s1, s2, gold = [], [], []
        for i in range(n):
            premise = _sentence(rng, i % 2, 6)
            s1.append(" ".join(premise))
            s2.append(" ".join(premise[:3] + [labels[i % 3]]))
            gold.append(labels[i % 3])
        for stem, lines in (("s1", s1), ("s2", s2), ("labels", gold)):
            (root / "snli" / f"{stem}.{split}").write_text("\n".join(lines) + "\n")


def _babi(root: Path, rng: random.Random) -> None:
    folder = root / "babi" / "en"
    folder.mkdir(parents=True)
    people, places = ["Mary", "John", "Sandra"], ["kitchen", "garden", "hallway"]
    stems = ["qa1_single-supporting-fact", "qa2_two-supporting-facts", "qa3_three-supporting-facts"]
    for stem in stems:
        for split, stories in (("train", 30), ("test", 8)):
            lines = []
            for _ in range(stories):
                where = {}
                for number in range(1, 4):
                    person, place = rng.choice(people), rng.choice(places)
                    where[person] = (place, number)
                    lines.append(f"{number} {person} went to the {place}.")
                person = rng.choice(sorted(where))
                lines.append(f"4 Where is {person}? \t{where[person][0]}\t{where[person][1]}")
            (folder / f"{stem}_{split}.txt").write_text("\n".join(lines) + "\n")


def _europarl(root: Path, rng: random.Random) -> None:
    de_en = {"das": "the", "haus": "house", "ist": "is", "gross": "big", "klein": "small", "ein": "a", "hund": "dog"}
    words = sorted(de_en)
    folder = root / "europarl-deen-20k"
    folder.mkdir()
    gold = root / "deen-alignment" / "DeEn"
    gold.mkdir(parents=True)
    for split, n in (("train", 60), ("validation", 10), ("test", 10), ("gold", 8)):
        pairs = []
        for _ in range(n):
            de = [rng.choice(words) for _ in range(rng.randint(3, 6))]
            pairs.append((de, [de_en[w] for w in de]))
        if split == "gold":
            (gold / "de").write_text("\n".join(" ".join(d) for d, _ in pairs) + "\n", encoding="latin-1")
            (gold / "en").write_text("\n".join(" ".join(e) for _, e in pairs) + "\n")
            links = ["".join(f"{i}-{i} " for i in range(1, len(d) + 1)) for d, _ in pairs]
            (gold / "alignmentDeEn.talp").write_text("\n".join(links) + "\n")
        else:
            (folder / f"{split}.de").write_text("\n".join(" ".join(d).capitalize() + " ." for d, _ in pairs) + "\n")
            (folder / f"{split}.en").write_text("\n".join(" ".join(e).capitalize() + " ." for _, e in pairs) + "\n")


def make_fake_data(root: Path, seed: int = 0) -> Path:
    """Write the tiny data directory under ``root`` (created) and return it."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for build in (_sst, _sst2, _conll, _agnews, _snli, _babi, _europarl):
        build(root, rng)
    return root
