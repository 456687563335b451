"""Integrated Gradients of a generated sequence's steps (a batch of prefixes of one sequence) from one pass of the longest
row per point of the path (:func:`~attnaudit.explain.helpers.gradients.prefix_integrated_gradients`) equals Captum's
IG of every row on its own, on tiny random decoders of three families, for both baselines and scores, with the explained
class given (a generated token) or the prediction's, and for the scale-weighted right Riemann sum."""

from __future__ import annotations

import pytest
import torch

from attnaudit.architectures import SENTENCES, build_tiny
from attnaudit.data.types import Batch
from attnaudit.explain.methods.ig import integrated_gradients
from attnaudit.models.hf import HFModel


def prefixes(model_type: str, explained: bool) -> tuple[HFModel, Batch, list[int]]:
    hf, tokenizer = build_tiny(model_type, "lm")
    model = HFModel(hf, tokenizer, "classification", model_type, trained_head=True)
    full = tokenizer(SENTENCES[0])["input_ids"]
    lengths = [len(full) - 2, len(full), len(full) - 1]
    tokens = torch.full((len(lengths), len(full)), int(full[-1]))
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.tensor(full[:n])
    batch = Batch(tokens=tokens, mask=torch.arange(len(full))[None] < torch.tensor(lengths)[:, None], examples=[],
                  explained=torch.tensor([3, 5, 7]) if explained else None)
    return model, batch, lengths


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize(("baseline", "score", "explained", "rule", "weight"),
                         [("zero", "probability", True, "gausslegendre", "none"), ("unk", "logit", False, "gausslegendre", "none"),
                          ("zero", "logit", True, "riemann_right", "scale")])
def test_shared_prefix_ig_equals_each_rows_own(model_type: str, baseline: str, score: str, explained: bool, rule: str, weight: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch, lengths = prefixes(model_type, explained)
    passes: list[int] = []
    plain = model.prefix_gradient_forward
    monkeypatch.setattr(model, "prefix_gradient_forward", lambda b, embeddings=None: passes.append(1) or plain(b, embeddings))
    options = {"steps": 8, "reduction": "sum", "score": score, "baseline": baseline, "rule": rule, "weight": weight}
    shared = integrated_gradients(model, batch, **options)
    assert len(passes) == 8  # one pass of the longest row per step of the path
    monkeypatch.setattr(model, "prefix_gradient_forward", lambda b, embeddings=None: None)  # Captum, row by row
    own = integrated_gradients(model, batch, **options)
    assert shared.abs().max() > 0
    torch.testing.assert_close(shared, own, rtol=1e-4, atol=1e-7)
    assert not shared[0, lengths[0]:].any()  # nothing beyond a row's own tokens
