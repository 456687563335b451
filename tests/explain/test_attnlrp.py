"""AttnLRP (and CP-LRP) against relevance propagated rule by rule, written out here, on a one-layer Transformer.

The reference never takes a gradient: it runs the model's forward pass by hand (float64) and sends the
predicted logit's relevance back layer by layer with the paper's rules: the ε-rule (ε = 0) through every
linear map (biases, the position embeddings and the norms' β keep their shares), the identity rule through
GELU, LayerNorm as the linear map it is with its spread held fixed, the uniform rule splitting each
product ``Q Kᵀ``, ``A V`` half and half between its factors, and the softmax rule
``R_s = s ⊙ (R_A − A Σ R_A)`` (Achtibat et al. 2024, eqs. 7-13); CP-LRP gives all of ``A V``'s relevance
to ``V``. The method computes the same numbers as input × gradient on a modified backward pass, so both
agree to float64 rounding (1e-9 absolute).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import Tensor, nn

from attnaudit.data.types import Batch, Example
from attnaudit.explain.helpers.lrp import lrp_relevance
from attnaudit.explain.methods.attnlrp import attnlrp
from attnaudit.explain.methods.cp_lrp import cp_lrp
from attnaudit.models.interface import ModelConfig
from attnaudit.models.transformer import TransformerClassifier


def linear_rule(x: Tensor, layer: nn.Linear, relevance: Tensor) -> Tensor:
    """ε-rule (ε = 0): ``R_i = Σ_j x_i W_ji R_j / z_j``, ``z = W x + b``."""
    z = layer(x)
    return torch.einsum("...i,ji,...j->...i", x, layer.weight, relevance / z)


def norm_rule(u: Tensor, norm: nn.LayerNorm, relevance: Tensor) -> Tensor:
    """LayerNorm with its spread fixed is ``y = M u + β``, ``M_ji = γ_j (δ_ij − 1/d) / σ``: the ε-rule through M."""
    d = u.shape[-1]
    sigma = (u.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    centre = torch.eye(d, dtype=u.dtype) - 1.0 / d
    m = norm.weight[None, :, None] * centre[None] / sigma[..., None]  # (T, j, i)
    y = norm(u)
    return torch.einsum("ti,tji,tj->ti", u, m, relevance / y)


def share(part: Tensor, whole: Tensor, relevance: Tensor) -> Tensor:
    """A summand's share of a sum's relevance (ε-rule through addition)."""
    return part / whole * relevance


def reference(model: TransformerClassifier, tokens: Tensor, rule: str) -> Tensor:
    """Per-token relevance ``(T,)`` of one unpadded sequence, propagated by hand (one-layer model)."""
    block, heads = model.layers[0], model.config.heads
    e = model.embedding(tokens)
    ln = model.embed_norm(e)
    x0 = ln + model.positions[: len(tokens)]
    q, k, v = (block.q_proj(x0), block.k_proj(x0), block.v_proj(x0))
    t, d = x0.shape
    dh = d // heads
    qh, kh, vh = (z.view(t, heads, dh).transpose(0, 1) for z in (q, k, v))
    s = qh @ kh.transpose(1, 2) / math.sqrt(dh)
    a = s.softmax(-1)
    o = a @ vh
    att = block.out_proj(o.transpose(0, 1).reshape(t, d))
    u1 = x0 + att
    h = block.attention_norm(u1)
    pre = block.ffn[0](h)
    g = block.ffn[1](pre)
    f = block.ffn[2](g)
    u2 = h + f
    x2 = block.ffn_norm(u2)
    pooled = x2.mean(0)
    logits = model.classifier(pooled)
    c = int(logits.argmax())
    r_logits = torch.zeros_like(logits)
    r_logits[c] = logits[c]
    r_pooled = linear_rule(pooled, model.classifier, r_logits)
    r_x2 = (x2 / t) / pooled * r_pooled
    r_u2 = norm_rule(u2, block.ffn_norm, r_x2)
    r_g = linear_rule(g, block.ffn[2], share(f, u2, r_u2))  # GELU: identity rule, R_pre = R_g
    r_h = share(h, u2, r_u2) + linear_rule(h, block.ffn[0], r_g)
    r_u1 = norm_rule(u1, block.attention_norm, r_h)
    r_merged = linear_rule(o.transpose(0, 1).reshape(t, d), block.out_proj, share(att, u1, r_u1))
    r_o = r_merged.view(t, heads, dh).transpose(0, 1)
    terms = torch.einsum("hij,hjk->hijk", a, vh) * (r_o / o)[:, :, None, :]  # A_ij V_jk R_ik / O_ik
    half = 0.5 if rule == "attnlrp" else 1.0
    r_v = half * terms.sum(1)
    r_x0 = torch.zeros_like(x0)
    if rule == "attnlrp":
        r_a = 0.5 * terms.sum(-1)
        r_s = s * (r_a - a * r_a.sum(-1, keepdim=True))
        products = torch.einsum("hic,hjc->hijc", qh, kh) / math.sqrt(dh) * (r_s / s)[..., None]
        r_q, r_k = 0.5 * products.sum(2), 0.5 * products.sum(1)
        r_x0 = r_x0 + linear_rule(x0, block.q_proj, r_q.transpose(0, 1).reshape(t, d))
        r_x0 = r_x0 + linear_rule(x0, block.k_proj, r_k.transpose(0, 1).reshape(t, d))
    r_x0 = r_x0 + linear_rule(x0, block.v_proj, r_v.transpose(0, 1).reshape(t, d)) + share(x0, u1, r_u1)
    r_ln = share(ln, x0, r_x0)  # the position embeddings keep their share
    return norm_rule(e, model.embed_norm, r_ln).sum(-1)


@pytest.fixture
def one_layer() -> TransformerClassifier:
    """A random one-layer, two-head Transformer classifier in float64, with biases (all non-zero)."""
    torch.manual_seed(3)
    config = ModelConfig(model="transformer", task_type="classification", vocab_size=30, num_labels=3,
                         embed_dim=12, d_model=12, d_ff=24, heads=2, layers=1, dropout=0.0)
    model = TransformerClassifier(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("rule", ["attnlrp", "cp_lrp"])
def test_relevance_equals_rule_by_rule_propagation(one_layer: TransformerClassifier, rule: str) -> None:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 30, (4, 9), generator=generator)
    batch = Batch(tokens=tokens, mask=torch.ones_like(tokens, dtype=torch.bool), examples=[])
    ours = (attnlrp if rule == "attnlrp" else cp_lrp)(one_layer, batch)
    for b in range(len(tokens)):
        torch.testing.assert_close(ours[b], reference(one_layer, tokens[b], rule), rtol=0, atol=1e-9)


def test_padding_changes_no_real_token_and_gets_zero(one_layer: TransformerClassifier) -> None:
    tokens = torch.tensor([[4, 7, 9, 2, 11], [4, 7, 9, 0, 0]])
    mask = tokens != 0
    batch = Batch(tokens=tokens, mask=mask, examples=[])
    ours = attnlrp(one_layer, batch)
    torch.testing.assert_close(ours[1, :3], reference(one_layer, tokens[1, :3], "attnlrp"), rtol=0, atol=1e-9)
    assert (ours[1, 3:] == 0).all()


def test_attnlrp_is_not_plain_gradient_times_input_nor_cp_lrp(one_layer: TransformerClassifier) -> None:
    tokens = torch.tensor([[4, 7, 9, 2, 11, 5]])
    batch = Batch(tokens=tokens, mask=torch.ones_like(tokens, dtype=torch.bool), examples=[])
    emb = one_layer.embed(batch).detach().requires_grad_(True)
    logits = one_layer(batch, embeddings=emb).logits
    logits[0, logits.argmax()].backward()
    plain = (emb.grad * emb).sum(-1).detach()
    lrp = lrp_relevance(one_layer, batch, "attnlrp")
    assert not torch.allclose(lrp, plain, atol=1e-6)
    assert not torch.allclose(lrp, lrp_relevance(one_layer, batch, "cp_lrp"), atol=1e-6)


def test_explain_command_on_a_tiny_llama_and_bert(tiny_hf, tmp_path) -> None:
    """``attnaudit explain --method attnlrp,cp_lrp`` writes the relevances of the explained decision
    (a causal LM's next token; a classifier's class) for every token: the methods' own numbers."""
    from typer.testing import CliRunner

    from attnaudit.cli import app
    from attnaudit.hf import load_hf
    from tests.models.test_hf_decoder import save_llama_lm

    text = "the movie was not very fun !"
    llama = save_llama_lm(tmp_path / "llama", tiny_hf.vocab)
    for folder in (llama, tiny_hf.dir):
        out = tmp_path / f"out-{folder.name}"
        result = CliRunner().invoke(app, ["explain", "--hf", str(folder), "--text", text, "--method", "attnlrp,cp_lrp", "--out", str(out), "-q"])
        assert result.exit_code == 0, result.output
        frame = pd.read_csv(out / "explanation.csv")
        assert list(frame.columns) == ["position", "token", "attnlrp", "cp_lrp"]
        run = load_hf(folder, task=tiny_hf.task() if folder == tiny_hf.dir else None, device="cpu")
        batch = run.collate([Example(tokens=text.split(), label="neg" if folder == tiny_hf.dir else None)])
        for rule in ("attnlrp", "cp_lrp"):
            expected = lrp_relevance(run.model, batch, rule)[0]
            torch.testing.assert_close(torch.tensor(frame[rule].to_numpy()), expected.double(), rtol=1e-5, atol=1e-6)
