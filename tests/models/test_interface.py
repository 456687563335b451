"""The shared model interface: capability defaults and the eval-mode context."""

from __future__ import annotations

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.models import ModelConfig, build_model, evaluation


def _model(name: str) -> torch.nn.Module:
    return build_model(ModelConfig(model=name, task_type="classification", vocab_size=20, num_labels=2, embed_dim=8,
                                   hidden_dim=8, d_model=8, heads=2, layers=1, d_ff=16))


def test_word_models_declare_no_value_output_maps_and_no_subwords() -> None:
    model = _model("bilstm")
    assert model.trained_head and not model.has_value_output and model.cross_layers == [] and model.special_tokens == {}
    assert model.wordpieces(None) is None
    with pytest.raises(AttnAuditError, match="no per-head value/output"):
        model.value_output_maps(0)


def test_transformer_exposes_value_output_maps() -> None:
    model = _model("transformer")
    w_v, b_v, w_o, heads = model.value_output_maps(0)
    assert model.has_value_output and w_v.shape == w_o.shape == (8, 8) and b_v.shape == (8,) and heads == 2


def test_evaluation_restores_the_previous_mode_even_on_error() -> None:
    model = _model("bilstm")
    model.train()
    with evaluation(model):
        assert not model.training
    assert model.training
    with pytest.raises(RuntimeError), evaluation(model):
        raise RuntimeError("inside")
    assert model.training
    model.eval()
    with evaluation(model):
        pass
    assert not model.training
