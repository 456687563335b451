"""Masked fine-tuning (Madsen et al. 2024): half of each batch masked at a per-row ratio from U[0, 1)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.training.finetune import finetune
from attnaudit.training.masking import mask_batch

MASK, SPECIAL = 4, (0, 2, 3)


def batch(rows: int = 64, width: int = 40) -> Batch:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 100, (rows, width), generator=g)
    tokens[:, 0], tokens[:, -1] = 2, 3  # [CLS] ... [SEP]
    mask = torch.ones(rows, width, dtype=torch.bool)
    mask[::2, -5:] = False  # padded rows
    tokens[~mask] = 0
    return Batch(tokens=tokens, mask=mask)


def test_half_the_rows_stay_and_specials_and_padding_are_never_masked() -> None:
    original = batch()
    masked = mask_batch(original, MASK, SPECIAL, seed=0)
    changed = masked.tokens != original.tokens
    assert int(changed.any(1).sum()) <= 32 and torch.equal(original.tokens, batch().tokens)  # at most half; input untouched
    assert not changed[torch.isin(original.tokens, torch.tensor(SPECIAL))].any() and not changed[~original.mask].any()
    assert bool((masked.tokens[changed] == MASK).all())


def test_masked_ratios_are_uniform_on_average_and_draws_are_seeded_by_content() -> None:
    rows = 2000
    original = batch(rows, 60)
    changed = mask_batch(original, MASK, SPECIAL, seed=1).tokens != original.tokens
    maskable = original.mask & ~torch.isin(original.tokens, torch.tensor(SPECIAL))
    share = (changed.sum(1) / maskable.sum(1)).double()
    # a masked row's share is ~U[0, 1) (mean 1/2); half the rows are not masked: overall mean 1/4
    assert share.mean().item() == pytest.approx(0.25, abs=0.02)
    assert (share > 0).sum().item() == pytest.approx(rows / 2, abs=0.03 * rows)
    assert torch.equal(mask_batch(original, MASK, SPECIAL, seed=1).tokens, mask_batch(original, MASK, SPECIAL, seed=1).tokens)
    assert not torch.equal(mask_batch(original, MASK, SPECIAL, seed=2).tokens, mask_batch(original, MASK, SPECIAL, seed=1).tokens)


def test_finetune_with_masking_trains_on_masked_batches_and_records_it(tiny_hf: SimpleNamespace, tmp_path, monkeypatch) -> None:
    from attnaudit.training import masking

    seen: list[tuple[int, int]] = []

    def spy(batch: Batch, mask_id: int, kept: list[int], seed: int) -> Batch:
        seen.append((mask_id, seed))
        return real(batch, mask_id, kept, seed)

    real = masking.mask_batch
    monkeypatch.setattr(masking, "mask_batch", spy)
    finetune(tiny_hf.task(), tmp_path / "masked", hf=str(tiny_hf.dir), epochs=1, batch_size=4, masking=True, seed=3, device="cpu")
    assert seen == [(tiny_hf.tokenizer().mask_token_id, 3)] * 2  # 8 examples, batches of 4
    assert json.loads((tmp_path / "masked" / "config.json").read_text())["finetune"]["masking"] is True
    finetune(tiny_hf.task(), tmp_path / "plain", hf=str(tiny_hf.dir), epochs=1, batch_size=4, device="cpu")
    assert len(seen) == 2 and "masking" not in json.loads((tmp_path / "plain" / "config.json").read_text())["finetune"]


def test_masking_without_a_mask_token_is_one_line(tmp_path) -> None:
    from tests.conftest import HF_VOCAB
    from tests.models.test_hf_decoder import save_llama_lm

    folder = save_llama_lm(tmp_path / "lm", HF_VOCAB)
    with pytest.raises(AttnAuditError, match="--masking replaces tokens by the mask token; this model's tokenizer has none"):
        finetune("synthetic", tmp_path / "out", hf=str(folder), epochs=1, limit=8, masking=True, device="cpu")
