"""Alignment from cross-attention: word merging, argmax links, and a trained tiny NMT model on
the synthetic translation task (known alignments) reaching a clearly low AER."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from attnaudit.algorithms.metrics import aer
from attnaudit.data.word_alignments import synthetic_translation
from attnaudit.experiments import run_test
from attnaudit.experiments.alignment import Alignment, argmax_links, diagonal_links, word_scores
from attnaudit.progress import set_quiet


def test_word_scores_average_subwords_on_both_sides():
    scores = torch.tensor([[1.0, 3.0, 0.0], [5.0, 7.0, 2.0]])  # 2 target subwords x 3 source subwords
    words = word_scores(scores, target_words=[0, 0], source_words=[0, 0, 1])
    assert torch.allclose(words, torch.tensor([[4.0, 1.0]]))
    assert argmax_links(torch.tensor([[0.1, 0.9], [0.7, 0.3], [0.2, 0.8]])) == {(1, 0), (0, 1), (1, 2)}
    assert diagonal_links(2, 4) == {(0, 0), (0, 1), (1, 2), (1, 3)} and diagonal_links(3, 3) == {(0, 0), (1, 1), (2, 2)}


@pytest.fixture(scope="module")
def nmt(tmp_path_factory):
    """A 2-layer, 2-head, d=32 NMT model trained for 8 epochs on 1500 synthetic pairs (~30-60 s)."""
    from attnaudit.training.nmt import train_nmt

    set_quiet(True)
    data = synthetic_translation(0, n_train=1500, n_dev=60, n_test=100, lexicon_size=16, max_len=6)
    run = train_nmt(
        data, tmp_path_factory.mktemp("nmt") / "run", layers=2, heads=2, d_model=32, d_ff=64, source_vocab=60,
        target_vocab=60, epochs=8, batch_size=32, lr=5e-3, warmup=150, max_len=64, max_train_len=40,
        bleu_split=None,
    )
    return run, data


def test_trained_model_aligns_synthetic_translation(nmt):
    run, data = nmt
    result = Alignment().run(run, data.test, Alignment.Options())
    best = min(result.summary[f"{s}_{m}_best"] for s in ("output", "input") for m in ("weight", "norm"))
    # Monotone baseline: target word t aligned to source word min(t, |s|-1); the pair swaps defeat it.
    monotone = {
        (n, min(t, len(ex.tokens) - 1), t) for n, ex in enumerate(data.test) for t in range(len(ex.target))
    }
    sure = {(n, s, t) for n, ex in enumerate(data.test) for s, t in ex.meta["sure"]}
    baseline = 100 * aer(monotone, sure, set())
    assert best < 35.0 < baseline
    assert result.summary["diagonal_baseline"] > 35.0
    layers = result.tables["layers"]
    assert len(layers) == 4 and {r["setting"] for r in layers} == {"output", "input"}
    assert len(result.instances) == 100 and "aer_output_norm_L2" in result.instances[0]


def test_gold_directory_gives_the_same_aer_as_the_examples_own_links(nmt, tmp_path):
    run, data = nmt
    examples = data.test[:20]
    gold = tmp_path / "gold"
    gold.mkdir()
    (gold / "de").write_text("".join(" ".join(ex.tokens) + "\n" for ex in examples), encoding="utf-8")
    (gold / "en").write_text("".join(" ".join(ex.target) + "\n" for ex in examples), encoding="utf-8")
    talp = "".join(" ".join(f"{s + 1}-{t + 1}" for s, t in ex.meta["sure"]) + "\n" for ex in examples)
    (gold / "alignmentDeEn.talp").write_text(talp, encoding="ascii")
    own = Alignment().run(run, examples, Alignment.Options())
    result = run_test("alignment", run, split="test", limit=3, out=tmp_path / "res", gold=str(gold))
    assert result.summary["pairs"] == 20
    assert result.tables["layers"] == own.tables["layers"]
    saved = json.loads((tmp_path / "res" / "alignment.json").read_text())
    assert saved["meta"]["published"]["output_norm_best"] == 41.4
    assert (tmp_path / "res" / "alignment_aer_by_layer.png").exists()


def test_applies_only_to_seq2seq_models(nmt):
    run, _ = nmt
    assert Alignment().applies(run) is None
    classifier = SimpleNamespace(task=SimpleNamespace(task_type="classification"), model=object())
    assert "encoder-decoder" in Alignment().applies(classifier)


def test_eflomal_baseline_in_the_same_run(nmt, tmp_path):
    pytest.importorskip("eflomal", reason="eflomal is not installed: pip install 'attnaudit[align]'")
    from attnaudit.report.summary import verdict_rows

    run, data = nmt
    result = run_test("alignment", run, split="test", limit=40, out=tmp_path, baseline="eflomal", baseline_runs=2)
    summary = result.summary
    assert summary["eflomal_runs"] == 2 and summary["eflomal_train_pairs"] == len(data.train)
    assert {r["symmetrisation"] for r in result.tables["baseline"]} == {"fwd", "rev", "intersection", "grow_diag_final"}
    assert summary["eflomal_grow_diag_final_mean"] < summary["diagonal_baseline"]
    assert any("eflomal baseline: trained on the run's 1500 training pairs plus the 40" in n for n in result.meta["notes"])
    row = verdict_rows("alignment", result)[-1]
    assert row["statistic"].startswith("eflomal AER, grow-diag-final") and row["value"].startswith(
        f"{summary['eflomal_grow_diag_final_mean']:.1f} ["
    )
    saved = json.loads((tmp_path / "alignment.json").read_text())
    assert saved["tables"]["baseline"] == result.tables["baseline"]
