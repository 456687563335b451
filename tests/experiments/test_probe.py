"""Attention probes: the context-only layer, replaying a source's attention, end to end with adversaries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from attnaudit.data.synthetic import synthetic_task
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.probe import ContextLayer, build_context_probe
from attnaudit.experiments.runner import run_test
from attnaudit.models import ModelConfig, build_model
from attnaudit.models.interface import freeze_to
from attnaudit.models.transformer import merge_heads, split_heads
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.adversary import Variant, attention_of, train_variant
from attnaudit.training.trainer import train

set_quiet(True)
CONFIG = ModelConfig(model="transformer", task_type="tagging", vocab_size=12, num_labels=3, embed_dim=8, d_model=8, heads=2, d_ff=16, layers=2)


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("tagging", seed=0, n_train=160, n_dev=30, n_test=30)
    return train(
        data, "transformer", tmp_path_factory.mktemp("probe") / "run", epochs=2, lr=1e-2, batch_size=16,
        embed_dim=16, d_model=16, heads=2, layers=1, d_ff=32, quiet_eval=True,
    )


def test_context_probe_has_no_query_key_path() -> None:
    names = {name for name, _ in build_context_probe(CONFIG).named_parameters()}
    assert not any("q_proj" in n or "k_proj" in n for n in names)
    assert any("v_proj" in n for n in names) and any("out_proj" in n for n in names)


def test_context_layer_needs_supplied_attention() -> None:
    layer = ContextLayer(8, 2, 16, 0.0)
    with pytest.raises(AttnAuditError, match="must be supplied"):
        layer(torch.randn(1, 3, 8), torch.ones(1, 3, dtype=torch.bool))


def test_context_layer_matches_its_formula() -> None:
    torch.manual_seed(0)
    layer = ContextLayer(8, 2, 16, 0.0).eval()
    x, mask = torch.randn(2, 4, 8), torch.tensor([[True] * 4, [True, True, True, False]])
    weights = torch.rand(2, 2, 4, 4) * mask[:, None, None, :]
    weights = weights / weights.sum(-1, keepdim=True)
    out, record = layer(x, mask, [freeze_to(weights)])
    context = layer.out_proj(merge_heads(weights @ split_heads(layer.v_proj(x), 2)))
    h = layer.attention_norm(context)
    torch.testing.assert_close(out, layer.ffn_norm(h + layer.ffn(h)))
    torch.testing.assert_close(record.weights, weights)


def test_with_identity_attention_tokens_see_nothing_else() -> None:
    torch.manual_seed(1)
    layer = ContextLayer(8, 2, 16, 0.0).eval()
    x, mask = torch.randn(1, 5, 8), torch.ones(1, 5, dtype=torch.bool)
    eye = freeze_to(torch.eye(5).expand(1, 2, 5, 5))
    changed = x.clone()
    changed[0, 3] += 5.0
    a, _ = layer(x, mask, [eye])
    b, _ = layer(changed, mask, [eye])
    keep = [0, 1, 2, 4]
    torch.testing.assert_close(a[0, keep], b[0, keep])
    assert not torch.allclose(a[0, 3], b[0, 3])


def test_frozen_probe_replays_the_source_attention_in_every_layer(tagger: Run, tmp_path: Path) -> None:
    sub = train_variant(tagger, tmp_path / "probe", Variant(key={"kind": "t"}, interventions=attention_of(tagger.model)), epochs=1)
    batch = next(tagger.batches(tagger.examples("test"), 8))
    with torch.no_grad():
        probe = sub.model(batch, sub.interventions(batch)).trace
        source = tagger.model(batch).trace
    for mine, theirs in zip(probe.layers, source.layers, strict=True):
        torch.testing.assert_close(mine.weights, theirs.weights)


def test_probe_end_to_end_and_resume(tagger: Run, tmp_path: Path) -> None:
    result = run_test("probe", tagger, lambdas=[0.5], epochs=1, out=tmp_path)
    pairs = [(row["source"], row["variant"]) for row in result.tables["probes"]]
    assert pairs == [(s, v) for s in ("original", "adversary λ=0.5") for v in ("frozen", "context")]
    assert {"original/frozen", "original/context", "adversary λ=0.5/context"} <= set(result.summary)
    assert result.meta["published"]["adversary λ=3/frozen"] == 0.89
    assert (tmp_path / "probe_scores.png").exists()
    assert (tmp_path / "subruns" / "global-adversary" / "lambda-0.5-seed-0-from-base" / "metrics.json").exists()  # tagging default

    again = run_test("probe", tagger, lambdas=[0.5], variants=["context"], epochs=1, out=tmp_path, plot=False)
    assert [row["trained_now"] for row in again.tables["probes"]] == [False, False]
    assert again.summary["original/context"] == result.summary["original/context"]


def test_probe_rejects_unknown_variants_and_non_transformers(tagger: Run) -> None:
    with pytest.raises(AttnAuditError, match="--variants"):
        run_test("probe", tagger, variants=["bogus"], epochs=1, plot=False)
    config = ModelConfig(model="bilstm", task_type="classification", vocab_size=8, num_labels=2, embed_dim=4, hidden_dim=4)
    rnn = dataclasses.replace(tagger, model=build_model(config))
    assert "Transformer" in get_experiment("probe").applies(rnn)
