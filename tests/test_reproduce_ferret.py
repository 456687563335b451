"""benchmarks/reproduce_ferret.py without ferret's venv: ferret's default removal sets by hand and as
properties, ferret's default AOPC computed by our batched perturbations against a slow loop of
single forwards on a tiny BERT, and the comparisons read from a hand-made worker answer (the
JSON contract with benchmarks/ferret_worker.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` is a folder of the checkout

from benchmarks import reproduce_ferret as bf  # noqa: E402


def test_ferret_sets_by_hand() -> None:
    # n = 5: thresholds 10..100 % give k = 0,1,1,2,2,3,3,4,4,5; only positive scores; repeats skipped
    scores = np.array([0.5, -0.1, 0.3, 0.2, 0.0])
    assert [s.tolist() for s in bf.ferret_sets(scores)] == [[0], [0, 2], [0, 2, 3]]
    assert bf.ferret_sets(np.array([-1.0, 0.0, -2.0])) == []
    # n = 4: k = 0,0,1,1,2,2,2,3,3,4 -> four distinct sets of positive scores
    assert [s.tolist() for s in bf.ferret_sets(np.array([1.0, 4.0, 3.0, 2.0]))] == [[1], [1, 2], [1, 2, 3], [1, 2, 3, 0]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=1, max_size=30, unique=True))
def test_ferret_sets_are_growing_top_positive_prefixes(values: list[float]) -> None:
    scores = np.array(values, dtype=float)
    sets = bf.ferret_sets(scores)
    order = [int(i) for i in np.argsort(-scores) if scores[i] > 0]
    sizes = [len(s) for s in sets]
    assert sizes == sorted(set(sizes))  # strictly growing: equal consecutive sets are skipped
    for chosen in sets:
        assert chosen.tolist() == order[: len(chosen)]
        assert len(chosen) <= int(1.0 * len(scores))


def test_ferret_default_on_a_tiny_bert_equals_single_forwards(tiny_hf) -> None:  # type: ignore[no-untyped-def]
    from attnaudit.experiments.eraser_metrics import predictions
    from attnaudit.hf import load_hf

    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    examples = run.examples("test")
    batch = run.collate(examples)
    gen = torch.Generator().manual_seed(3)
    scores = {"a": torch.randn(batch.tokens.shape, generator=gen, dtype=torch.float64)}
    pred, full = predictions(run.model, batch)
    got = bf.ferret_default_ours(run, batch, scores, pred, full)
    hf = run.model.hf.eval()
    for b in range(len(batch)):
        ids = batch.tokens[b, : int(batch.mask[b].sum())]
        inner, values = ids[1:-1], scores["a"][b, 1 : len(ids) - 1].numpy()
        comp, suff = [], []
        for chosen in bf.ferret_sets(values):
            top = np.zeros(len(inner), dtype=bool)
            top[chosen] = True
            for out, keep in ((comp, ~top), (suff, top)):
                seq = torch.cat([ids[:1], inner[torch.from_numpy(keep)], ids[-1:]])[None]
                with torch.no_grad():
                    p = hf(input_ids=seq).logits.double().softmax(-1)[0, pred[b]]
                out.append(float(full[b] - p))
        assert got["a_comp"][b] == pytest.approx(np.mean(comp) if comp else 0.0, abs=1e-6)
        assert got["a_suff"][b] == pytest.approx(np.mean(suff) if suff else 1.0, abs=1e-6)


def _row(comp: list[float], suff: list[float], scores: list[float]) -> dict:
    row = {"ids": [101, 7, 8, 102], "logits": [0.0, 1.0], "target": 1, "scores": {m: scores for m in bf.METHODS}}
    for m in bf.METHODS:
        row.update({f"{m}_comp_bins": comp, f"{m}_suff_bins": suff, f"{m}_comp_aopc": float(np.mean(comp)),
                    f"{m}_suff_aopc": float(np.mean(suff)), f"{m}_comp_ferret_default": 0.3, f"{m}_suff_ferret_default": 0.1})
    return row


def test_comparisons_of_a_hand_made_worker_answer() -> None:
    rows = [_row([0.1] * 5, [0.2] * 5, [0.0, 2.0, 1.0, 0.0]), _row([0.4] * 5, [0.0] * 5, [0.0, 1.0, 3.0, 0.0])]
    unchanged = {"comp_changed": [False] * 5, "suff_changed": [False] * 5}
    bins = [{"comp": [0.1] * 4 + [0.35], "suff": [0.2] * 5, **unchanged, "comp_changed": [False] * 4 + [True]},
            {"comp": [0.4] * 5, "suff": [0.0] * 4 + [0.00005], **unchanged}]
    answer = {
        "ids": [[101, 7, 8, 102], [101, 7, 9, 102]], "logits": [[0.0, 1.5], [0.5, 0.25]], "attn_implementation": "sdpa",
        "versions": {}, "given": {m: [{"bins": b, "default": {"comp": 0.3, "suff": 0.2}, "default_retokenised": r}
                         for b, r in zip(bins, (True, False))] for m in bf.METHODS},
        "own": {m: [{"scores": [9.0, 5.0, -1.0, 9.0], "default": {"comp": 0.5, "suff": 0.0}},
                    {"scores": [9.0, -3.0, 2.0, 9.0], "default": {"comp": 0.1, "suff": 0.2}}] for m in bf.METHODS},
    }
    checks = bf.checks(rows, answer)
    assert (checks["token_ids_equal"], checks["logits_max_abs_diff"], checks["same_prediction"]) == (1, 0.75, 1)
    same = bf.identical_scores(rows, answer, tol=1e-4)["gradient"]
    assert same["sentences_with_all_scores_positive"] == 2
    comp = same["comp_per_bin"]
    assert comp["all"]["n"] == 10 and comp["all"]["max_abs_diff"] == pytest.approx(0.25)
    assert comp["all"]["fraction_within_tolerance"] == pytest.approx(0.9)
    assert comp["retokenised_perturbations"] == 1 and comp["ferret_input_unchanged"]["max_abs_diff"] == pytest.approx(0, abs=1e-12)
    assert comp["by_bin"]["50%"]["mean_abs_diff"] == pytest.approx(0.125)
    assert same["suff_per_bin"]["all"]["fraction_within_tolerance"] == 1.0  # 5e-5 is within 1e-4
    assert same["suff_ferret_default_aopc"]["max_abs_diff"] == pytest.approx(0.1)
    assert same["comp_ferret_default_aopc"]["sentences_with_a_retokenised_input"] == 1
    assert same["comp_ferret_default_aopc"]["sentences_ferret_input_unchanged"]["fraction_within_tolerance"] == 1.0
    e2e = bf.end_to_end(rows, answer)["ig"]
    assert e2e["aopc_comp"] == {"ours": pytest.approx(0.25), "ferret": pytest.approx(0.3), "ours_n": 2}
    # ours (2, 1) and (1, 3); ferret (5, −1): τ = 1 signed and absolute; (−3, 2): τ = 1 signed, −1 absolute
    assert e2e["kendall_tau"]["mean"] == pytest.approx(1.0) and e2e["kendall_tau"]["n"] == 2
    assert e2e["kendall_tau_vs_abs_ferret"]["mean"] == pytest.approx(0.0)
    assert e2e["kendall_tau_vs_abs_ferret"]["fraction_positive"] == pytest.approx(0.5)


def test_arithmetic_floor_counts_the_round_s_work_on_a_tiny_bert(tiny_hf, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Each linear weight of the blocks costs 2 FLOP a row it is given (hand count from the config), a differentiated
    pass twice that; IG's steps and the gradient are the passes with a backward: at least every real token (steps + 1)
    times through every block but the last one's tail after its attention (run at the [CLS] row alone, the read-rows
    cut), at most every padded token through every block; the seconds are the FLOP over the (here fixed) matmul rate."""
    from attnaudit.hf import load_hf

    run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
    examples = run.examples("test")
    monkeypatch.setattr(bf, "matmul_rate", lambda: 100.0)
    steps = 3
    floor = bf.arithmetic_floor(run, examples, steps, chunk=4)
    cfg = run.model.hf.config
    h, ff, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    every_block = 2 * layers * (4 * h * h + 2 * h * ff)
    but_the_tail = every_block - 2 * 2 * h * ff  # the last block's feed-forward at one row of each example
    work = floor["forward_gflop"]
    assert floor["linear_gflop"] == pytest.approx(work["forward_only"] + 2 * work["forward_backward"])
    batches = [batch for _, batch in run.sorted_batches(examples, 4)]
    real = sum(int(b.mask.sum()) for b in batches)
    padded = sum(b.tokens.numel() for b in batches)
    assert run.model.read_cut() is not None
    assert (steps + 1) * real * but_the_tail <= work["forward_backward"] * 1e9 < (steps + 1) * padded * every_block
    assert work["forward_only"] * 1e9 >= 2 * real * but_the_tail  # IG's and the metrics' unperturbed predictions, then the perturbed inputs
    assert floor["seconds_at_matmul_rate"] == pytest.approx(floor["linear_gflop"] / 100.0)
