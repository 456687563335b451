"""Leave-one-out on causal decoders by continuing from the kept keys and values.

The fast route (:func:`attnaudit.explain.methods.loo._loo_decoder`) reruns only the tokens after the
removed one, reading the full pass's keys/values of the tokens before it
(:class:`~attnaudit.models.hf.attention.KeyValuePrefix`). It is checked against the slow
reference written here: the token removed from the prompt and the whole prompt rerun, one
deletion at a time. Tiny random Llama (4 query heads sharing 2 key/value heads) and Qwen2
(1 key/value head) causal LMs, built here, are zero-shot classifiers over the tiny vocabulary.
Tolerance 1e-6 on probabilities: the same float32 operations, summed over differently padded keys.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnaudit.algorithms.metrics import output_change
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain import item_mask
from attnaudit.explain.methods import loo
from attnaudit.explain.methods.loo import _loo_decoder, _loo_method, loo_importance
from attnaudit.models.hf import HFModel, ZeroShotCollator, make_zero_shot
from attnaudit.models.interface import Cache
from tests.models.test_hf_decoder import build, tokenizer

VERBALIZER = {"neg": "bad", "pos": "good"}
PROMPTS = ["a dog runs , {text} was", "the {text}"]  # the second ends on a text token: removing it reruns the one before


def zero_shot(family: str, vocab: list[str], prompt: str) -> tuple[HFModel, ZeroShotCollator]:
    tok = tokenizer(vocab)
    model = HFModel(build(family, len(vocab), lm=True, seed=3), tok, "classification", family, trained_head=False).eval()
    make_zero_shot(model, prompt, VERBALIZER, ["neg", "pos"])
    return model, ZeroShotCollator(prompt, tok, ["neg", "pos"], 64)


def slow_loo(model: HFModel, batch: Batch) -> torch.Tensor:
    """Each item removed from the token sequence and the whole sequence rerun alone (NaN for a one-item text)."""
    mask = item_mask(model, batch)
    out = torch.zeros(mask.shape)
    with torch.no_grad():
        for b in range(len(batch)):
            ids = batch.tokens[b][batch.mask[b]]
            full = model(Batch(tokens=ids[None], mask=torch.ones(1, len(ids), dtype=torch.bool))).probs
            for i in mask[b].nonzero()[:, 0].tolist():
                kept = torch.cat([ids[:i], ids[i + 1 :]])[None]
                probs = model(Batch(tokens=kept, mask=torch.ones_like(kept, dtype=torch.bool))).probs
                out[b, i] = output_change(probs, full)[0] if mask[b].sum() > 1 else float("nan")
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("pass_tokens", [512, 8])
def test_prefix_loo_equals_full_recomputation(
    family: str, prompt: str, pass_tokens: int, tiny_hf: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pass for every deletion, or (8 tokens a pass) many passes of a few rows each."""
    monkeypatch.setattr(loo, "_PASS_TOKENS", pass_tokens)
    model, collate = zero_shot(family, tiny_hf.vocab, prompt)
    batch = collate(tiny_hf.task().test)
    assert _loo_method(model) is _loo_decoder
    fast = loo_importance(model, batch)
    reference = slow_loo(model, batch)
    mask = item_mask(model, batch)
    assert mask.sum() > 20 and torch.all(fast[~mask] == 0)
    torch.testing.assert_close(fast[mask], reference[mask], rtol=0, atol=1e-6, equal_nan=True)
    assert reference[mask].nan_to_num().abs().max() > 1e-3  # deletions do move the prediction


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_continuation_logits_equal_the_whole_sequence(family: str, tiny_hf: SimpleNamespace) -> None:
    """For every split point p: the prefix [0, p) from the full trace + a decode of [p, n) = the full pass."""
    model, collate = zero_shot(family, tiny_hf.vocab, PROMPTS[0])
    batch = collate(tiny_hf.task().test)
    with torch.no_grad():
        output = model.decode(model.encode(batch))
        lengths = batch.mask.sum(1)
        for p in range(int(lengths.min())):
            rows = torch.arange(len(batch))
            rest_len = lengths - p
            steps = torch.arange(int(rest_len.max()))[None, :]
            valid = steps < rest_len[:, None]
            index = (p + steps).clamp_max(batch.tokens.shape[1] - 1).expand(len(batch), -1)
            tokens = batch.tokens.gather(1, index).masked_fill(~valid, 0)
            rest = model.encode(Batch(tokens=tokens, mask=valid))
            rest.extra["prefix"] = model.prefix_from(output.trace, rows, torch.full((len(batch),), p))
            torch.testing.assert_close(model.decode(rest).logits, output.logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "qwen2-window"])
def test_other_decoders_recompute(family: str, tiny_hf: SimpleNamespace) -> None:
    """Learned positions (GPT-2) or sliding windows cannot continue a prefix: full recomputation, and decode refuses."""
    model = HFModel(build(family, len(tiny_hf.vocab), lm=True), tokenizer(tiny_hf.vocab), "classification", family, False)
    assert not model.continues_prefix and _loo_method(model) is not _loo_decoder
    batch = Batch(tokens=torch.tensor([[4, 5, 6]]), mask=torch.ones(1, 3, dtype=torch.bool))
    with torch.no_grad():
        output = model.decode(model.encode(batch))
    if family == "gpt2":
        with pytest.raises(AttnAuditError, match="cannot continue"):
            prefix = model.prefix_from(output.trace, torch.tensor([0]), torch.tensor([1]))
            model.decode(Cache(states=model.embed(batch), mask=batch.mask, extra={"prefix": prefix}))
