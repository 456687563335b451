"""Our ``ig`` and ``input_gradient`` on a zero-shot decoder equal Captum run on HF's model directly.

The same check as ``benchmarks/bench_llm_captum.py`` (whose peer functions are used: Captum's
``LayerIntegratedGradients`` on the embedding layer of a plain eager copy of the HF model, with
an extra all-zero embedding row as the zero baseline, and ``Saliency(abs=False)``), on a tiny
random Llama causal LM (grouped-query attention) classifying a padded batch zero-shot.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnaudit.explain import item_mask
from attnaudit.explain.methods.ig import integrated_gradients
from attnaudit.explain.methods.input_gradient import input_gradient
from attnaudit.hf import load_hf
from tests.models.test_hf_decoder import build, tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks` is a folder of the checkout

from benchmarks.bench_llm_captum import TOLERANCE, compare, difference, peer_model  # noqa: E402


@pytest.fixture(scope="module")
def zero_shot(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("llama-lm")
    build("llama", len(tiny_hf.vocab), lm=True).save_pretrained(folder, safe_serialization=True)
    tokenizer(tiny_hf.vocab).save_pretrained(folder)
    run = load_hf(folder, task=tiny_hf.task(), prompt="the {text} was", verbalizer={"neg": "bad", "pos": "good"}, device="cpu")
    batch = run.collate(tiny_hf.task().test)
    assert not batch.mask.all()  # padded: the last real token differs per row
    return SimpleNamespace(run=run, batch=batch)


def test_zero_row_baseline_leaves_the_forward_unchanged(zero_shot: SimpleNamespace) -> None:
    peer, zero_id = peer_model(zero_shot.run.model.hf)
    batch = zero_shot.batch
    with torch.no_grad():
        theirs = peer(input_ids=batch.tokens, attention_mask=batch.mask.long()).logits
        ours = zero_shot.run.model.hf(input_ids=batch.tokens, attention_mask=batch.mask.long()).logits
        assert not peer.get_input_embeddings().weight[zero_id].any()
    torch.testing.assert_close(theirs[..., :zero_id], ours, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["ig", "input_gradient"])
def test_ours_equals_captum_on_the_hf_model(zero_shot: SimpleNamespace, method: str) -> None:
    fns = compare(zero_shot.run, zero_shot.batch, steps=20)
    name = "" if method == "ig" else "_input_gradient"
    ours, theirs = fns[f"ours{name}"](), fns[f"peer{name}"]()
    items = item_mask(zero_shot.run, zero_shot.batch)
    assert not torch.equal(items, zero_shot.batch.mask.bool())  # the template is not ranked
    result = difference(ours, theirs, items)
    assert result["max_abs_attribution"] > 0 and result["agree"], result
    assert result["max_abs_diff"] <= TOLERANCE * result["max_abs_attribution"]
    assert torch.all(ours[~items] == 0)


def test_ig_steps_matter_on_both_sides(zero_shot: SimpleNamespace) -> None:
    """Few steps against many differ on both sides alike: the comparison is sensitive to the step count."""
    run, batch = zero_shot.run, zero_shot.batch
    coarse, fine = integrated_gradients(run, batch, steps=2), integrated_gradients(run, batch, steps=40)
    peer = compare(run, batch, steps=2)["peer"]()
    assert difference(coarse, peer, item_mask(zero_shot.run, batch))["agree"]
    assert not torch.allclose(coarse, fine, rtol=0, atol=TOLERANCE * float(fine.abs().max()))
    assert input_gradient(run, batch).shape == batch.tokens.shape
