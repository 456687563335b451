"""Raw attention / rollout / flow vs importance (Abnar & Zuidema 2020) on tiny models."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from transformers import BertModel

from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.experiments.rollout import explanation_rows, input_gradient
from attnaudit.flow import flow, rollout
from attnaudit.importance import gradient_importance
from attnaudit.models.hf import load_hf
from attnaudit.run import Run


@pytest.fixture(scope="module")
def hf_run(tiny_hf: SimpleNamespace) -> Run:
    """The tiny BERT checkpoint carries a (random) classification head, so it counts as trained."""
    return load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")


def test_explanation_rows_by_hand() -> None:
    m = torch.tensor([[[[0.1, 0.9, 0.0], [0.6, 0.4, 0.0], [0.3, 0.3, 0.4]]]])  # (B=1, L=1, T=3, T=3)
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(explanation_rows(m, mask, "cls", 0), torch.tensor([[[0.1, 0.9, 0.0]]]))
    torch.testing.assert_close(explanation_rows(m, mask, "mean", 0), torch.tensor([[[0.35, 0.65, 0.0]]]))
    torch.testing.assert_close(explanation_rows(m, mask, "max", 0), torch.tensor([[[0.6, 0.9, 0.0]]]))
    torch.testing.assert_close(explanation_rows(m, mask, "cls", None), torch.tensor([[[0.35, 0.65, 0.0]]]))


def test_input_gradient_is_the_predicted_logit_gradient(hf_run: Run) -> None:
    batch = next(hf_run.batches(hf_run.data().test, 8))
    model = hf_run.model
    emb = model.embed(batch).detach().requires_grad_(True)
    logits = model(batch, embeddings=emb).logits
    logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
    expected = emb.grad.sum(-1).abs() * batch.mask
    torch.testing.assert_close(input_gradient(hf_run, batch), expected)


def test_end_to_end_on_hf_matches_a_hand_computation(hf_run: Run, tmp_path: Path) -> None:
    result = run_test("rollout", hf_run, split="test", out=tmp_path, seed=0, flow_limit=5, batch_size=3)
    assert {Path(p).name for p in result.figures} == {"rollout_correlation.png", "rollout_correlation.svg"}
    assert (tmp_path / "rollout.json").exists() and (tmp_path / "rollout.csv").exists()
    assert len(result.instances) == 8 and result.summary["flow_instances"] == 5
    layers = result.tables["layers"]
    assert {(r["layer"], r["method"], r["importance"]) for r in layers} == {
        (l, m, i) for l in (0, 1) for m in ("raw", "rollout", "flow") for i in ("gradient", "loo", "input_gradient")
    }
    assert all(r["n"] == 5 for r in layers if r["method"] == "flow")
    assert "L0_flow_gradient" not in result.instances[5] and "L0_flow_gradient" in result.instances[4]
    assert result.meta["published"]["input_gradient"]["L6"]["flow"] == [0.14, 0.21]

    # instance 1, last layer: [CLS] row of raw attention, rollout and flow vs J&W gradient, by hand with scipy
    examples = hf_run.data().test
    batch = next(hf_run.batches(examples[:3], 3))
    with torch.no_grad():
        weights = hf_run.model(batch).trace.weights
    n = int(batch.mask[1].sum())
    grad = gradient_importance(hf_run, batch)[1, :n].numpy()
    raw = torch.stack(weights, 1).mean(2)[1, -1, 0, :n].numpy()
    rolled = rollout(weights, mask=batch.mask)[1, -1, 0, :n].numpy()
    flowed = flow(weights, mask=batch.mask)[1, -1, 0, :n].numpy()
    row = result.instances[1]
    assert row["L1_raw_gradient"] == pytest.approx(spearmanr(raw, grad)[0], abs=1e-9)
    assert row["L1_rollout_gradient"] == pytest.approx(spearmanr(rolled, grad)[0], abs=1e-9)
    assert row["L1_flow_gradient"] == pytest.approx(spearmanr(flowed, grad)[0], abs=1e-6)


def test_special_tokens_can_be_left_out(hf_run: Run, tmp_path: Path) -> None:
    every = run_test("rollout", hf_run, split="test", out=tmp_path / "a", plot=False, importance=["gradient"], flow_limit=0)
    words = run_test(
        "rollout", hf_run, split="test", out=tmp_path / "b", plot=False, importance=["gradient"], flow_limit=0,
        include_special=False,
    )
    assert [r["n_items"] + 2 for r in words.instances] == [r["n_items"] for r in every.instances]
    # "good" and "bad plot" keep fewer than 3 word pieces: no correlation for them
    assert np.isnan(words.instances[3]["L1_raw_gradient"]) and np.isfinite(every.instances[3]["L1_raw_gradient"])
    assert all(r["method"] != "flow" or r["n"] == 0 for r in words.tables["layers"])


def test_our_transformer_uses_the_mean_query_row(tiny_transformer_run: Run, tmp_path: Path) -> None:
    result = run_test(
        "rollout", tiny_transformer_run, split="test", limit=6, plot=False, flow_limit=2, importance=["gradient", "loo"],
        out=tmp_path,
    )
    assert "mean over real query rows" in result.meta["notes"][0]
    assert np.isfinite(result.summary["rollout_vs_gradient"])


def test_applicability_and_options(tiny_hf: SimpleNamespace, tiny_attention_run, hf_run: Run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AttnAuditError, match="one attention"):
        run_test("rollout", tiny_attention_run("bilstm"), limit=2, plot=False, out=tmp_path)
    with pytest.raises(AttnAuditError, match="one per token"):
        run_test("rollout", tiny_attention_run("tagger"), limit=2, plot=False, out=tmp_path)
    torch.manual_seed(0)
    BertModel(tiny_hf.config()).save_pretrained(tmp_path / "bare", safe_serialization=True)
    tiny_hf.tokenizer().save_pretrained(tmp_path / "bare")
    bare = load_hf(tmp_path / "bare", task=tiny_hf.task(), device="cpu")
    with pytest.raises(AttnAuditError, match="fine-tune it first"):
        run_test("rollout", bare, out=tmp_path, plot=False)
    # every test of predictions refuses a headless encoder; the attention-only ones run on it
    for name in ("importance", "permutation", "adversarial", "erasure"):
        with pytest.raises(AttnAuditError, match="no trained classification head"):
            run_test(name, bare, out=tmp_path, plot=False)
    assert run_test("norms", bare, out=tmp_path, plot=False, limit=2).summary
    with pytest.raises(AttnAuditError, match="--importance"):
        run_test("rollout", hf_run, out=tmp_path, plot=False, importance=["nonsense"])
    with pytest.raises(AttnAuditError, match="--query"):
        run_test("rollout", hf_run, out=tmp_path, plot=False, query="first")
