"""Lean passes (:attr:`attnaudit.models.hf.attention.Capture.lean`): a pass read for its logits or their gradient alone
runs transformers' SDPA function in every layer that allows it (no ``(B,H,Q,K)`` weights made), detached weights as
detached queries and keys, and long passes recompute each block in the backward pass. On tiny random decoders of four
families, with padding: the logits and input gradients equal the full eager pass's, with the weights live and detached,
checkpointed or not."""

from __future__ import annotations

import pytest
import torch

from attnaudit.architectures import SENTENCES, build_tiny
from attnaudit.data.types import Batch
from attnaudit.models.hf import HFModel, passes
from attnaudit.models.hf import attention as hf_attention
from attnaudit.models.interface import detach_weights, evaluation

FAMILIES = ("llama", "gpt2", "qwen2", "gemma")


def tiny(model_type: str) -> tuple[HFModel, Batch]:
    hf, tokenizer = build_tiny(model_type, "lm")
    model = HFModel(hf, tokenizer, "classification", model_type, trained_head=True)
    encoded = tokenizer(list(SENTENCES), padding=True, return_tensors="pt")
    return model, Batch(tokens=encoded["input_ids"], mask=encoded["attention_mask"].bool(), examples=[])


def gradient(model: HFModel, batch: Batch, detach: bool, lean: bool) -> tuple[torch.Tensor, torch.Tensor]:
    interventions = [detach_weights()] if detach else []
    with evaluation(model), torch.enable_grad():
        embeddings = model.embed(batch).detach().requires_grad_(True)
        if lean:
            logits = model.logits_forward(batch, interventions, embeddings=embeddings).logits
        else:
            logits = model.decode(model.encode(batch, embeddings), interventions, keep_layers=()).logits
        (grad,) = torch.autograd.grad(logits.max(-1).values.sum(), embeddings)
    return logits.detach(), grad


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_a_lean_pass_gives_the_full_pass_logits_and_gradients(model_type: str, detach: bool, recompute: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch = tiny(model_type)
    reference = gradient(model, batch, detach, lean=False)
    fused: list[int] = []
    plain_sdpa = hf_attention.sdpa_attention_forward

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        fused.append(1)
        return plain_sdpa(*args, **kwargs)

    monkeypatch.setattr(hf_attention, "sdpa_attention_forward", counted)
    monkeypatch.setattr(passes, "CHECKPOINT_TOKENS", 1 if recompute else 10**9)
    logits, grad = gradient(model, batch, detach, lean=True)
    layers = model.num_attention_layers
    # every layer fused in the forward; recomputed blocks (all but the last) run it again in the backward pass
    assert len(fused) == (2 * layers - 1 if recompute else layers)
    torch.testing.assert_close(logits, reference[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, reference[1], rtol=1e-4, atol=1e-6)
    if detach:  # the detached weights change the gradient: the test tells the two apart
        assert not torch.allclose(grad, gradient(model, batch, False, lean=True)[1], atol=1e-6)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_prefix_rows_share_one_pass(model_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of prefixes of one sequence (a generated sequence's steps) runs its longest row once: the logits and every
    layer's explanation row equal the batch's own row-only pass."""
    model, batch = tiny(model_type)
    full = batch.tokens[0][batch.mask[0]].tolist()
    lengths = [len(full) - 3, len(full) - 1, len(full) - 2, len(full)]
    tokens = torch.full((len(lengths), len(full)), int(batch.tokens[1, -1]))
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.tensor(full[:n])
    prefixes = Batch(tokens=tokens, mask=torch.arange(len(full))[None] < torch.tensor(lengths)[:, None], examples=[])
    batches: list[int] = []
    plain_encode = model.encode
    monkeypatch.setattr(model, "encode", lambda b, *a, **k: batches.append(len(b)) or plain_encode(b, *a, **k))
    with evaluation(model), torch.no_grad():
        shared = model.rows_forward(prefixes)
        own = model.decode(plain_encode(prefixes), rows_only=True)
    assert batches == [1]
    torch.testing.assert_close(shared.logits, own.logits, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(shared.trace.layers, own.trace.layers):
        torch.testing.assert_close(mine.weights, theirs.weights, rtol=1e-5, atol=1e-6)
    prefixes.tokens[0, 1] += 1  # no longer a prefix: the batch runs as it is
    with evaluation(model), torch.no_grad():
        model.rows_forward(prefixes)
    assert batches == [1, len(lengths)]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_prefix_rows_share_one_gradient_pass(model_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``input_gradient``'s gradient of a batch of prefixes (a generated sequence's steps) from one pass over the longest
    row and a batched backward equals each row's own gradient, and is 0 beyond each row's tokens."""
    from attnaudit.explain.helpers.gradients import decision_gradient

    model, batch = tiny(model_type)
    full = batch.tokens[0][batch.mask[0]].tolist()
    lengths = [len(full) - 2, len(full), len(full) - 1]
    tokens = torch.full((len(lengths), len(full)), int(batch.tokens[1, -1]))
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.tensor(full[:n])
    prefixes = Batch(tokens=tokens, mask=torch.arange(len(full))[None] < torch.tensor(lengths)[:, None], examples=[],
                     explained=torch.tensor([3, 5, 7]))
    with torch.enable_grad():
        assert model.prefix_gradient_forward(prefixes) is not None  # the shared pass is the one taken below
    for score in ("logit", "probability"):
        _, shared = decision_gradient(model, prefixes, score)
        monkeypatch.setattr(model, "prefix_gradient_forward", lambda b: None)  # each row its own pass
        _, own = decision_gradient(model, prefixes, score)
        monkeypatch.undo()
        torch.testing.assert_close(shared, own * prefixes.mask[..., None], rtol=1e-4, atol=1e-7)
        assert not shared[0, lengths[0]:].any()
