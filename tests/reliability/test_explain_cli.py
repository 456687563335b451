"""``attnaudit explain`` and ``attnaudit tests --hf/--run`` from the command line.

Bad input (no --text, both or neither of --hf/--run, an unknown method, a method that does not
apply, an --out that is a file) ends with one ``error:`` line, exit 2 and nothing written. A
tiny saved Llama causal LM (its fixture is the zero-shot CLI test's) and the shared tiny BiLSTM
run are explained end to end; the test listing for the decoder is each test's own ``why_not``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnaudit.experiments import discover
from attnaudit.explain import EXPLANATIONS
from attnaudit.hf import load_hf
from attnaudit.run import Run

from .helpers import assert_clean_failure, cli, written
from .test_zero_shot_cli import llama_lm  # noqa: F401  (the saved tiny Llama fixture)

TEXT = "the movie was not very fun !"


def test_explain_next_token_cli(llama_lm: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "out"
    proc = cli("explain", "--hf", llama_lm, "--text", TEXT, "--method", "attention,gradient", "--method", "loo", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    frame = pd.read_csv(out / "explanation.csv")
    assert list(frame.columns) == ["position", "token", "attention", "gradient", "loo"] and len(frame) == 7
    data = json.loads((out / "explanation.json").read_text())
    assert data["decision"]["kind"] == "next_token" and len(data["attention"]) == 2
    assert (out / "explanation.png").is_file() and (out / "explanation.svg").is_file()


def test_explain_run_cli(trained: Run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = cli("explain", "--run", trained.path, "--text", "w130 pos0 w122", "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "explained: class" in proc.stdout
    assert "skipped: rollout:" in proc.stdout and "skipped: norms:" in proc.stdout  # defaults a BiLSTM cannot take
    data = json.loads((out / "explanation.json").read_text())
    applying = [m.name for m in EXPLANATIONS.values() if m.default and m.applies(trained.model) is None]
    assert data["decision"]["label"] in trained.labels and list(data["scores"]) == applying
    assert {"attention", "gradient", "loo", "ig"} <= set(applying)


def test_missing_text(llama_lm: Path, tmp_path: Path) -> None:  # noqa: F811
    assert_clean_failure(cli("explain", "--hf", llama_lm, "--out", tmp_path / "out"), "--text", out=tmp_path / "out")


def test_both_or_neither_model(trained: Run, llama_lm: Path, tmp_path: Path) -> None:  # noqa: F811
    for models in (["--hf", llama_lm, "--run", trained.path], []):
        proc = cli("explain", *models, "--text", TEXT, "--out", tmp_path / "out")
        assert_clean_failure(proc, "give exactly one of --hf MODEL and --run RUN", out=tmp_path / "out")


def test_unknown_method(trained: Run, tmp_path: Path) -> None:
    proc = cli("explain", "--run", trained.path, "--text", TEXT, "--method", "attention,nope", "--out", tmp_path / "out")
    line = assert_clean_failure(proc, "--method: unknown method 'nope'", out=tmp_path / "out")
    assert "choose from attention" in line


def test_method_that_does_not_apply(trained: Run, tmp_path: Path) -> None:
    proc = cli("explain", "--run", trained.path, "--text", TEXT, "--method", "rollout", "--out", tmp_path / "out")
    line = assert_clean_failure(proc, "--method: rollout does not apply to this model", out=tmp_path / "out")
    assert "no stack of token-to-token self-attention layers" in line
    assert not (tmp_path / "out").exists()


def test_out_is_a_file(trained: Run, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("keep")
    proc = cli("explain", "--run", trained.path, "--text", TEXT, "--out", tmp_path / "file")
    assert_clean_failure(proc, "exists and is not a directory")
    assert (tmp_path / "file").read_text() == "keep" and written(tmp_path) == []


def grouped_listing(stdout: str) -> dict[str, str]:
    """``tests --hf``'s lines (``runs (N): a, b`` and ``does not apply (N: c, d): why``) as test -> ``runs`` or ``does not apply: why``."""
    listed = {}
    for line in stdout.splitlines():
        head, _, rest = line.partition("): ")
        if head.startswith("runs ("):
            listed.update({name: "runs" for name in rest.split(", ") if name and name != "none"})
        else:
            names = head.removeprefix("does not apply (").split(": ", 1)[1]
            listed.update({name: f"does not apply: {rest}" for name in names.split(", ")})
    return listed


def test_tests_listing_for_a_decoder_is_each_tests_why_not(llama_lm: Path) -> None:  # noqa: F811
    proc = cli("tests", "--hf", llama_lm)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = grouped_listing(proc.stdout)
    reasons = [line.split("): ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("does not apply")]
    assert len(reasons) == len(set(reasons)) < len(listed) / 2  # each reason once, naming its tests
    run = load_hf(str(llama_lm), device="cpu")
    registry = discover()
    assert set(listed) == set(registry)
    for name, cls in registry.items():
        reason = cls().why_not(run)
        assert listed[name] == ("runs" if reason is None else f"does not apply: {reason}"), name
    for name in ("uniform", "seeds", "diagnostic", "global-adversary", "probe"):  # the training-based tests
        assert "would mean retraining or fine-tuning it" in listed[name] and " parameters) that would mean" in listed[name]
    assert "--prompt/--verbalizer" in listed["importance"] and listed["norms"] == "runs"


def test_tests_listing_needs_one_model(trained: Run, llama_lm: Path) -> None:  # noqa: F811
    assert_clean_failure(cli("tests", "--hf", llama_lm, "--run", trained.path), "give exactly one of --hf MODEL and --run RUN")


def test_audit_skips_the_training_tests_of_a_zero_shot_llm(llama_lm: Path) -> None:  # noqa: F811
    """With a prediction (zero-shot) the prediction tests run on the LM; the training-based ones are
    skipped because they would retrain it, and the audit gives that reason."""
    from attnaudit.audit import skip_reason

    run = load_hf(str(llama_lm), task="synthetic", device="cpu", prompt="the {text} was", verbalizer="negative=bad,positive=good")
    registry = discover()
    assert skip_reason(registry["importance"](), run) is None
    size = f"{sum(p.numel() for p in run.model.parameters()):,}"  # a tiny model: the count itself
    for name in ("uniform", "seeds", "global-adversary", "probe", "diagnostic"):
        reason = skip_reason(registry[name](), run)
        assert reason is not None and f"({size} parameters) that would mean retraining or fine-tuning it" in reason, name


def test_explain_without_out_prints_a_table_and_writes_nothing(trained: Run, tmp_path: Path) -> None:
    """A quick look: tokens × methods and the decision on the terminal; nothing written anywhere."""
    done = cli("explain", "--run", trained.path, "--text", "w130 pos0 w122", "--method", "attention,input-gradient", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "explained: class" in done.stdout and "input_gradient" in done.stdout and "explanation:" not in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_names_take_dash_and_underscore_alike_and_suggest_the_closest(trained: Run, tmp_path: Path) -> None:
    done = cli("run", "global_adversary", "--help")
    assert done.returncode == 0 and "global" in done.stdout.lower()
    line = assert_clean_failure(cli("audit", "--run", trained.path, "--only", "permutatoin", "--out", tmp_path / "a"), "--only",
                                out=tmp_path / "a")
    assert "did you mean 'permutation'?" in line
    line = assert_clean_failure(cli("audit", "--run", trained.path, "--only", "erasure", "--skip", "erasure", "--out", tmp_path / "b"),
                                "no test left to run", out=tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_definition_options(llama_lm: Path, tmp_path: Path) -> None:  # noqa: F811
    """--reduction/--score/--baseline reach the gradient methods and are recorded per method; a bad value is one line."""
    out = tmp_path / "out"
    proc = cli("explain", "--hf", llama_lm, "--text", TEXT, "--method", "input_gradient,ig", "--steps", "2", "--reduction", "l2",
               "--score", "probability", "--baseline", "unk", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((out / "explanation.json").read_text())
    assert data["meta"]["definitions"] == {
        "input_gradient": {"reduction": "l2", "score": "probability"},
        "ig": {"steps": 2, "absolute": True, "reduction": "l2", "score": "probability", "baseline": "unk", "rule": "gausslegendre", "weight": "none"},
    }
    for flag, value, words in (("--reduction", "l3", "unknown reduction 'l3'"), ("--score", "prob", "unknown score 'prob'"),
                               ("--baseline", "bos", "unknown baseline 'bos'")):
        proc = cli("explain", "--hf", llama_lm, "--text", TEXT, flag, value, "--out", tmp_path / "bad")
        assert "choose from" in assert_clean_failure(proc, words, out=tmp_path / "bad")
