"""benchmarks/roar_rationale.py: a ROAR run's kept masks against bAbI's supporting facts, counted as hand-worked on a
tiny bAbI file, split by split, with the retrain's test score beside them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from attnaudit.data.types import Example
from attnaudit.io import atomic_write_json
from attnaudit.run import TaskSpec, write_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` is a folder of the checkout

from benchmarks import roar_rationale as rr  # noqa: E402

STORY = "1 Mary moved to the bathroom.\n2 John went to the hallway.\n3 Where is Mary? \tbathroom\t1\n"
TEST = (STORY + "4 Daniel went back to the kitchen.\n5 Where is Daniel? \tkitchen\t4\n"
        "1 Sandra journeyed to the office.\n2 Where is Sandra? \toffice\t1\n")


def _runs(tmp_path: Path, test_masks: list[list[int]]) -> tuple[Path, Path]:
    data = tmp_path / "data"
    folder = data / "babi" / "en"
    folder.mkdir(parents=True)
    (folder / "qa1_single-supporting-fact_train.txt").write_text(STORY * 10)
    (folder / "qa1_single-supporting-fact_test.txt").write_text(TEST)
    runs = tmp_path / "runs"
    spec = TaskSpec("babi1", "pair", ["bathroom", "hallway", "kitchen", "office"], seed=0)
    write_config(runs / "base", {"kind": "attnaudit", "model": {}, "task": spec.to_dict()})
    curve = runs / "base-roar" / "subruns" / "roar" / "seed-0" / "attention"
    masks = {"key": "k", "train": [[]] * 9, "dev": [[4]], "test": test_masks}
    atomic_write_json(curve / "ratio-10.masks.json", masks)
    atomic_write_json(curve / "ratio-10" / "metrics.json", {"test": {"accuracy": 0.25}})
    atomic_write_json(curve / "ratio-20.masks.json", masks)  # not finished: no test score
    return runs, data


def test_counts_the_masked_answer_words_and_rationale_tokens_as_hand_worked(tmp_path: Path, monkeypatch) -> None:
    # test stories: 0 "mary moved to the bathroom . john ..." (supporting tokens 0-5, answer at 4);
    # 1 the same and "daniel went back to the kitchen ." (supporting 12-18, answer at 17); 2 "sandra ... office ." (0-5, 4)
    runs, data = _runs(tmp_path, [[4], [0, 1], []])
    written: dict[str, dict] = {}
    monkeypatch.setattr(rr, "write_result", lambda name, payload: written.setdefault(name, payload))
    monkeypatch.setattr(sys, "argv", ["roar_rationale.py", "--runs", str(runs), "--data-dir", str(data), "--name", "t"])
    rr.main()
    run = written["t"]["runs"]["base"]
    assert run["task"] == "babi1" and list(run["curves"]) == ["seed-0/attention"]
    ten = run["curves"]["seed-0/attention"]["10"]
    assert ten["test"] == {"instances": 3, "with_rationale": 3, "with_answer": 3, "rationale_hit": pytest.approx(1 / 3),
                           "rationale_masked": pytest.approx((1 / 6) / 3), "answer_hit": pytest.approx(1 / 3),
                           # story 0's only "bathroom" is masked; stories 1 and 2 keep their answers readable
                           "answer_everywhere": pytest.approx(1 / 3),
                           # story 0: bathroom, kitchen and office are named nowhere unmasked, so one guess in 3;
                           # stories 1 and 2 name their answers, which elimination then never guesses
                           "elimination": pytest.approx((1 / 3) / 3)}
    assert ten["dev"]["answer_hit"] == 1.0 and ten["dev"]["rationale_masked"] == pytest.approx(1 / 6)
    assert (ten["train"]["instances"], ten["train"]["answer_hit"], ten["train"]["rationale_hit"]) == (9, 0.0, 0.0)
    assert ten["test_score"] == {"accuracy": 0.25}
    assert run["curves"]["seed-0/attention"]["20"]["test_score"] is None
    assert ten["by_answer"] is None  # no weights to load (its scores only, as a retrain restored from a ledger)
    assert json.dumps(written["t"])


def test_elimination_guesses_among_the_labels_left_unnamed_or_all_when_none_is() -> None:
    story = Example(tokens="mary went to the kitchen . john went to the office .".split(), label="kitchen")
    labels = {"kitchen", "office", "garden"}
    assert rr.elimination(story, set(), labels) == 0.0  # kitchen readable: the guess falls on garden
    assert rr.elimination(story, {4}, labels) == pytest.approx(1 / 2)  # kitchen or garden
    assert rr.elimination(story, {4, 10}, labels) == pytest.approx(1 / 3)  # nothing named: any of the three
    assert rr.elimination(Example(tokens="kitchen office garden".split(), label="office"), set(), labels) == pytest.approx(1 / 3)


def test_the_retrains_accuracy_is_split_by_whether_the_answer_is_still_named(tmp_path: Path, monkeypatch) -> None:
    runs, data = _runs(tmp_path, [[4], [0, 1], []])
    retrain = runs / "base-roar" / "subruns" / "roar" / "seed-0" / "attention" / "ratio-10"
    write_config(retrain, {"kind": "attnaudit"})
    (retrain / "model.safetensors").write_bytes(b"")  # its weights (load_run is replaced below)
    seen: dict[str, list[Example]] = {}

    def predict(run: object, examples: list[Example]) -> dict[str, list[str]]:
        seen["examples"] = examples
        return {"pred": ["bathroom", "hallway", "office"]}

    monkeypatch.setattr(rr, "load_run", lambda path, device: path)
    monkeypatch.setattr(rr, "mask_token", lambda run: "[MASK]")
    monkeypatch.setattr(rr, "predict", predict)
    written: dict[str, dict] = {}
    monkeypatch.setattr(rr, "write_result", lambda name, payload: written.setdefault(name, payload))
    monkeypatch.setattr(sys, "argv", ["roar_rationale.py", "--runs", str(runs), "--data-dir", str(data), "--name", "t"])
    rr.main()
    ten = written["t"]["runs"]["base"]["curves"]["seed-0/attention"]["10"]
    # story 0 (bathroom, its one occurrence masked) guessed right; stories 1 (kitchen, guessed hallway) and 2 (office)
    # still name their answers
    assert ten["by_answer"] == {"readable": {"instances": 2, "accuracy": 0.5}, "hidden": {"instances": 1, "accuracy": 1.0}}
    assert [ex.tokens[4] for ex in seen["examples"]] == ["[MASK]", "bathroom", "office"]
    assert seen["examples"][1].tokens[:2] == ["[MASK]", "[MASK]"]


def test_masks_that_are_not_the_runs_split_are_refused(tmp_path: Path, monkeypatch) -> None:
    runs, data = _runs(tmp_path, [[4], [0, 1]])
    monkeypatch.setattr(sys, "argv", ["roar_rationale.py", "--runs", str(runs), "--data-dir", str(data)])
    with pytest.raises(SystemExit, match="2 masks for 3 instances"):
        rr.main()


def test_a_folder_without_roar_masks_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["roar_rationale.py", "--runs", str(tmp_path)])
    with pytest.raises(SystemExit, match="no RUN/subruns/roar or RUN-roar/subruns/roar folder"):
        rr.main()


def test_the_roar_tests_own_layout_is_read_and_a_folder_without_its_run_is_refused(tmp_path: Path, monkeypatch) -> None:
    runs, data = _runs(tmp_path, [[4], [0, 1], []])
    (runs / "base-roar").rename(runs / "elsewhere")  # `attnaudit run roar` keeps its sub-runs inside the run
    (runs / "elsewhere" / "subruns").rename(runs / "base" / "subruns")
    written: dict[str, dict] = {}
    monkeypatch.setattr(rr, "write_result", lambda name, payload: written.setdefault(name, payload))
    monkeypatch.setattr(sys, "argv", ["roar_rationale.py", "--runs", str(runs), "--data-dir", str(data), "--name", "t"])
    rr.main()
    assert written["t"]["runs"]["base"]["curves"]["seed-0/attention"]["10"]["test"]["answer_hit"] == pytest.approx(1 / 3)
    (runs / "orphan-roar").mkdir()  # named as the script's layout, but no run "orphan" beside it
    (runs / "base" / "subruns").rename(runs / "orphan-roar" / "subruns")
    with pytest.raises(SystemExit, match="holds ROAR masks but is no run"):
        rr.main()


def test_a_han_runs_masks_name_sentences_and_mask_all_their_words() -> None:
    example = Example(tokens=list("abcdefg"), label="x", sentences=[list("abc"), list("de"), list("fg")], rationale=[3])
    assert rr.hits([example], [[1]], sentences=True)["rationale_hit"] == 1.0
    assert rr.hits([example], [[1]], sentences=True)["rationale_masked"] == 1.0
    assert rr.hits([example], [[1]], sentences=False)["rationale_hit"] == 0.0
