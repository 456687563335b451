"""Freed memory goes back to the system before a long pass and each of its blocks (:mod:`attnaudit.models.hf.memory`):
only passes over ``CHECKPOINT_TOKENS`` positions or more pay for the heap walk, and the results do not change."""

from __future__ import annotations

import ctypes.util
import platform

import pytest
import torch

from attnaudit.architectures import SENTENCES, build_tiny
from attnaudit.data.types import Batch
from attnaudit.models.hf import HFModel, passes
from attnaudit.models.hf import memory as hf_memory
from attnaudit.models.hf import model as hf_model
from attnaudit.models.interface import evaluation


def test_release_says_whether_the_c_library_could() -> None:
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c") is not None
    assert hf_memory.release_freed_memory() is glibc


def test_only_long_passes_release_and_logits_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    hf, tokenizer = build_tiny("llama", "lm")
    model = HFModel(hf, tokenizer, "classification", "llama", trained_head=True)
    encoded = tokenizer(list(SENTENCES), padding=True, return_tensors="pt")
    batch = Batch(tokens=encoded["input_ids"], mask=encoded["attention_mask"].bool(), examples=[])
    with evaluation(model), torch.no_grad():
        short = model.logits_forward(batch).logits
    calls: list[str] = []
    for module in (hf_model, passes):
        monkeypatch.setattr(module, "release_freed_memory", lambda where=module.__name__: calls.append(where) or True)
    with evaluation(model), torch.no_grad():
        model.logits_forward(batch)
        assert calls == []  # shorter than CHECKPOINT_TOKENS: no heap walk
        for module in (hf_model, passes):
            monkeypatch.setattr(module, "CHECKPOINT_TOKENS", batch.tokens.shape[1])
        long = model.logits_forward(batch).logits
    # once before the pass, then before each block
    assert calls == [hf_model.__name__] + [passes.__name__] * len(model.structure.blocks)
    torch.testing.assert_close(long, short, rtol=0, atol=0)
