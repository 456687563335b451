"""The LRP rules' machinery (:mod:`attnaudit.models.lrp`): each rule's backward pass against its formula,
what each family exposes, and that leaving the context restores the model bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from attnaudit.errors import AttnAuditError
from attnaudit.hf import load_hf
from attnaudit.models.interface import ModelConfig
from attnaudit.models.lrp import IdentityRule, ScaleGradient, attention_operands, frozen_norm, relevance_rules
from attnaudit.models.transformer import TransformerClassifier
from tests.models.test_hf_decoder import wrap


def test_identity_rule_passes_the_output_relevance_on() -> None:
    x = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.7], dtype=torch.float64, requires_grad=True)
    out = IdentityRule.apply(x, nn.functional.gelu)
    torch.testing.assert_close(out, nn.functional.gelu(x.detach()))
    grad = torch.tensor([0.7, -1.1, 2.0, 0.4, 1.3], dtype=torch.float64)
    out.backward(grad)
    torch.testing.assert_close(x.grad * x.detach(), out.detach() * grad)  # R_in = R_out
    assert x.grad[2] == 0


def test_scale_gradient_and_operands_outside_the_rules() -> None:
    x = torch.ones(3, requires_grad=True)
    ScaleGradient.apply(x, 0.25).sum().backward()
    assert (x.grad == 0.25).all()
    q, k, v = (torch.randn(2, 3) for _ in range(3))
    assert all(a is b for a, b in zip(attention_operands(q, k, v), (q, k, v)))


def test_frozen_norm_keeps_the_values_and_holds_the_spread_constant() -> None:
    norm = nn.LayerNorm(6).double()
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    out = frozen_norm(norm)(x)
    torch.testing.assert_close(out, norm(x))
    (jac,) = torch.autograd.grad(out[0, 1], x)
    sigma = (x[0].var(unbiased=False) + norm.eps).sqrt().detach()
    expected = norm.weight[1].detach() * ((torch.arange(6) == 1).double() - 1 / 6) / sigma
    torch.testing.assert_close(jac[0], expected)


def test_rules_are_undone_on_exit_and_do_not_nest() -> None:
    torch.manual_seed(0)
    config = ModelConfig(model="transformer", task_type="classification", vocab_size=10, num_labels=2,
                         embed_dim=8, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0)
    model = TransformerClassifier(config).eval()
    x = torch.randn(2, 5, 8, requires_grad=True)

    def grad_of_output() -> torch.Tensor:
        out = model.layers[0](x, torch.ones(2, 5, dtype=torch.bool))[0].sum()
        return torch.autograd.grad(out, x)[0]

    before = grad_of_output()
    with relevance_rules(model, "attnlrp"):
        during = grad_of_output()
        with pytest.raises(AttnAuditError, match="do not nest"):
            with relevance_rules(model, "cp_lrp"):
                pass
    assert not torch.allclose(before, during)
    assert torch.equal(grad_of_output(), before)
    assert all("forward" not in m.__dict__ for m in model.modules())
    with pytest.raises(AttnAuditError, match="unknown LRP rule"):
        with relevance_rules(model, "lrp"):
            pass


def test_what_each_family_exposes(tiny_hf: SimpleNamespace) -> None:
    bert = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu").model
    sites = bert.relevance_sites()
    assert len(sites.norms) == 1 + 2 * 2  # embedding LN, two per layer
    assert {type(m).__name__ for m in sites.activations} == {"GELUActivation", "Tanh"}  # FFN, pooler
    llama, _, _ = wrap("llama", tiny_hf)
    sites = llama.relevance_sites()
    assert len(sites.norms) == 2 * 2 + 1 and len(sites.gates) == 2
    assert all(down is layer.mlp.down_proj for (_, down), layer in zip(sites.gates, llama.layers))
    gpt2, _, _ = wrap("gpt2", tiny_hf)
    assert not gpt2.relevance_sites().gates and len(gpt2.relevance_sites().activations) == 2
