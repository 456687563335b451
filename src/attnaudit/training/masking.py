"""Masked fine-tuning's inputs (Madsen et al. 2024, "Faithfulness measurable masked language models").

A model fine-tuned on batches of which half are masked sees masked inputs in training, so the inputs an
erasure-based faithfulness measure makes (tokens replaced by the mask token) are in distribution
(:mod:`attnaudit.algorithms.masf` tests that they are). Each batch: a random half of its rows stays as it is;
each row of the other half draws a ratio ``r ~ U[0, 1)`` and masks each of its maskable tokens (real, not a
special token) with probability ``r``, as the authors' ``RandomMaxMasking`` does.

The draws are seeded by the run's seed and the batch's own token ids, so a resumed fine-tune masks every batch
as the uninterrupted one did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace

import torch

from attnaudit.data.types import Batch

MASKED_SHARE = 0.5
"""The share of each batch's rows that are masked (the rest are seen as they are)."""


def batch_generator(seed: int, tokens: torch.Tensor) -> torch.Generator:
    """A generator seeded by ``seed`` and the batch's token ids (the same batch, the same draws)."""
    digest = hashlib.sha256(tokens.detach().cpu().numpy().tobytes()).digest()
    return torch.Generator().manual_seed((seed * 1_000_003 + int.from_bytes(digest[:8], "little")) % 2**63)


def mask_batch(batch: Batch, mask_id: int, kept_ids: Iterable[int], seed: int) -> Batch:
    """``batch`` with a random :data:`MASKED_SHARE` of its rows masked at a per-row ratio drawn from U[0, 1)
    (tokens in ``kept_ids``, the special tokens, and padding are never masked); the rows' ``masked`` ratios
    are not kept: the model learns from the inputs alone. ``batch`` itself is not changed."""
    tokens = batch.tokens
    generator = batch_generator(seed, tokens)
    rows = tokens.shape[0]
    chosen = torch.randperm(rows, generator=generator)[: int(rows * MASKED_SHARE)]
    ratio = torch.zeros(rows)
    ratio[chosen] = torch.rand(len(chosen), generator=generator)
    draws = torch.rand(tokens.shape, generator=generator)
    kept = torch.tensor(sorted(set(kept_ids)), dtype=tokens.dtype)
    maskable = batch.mask.bool().cpu() & ~torch.isin(tokens.cpu(), kept)
    masked = maskable & (draws < ratio[:, None])
    return replace(batch, tokens=tokens.masked_fill(masked.to(tokens.device), mask_id))
