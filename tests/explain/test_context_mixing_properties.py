"""Properties of the context-mixing methods (norms_res_ln, globenc, alti, value_zeroing, chefer, decompx) on
random small Transformers, with hypothesis: padding changes nothing and scores 0, permuting the tokens
of a model without positions permutes the scores, the normalised methods' scores sum to 1."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import torch

from attnaudit.data.types import Batch
from attnaudit.explain import EXPLANATIONS
from attnaudit.explain.methods.alti import alti_layer
from attnaudit.models import ModelConfig, build_model

from .plain import tiny_llama

METHODS = ("norms_res_ln", "globenc", "alti", "value_zeroing", "chefer", "decompx")
NORMALISED = ("globenc", "alti", "value_zeroing")


def positionless_transformer(seed: int) -> torch.nn.Module:
    """A random 2-layer, 2-head mean-pooled Transformer with its position table zeroed, so that it is
    permutation equivariant (and its prediction invariant). In float64: Value Zeroing's ``1 − cos`` of
    nearly equal states (repeated tokens) is below float32's resolution."""
    torch.manual_seed(seed)
    config = ModelConfig(model="transformer", task_type="classification", vocab_size=20, num_labels=3, embed_dim=8,
                         d_model=8, heads=2, layers=2, d_ff=16, dropout=0.0)
    model = build_model(config).double().eval()
    model.positions.zero_()
    return model


def scores(model: torch.nn.Module, tokens: list[int], pad: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.tensor([tokens + [0] * pad])
    batch = Batch(tokens=ids, mask=ids > 0)
    return {name: EXPLANATIONS[name](model, batch)[0] for name in METHODS}


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(
    seed=st.integers(0, 3),
    tokens=st.lists(st.integers(1, 19), min_size=2, max_size=6),
    pad=st.integers(1, 3),
    data=st.data(),
)
def test_padding_permutation_and_normalisation(seed: int, tokens: list[int], pad: int, data: st.DataObject) -> None:
    model = positionless_transformer(seed)
    order = data.draw(st.permutations(range(len(tokens))))
    plain = scores(model, tokens)
    padded = scores(model, tokens, pad)
    permuted = scores(model, [tokens[k] for k in order])
    for name in METHODS:
        assert name == "decompx" or (plain[name] >= 0).all(), name  # DecompX is signed
        torch.testing.assert_close(padded[name][: len(tokens)], plain[name], atol=1e-5, rtol=1e-4, msg=name)
        assert (padded[name][len(tokens):] == 0).all(), name
        torch.testing.assert_close(permuted[name], plain[name][list(order)], atol=1e-5, rtol=1e-4, msg=name)
        if name in NORMALISED:
            total = torch.tensor(1.0 if name != "alti" or alti_rows_positive(model, tokens) else float(plain[name].sum()))
            torch.testing.assert_close(plain[name].sum(), total.to(plain[name].dtype), atol=1e-5, rtol=0, msg=name)
            assert plain[name].sum() <= 1 + 1e-5, name


def alti_rows_positive(model: torch.nn.Module, tokens: list[int]) -> bool:
    """Whether every row of every layer's ALTI map has a positive contribution. Under the L1 distance a
    token's output can be farther from every share than from the origin; its row then stays 0, and the
    rolled-out scores sum to less than 1."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        trace = model(Batch(tokens=ids, mask=ids > 0)).trace
        return all(bool((alti_layer(model, record, layer).sum(-1) > 0).all()) for layer, record in enumerate(trace.layers))


def test_every_context_mixing_method_on_a_llama_reads_the_last_real_token(tiny_hf) -> None:  # noqa: ANN001
    """On a causal pre-RMSNorm decoder every method applies; scores are 0 at padding, the normalised ones
    sum to 1 over the tokens the last real token sees (all real ones)."""
    model, _, batch = tiny_llama(tiny_hf)
    real = batch.mask.bool()
    for name in METHODS[:-1]:  # DecompX: post-LN only
        assert EXPLANATIONS[name].applies(model) is None, name
        found = EXPLANATIONS[name](model, batch)
        assert found.shape == real.shape and (found[~real] == 0).all() and (found[real] >= 0).all(), name
        assert torch.isfinite(found).all(), name
        if name in NORMALISED and name != "alti":
            torch.testing.assert_close(found.sum(-1), torch.ones(len(batch)), atol=1e-5, rtol=0, msg=name)
