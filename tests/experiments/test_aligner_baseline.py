"""The eflomal baseline of the alignment test: grow-diag-final on hand-computed cases, the run's
training pairs, and eflomal itself on the synthetic translation task (skipped without eflomal)."""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import pytest

from attnaudit.algorithms.metrics import aer
from attnaudit.data.types import Example
from attnaudit.data.word_alignments import synthetic_translation
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.aligner_baseline import (
    INSTALL,
    SYMMETRISATIONS,
    eflomal_baseline,
    grow_diag_final,
    symmetrise,
    training_pairs,
)
from attnaudit.experiments.alignment import Alignment, diagonal_links

NEEDS_EFLOMAL = f"eflomal is not installed: {INSTALL}"


def test_grow_diag_final_hand_computed():
    # Intersection {(0,0),(1,1)}. Grow: (2,2) neighbours (1,1) diagonally and both its words are
    # free -> added; (0,1) neighbours (0,0) but both its words are aligned -> never added. Final:
    # (3,0) comes from fwd and source word 3 is still free -> added (grow-diag-final-and, which
    # needs both words free, would leave it out).
    fwd = {(0, 0), (1, 1), (2, 2), (3, 0)}
    rev = {(0, 0), (1, 1), (0, 1)}
    assert grow_diag_final(fwd, rev, 4, 4) == {(0, 0), (1, 1), (2, 2), (3, 0)}
    # With (3,3) in rev, growing reaches it from (2,2) (added in the same pass), so source word 3
    # is aligned before the final step and (3,0) is no longer added: growth comes first.
    rev_33 = rev | {(3, 3)}
    assert grow_diag_final(fwd, rev_33, 4, 4) == {(0, 0), (1, 1), (2, 2), (3, 3)}
    both = symmetrise(fwd, rev_33, 4, 4)
    assert list(both) == list(SYMMETRISATIONS)
    assert both["intersection"] == {(0, 0), (1, 1)} and both["fwd"] == fwd and both["rev"] == rev_33


def test_grow_diag_final_lies_between_intersection_and_union_and_covers_every_aligned_word():
    rng = random.Random(0)
    for _ in range(200):
        s, t = rng.randint(1, 7), rng.randint(1, 7)
        fwd = {(rng.randrange(s), j) for j in range(t) if rng.random() < 0.8}
        rev = {(i, rng.randrange(t)) for i in range(s) if rng.random() < 0.8}
        links = grow_diag_final(fwd, rev, s, t)
        assert fwd & rev <= links <= fwd | rev
        # every word aligned in either direction ends up aligned (the final steps guarantee it)
        assert {i for i, _ in fwd | rev} == {i for i, _ in links}
        assert {j for _, j in fwd | rev} == {j for _, j in links}
        assert grow_diag_final(fwd, fwd, s, t) == fwd


class _Encoder:
    """One subword per character: a word of n letters has n subwords."""

    def encode(self, words):
        ids = [1 for word in words for _ in word]
        return ids, [n for n, word in enumerate(words) for _ in word]


def test_training_pairs_apply_the_runs_length_filter():
    train = [Example(tokens=["ab"], target=["c"]), Example(tokens=["abcd"], target=["c"]),
             Example(tokens=["a"], target=["abcdef"])]
    data = SimpleNamespace(train=train)
    collate = SimpleNamespace(source=_Encoder(), target=_Encoder())
    run = SimpleNamespace(data=lambda: data, collate=collate, info={"train": {"max_train_len": 3}})
    assert training_pairs(run) == [train[0]]  # < 3 subwords on both sides, as train_nmt keeps
    run.info = {}
    assert training_pairs(run) == train


def test_missing_eflomal_is_one_clean_error_before_any_work(monkeypatch):
    monkeypatch.setitem(sys.modules, "eflomal", None)  # import eflomal now raises ImportError
    examples = [Example(tokens=["a"], target=["b"], meta={"sure": [(0, 0)], "possible": []})]
    with pytest.raises(AttnAuditError, match=r"pip install 'attnaudit\[align\]'"):
        Alignment().run(object(), examples, Alignment.Options(baseline="eflomal"))  # no model needed to fail
    with pytest.raises(AttnAuditError, match="--baseline must be one of none, eflomal"):
        Alignment().run(object(), examples, Alignment.Options(baseline="giza"))


def _gold_sets(examples):
    sure = {(n, s, t) for n, ex in enumerate(examples) for s, t in ex.meta["sure"]}
    possible = {(n, s, t) for n, ex in enumerate(examples) for s, t in ex.meta["possible"]}
    return sure, possible


def test_eflomal_aligns_the_synthetic_task_far_better_than_the_diagonal():
    pytest.importorskip("eflomal", reason=NEEDS_EFLOMAL)
    data = synthetic_translation(0, n_train=800, n_dev=10, n_test=60, lexicon_size=16, max_len=6)
    sure, possible = _gold_sets(data.test)
    summary, rows = eflomal_baseline(data.train, data.test, 2, sure, possible)
    assert summary["eflomal_runs"] == 2 and summary["eflomal_train_pairs"] == 800
    assert len(rows) == 2 * len(SYMMETRISATIONS)
    for name in SYMMETRISATIONS:
        values = [r["aer"] for r in rows if r["symmetrisation"] == name]
        assert summary[f"eflomal_{name}_min"] == min(values) <= summary[f"eflomal_{name}_mean"] <= max(values)
    diagonal = {(n, *link) for n, ex in enumerate(data.test) for link in diagonal_links(len(ex.tokens), len(ex.target))}
    # A lexicon with swapped word pairs is what IBM/HMM models learn well; position alone does not.
    # Observed (3 x 2 runs): grow-diag-final 3.4-8.3, intersection 12.3-17.9 (it drops one link of
    # each one-to-two translation); the diagonal is at 82.
    assert summary["eflomal_grow_diag_final_max"] < 15.0 < 100 * aer(diagonal, sure, possible)
    assert summary["eflomal_intersection_max"] < 25.0


def test_eflomal_refuses_pairs_it_cannot_write():
    pytest.importorskip("eflomal", reason=NEEDS_EFLOMAL)
    bad = [Example(tokens=["a b"], target=["c"], meta={"source": "x.txt:3"})]
    with pytest.raises(AttnAuditError, match="x.txt:3"):
        eflomal_baseline(bad, [], 1, set(), set())
    with pytest.raises(AttnAuditError, match="at least 1"):
        eflomal_baseline([], [], 0, set(), set())
