"""The model's own cached continuation and one teacher-forced pass against per-step passes through the interface."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnaudit.architectures import save_tiny
from attnaudit.explain.generation import encode_exactly, step_batches
from attnaudit.hf import load_hf
from attnaudit.models.interface import evaluation


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5", "bart"])
def test_continuation_and_forced_pass_equal_the_interface_steps(family: str, tmp_path: Path) -> None:
    model = load_hf(str(save_tiny(family, tmp_path / family, seed=0)), device="cpu").model
    source = encode_exactly(model.tokenizer, "the film was very good")
    ids, probs = model.continuation(source, 4)
    decision = type(model).forced_decision if model.kind == "encoder-decoder" else type(model).next_token_decision
    with decision(model), evaluation(model), torch.no_grad():
        reference = torch.cat([model(batch).probs.float() for batch in step_batches(model, source, ids)])
    assert reference.argmax(-1).tolist() == ids
    torch.testing.assert_close(probs, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.forced_distributions(source, ids), reference, atol=1e-5, rtol=0)


def test_sampling_is_seeded(tmp_path: Path) -> None:
    model = load_hf(str(save_tiny("llama", tmp_path / "llama", seed=0)), device="cpu").model
    source = encode_exactly(model.tokenizer, "the film was")
    first = model.continuation(source, 6, sample=True, seed=3)
    assert model.continuation(source, 6, sample=True, seed=3)[0] == first[0]
    draws = {tuple(model.continuation(source, 6, sample=True, seed=s)[0]) for s in range(6)}
    assert len(draws) > 1
