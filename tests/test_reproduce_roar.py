"""benchmarks/reproduce_roar.py ``--so-far``: the RACU of the curves a reproduction has finished so far, read from
a hand-made folder of finished sub-runs (nothing trained), against a hand-computed RACU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` is a folder of the checkout

from benchmarks import reproduce_roar as rr  # noqa: E402


def _finished(folder: Path, macro_f1: float, seconds: float | None = None) -> None:
    folder.mkdir(parents=True)
    timed = {} if seconds is None else {"train_seconds": seconds}
    (folder / "metrics.json").write_text(json.dumps({"test": {"macro_f1": macro_f1, "accuracy": macro_f1}, **timed}))


def test_so_far_reads_only_finished_curves_beside_their_random_baseline(tmp_path: Path) -> None:
    base = tmp_path / "roar-sst"
    _finished(base, 1.0)  # seed 0's 0 % model: the base run
    root = tmp_path / "roar-sst-roar" / "subruns" / "roar" / "seed-0"
    _finished(root / "all" / "ratio-100", 0.0, seconds=1800)
    _finished(root / "random" / "ratio-50", 0.75, seconds=3600)
    _finished(root / "attention-recursive" / "ratio-50", 0.25, seconds=1800)
    gradient = rr.measure_folder("gradient")  # their gradient: ours with options, the gold label explained
    assert gradient == "input_gradient-reduction-l2-score-logit-gold-recursive"
    (root / gradient / "ratio-50" / "checkpoint").mkdir(parents=True)  # under way: not finished
    _finished(root / "ig-score-logit-gold-recursive" / "ratio-50", 0.5)  # an earlier definition of a measure: another curve
    args = argparse.Namespace(runs=tmp_path, limit=None, seeds=2, methods=["attention", "gradient"], ratios=[50], vectors=None, explain="gold")
    part = rr.so_far("sst", args)
    # x = 0, .5, 1; random − attention = 0, .5, 0 -> area .25; random − random(100 %) = 1, .75, 0 -> area .625; .25/.625
    by_method = {row["method"]: row for row in part["racu"]}
    assert by_method["attention"]["racu"] == pytest.approx(40.0)
    assert by_method["attention"]["seeds"] == 1 and by_method["attention"]["published"]["racu"] == 15.7
    assert by_method["gradient"]["seeds"] == 0  # its curve is not finished: no RACU yet
    assert part["partial"] and part["racu_per_seed"] == [{"method": "attention", "seed": 0, "racu": pytest.approx(40.0)}]
    assert sorted(part["missing_retrains"]) == sorted([
        f"seed-0/{gradient}/ratio-50", "seed-1/random/ratio-50", "seed-1/attention-recursive/ratio-50",
        f"seed-1/{gradient}/ratio-50", "seed-1/unmasked", "seed-1/all/ratio-100",
    ])
    assert part["unfinished_points"] == []  # seed 1 has no finished point; the gradient's 50 % is under way
    assert part["anchors"] == [{"seed": 0, "zero": 1.0, "all": 0.0}]
    # the retrains behind the RACU: the 0 % model (no time recorded), the 100 % model, random's and attention's 50 %
    assert part["training"] == {"retrains": 4, "timed": 3, "train_hours": pytest.approx(2.0)}
    # random − the other curve = 0, .25, 0 -> area .125; over .625
    (other,) = part["other_curves"]
    assert other["folder"] == "ig-score-logit-gold-recursive" and other["seeds"] == 1 and other["racu"] == pytest.approx(20.0)
    assert other["per_seed"] == [{"seed": 0, "racu": pytest.approx(20.0), "curve": [1.0, 0.5, 0.0]}]
    assert {(r["method"], r["ratio"]): r["score"] for r in part["curves"]} == {
        ("random", 0): 1.0, ("random", 50): 0.75, ("random", 100): 0.0,
        ("attention", 0): 1.0, ("attention", 50): 0.25, ("attention", 100): 0.0,
    }
    # every point of a complete curve keeps its model's training time (the 0 % model's was not recorded)
    assert {(r["method"], r["ratio"]): r["train_seconds"] for r in part["curves"]} == {
        ("random", 0): None, ("random", 50): 3600, ("random", 100): 1800,
        ("attention", 0): None, ("attention", 50): 1800, ("attention", 100): 1800,
    }


def test_explaining_the_predicted_class_reads_and_asks_for_curves_of_its_own(tmp_path: Path) -> None:
    """``--explain predicted``: the same measures, the class each step's model predicts; its curves sit beside the gold
    ones (no ``-gold`` in the folder), so each reading reports the other's among the other curves."""
    assert rr.measure_folder("input_gradient", "predicted") == "gradient-attention-live-score-logit-recursive"
    assert rr.measure_folder("input_gradient") == "gradient-attention-live-score-logit-gold-recursive"
    assert rr.roar_options(["input_gradient"], "predicted") == {
        "methods": ["gradient"], "explain": "predicted", "method_options": ["gradient.attention=live", "gradient.score=logit"]}
    _finished(tmp_path / "roar-babi1", 1.0)
    root = tmp_path / "roar-babi1-roar" / "subruns" / "roar" / "seed-0"
    _finished(root / "all" / "ratio-100", 0.0)
    _finished(root / "random" / "ratio-50", 0.75)
    _finished(root / rr.measure_folder("input_gradient") / "ratio-50", 0.25)
    _finished(root / rr.measure_folder("input_gradient", "predicted") / "ratio-50", 0.5)
    args = argparse.Namespace(runs=tmp_path, limit=None, seeds=1, methods=["input_gradient"], ratios=[50], vectors=None,
                              explain="predicted")
    part = rr.so_far("babi1", args)
    # as in the first test: an area of .125 between random and the curve at .5, .25 at .25, over .625
    assert part["racu_per_seed"] == [{"method": "input_gradient", "seed": 0, "racu": pytest.approx(20.0)}]
    assert part["racu"][0]["explain"] == "predicted"
    (gold,) = part["other_curves"]
    assert gold["folder"] == rr.measure_folder("input_gradient") and gold["racu"] == pytest.approx(40.0)


def test_so_far_gives_the_finished_points_of_curves_under_way(tmp_path: Path) -> None:
    root = tmp_path / "roar-babi1-roar" / "subruns" / "roar" / "seed-0"
    _finished(tmp_path / "roar-babi1", 1.0)
    _finished(root / "random" / "ratio-10", 0.875, seconds=1155)
    _finished(root / "attention-recursive" / "ratio-10", 0.164, seconds=1245)
    (root / "attention-recursive" / "ratio-20" / "checkpoint").mkdir(parents=True)  # under way
    args = argparse.Namespace(runs=tmp_path, limit=None, seeds=1, methods=["attention"], ratios=[10, 20], vectors=None, explain="gold")
    part = rr.so_far("babi1", args)
    assert part["racu_per_seed"] == [] and part["curves"] == []  # no curve is complete (nor the 100 % model)
    assert part["anchors"] == [{"seed": 0, "zero": 1.0, "all": None}]
    assert part["unfinished_points"] == [
        {"method": "random", "seed": 0, "ratio": 10, "score": 0.875, "train_seconds": 1155},
        {"method": "attention", "seed": 0, "ratio": 10, "score": 0.164, "train_seconds": 1245},
    ]
    assert sorted(part["missing_retrains"]) == ["seed-0/all/ratio-100", "seed-0/attention-recursive/ratio-20", "seed-0/random/ratio-20"]


def test_a_reproduction_from_pretrained_vectors_has_folders_of_its_own(tmp_path: Path) -> None:
    args = argparse.Namespace(runs=tmp_path, limit=200, vectors="hf:some/models/MiniLM_L6")
    assert rr.base_folder("sst", args) == tmp_path / "roar-sst-limit200-vectors-MiniLM-L6"
    assert rr.roar_root("sst", args) == tmp_path / "roar-sst-limit200-vectors-MiniLM-L6-roar" / "subruns" / "roar"
    plain = argparse.Namespace(runs=tmp_path, limit=None, vectors=None)
    assert rr.base_folder("sst", plain) == tmp_path / "roar-sst"  # the reproduction's own folders keep their names


def test_their_measures_are_ours_with_options_explaining_the_gold_label(tmp_path: Path) -> None:
    """Each of Madsen et al.'s measures, as their code computes it, from the gradient of the gold label's logit with the
    attention live: gradient ‖∂z/∂e‖₂ (over the embedding: see the module docstring), x ⊙ ∇ |Σ_d ∂z/∂e·e|; IG is ig
    with score=logit; and the roar test is asked for them with the gold label explained."""
    import torch

    from attnaudit.data.synthetic import synthetic_task
    from attnaudit.experiments.roar import item_scores
    from attnaudit.progress import set_quiet
    from attnaudit.training.trainer import train

    set_quiet(True)
    data = synthetic_task("classification", seed=1, n_train=60, n_dev=12, n_test=12)
    run = train(data, "bilstm", tmp_path / "run", epochs=1, batch_size=16, embed_dim=8, hidden_dim=4, quiet_eval=True)
    (batch,) = list(run.batches(data.test, 32))
    embeddings = run.model.embed(batch).detach().requires_grad_(True)
    z = run.model.logits_forward(batch, embeddings=embeddings).logits
    (grad,) = torch.autograd.grad(z.gather(1, batch.labels[:, None]).sum(), embeddings)
    lengths = batch.mask.sum(1).tolist()
    expected = {"gradient": grad.norm(dim=-1), "input_gradient": (grad * embeddings).sum(-1).abs()}
    for measure, by_hand in expected.items():
        method, settings = rr.MEASURES[measure]
        ours = item_scores(run, run.model, data.test, rr.EXPLANATIONS[method], 0, settings, gold=True)
        for row, n in zip(ours, lengths):
            assert len(row) == n
        assert np.allclose(np.concatenate(ours), np.concatenate([by_hand[i, :n].detach().numpy() for i, n in enumerate(lengths)]), atol=1e-6)
    assert rr.roar_options(["attention", "gradient", "input_gradient", "ig"]) == {
        "methods": ["attention", "input_gradient", "gradient", "ig"], "explain": "gold",
        "method_options": ["input_gradient.reduction=l2", "input_gradient.score=logit", "gradient.attention=live", "gradient.score=logit",
                           "ig.score=logit", "ig.rule=riemann_right", "ig.weight=scale"],
    }


OTHER_CURVES = {"ig-score-logit-gold-recursive": "IG, the integral", "gradient-recursive": "Jain & Wallace's gradient"}
"""What the results page calls the other complete curves ``--so-far`` reports (earlier definitions of a measure)."""


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def _seed_rows(task: dict, names: dict[str, str]) -> list[str]:
    """The per-seed RACU table's rows a page shows for ``task`` (``–`` where a seed lacks the measure's curve)."""
    seeds = sorted({r["seed"] for r in task["racu_per_seed"]})
    rows = []
    for row in task["racu"]:
        by_seed = {r["seed"]: r["racu"] for r in task["racu_per_seed"] if r["method"] == row["method"]}
        if by_seed:
            rows.append(f"| {names[row['method']]} | " + " | ".join(f"{by_seed[s]:.1f}" if s in by_seed else "–" for s in seeds) + " |")
    return rows


def test_the_pages_show_what_the_so_far_result_holds() -> None:
    """README's row and the results page's tables and seed-0 curves are the figures of ``roar_madsen2022_sst_so_far.json``:
    every measure's RACU, seed count and interval beside the published one, every seed's RACU, every other curve's."""
    root = Path(__file__).resolve().parents[1]
    result = json.loads((root / "benchmarks" / "results" / "roar_madsen2022_sst_so_far.json").read_text())
    (task,) = result["tasks"]
    page = (root / "docs" / "sections" / "results.md").read_text()
    readme = (root / "README.md").read_text()
    assert f"commit {result['commit'][:7]}" in page and not result["commit"].endswith("-dirty")
    names = {"attention": "attention", "gradient": "gradient", "input_gradient": "input × gradient", "ig": "IG"}
    for row in task["racu"]:
        paper = row["published"]
        theirs = f"{paper['racu']:.1f} ({paper['low']:.1f}–{paper['high']:.1f})"
        interval = f"; bootstrap interval {row['low']:.1f}–{row['high']:.1f}" if row["seeds"] > 1 else ""
        ours = "not yet" if row["seeds"] == 0 else f"{row['racu']:.1f} ({_seeds(row['seeds'])}{interval})"
        assert f"| {names[row['method']]} | {ours} | {theirs} |" in page
    for line in _seed_rows(task, names):
        assert line in page
    flat = " ".join(page.split())
    for other in task["other_curves"]:
        interval = f"; bootstrap interval {other['low']:.1f}–{other['high']:.1f}" if other["seeds"] > 1 else ""
        assert f"| {OTHER_CURVES[other['folder']]} | {other['racu']:.1f} ({_seeds(other['seeds'])}{interval}) |" in page
        zero = [s["curve"] for s in other["per_seed"] if s["seed"] == 0]
        if zero:
            assert f"{OTHER_CURVES[other['folder']]} {', '.join(f'{v:.3f}' for v in zero[0])}" in flat
    for method in ("random", *(r["method"] for r in task["racu"] if r["seeds"])):
        scores = [f"{r['score']:.3f}" for r in sorted(task["curves"], key=lambda r: r["ratio"]) if r["method"] == method and r["seed"] == 0]
        assert scores and f"{names.get(method, method)} {', '.join(scores)}" in flat
    first = "Without it (first protocol, 5 seeds) " + ", ".join(f"{names[r['method']]} {'was ' if i == 0 else ''}{r['racu']:.1f}%"
                                                               for i, r in enumerate(task["racu"]) if r["seeds"] == 5)
    assert first + ";" in readme


def test_the_pages_show_the_result_with_their_data_handling_beside_the_first_protocols_seed_0() -> None:
    """The results page's table with their data handling (``roar_madsen2022_sst_their_data_so_far.json``) beside the first
    protocol's seed 0 (``roar_madsen2022_sst_so_far.json``) and the published RACU; its seed-0 curves; README's row."""
    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results"
    (task,) = json.loads((results / "roar_madsen2022_sst_their_data_so_far.json").read_text())["tasks"]
    (first,) = json.loads((results / "roar_madsen2022_sst_so_far.json").read_text())["tasks"]
    commit = json.loads((results / "roar_madsen2022_sst_their_data_so_far.json").read_text())["commit"]
    page, readme = (root / "docs" / "sections" / "results.md").read_text(), (root / "README.md").read_text()
    assert f"commit {commit[:7]}" in page and not commit.endswith("-dirty")
    names = {"attention": "attention", "gradient": "gradient", "input_gradient": "input × gradient", "ig": "IG"}
    for row in task["racu"]:
        paper = row["published"]
        theirs = f"{paper['racu']:.1f} ({paper['low']:.1f}–{paper['high']:.1f})"
        interval = f"; bootstrap interval {row['low']:.1f}–{row['high']:.1f}" if row["seeds"] > 1 else ""
        ours = "not yet" if row["seeds"] == 0 else f"{row['racu']:.1f} ({_seeds(row['seeds'])}{interval})"
        seed0 = [f"{r['racu']:.1f}" for r in first["racu_per_seed"] if r["method"] == row["method"] and r["seed"] == 0] or ["–"]
        assert f"| {names[row['method']]} | {ours} | {seed0[0]} | {theirs} |" in page
        said = "not yet" if row["seeds"] == 0 else f"{row['racu']:.1f}% ({_seeds(row['seeds'])})"
        assert f"{names[row['method']]} {said} against {paper['racu']:.1f}% ({paper['low']:.1f}–{paper['high']:.1f})" in readme
    section = page[page.index("**With their data handling"):page.index("**First protocol")]
    seeds = sorted({r["seed"] for r in task["racu_per_seed"]})
    if len(seeds) > 1:  # each seed's RACU, in this section (the first protocol's table is below it)
        assert "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |" in section
        for line in _seed_rows(task, names):
            assert line in section
    flat = " ".join(section.split())
    if "training" in task:  # how many retrains the table rests on and how long they trained, as the JSON says
        training = task["training"]
        assert f"the {training['retrains']:,} retrains behind this table trained for {training['train_hours']:.1f} hours" in flat
    for method in ("random", *(r["method"] for r in task["racu"] if r["seeds"])):
        scores = [f"{r['score']:.3f}" for r in sorted(task["curves"], key=lambda r: r["ratio"]) if r["method"] == method and r["seed"] == 0]
        assert scores and f"{names.get(method, method)} {', '.join(scores)}" in flat


def _sub_run(folder: Path, data: Path, name: str, macro_f1: float | None) -> None:
    """A sub-run folder as ROAR leaves it: its config (hashed as the trainer hashes it), and its scores once finished."""
    from attnaudit.training.adversary import config_hash

    folder.mkdir(parents=True)
    config = {"kind": "attnaudit", "version": "0", "task": {"spec": "sst", "data_dir": str(data)}, "variant": {"method": name}}
    (folder / "config.json").write_text(json.dumps({**config, "hash": config_hash(config)}))
    (folder / "model.safetensors").write_bytes(b"weights are never carried")
    if macro_f1 is not None:
        (folder / "metrics.json").write_text(json.dumps({"dev": {}, "test": {"macro_f1": macro_f1}, "history": [{"epoch": 1}]}))


def test_the_ledger_carries_complete_curves_without_a_path_and_restores_them_where_the_data_is(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rr, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(rr, "write_result",
                        lambda name, payload, indent=2: rr.atomic_write_json(tmp_path / "results" / f"{name}.json", payload, indent))
    data = tmp_path / "data"
    args = argparse.Namespace(runs=tmp_path / "a", limit=None, seeds=1, methods=["attention", "gradient"], ratios=[30, 60],
                              data_dir=data, name="roar_test", vectors=None)
    root = rr.roar_root("sst", args) / "seed-0"
    _sub_run(root / "all" / "ratio-100", data, "all", 0.5)
    for ratio in (30, 60):
        _sub_run(root / "random" / f"ratio-{ratio}", data, "random", 0.75)
        _sub_run(root / "attention-recursive" / f"ratio-{ratio}", data, "attention", 0.6)
    _sub_run(root / "gradient-recursive" / "ratio-30", data, "gradient", 0.7)
    _sub_run(root / "gradient-recursive" / "ratio-60", data, "gradient", None)  # under way: its curve is not carried
    ledger = rr.write_ledger(["sst"], args)
    text = ledger.read_text()
    assert str(tmp_path) not in text and '"data_dir": "DATA"' in text and text.count("\n") == 1  # one line
    assert sorted(json.loads(text)["tasks"]["sst"]) == sorted(
        ["seed-0/all/ratio-100", *(f"seed-0/{n}/ratio-{r}" for n in ("random", "attention-recursive") for r in (30, 60))]
    )

    elsewhere = argparse.Namespace(**{**vars(args), "runs": tmp_path / "b"})
    assert rr.restore_ledger("sst", elsewhere) == 5
    for where in json.loads(text)["tasks"]["sst"]:
        restored, original = rr.roar_root("sst", elsewhere) / where, rr.roar_root("sst", args) / where
        assert sorted(p.name for p in restored.iterdir()) == ["config.json", "metrics.json"]  # scores only: no weights
        assert json.loads((restored / "config.json").read_text()) == json.loads((original / "config.json").read_text())
        scores = {k: v for k, v in json.loads((original / "metrics.json").read_text()).items() if k != "history"}
        assert json.loads((restored / "metrics.json").read_text()) == scores  # the per-epoch history left out
    assert rr.restore_ledger("sst", elsewhere) == 0  # already there
    moved = argparse.Namespace(**{**vars(args), "runs": tmp_path / "c", "data_dir": tmp_path / "other-data"})
    assert rr.restore_ledger("sst", moved) == 0  # the hashes were made with the data in another folder


def test_gradient_norm_agreement_counts_the_same_masked_words_and_the_rank_correlation() -> None:
    """benchmarks/roar_gradient_norm.py's summary, on hand-made scores: equal rankings agree at every ratio; a reversed
    ranking of ten words masks other words at every ratio below 100 % and correlates −1."""
    from benchmarks.roar_gradient_norm import RATIOS, agreement

    up = np.arange(10, dtype=float)
    same = agreement([(up, 2 * up + 1)])
    assert same["same_masked_words"] == {r: 1.0 for r in RATIOS} and same["spearman"]["mean"] == pytest.approx(1.0)
    mixed = agreement([(up, 2 * up), (up, -up)])
    assert mixed["same_masked_words"][50] == 0.5 and mixed["spearman"]["min"] == pytest.approx(-1.0)
    assert mixed["spearman"]["mean"] == pytest.approx(0.0) and mixed["n"] == 2


def test_their_ig_written_out_is_our_ig_with_their_options(tmp_path: Path) -> None:
    """benchmarks/roar_ig_path.py's ``riemann_paths``: their scale-weighted right Riemann sum, written out as their code
    computes it, equals our ``ig`` with the reproduction's options; the unweighted sum is another ranking."""
    from attnaudit.data.synthetic import synthetic_task
    from attnaudit.experiments.roar import item_scores
    from attnaudit.progress import set_quiet
    from attnaudit.training.trainer import train
    from benchmarks.roar_ig_path import riemann_paths

    set_quiet(True)
    data = synthetic_task("classification", seed=1, n_train=60, n_dev=12, n_test=12)
    run = train(data, "bilstm", tmp_path / "run", epochs=1, batch_size=16, embed_dim=8, hidden_dim=4, quiet_eval=True)
    theirs, plain = riemann_paths(run, data.test, steps=8)
    method, settings = rr.MEASURES["ig"]
    ours = item_scores(run, run.model, data.test, rr.EXPLANATIONS[method], 0, {**settings, "steps": 8}, gold=True)
    assert np.allclose(np.concatenate(ours), np.concatenate(theirs), atol=1e-6)
    assert not np.allclose(np.concatenate(plain), np.concatenate(theirs), atol=1e-6)


def test_vectors_diagnostic_compares_input_x_gradient_with_the_gradient_and_the_embedding(tmp_path: Path) -> None:
    """benchmarks/roar_vectors.py: ``alike`` on hand-made scores, and ``scores`` on a tiny run against the
    registered input × gradient of their definition (our ``gradient`` with the attention live, the gold logit)."""
    from dataclasses import replace

    import torch

    from attnaudit.data.synthetic import synthetic_task
    from attnaudit.explain.registry import EXPLANATIONS
    from attnaudit.training.trainer import train
    from benchmarks.roar_vectors import RATIOS, alike, scores

    up = np.arange(10, dtype=float)
    rows = [{"product": up, "gradient": 3 * up, "embedding": -up}]
    same = alike(rows, "gradient")
    assert same["same_masked_words"] == dict.fromkeys(RATIOS, 1.0) and same["spearman_mean"] == pytest.approx(1.0) and same["sentences"] == 1
    reversed_ = alike(rows, "embedding")
    assert reversed_["spearman_mean"] == pytest.approx(-1.0) and all(v == 0.0 for v in reversed_["same_masked_words"].values())

    run = train(synthetic_task("classification", seed=0, n_train=30, n_dev=10, n_test=10), "bilstm", tmp_path / "run",
                epochs=1, hidden_dim=4, embed_dim=4, quiet_eval=True)
    examples = run.data().test
    ours = scores(run, examples)
    batch = next(iter(run.batches(examples, 64)))
    batch = replace(batch, explained=batch.labels)  # the gold label, as the diagnostic explains it
    expected = EXPLANATIONS["gradient"](run, batch, attention="live", score="logit")
    for row, got in enumerate(ours):
        n = len(got["product"])
        assert np.allclose(got["product"], expected[row, :n].abs().numpy(), atol=1e-6)
        assert np.all(got["gradient"] >= 0) and np.allclose(got["embedding"], run.model.embed(batch)[row, :n].norm(dim=-1).detach().numpy())
    from benchmarks.roar_gradient_norm import both_norms  # the same gradients, through the helper both scripts share

    for (plain, through), got in zip(both_norms(run, examples, torch.eye(4)), ours):
        assert np.allclose(plain, through, atol=1e-6) and np.allclose(plain, got["gradient"], atol=1e-6)


def test_the_pages_show_the_result_from_pretrained_vectors_beside_the_random_start() -> None:
    """The results page's table of the reproduction started from MiniLM's static vectors
    (``roar_madsen2022_sst_minilm_vectors_so_far.json``: mean and each seed's RACU, "–" at a seed where a measure is
    not finished, its seed count in README's sentence) beside the same seeds of the random
    start with the same data handling (``roar_madsen2022_sst_their_data_so_far.json``) and the published RACU; its seed-0
    curves; README's sentence."""
    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results"
    vectors = json.loads((results / "roar_madsen2022_sst_minilm_vectors_so_far.json").read_text())
    (task,) = vectors["tasks"]
    (random_start,) = json.loads((results / "roar_madsen2022_sst_their_data_so_far.json").read_text())["tasks"]
    page, readme = (root / "docs" / "sections" / "results.md").read_text(), " ".join((root / "README.md").read_text().split())
    section = page[page.index("**Starting from pretrained vectors"):page.index("**First protocol")]
    assert task["vectors"] == "minilm" and f"commit {vectors['commit'][:7]}" in section and not vectors["commit"].endswith("-dirty")
    names = {"attention": "attention", "gradient": "gradient", "input_gradient": "input × gradient", "ig": "IG"}
    columns = sorted({r["seed"] for r in task["racu_per_seed"]})  # the table's seeds; a measure finished at fewer shows "–" for the rest
    most = max(row["seeds"] for row in task["racu"])
    assert columns == list(range(most)) and f"seeds 0–{most - 1}" in section

    def cells(values: dict[int, float]) -> str:
        return ", ".join(f"{values[k]:.1f}" if k in values else "–" for k in columns)

    said = []
    for row in task["racu"]:
        if not row["seeds"]:
            continue
        paper = row["published"]
        ours = {r["seed"]: r["racu"] for r in task["racu_per_seed"] if r["method"] == row["method"]}
        theirs = {r["seed"]: r["racu"] for r in random_start["racu_per_seed"] if r["method"] == row["method"] and r["seed"] in ours}
        assert len(ours) == row["seeds"] and sorted(theirs) == sorted(ours) and abs(row["racu"] - np.mean(list(ours.values()))) < 1e-9
        same = float(np.mean(list(theirs.values())))
        assert (f"| {names[row['method']]} | {row['racu']:.1f} ({cells(ours)}) | {same:.1f} ({cells(theirs)}) | "
                f"{paper['racu']:.1f} ({paper['low']:.1f}–{paper['high']:.1f}) |") in section
        fewer = "" if row["seeds"] == most else f"{rr.seeds(row['seeds'])}; "  # a measure with fewer seeds says how many
        said.append(f"{names[row['method']]} {row['racu']:.1f}% ({fewer}random start, same seeds, {same:.1f}%)")
    assert said and ", ".join(said) in readme
    flat = " ".join(section.split())
    for seed in columns:  # every seed's curves, each in its own sentence, with every measure finished at that seed
        line = flat[flat.index(f"Seed {seed}'s curves from the vectors"):]
        line = line[:line.index(". ")]  # the sentence ends at its full stop; the scores' decimal points have digits after them
        for method in ("random", *(r["method"] for r in task["racu"] if r["seeds"])):
            scores = [f"{r['score']:.3f}" for r in sorted(task["curves"], key=lambda r: r["ratio"]) if r["method"] == method and r["seed"] == seed]
            assert scores or method != "random"  # random is every seed's baseline; a measure may be finished at fewer seeds
            assert not scores or f"{names.get(method, method)} {', '.join(scores)}" in line
    why = json.loads((results / "roar_vectors.json").read_text())  # benchmarks/roar_vectors.py, quoted in the same section
    assert f"commit {why['commit'][:7]}" in flat and not why["commit"].endswith("-dirty")
    vec, rnd = why["bases"]["minilm"], why["bases"]["random"]
    assert (f"{vec['product_vs_embedding']['spearman_mean']:.2f} for the base started from the vectors, against "
            f"{rnd['product_vs_embedding']['spearman_mean']:.2f} for the base started random") in flat
    assert f"(coefficient of variation {vec['embedding_norm']['cv']:.2f} against {rnd['embedding_norm']['cv']:.2f})" in flat
    assert f"({vec['product_vs_gradient']['spearman_mean']:.2f} against {rnd['product_vs_gradient']['spearman_mean']:.2f})" in flat


def test_the_pages_show_the_gpu_run_and_the_gpu_batching_as_measured() -> None:
    """The results page's paragraph on the GPU run (``roar_sst_cuda.json`` and its ledger beside the CPU's seed 0 of
    ``roar_madsen2022_sst_their_data_so_far.json`` and its ledger) and the training-tests page's GPU batching sentence
    (``batched_lstm_cuda*.json``) say what the files hold."""
    from benchmarks.common import stats  # the min / median / max every speed figure uses

    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results"
    load = lambda name: json.loads((results / f"{name}.json").read_text())  # noqa: E731
    page = " ".join((root / "docs" / "sections" / "results.md").read_text().split())
    section = page[page.index("**On a GPU (seed 0, attention only).**"):page.index("**Starting from pretrained vectors")]
    (gpu,) = load("roar_sst_cuda")["tasks"]
    (cpu,) = load("roar_madsen2022_sst_their_data_so_far")["tasks"]
    g = {(r["method"], r["ratio"]): r["score"] for r in gpu["curves"]}
    c = {(r["method"], r["ratio"]): r["score"] for r in cpu["curves"] if r["seed"] == 0}
    same = [r for r in range(0, 101, 10) if g["random", r] == c["random", r]]
    differ = [r for r in range(0, 101, 10) if r not in same]
    assert g["random", 0] == c["random", 0] and f"macro-F1 {g['random', 0]:.4f}" in section
    assert f"at every ratio but {differ[0]} % and {differ[1]} %" in section and len(differ) == 2
    pairs = ", ".join(f"{g['random', r]:.3f} against {c['random', r]:.3f}" for r in differ)
    assert f"({pairs})" in section
    assert f"({g['attention', 40]:.3f} against {c['attention', 40]:.3f} at 40 %)" in section
    assert all(abs(g["attention", r] - c["attention", r]) < 0.002 for r in (10, 20, 30))  # the drift starts at 40 %
    theirs = next(r["racu"] for r in cpu["racu_per_seed"] if r["method"] == "attention" and r["seed"] == 0)
    assert f"attention's RACU is {gpu['racu'][0]['racu']:.1f}, against {theirs:.1f} for the CPU's seed 0" in section
    on_gpu = load("roar_sst_cuda_ledger")["tasks"]["sst"]
    seconds = [e["metrics"]["train_seconds"] for e in on_gpu.values()]
    cpu_seconds = [e["metrics"]["train_seconds"] for k, e in load("roar_madsen2022_sst_their_data_ledger")["tasks"]["sst"].items() if k in on_gpu]
    assert len(seconds) == len(cpu_seconds) == 19
    there, here = stats(seconds), stats(cpu_seconds)
    assert (f"{there['median']:.1f} s there (median of {len(seconds)}; {there['min']:.1f}–{there['max']:.1f} s), against "
            f"{here['median']:.1f} s ({here['min']:.1f}–{here['max']:.1f} s)") in section
    tests_page = " ".join((root / "docs" / "sections" / "training-tests.md").read_text().split())
    ten, fifty = load("batched_lstm_cuda"), load("batched_lstm_cuda_k50")
    for data in (ten, fifty):
        assert data["device"] == "NVIDIA H200" and data["equal"]["max_gradient_difference"] < 1e-4
    ratio = lambda d: f"{d['timing']['speedup']['median']:.1f}× ({d['timing']['speedup']['min']:.1f}–{d['timing']['speedup']['max']:.1f}×)"  # noqa: E731
    assert f"runs 10 encoders' step {ratio(ten)} faster than 10 `nn.LSTM` passes and 50 encoders' {ratio(fifty)} faster" in tests_page
    ms = lambda d: round(d["timing"]["seconds"]["stacked"]["median"] * 1000)  # noqa: E731
    assert f"in {ms(ten)} ms for 10 and {ms(fifty)} ms for 50" in tests_page
    roof = fifty["roofline"]
    assert f"reach {roof['separate_gflops']['median']:.0f} GFLOP/s, a 4096² matmul {roof['matmul_gflops']['median']:,.0f})" in tests_page


def test_the_tests_page_shows_the_cuda_runs_of_roar_and_sanity_as_measured() -> None:
    """The training-tests page's "On CUDA" sentence says what ``benchmarks/cuda_roar_sanity.sh`` wrote on each device."""
    root = Path(__file__).resolve().parents[1]
    folder = root / "benchmarks" / "results" / "cuda_roar_sanity"
    page = " ".join((root / "docs" / "sections" / "training-tests.md").read_text().split())
    line = page[page.index("**On CUDA**"):]
    names = {"attention": "attention", "gradient": "gradient", "loo": "leave-one-out", "input_gradient": "input gradient"}
    for run, label in (("syn", "BiLSTM"), ("sparse", "sparsemax Transformer")):
        summary = {d: json.loads((folder / f"{d}-{run}-sanity.json").read_text())["summary"] for d in ("cuda", "cpu")}
        methods = [k.removesuffix("_verdict") for k in summary["cuda"] if k.endswith("_verdict")]
        assert methods == [k.removesuffix("_verdict") for k in summary["cpu"] if k.endswith("_verdict")]
        assert all(summary[d][f"{m}_verdict"] == "passes" for d in summary for m in methods)
        assert f"{label}: {', '.join(names[m] for m in methods)}" in line
        racu = {d: json.loads((folder / f"{d}-{run}-roar.json").read_text())["summary"] for d in ("cuda", "cpu")}
        said = ", ".join(f"{m} {racu['cuda'][f'racu_{m}']:.1f} against {racu['cpu'][f'racu_{m}']:.1f}" for m in ("attention", "gradient"))
        assert f"{label} {said}" in line
    assert not any("/tmp" in f.read_text() for f in folder.glob("*.json"))  # the scratch folder is written RUNS


def test_the_tests_page_shows_the_retrains_trained_together_on_the_gpu_as_measured() -> None:
    """The training-tests page's "Together" paragraph says what ``benchmarks/bench_together.py`` wrote (``together_cuda.json``)."""
    from benchmarks.common import ratio_span, span

    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "benchmarks" / "results" / "together_cuda.json").read_text())
    page = " ".join((root / "docs" / "sections" / "training-tests.md").read_text().split())
    timing = data["timing"]
    assert data["device"] == "NVIDIA H200" and data["models"] == 20 and data["epochs"] == 1 and timing["repeats"] == 5
    seconds = {way: span(timing["seconds"][way], ".1f", " s") for way in ("together", "separate")}
    assert (f"train together in {seconds['together']} against {seconds['separate']} one at a time: "
            f"{ratio_span(timing['speedup'])} over 5 interleaved rounds") in page
    gap = max(abs(job["together"][k] - job["separate"][k]) for job in data["test_scores"] for k in job["together"])
    assert f"test scores agree to {gap:.0e}" in page
    assert f"the weights differ by up to {data['max_weight_difference']:.1g} after the epoch" in page
    readme = " ".join((root / "README.md").read_text().split())
    assert f"20 SST retrains {ratio_span(timing['speedup'])} faster than one at a time" in readme


BABI_LABELS = {"attention": "attention", "gradient": "gradient", "input_gradient": "input × gradient", "ig": "IG"}
"""How the bAbI-1 section and README's row name their measures."""


def _first_babi_run_in_readme(results: Path, readme: str) -> None:
    """README's row keeps the first run's (128 units) attention RACU beside theirs and the floor's ceiling."""
    from attnaudit.algorithms.racu import racu

    (first,) = json.loads((results / "roar_madsen2022_babi1_h128_so_far.json").read_text())["tasks"]
    (attention,) = [r for r in first["racu_per_seed"] if r["seed"] == 0]
    published = {r["method"]: r["published"] for r in first["racu"]}["attention"]
    points = [r for r in first["curves"] if r["seed"] == 0 and r["method"] == "random"]
    random = [p["score"] for p in sorted(points, key=lambda p: p["ratio"])]
    ceiling = 100 * racu(list(range(0, 101, 10)), [random[0], *[random[-1]] * 10], random)
    assert f"On bAbI-1 (seed 0 so far, `python benchmarks/reproduce_roar.py --tasks babi1 --seeds 5 --runs ../runs-babi " \
           f"--name roar_madsen2022_babi1_h128 --so-far`, our earlier 128-unit model): attention {attention['racu']:.1f}% " \
           f"against {published['racu']}% ({published['low']}–{published['high']}), " \
           f"near the {ceiling:.1f}% of a curve at the floor from the first step" in readme


def _babi_masks_on_page(section: str, masked: dict[str, dict[int, Any]], measures: list[str]) -> None:
    """What each measure's masks took, and why input × gradient and IG climb back (their retrains' accuracy where
    every occurrence of the answer is masked), as ``roar_babi32_rationale.json`` holds them."""
    for folder in ["random", *(rr.measure_folder(m) for m in measures)]:
        assert sorted(masked[folder]) == list(range(10, 100, 10))
    answer = masked[rr.measure_folder("attention")]
    assert {v[split]["answer_hit"] for v in answer.values() for split in ("train", "dev", "test")} == {1.0}
    for method in measures:
        hits = [masked[rr.measure_folder(method)][r]["test"]["answer_hit"] for r in (10, 50, 90)]
        assert f"{BABI_LABELS[method]}'s in " + "{:.1%}, {:.1%} and {:.1%}".format(*hits) in section
    hits = [masked["random"][r]["test"]["answer_hit"] for r in (10, 50, 90)]
    assert "random's in {:.1%}, {:.1%} and {:.1%} at 10, 50 and 90 %".format(*hits) in section
    late = (50, 60, 70, 80, 90)
    if "input_gradient" in measures:  # the climb from 50 % on, read from the retrains' accuracy where the answer is hidden
        x = masked[rr.measure_folder("input_gradient")]
        assert f"hide every occurrence of the answer in {x[50]['test']['answer_everywhere']:.0%} to " \
               f"{x[90]['test']['answer_everywhere']:.0%} of the test stories" in section
        hidden = ", ".join(f"{x[r]['by_answer']['hidden']['accuracy']:.2f}" for r in late)
        assert f"yet its retrains answer those stories right {hidden} of the time at 50, 60, 70, 80 and 90 %" in section
        eliminated = [x[r]["test"]["elimination"] for r in late]
        assert f"{min(eliminated):.3f} to {max(eliminated):.3f} for a guess among the candidates" in section
        guessed = [masked[rr.measure_folder("attention")][r]["by_answer"]["hidden"]["accuracy"] for r in late]
        assert f"Attention's retrains score {min(guessed):.2f} to {max(guessed):.2f} on such stories" in section
        assert min(x[r]["by_answer"]["hidden"]["accuracy"] for r in late) > 2 * max(eliminated)  # what the sentence claims
    if "ig" in measures:
        ig = masked[rr.measure_folder("ig")]
        hidden = ", ".join(f"{ig[r]['by_answer']['hidden']['accuracy']:.2f}" for r in range(10, 100, 10))
        assert f"on the stories whose answer every mask hides its retrains score {hidden} from 10 to 90 %" in section


def _babi_predicted_control(section: str, readme: str, task: dict[str, Any], masked: dict[str, dict[int, Any]],
                            gold_racu: float) -> None:
    """input × gradient asked for the predicted class (``--explain predicted``, among ``other_curves``): its curve,
    RACU and accuracy where the answer is hidden, on the page and in README's row, where it was run."""
    predicted = rr.measure_folder("input_gradient", "predicted")
    other = {o["folder"]: o for o in task["other_curves"]}
    if predicted not in other:
        return
    (one,) = other[predicted]["per_seed"]
    assert "--methods input_gradient --explain predicted --runs ../runs-babi32" in section
    assert f"its curve reads {', '.join(f'{v:.3f}' for v in one['curve'][1:-1])} from 10 to 90 %, RACU {one['racu']:.1f} " \
           f"against {gold_racu:.1f} explaining the gold label" in section
    hidden = ", ".join(f"{masked[predicted][r]['by_answer']['hidden']['accuracy']:.2f}" for r in (50, 60, 70, 80, 90))
    assert f"On the stories whose answer every mask hides, its retrains score {hidden} at 50, 60, 70, 80 and 90 %" in section
    assert f"asked for the predicted class instead, input × gradient's RACU is {one['racu']:.1f}" in readme


def test_the_results_page_shows_babi_with_their_model_as_measured() -> None:
    """bAbI-1 with their model (the preset since e55444a): seed 0's curves and every finished measure's RACU beside
    theirs, the ceiling a curve at the floor would reach, the retrains' times and the missing count
    (``roar_madsen2022_babi1_so_far.json``), what each measure's masks took (``roar_babi32_rationale.json``), the
    predicted-class control, and README's row beside the first run's RACU."""
    from attnaudit.algorithms.racu import racu

    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results"
    page = (root / "docs" / "sections" / "results.md").read_text()
    section = " ".join(page[page.index("### bAbI-1 (under way"):page.index("#### The first run: our earlier preset")].split())
    readme = " ".join((root / "README.md").read_text().split())
    _first_babi_run_in_readme(results, readme)

    (task,) = json.loads((results / "roar_madsen2022_babi1_so_far.json").read_text())["tasks"]
    points = [r for r in task["curves"] if r["seed"] == 0]
    ratios = list(range(0, 101, 10))
    assert sorted({p["ratio"] for p in points}) == ratios
    per_seed = {r["method"]: r["racu"] for r in task["racu_per_seed"] if r["seed"] == 0}
    measures = [m for m in rr.MEASURES if m in per_seed]
    assert "attention" in measures
    published = {r["method"]: r["published"] for r in task["racu"]}
    random = [next(p["score"] for p in points if p["method"] == "random" and p["ratio"] == r) for r in ratios]
    ceiling = 100 * racu(ratios, [random[0], *[random[-1]] * (len(ratios) - 1)], random)
    assert f"| seed 0 | {' | '.join(f'{r} %' for r in ratios)} | RACU |" in section
    for method in ["random", *measures]:
        scores = [next(p["score"] for p in points if p["method"] == method and p["ratio"] == r) for r in ratios]
        value = "–" if method == "random" else f"{per_seed[method]:.1f}"
        assert f"| {method} | {' | '.join(f'{v:.3f}' for v in scores)} | {value} |" in section

    def against(method: str, unit: str = "") -> str:
        theirs = published[method]
        return f"{BABI_LABELS[method]} {per_seed[method]:.1f}{unit} against their {theirs['racu']}{unit} " \
               f"({theirs['low']}–{theirs['high']})"

    assert "Seed 0's RACU: " + ", ".join(against(m) for m in measures) + "." in section
    assert "their 32-unit model (seed 0, `python benchmarks/reproduce_roar.py --tasks babi1 --seeds 5 --runs ../runs-babi32 " \
           "--name roar_madsen2022_babi1 --so-far`): " + ", ".join(against(m, "%") for m in measures) in readme
    sides = {m: "inside" if published[m]["low"] <= per_seed[m] <= published[m]["high"] else
             "above" if per_seed[m] > published[m]["high"] else "below" for m in measures}
    assert "Against their intervals, " + "; ".join(
        f"{side}: " + ", ".join(BABI_LABELS[m] for m in measures if sides[m] == side)
        for side in ("inside", "above", "below") if side in sides.values()) in section
    assert f"The most any measure can reach against this random curve is {ceiling:.1f}" in section
    minutes = [p["train_seconds"] / 60 for p in points if p["ratio"] > 0]
    assert f"each took {min(minutes):.1f} to {max(minutes):.1f} minutes" in section
    training = task["training"]
    assert f"the {training['retrains']} retrains behind it trained for {training['train_hours']:.1f} hours" in section
    missing = len(task["missing_retrains"])
    assert f"{missing} retrains of the five seeds and four measures are still missing" in section
    assert f"about {missing * sum(minutes) / len(minutes) / 60:.0f} CPU-hours at this pace" in section

    rationale = json.loads((results / "roar_babi32_rationale.json").read_text())["runs"]["roar-babi1"]["curves"]
    masked = {c.split("/")[-1]: {int(k): v for k, v in r.items()} for c, r in rationale.items() if c.startswith("seed-0/")}
    _babi_masks_on_page(section, masked, measures)
    if "input_gradient" in measures:
        _babi_predicted_control(section, readme, task, masked, per_seed["input_gradient"])


def test_the_results_page_shows_the_first_babi_run_as_measured() -> None:
    """The first bAbI-1 run (our earlier preset: 128 units, our pair head): seed 0's curves and RACU beside theirs, the
    retrains' times and the missing count are those of ``roar_madsen2022_babi1_h128_so_far.json``; the early-stopping
    figures those of ``roar_babi_patience.json``; what the masks removed those of ``roar_babi_rationale.json``."""
    root = Path(__file__).resolve().parents[1]
    results = root / "benchmarks" / "results"
    (task,) = json.loads((results / "roar_madsen2022_babi1_h128_so_far.json").read_text())["tasks"]
    page = (root / "docs" / "sections" / "results.md").read_text()
    section = " ".join(page[page.index("#### The first run: our earlier preset"):page.index("## Sparse attention")].split())
    points = [r for r in task["curves"] if r["seed"] == 0]
    ratios = sorted({p["ratio"] for p in points})
    assert ratios == list(range(0, 101, 10)) and task["unfinished_points"] == []
    assert f"| seed 0 | {' | '.join(f'{r} %' for r in ratios)} | RACU |" in section
    (attention,) = [r for r in task["racu_per_seed"] if r["seed"] == 0]
    for method, racu in (("random", "–"), ("attention", f"{attention['racu']:.1f}")):
        scores = [next(p["score"] for p in points if p["method"] == method and p["ratio"] == r) for r in ratios]
        assert f"| {method} | {' | '.join(f'{v:.3f}' for v in scores)} | {racu} |" in section
    published = next(r for r in task["racu"] if r["method"] == "attention")["published"]
    assert f"against their {published['racu']} ({published['low']}–{published['high']})" in section
    random = [next(p["score"] for p in points if p["method"] == "random" and p["ratio"] == r) for r in ratios]
    from attnaudit.algorithms.racu import racu

    floor = 100 * racu(ratios, [random[0], *[random[-1]] * (len(ratios) - 1)], random)  # at the 100 % model from 10 % on
    assert f"against this random curve: {floor:.1f}, for a curve at the 100 % model's score from 10 % on" in section
    minutes = [p["train_seconds"] / 60 for p in points if p["ratio"] > 0]
    assert f"each took {min(minutes):.0f} to {max(minutes):.0f} minutes" in section
    training = task["training"]
    assert training["retrains"] == training["timed"] == 2 + 2 * 9  # the 0 % and 100 % models, random's and attention's nine
    assert f"the {training['retrains']} retrains behind it trained for {training['train_hours']:.1f} hours" in section
    assert f"{len(task['missing_retrains'])} retrains of the five seeds" in section
    assert f"at {min(minutes):.0f} minutes each, more than {len(task['missing_retrains']) * min(minutes) // 600 * 10:.0f} CPU-hours" in section
    rationale = json.loads((results / "roar_babi_rationale.json").read_text())["runs"]["roar-babi1"]["curves"]
    masked = {c.split("/")[-1]: {int(k): v for k, v in r.items()} for c, r in rationale.items()}
    assert all(v[split]["answer_hit"] == 1.0 for v in masked["attention-recursive"].values() for split in ("train", "dev", "test"))
    assert sorted(masked["attention-recursive"]) == sorted(masked["random"]) == list(range(10, 100, 10))
    first = masked["attention-recursive"][10]["test"]
    assert (first["instances"], first["with_answer"]) == (1000, 1000)
    assert f"{first['rationale_masked']:.0%} of the supporting sentence's tokens" in section
    hits = [masked["random"][r]["test"]["answer_hit"] for r in (10, 50, 90)]
    assert "Random masks hit it in {:.1%}, {:.1%} and {:.1%} of the test stories at 10, 50 and 90 %".format(*hits) in section
    random_ten = next(p["score"] for p in points if p["method"] == "random" and p["ratio"] == 10)
    assert f"at 10 % its retrain scores a little under the share of stories left with it ({random_ten:.3f} against {1 - hits[0]:.3f})" in section
    patience = json.loads((results / "roar_babi_patience.json").read_text())
    summary, runs = patience["summary"], patience["runs"]
    base = next(r for r in runs if r["run"] == "roar-babi1")
    assert base["epochs"] == base["kept"] == 4 and "at its fourth epoch" in section
    twenty, five, ten = summary["20"], summary["5"], summary["10"]
    assert twenty["runs"] == five["runs"] == ten["runs"] == len(runs)
    assert f"Of the {len(runs)} finished runs, patience 20 keeps the epoch of {twenty['same']}, " \
           f"in {twenty['epochs']} of their {twenty['epochs_full']} epochs" in section
    (missed,) = [r for r in runs if not r["patience_20"]["same"]]  # the page names one
    assert missed["run"].endswith("attention-recursive/ratio-50")
    assert f"best at epoch {missed['kept']}, and patience 20 stops it with {missed['patience_20']['dev_lost']:.3f} less" in section
    assert f"Patience 10 keeps {ten['same']} of {ten['runs']} and patience 5 keeps {five['same']}, " \
           f"losing up to {max(five['max_dev_lost'], ten['max_dev_lost']):.3f} dev accuracy" in section

    def listed(words: list[str]) -> str:
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]

    late = sorted((r for r in runs if "attention-recursive" in r["run"] and not r["patience_5"]["same"]),
                  key=lambda r: int(r["run"].rsplit("-", 1)[-1]))
    assert f"best at epochs {listed([str(r['kept']) for r in late])} at " \
           f"{listed([r['run'].rsplit('-', 1)[-1] for r in late])} %" in section
