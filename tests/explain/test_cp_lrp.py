"""CP-LRP is conservative: on models without biases and without additive position embeddings the
token relevances add up to the explained logit (float64: to 1e-10 relative, 1e-6 where HF's RMSNorm
rounds to float32; float32: 1e-4).

Our Transformer (biases zeroed, sinusoidal positions zeroed) and a tiny random Llama causal LM
(no biases by construction; RoPE rotates queries and keys, which CP-LRP holds constant) each
explain their prediction; AttnLRP on the same models is not conservative (the softmax rule gives
part of the relevance to the softmax's bias term), which the last test shows.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnaudit.data.types import Batch
from attnaudit.explain.helpers.lrp import lrp_relevance
from attnaudit.explain.methods.cp_lrp import cp_lrp
from attnaudit.hf import HFCollator
from attnaudit.models.hf import HFModel
from attnaudit.models.interface import ModelConfig
from attnaudit.models.transformer import TransformerClassifier
from tests.models.test_hf_decoder import build, tokenizer


def bias_free_transformer() -> tuple[TransformerClassifier, Batch]:
    torch.manual_seed(5)
    config = ModelConfig(model="transformer", task_type="classification", vocab_size=25, num_labels=3,
                         embed_dim=16, d_model=16, d_ff=32, heads=4, layers=3, dropout=0.0)
    model = TransformerClassifier(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
        model.positions.zero_()
    tokens = torch.randint(1, 25, (4, 8), generator=torch.Generator().manual_seed(0))
    tokens[2, 5:] = 0
    return model, Batch(tokens=tokens, mask=tokens != 0, examples=[])


def tiny_llama(tiny_hf: SimpleNamespace) -> tuple[HFModel, Batch]:
    hf = build("llama", len(tiny_hf.vocab), lm=True, seed=2).double()
    tok = tokenizer(tiny_hf.vocab)
    model = HFModel(hf, tok, "classification", "llama", trained_head=True).eval()
    batch = HFCollator(tok, ["neg", "pos"], "classification", 64, token_types=False)(tiny_hf.task().test)
    return model, batch


def predicted_logit(model, batch: Batch) -> torch.Tensor:
    with torch.no_grad():
        return model(batch).logits.max(-1).values


def test_transformer_relevances_add_up_to_the_logit() -> None:
    model, batch = bias_free_transformer()
    relevance = cp_lrp(model, batch)
    assert not batch.mask.all() and (relevance[~batch.mask] == 0).all()
    torch.testing.assert_close(relevance.sum(1), predicted_logit(model, batch), rtol=1e-10, atol=0)


def test_llama_relevances_add_up_to_the_next_token_logit(tiny_hf: SimpleNamespace) -> None:
    model, batch = tiny_llama(tiny_hf)
    assert all(m.bias is None for m in model.hf.modules() if isinstance(m, torch.nn.Linear))
    relevance = cp_lrp(model, batch)
    # 1e-6, not 1e-10: HF's RMSNorm computes in float32 even in a float64 model (the rules' norm does not)
    torch.testing.assert_close(relevance.sum(1), predicted_logit(model, batch), rtol=1e-6, atol=0)


def test_in_float32_the_sum_holds_to_rounding(tiny_hf: SimpleNamespace) -> None:
    model, batch = tiny_llama(tiny_hf)
    model = model.float()
    torch.testing.assert_close(cp_lrp(model, batch).sum(1), predicted_logit(model, batch), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which", ["transformer", "llama"])
def test_attnlrp_on_the_same_models_is_not_conservative(which: str, tiny_hf: SimpleNamespace) -> None:
    model, batch = bias_free_transformer() if which == "transformer" else tiny_llama(tiny_hf)
    gap = lrp_relevance(model, batch, "attnlrp").sum(1) - predicted_logit(model, batch)
    assert gap.abs().max() > 1e-3
