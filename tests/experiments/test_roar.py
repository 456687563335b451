"""ROAR / Recursive ROAR: the masking rule, RACU from the result's own curves, which model explains each
recursive step, resume after a kill, bad values through the command line."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Example
from attnaudit.experiments.experiment import Result, get_experiment
from attnaudit.experiments.roar import (
    RationaleHits,
    curve_name,
    item_scores,
    mask_example,
    masked_count,
    masked_data,
    masked_positions,
    method_settings,
    rationale_hit,
    top_items,
)
from attnaudit.experiments.runner import run_test
from attnaudit.explain.registry import get_explanation
from attnaudit.io import read_json
from attnaudit.progress import set_quiet
from attnaudit.run import Run, load_run
from attnaudit.training.trainer import train
from tests.reliability.helpers import assert_clean_failure, cli

set_quiet(True)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data = synthetic_task("classification", seed=0, n_train=120, n_dev=24, n_test=24)
    return train(
        data, "bilstm", tmp_path_factory.mktemp("roar") / "run", epochs=2, lr=1e-2, batch_size=16,
        embed_dim=16, hidden_dim=8, quiet_eval=True,
    )


@pytest.fixture(scope="module")
def recursive(base: Run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("roar-recursive")
    result = run_test("roar", base, out=out, methods=["attention"], ratios=[30, 60], recursive=True, epochs=1, plot=False)
    return result, out


# --------------------------------------------------------------------------- the masking rule


def test_masked_count_is_the_floor_in_exact_arithmetic() -> None:
    # float32 int(0.7 * 10) can give 6; the floor of 70 % of 10 is 7
    assert [masked_count(k, 10) for k in (10, 30, 70, 90)] == [1, 3, 7, 9]
    assert [masked_count(k, 3) for k in (10, 33, 34, 50, 66, 67)] == [0, 0, 1, 1, 1, 2]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30), st.integers(1, 99), st.data())
def test_top_items_counts_keeps_and_breaks_ties_to_the_earlier_item(scores, ratio, data) -> None:
    n = len(scores)
    count = masked_count(ratio, n)
    keep = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=count)))
    chosen = top_items(np.array(scores), count, keep)
    assert len(chosen) == count == math.floor(ratio * n / 100)
    assert set(keep) <= set(chosen)
    rest = [i for i in range(n) if i not in keep]
    wanted = sorted(rest, key=lambda i: (-scores[i], i))[: count - len(keep)]
    assert chosen == sorted([*keep, *wanted])


def test_mask_example_masks_tokens_or_whole_sentences() -> None:
    ex = Example(tokens=["a", "b", "c", "d"], label="x")
    assert mask_example(ex, [1, 3], "<unk>").tokens == ["a", "<unk>", "c", "<unk>"]
    doc = Example(tokens=["a", "b", ".", "c", "."], sentences=[["a", "b", "."], ["c", "."]], label="x")
    masked = mask_example(doc, [0], "<unk>", sentences=True)
    assert masked.sentences == [["<unk>"] * 3, ["c", "."]] and masked.tokens == ["<unk>"] * 3 + ["c", "."]


# --------------------------------------------------------------------------- the test on a tiny BiLSTM


def racu_by_hand(curve: dict[int, float], random: dict[int, float]) -> float:
    ratios = sorted(curve)
    x = [r / 100 for r in ratios]
    dp = [random[r] - curve[r] for r in ratios]
    db = [random[r] - random[100] for r in ratios]
    between = sum(0.5 * (x[i + 1] - x[i]) * (dp[i] + dp[i + 1]) for i in range(len(x) - 1))
    most = sum(0.5 * (x[i + 1] - x[i]) * (db[i] + db[i + 1]) for i in range(len(x) - 1))
    return 100 * max(-1.0, min(1.0, between / most))


def test_racu_of_the_result_is_the_hand_computation_on_its_own_curves(recursive) -> None:
    result, _ = recursive
    curves = result.tables["curves"]
    by = {m: {r["ratio"]: r["score"] for r in curves if r["method"] == m} for m in ("attention", "random")}
    assert sorted(by["attention"]) == sorted(by["random"]) == [0, 30, 60, 100]
    assert by["attention"][0] == by["random"][0] and by["attention"][100] == by["random"][100]  # shared anchors
    if by["random"][0] == by["random"][100] and by["random"][30] == by["random"][100] == by["random"][60]:
        pytest.skip("flat random curve: no RACU")
    assert result.summary["racu_attention"] == pytest.approx(racu_by_hand(by["attention"], by["random"]), abs=1e-9)
    assert result.summary["metric"] == "accuracy" and result.summary["recursive"] is True
    base_accuracy = json.loads((Path(result.meta["run"]) / "metrics.json").read_text())["test"]["accuracy"]
    assert by["attention"][0] == pytest.approx(base_accuracy)


def _masks(out: Path, folder: str, ratio: int) -> dict[str, list[list[int]]]:
    return json.loads((out / "subruns" / "roar" / folder / f"ratio-{ratio}.masks.json").read_text())


def test_every_instance_has_floor_k_percent_of_its_items_masked(base: Run, recursive) -> None:
    _, out = recursive
    data = base.data()
    for ratio in (30, 60):
        masks = _masks(out, "seed-0/attention-recursive", ratio)
        for split in ("train", "dev", "test"):
            counts = [len(m) for m in masks[split]]
            assert counts == [math.floor(ratio * len(ex.tokens) / 100) for ex in data.split(split)]
    sub = load_run(out / "subruns" / "roar" / "seed-0" / "all" / "ratio-100")
    assert sub.info["variant"]["method"] == "all"


def test_recursive_step_is_explained_by_the_previous_steps_model_on_its_masked_data(base: Run, recursive) -> None:
    result, out = recursive
    rows = {r["ratio"]: r for r in result.tables["curves"] if r["method"] == "attention"}
    assert rows[30]["explained_by"] == "base"
    assert rows[60]["explained_by"] == "seed-0/attention-recursive/ratio-30"
    m30, m60 = _masks(out, "seed-0/attention-recursive", 30), _masks(out, "seed-0/attention-recursive", 60)
    previous = load_run(out / "subruns" / "roar" / "seed-0" / "attention-recursive" / "ratio-30")
    data30 = masked_data(base.data(), m30, "<unk>", False)
    scores = item_scores(base, previous.model, data30.test, get_explanation("attention"), 0)
    expected = [top_items(s, masked_count(60, len(s)), keep) for s, keep in zip(scores, m30["test"])]
    assert m60["test"] == expected
    assert all(set(a) <= set(b) for a, b in zip(m30["train"], m60["train"]))  # masked items stay masked
    base_scores = item_scores(base, base.model, base.data().test, get_explanation("attention"), 0)
    assert m30["test"] == [top_items(s, masked_count(30, len(s))) for s in base_scores]


def test_not_recursive_takes_every_ratio_from_the_base_model(base: Run, tmp_path: Path) -> None:
    result = run_test("roar", base, out=tmp_path, methods=["gradient"], ratios=[30, 60], epochs=1, plot=False)
    rows = [r for r in result.tables["curves"] if r["method"] == "gradient" and r["ratio"] in (30, 60)]
    assert [r["explained_by"] for r in rows] == ["base", "base"]
    scores = item_scores(base, base.model, base.data().test, get_explanation("gradient"), 0)
    assert _masks(tmp_path, "seed-0/gradient", 60)["test"] == [top_items(s, masked_count(60, len(s))) for s in scores]


def test_method_options_take_each_value_as_its_option_does_and_name_the_curve() -> None:
    given = method_settings(["attention.layer=0", "ig.steps=8", "ig.score=logit", "ig.absolute=false"], ["attention", "ig"])
    assert given == {"attention": {"layer": 0}, "ig": {"steps": 8, "score": "logit", "absolute": False}}
    assert curve_name(get_explanation("ig"), given["ig"], gold=True, recursive=True) == "ig-absolute-False-score-logit-steps-8-gold-recursive"
    assert curve_name(get_explanation("attention"), {}, gold=True, recursive=False) == "attention"  # attention explains no class


def test_gold_class_and_method_options_define_the_masks_and_their_own_curve(base: Run, recursive, tmp_path: Path) -> None:
    """Madsen et al.'s measures: the gold label explained, options per method; each such curve in a folder of its own, and
    a method with its defaults keeps the sub-runs (and config hashes) it had."""
    options = ["gradient.attention=live", "gradient.score=logit"]
    result = run_test("roar", base, out=tmp_path, methods=["attention", "gradient"], ratios=[30], epochs=1, plot=False,
                      explain="gold", method_options=options)
    data, gradient = base.data(), get_explanation("gradient")
    gold = item_scores(base, base.model, data.test, gradient, 0, {"attention": "live", "score": "logit"}, gold=True)
    masks = _masks(tmp_path, "seed-0/gradient-attention-live-score-logit-gold", 30)
    assert masks["test"] == [top_items(s, masked_count(30, len(s))) for s in gold]
    predicted = item_scores(base, base.model, data.test, gradient, 0, {"attention": "live", "score": "logit"})
    with torch.no_grad():
        guesses = torch.cat([base.model.logits_forward(b).logits.argmax(-1) for b in base.batches(data.test, 32)]).tolist()
    labels = [data.labels.index(str(ex.label)) for ex in data.test]
    same = [np.allclose(g, p) for g, p in zip(gold, predicted)]
    assert same == [g == y for g, y in zip(guesses, labels)]  # two classes: the gold class's gradient is another one where wrong
    assert not all(same)
    assert not np.allclose(np.concatenate(predicted), np.concatenate(item_scores(base, base.model, data.test, gradient, 0)))  # live
    # attention explains no class: the same folder, masks and hash as without --explain gold
    plain = run_test("roar", base, out=tmp_path / "plain", methods=["attention"], ratios=[30], epochs=1, plot=False)
    assert _masks(tmp_path, "seed-0/attention", 30) == _masks(tmp_path / "plain", "seed-0/attention", 30)
    config = [json.loads((o / "subruns/roar/seed-0/attention/ratio-30/config.json").read_text()) for o in (tmp_path, tmp_path / "plain")]
    assert config[0]["hash"] == config[1]["hash"]
    assert [r["score"] for r in plain.tables["curves"]] == [r["score"] for r in result.tables["curves"] if r["method"] in ("random", "attention")]
    notes = " ".join(result.meta["notes"])
    assert "gradient with attention=live, score=logit" in notes and "gold label" in notes


def test_resume_after_a_kill_retrains_only_the_unfinished_sub_run(base: Run, recursive, tmp_path: Path) -> None:
    import shutil

    result, out = recursive
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "subruns" / "roar" / "seed-0" / "attention-recursive" / "ratio-60" / "metrics.json").unlink()  # killed before the end
    again = run_test("roar", base, out=copy, methods=["attention"], ratios=[30, 60], recursive=True, epochs=1, plot=False)
    fresh = {(r["method"], r["ratio"]) for r in again.tables["curves"] if r["trained_now"]}
    assert fresh == {("attention", 60)}
    strip = [{k: v for k, v in r.items() if k != "trained_now"} for r in result.tables["curves"]]
    assert [{k: v for k, v in r.items() if k != "trained_now"} for r in again.tables["curves"]] == strip
    assert json.dumps(again.summary) == json.dumps(result.summary)  # NaN intervals (one seed) alike

    # another epoch budget retrains every model; the recursive step's source changed, so its items are chosen anew
    key = json.loads((copy / "subruns" / "roar" / "seed-0" / "attention-recursive" / "ratio-60.masks.json").read_text())["key"]
    longer = run_test("roar", base, out=copy, methods=["attention"], ratios=[30, 60], recursive=True, epochs=2, plot=False)
    assert all(r["trained_now"] for r in longer.tables["curves"] if r["model"] != "base")
    changed = json.loads((copy / "subruns" / "roar" / "seed-0" / "attention-recursive" / "ratio-60.masks.json").read_text())["key"]
    assert changed != key


def test_sub_runs_known_by_their_scores_alone_are_read_and_never_used_as_models(base: Run, recursive, tmp_path: Path) -> None:
    """A folder restored from a ledger (config and metrics, no weights, no masks) is read, not retrained; a curve
    cut short there needs its last step's model, and says so in one line; other tests train such a sub-run again."""
    import shutil

    from attnaudit.errors import AttnAuditError
    from attnaudit.experiments.uniform import UNIFORM
    from attnaudit.training.adversary import train_variant

    result, out = recursive
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    root = copy / "subruns" / "roar" / "seed-0"
    for stored in [*root.rglob("model.safetensors"), *root.rglob("*.masks.json"), *root.rglob("vocab.json")]:
        stored.unlink()
    again = run_test("roar", base, out=copy, methods=["attention"], ratios=[30, 60], recursive=True, epochs=1, plot=False)
    assert not any(r["trained_now"] for r in again.tables["curves"])
    restored = ("trained_now", "rationale_hit")
    strip = [{k: v for k, v in r.items() if k not in restored} for r in result.tables["curves"]]
    assert [{k: v for k, v in r.items() if k not in restored} for r in again.tables["curves"]] == strip
    # without its masks a restored step cannot say what they took; the anchors still can
    assert [r["rationale_hit"] for r in again.tables["curves"]] == [
        None if r["ratio"] in (30, 60) else r["ratio"] / 100 for r in again.tables["curves"]]
    assert not list(root.rglob("model.safetensors"))  # nothing was trained

    (root / "attention-recursive" / "ratio-60" / "metrics.json").unlink()  # the curve cut short after ratio 30
    with pytest.raises(AttnAuditError, match="not its weights.*delete that folder"):
        run_test("roar", base, out=copy, methods=["attention"], ratios=[30, 60], recursive=True, epochs=1, plot=False)

    uniform = tmp_path / "uniform"
    train_variant(base, uniform, UNIFORM, epochs=1)
    (uniform / "model.safetensors").unlink()
    assert train_variant(base, uniform, UNIFORM, epochs=1).trained and (uniform / "model.safetensors").is_file()


def test_plot_and_saved_tables(base: Run, recursive, tmp_path: Path) -> None:
    result, _ = recursive
    paths = get_experiment("roar").plot(result, tmp_path)
    assert {p.name for p in paths} == {"roar_curves.png", "roar_curves.svg"}
    result.save(tmp_path)
    assert (tmp_path / "roar_curves.csv").exists() and (tmp_path / "roar_racu.csv").exists()
    rows = get_experiment("roar").verdict(result)
    assert [r["statistic"] for r in rows] == ["racu_attention"]


def test_a_model_that_cannot_be_retrained_is_refused(base: Run) -> None:
    foreign = replace(base, info={**base.info, "kind": "hf"})
    assert "Hugging Face" in (get_experiment("roar").why_not(foreign) or "")


# --------------------------------------------------------------------------- bad values, through the CLI


@pytest.mark.parametrize(
    ("options", "names"),
    [
        (["--ratios", "0,120"], "--ratios must be percents strictly between 0 and 100"),
        (["--methods", "nonsense"], "--methods"),
        (["--methods", "rollout"], "rollout does not apply"),
        (["--metric", "bleu"], "--metric"),
        (["--seeds", "0"], "--seeds"),
        (["--seeds", "2147483648"], "--seeds 2147483648: at least"),
        (["--engine", "dask"], "unknown engine 'dask'; choose local or ray"),
        (["--workers", "2"], "--workers and --address are for --engine ray"),
        (["--engine", "ray", "--workers", "0"], "--workers must be at least 1"),
        (["--explain", "true"], "--explain must be predicted or gold, got 'true'"),
        (["--method-options", "ig.score"], "--method-options: 'ig.score' is not METHOD.OPTION=VALUE"),
        (["--methods", "gradient", "--method-options", "ig.score=logit"], "'ig' is not among the methods measured"),
        (["--methods", "gradient", "--method-options", "gradient.steps=4"], "gradient takes reduction, score, attention, not 'steps'"),
        (["--methods", "gradient", "--method-options", "gradient.attention=off"], "attention"),
        (["--methods", "ig", "--method-options", "ig.steps=many"], "ig.steps takes a int, got 'many'"),
        (["--methods", "ig", "--method-options", "ig.steps=0"], "ig.steps must be at least 1, got 0"),
        (["--methods", "attention", "--method-options", "attention.layer=last"], "attention.layer takes a int, got 'last'"),
        (["--methods", "ig", "--method-options", "ig.steps=100000000"], "--method-options ig.steps"),
        (["--together", "--engine", "ray"], "--together trains the retrains in this process: leave --engine at local"),
        (["--together"], "--together: dropout draws from one random stream per model, which stacked models would not reproduce"),
    ],
)
def test_bad_values_one_line_exit_2_nothing_written(base: Run, tmp_path: Path, options: list[str], names: str) -> None:
    out = tmp_path / "out"
    proc = cli("run", "roar", base.path, "--out", out, "--quiet", *options)
    assert_clean_failure(proc, names, out=out)
    assert not (out / "subruns").exists()


@pytest.mark.parametrize("family", ["han", "transformer", "pair", "transformer-pair"])
def test_every_native_family_retrains_with_its_items_masked(tiny_attention_run, family: str, tmp_path: Path) -> None:
    run = tiny_attention_run(family)
    result = run_test("roar", run, out=tmp_path, methods=["attention"], ratios=[50], epochs=1, plot=False)
    assert {(r["method"], r["ratio"]) for r in result.tables["curves"]} == {(m, k) for m in ("attention", "random") for k in (0, 50, 100)}
    masks = _masks(tmp_path, "seed-0/attention", 50)
    data = run.data()
    for split in ("train", "test"):
        if family == "han":  # items are sentences: every word of a masked sentence is masked
            n = [len([s for s in ex.sentences if s]) for ex in data.split(split)]
        else:  # items are the (passage) tokens; the query is never masked
            n = [len(ex.tokens) for ex in data.split(split)]
        assert [len(m) for m in masks[split]] == [k // 2 for k in n]
    sub = load_run(tmp_path / "subruns" / "roar" / "seed-0" / "attention" / "ratio-50")
    assert sub.info["variant"]["ratio"] == 50


def test_rationale_hit_counts_the_instances_whose_masks_take_part_of_their_rationale() -> None:
    han = Example(tokens=list("abcdefg"), label="x", sentences=[list("abc"), list("de"), list("fg")], rationale=[3])
    assert masked_positions(han, [1], sentences=True) == {3, 4}  # a HAN item is a sentence: all its words
    assert masked_positions(han, [0, 2], sentences=True) == {0, 1, 2, 5, 6}
    assert masked_positions(han, [1]) == {1}
    plain = [Example(tokens=list("abcd"), label="x", rationale=[2]), Example(tokens=list("abcd"), label="y", rationale=[0, 3]),
             Example(tokens=list("abcd"), label="x")]  # no rationale: not counted
    assert rationale_hit(plain, [[2], [1, 2], [0]]) == 0.5
    assert rationale_hit(plain, [[], [3], [0, 1, 2, 3]]) == 0.5
    assert rationale_hit([han], [[1]], sentences=True) == 1.0 and rationale_hit([han], [[0, 2]], sentences=True) == 0.0
    assert rationale_hit(plain[2:], [[0]]) is None
    hits = RationaleHits(plain, sentences=False)
    assert (hits.with_rationale, hits.none, hits.all) == (2, 0.0, 1.0)
    assert RationaleHits(plain[2:], sentences=False).add({"ratio": 0}, None) == {"ratio": 0}  # no rationale: no column


def test_the_curves_say_how_often_the_masks_took_the_synthetic_cue_words(base: Run, recursive) -> None:
    result, out = recursive
    test = base.data().test
    assert all(ex.rationale for ex in test)
    for row in result.tables["curves"]:
        if row["ratio"] in (0, 100):
            assert row["rationale_hit"] == (row["ratio"] / 100)
            continue
        folder = f"seed-0/{'attention-recursive' if row['method'] == 'attention' else 'random'}"
        masks = _masks(out, folder, row["ratio"])["test"]
        by_hand = sum(any(i in ex.rationale for i in m) for ex, m in zip(test, masks)) / len(test)
        assert row["rationale_hit"] == pytest.approx(by_hand)
    assert any(note.startswith(f"rationale_hit: of the {len(test)} test instances") for note in result.meta["notes"])


# --------------------------------------------------------------------------- a Hugging Face encoder through finetune


def test_mask_example_masks_the_text_as_written() -> None:
    ex = Example(tokens=["a", "warm", ",", "funny", "film"], label="x", meta={"text": "A warm, funny film"})
    masked = mask_example(ex, [1, 3], "[MASK]")
    assert masked.meta["text"] == "A [MASK], [MASK] film" and masked.tokens == ["a", "[MASK]", ",", "[MASK]", "film"]
    assert ex.meta["text"] == "A warm, funny film"  # the original untouched


@pytest.fixture(scope="module")
def tuned_hf(tiny_hf, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The tiny BERT fine-tuned by ``finetune`` on 40 sentences of its words whose label is whether ``good`` occurs."""
    import random as random_module

    from attnaudit.data.types import TaskData
    from attnaudit.training.finetune import finetune

    rng = random_module.Random(0)
    words = [w for w in tiny_hf.vocab[5:] if w != "good"]

    def example(i: int) -> Example:
        tokens = [rng.choice(words) for _ in range(rng.randint(4, 7))]
        if i % 2:
            tokens[rng.randrange(len(tokens))] = "good"
        return Example(tokens=tokens, label=["neg", "pos"][i % 2], meta={"text": " ".join(tokens)})

    data = [example(i) for i in range(56)]
    task = TaskData(name="t", task_type="classification", train=data[:40], dev=data[40:48], test=data[48:], labels=["neg", "pos"])
    return finetune(task, tmp_path_factory.mktemp("roar-hf") / "run", hf=str(tiny_hf.dir), epochs=1, batch_size=8, lr=1e-3, device="cpu")


def test_a_fine_tuned_hf_encoder_is_retrained_through_finetune(tuned_hf: Run, tmp_path: Path) -> None:
    result = run_test("roar", tuned_hf, out=tmp_path / "r", plot=False, methods=["gradient"], ratios=[50], seeds=1, epochs=1)
    curves = pd.DataFrame(result.tables["curves"])
    assert set(curves["method"]) == {"gradient", "random"} and set(curves["ratio"]) == {0, 50, 100}
    sub = tmp_path / "r" / "subruns" / "roar" / "seed-0" / "gradient" / "ratio-50"
    assert (sub / "metrics.json").is_file() and read_json(sub / "config.json")["finetune"]["variant"]
    masks = read_json(sub.with_name("ratio-50.masks.json"))
    test = tuned_hf.data().test
    assert [len(m) for m in masks["test"]] == [len(ex.tokens) // 2 for ex in test]  # floor(50 % of the words)
    again = run_test("roar", tuned_hf, out=tmp_path / "r", plot=False, methods=["gradient"], ratios=[50], seeds=1, epochs=1)
    assert [r["score"] for r in again.tables["curves"]] == [r["score"] for r in result.tables["curves"]]  # every sub-run loaded
    assert not any(row["trained_now"] for row in again.tables["curves"])


def test_a_pretrained_or_zero_shot_hf_model_is_refused(tiny_hf) -> None:
    from attnaudit.hf import load_hf

    run = load_hf(str(tiny_hf.dir), task=tiny_hf.task("classification"), device="cpu")
    assert "attnaudit finetune" in (get_experiment("roar").why_not(run) or "")


# --------------------------------------------------------------------------- --engine ray


class InlineRay:
    """Ray's task calls the engine uses (remote, wait, get, cancel), each task run at once in this process, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[int, str]] = []

    def remote(self, **_: object) -> object:
        ray = self

        class Remote:
            def __init__(self, fn: object) -> None:
                self.fn = fn

            def remote(self, item: tuple[object, int, str]) -> object:
                ray.items.append((item[1], item[2]))
                return self.fn(item)  # type: ignore[operator]

        return Remote

    def wait(self, refs: list[object], num_returns: int = 1, timeout: float | None = None) -> tuple[list[object], list[object]]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: object) -> object:
        return ref

    def cancel(self, ref: object, force: bool = False) -> None:  # pragma: no cover - nothing pends in this fake
        raise AssertionError("nothing to cancel")


def test_ray_engine_trains_every_sub_run_on_workers_and_the_driver_only_loads_them(base: Run, recursive, tmp_path: Path, monkeypatch) -> None:
    """``--engine ray``: the 0 % model of every seed, then each (seed, method) curve and the 100 % models, as tasks of their own
    (each a fresh load of the run from its folder); the test's loop then trains nothing and gives the one-process result."""
    from contextlib import contextmanager

    from attnaudit.experiments import roar

    fake = InlineRay()

    @contextmanager
    def session(address: object, workers: object):  # type: ignore[no-untyped-def]
        assert (address, workers) == (None, 2)
        yield fake

    monkeypatch.setattr(roar, "ray_session", session)
    monkeypatch.setattr(roar, "check_engine", lambda *args: None)  # the ray package need not be installed
    result, _ = recursive
    again = run_test("roar", base, out=tmp_path, methods=["attention"], ratios=[30, 60], recursive=True, epochs=1, plot=False,
                     engine="ray", workers=2)
    assert fake.items == [(0, "zero"), (0, "random"), (0, "attention"), (0, "all")]  # the one-retrain 100 % model last
    assert not any(r["trained_now"] for r in again.tables["curves"])  # every retrain was a task's
    strip = [{k: v for k, v in r.items() if k != "trained_now"} for r in result.tables["curves"]]
    assert [{k: v for k, v in r.items() if k != "trained_now"} for r in again.tables["curves"]] == strip


@pytest.mark.slow  # starts a local Ray (~15 s)
def test_ray_engine_on_a_local_ray_equals_one_process(base: Run, recursive, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    result, _ = recursive
    again = run_test("roar", base, out=tmp_path, methods=["attention"], ratios=[30, 60], recursive=True, epochs=1, plot=False,
                     engine="ray", workers=2)
    assert not any(r["trained_now"] for r in again.tables["curves"])
    assert [r["score"] for r in again.tables["curves"]] == [r["score"] for r in result.tables["curves"]]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A BiLSTM without dropout or clipping, whose retrains can train stacked (``--together``)."""
    data = synthetic_task("classification", seed=0, n_train=120, n_dev=24, n_test=24)
    return train(data, "bilstm", tmp_path_factory.mktemp("roar-plain") / "run", epochs=2, lr=1e-2, batch_size=16,
                 embed_dim=16, hidden_dim=8, dropout=0.0, clip=0.0, quiet_eval=True)


def test_together_trains_each_round_stacked_and_gives_the_one_process_result(plain: Run, tmp_path: Path) -> None:
    """``--together``: round 1 stacks both seeds' 100 % models and their first ratio of every curve (6 models), round 2
    the second ratio (4); seed 1's 0 % model trains alone. Every score is the one-at-a-time one."""
    options = {"methods": ["attention"], "ratios": [30, 60], "recursive": True, "seeds": 2, "epochs": 1, "plot": False}
    alone = run_test("roar", replace(plain, subruns=tmp_path / "alone"), out=tmp_path / "a", **options)
    together = run_test("roar", replace(plain, subruns=tmp_path / "together"), out=tmp_path / "b", together=True, **options)
    assert not any(r["trained_now"] for r in together.tables["curves"])  # the rounds trained them; the loop loads them
    for mine, theirs in zip(together.tables["curves"], alone.tables["curves"], strict=True):
        assert {k: v for k, v in mine.items() if k not in ("score", "trained_now")} == {
            k: v for k, v in theirs.items() if k not in ("score", "trained_now")}
        assert mine["score"] == pytest.approx(theirs["score"], abs=1e-6)
    stacked: dict[str, int] = {}
    for metrics in (tmp_path / "together").rglob("metrics.json"):
        name = metrics.parent.relative_to(tmp_path / "together" / "roar").as_posix()
        stacked[name] = read_json(metrics).get("together", {}).get("models", 1)
    assert stacked == {"seed-1/unmasked": 1, **{f"seed-{s}/all/ratio-100": 6 for s in (0, 1)},
                       **{f"seed-{s}/{c}/ratio-30": 6 for s in (0, 1) for c in ("random", "attention-recursive")},
                       **{f"seed-{s}/{c}/ratio-60": 4 for s in (0, 1) for c in ("random", "attention-recursive")}}
