"""``attnaudit run <test> RUN`` with no optional argument, for every test on a tiny run of every
model family: it runs where the test applies and is refused in one line where it does not
(issue: `run uniform RUN`, the README's own example, failed whenever --seeds was left out)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnaudit.experiments import discover, get_experiment

from .documented import Workspace
from .helpers import built_once

# Family -> the run directory (in the docs workspace) that represents it; "hf" is the headless
# embedded MiniLM given with --hf. Runs made by documented commands are reused; the other
# families are trained here with small sizes. The BiLSTM on the synthetic task ("runs/syn") runs only
# the tests no other run here can take (:data:`SYNTHETIC_ONLY`): `attnaudit audit --task synthetic
# --model bilstm` (the audit's --help example, run by test_documented_commands) runs every test with
# its defaults on one, and `run <test>` reads its options the same way for every family, which the
# CNN and the average encoder (the same classifier around another encoder) check.
FAMILY_RUNS = {
    "bilstm": "runs/syn",
    "cnn": "runs/defaults-cnn",
    "average": "runs/defaults-average",
    "han": "runs/defaults-han",
    "flat": "runs/defaults-flat",
    "transformer": "runs/sst2-transformer",
    "transformer-tagger": "runs/conll",
    "hf-finetuned": "runs/minilm-sst2",
    "nmt": "runs/nmt-deen",
    "hf": None,
}
EXTRA = {
    "cnn": ["--task", "sst", "--model", "cnn"],
    "average": ["--task", "sst", "--model", "average"],
    "han": ["--task", "agnews", "--model", "han"],
    "flat": ["--task", "agnews", "--model", "flat"],
}
SMALL = ["--embed-dim", "16", "--hidden-dim", "16", "--epochs", "2", "--data-dir", "../shared/data", "--quiet"]


@pytest.fixture(scope="module")
def family_runs(docs_workspace: Workspace, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The documentation's runs plus the :data:`EXTRA` families, trained once per test run."""

    def build(folder: Path) -> None:
        (folder / "main").mkdir()
        (folder / "shared").symlink_to(docs_workspace.root / "shared")
        trainer = Workspace.existing(folder)
        for family, args in EXTRA.items():
            code, _, err = trainer.run(["train", *args, "--out", FAMILY_RUNS[family], *SMALL])
            assert code == 0, err

    trained = built_once(tmp_path_factory, "family-runs", build)
    for family in EXTRA:
        shutil.copytree(trained / "main" / FAMILY_RUNS[family], docs_workspace.main / FAMILY_RUNS[family], dirs_exist_ok=True)
    return docs_workspace


def _why_not(workspace: Workspace, family: str, test: str) -> str | None:
    from attnaudit.hf import load_hf
    from attnaudit.run import load_run

    if FAMILY_RUNS[family] is None:
        run = load_hf("minilm", task="sst2", data_dir=workspace.root / "shared" / "data")
    else:
        run = load_run(workspace.main / FAMILY_RUNS[family])
    return get_experiment(test).why_not(run)


SYNTHETIC_ONLY = ("rationale",)
"""Tests that need the synthetic task's known rationales, which only the BiLSTM run has."""
CASES = [(family, test) for family in FAMILY_RUNS for test in sorted(discover())
         if family != "bilstm" or test in SYNTHETIC_ONLY]
SLOW = {("hf-finetuned", "adversarial"), ("hf-finetuned", "faithfulness"), ("hf-finetuned", "sanity"),
        *((family, "roar") for family in ("average", "han", "flat", "transformer"))}
"""The slowest defaults (~22 s, ~13 s and sanity's every default method on 2 × 16 randomised MiniLM states; every other
family runs them in make test): with the slow tests (make test-all). roar's defaults retrain 5 methods + random at 9
ratios (~11 s a family): the CNN runs them in make test, the others with the slow tests (tests/experiments/test_roar.py
runs every family at one ratio in make test)."""


@pytest.mark.parametrize(
    ("family", "test"),
    [pytest.param(*case, marks=pytest.mark.slow) if case in SLOW else case for case in CASES],
    ids=[f"{family}-{test}" for family, test in CASES],
)
def test_run_with_default_options(family_runs: Workspace, family: str, test: str) -> None:
    run = FAMILY_RUNS[family]
    if run is None:
        args = ["run", test, "--hf", "minilm", "--task", "sst2", "--out", f"results/defaults-{test}",
                "--data-dir", "../shared/data", "--quiet"]
    else:
        args = ["run", test, run, "--quiet"]
    reason = _why_not(family_runs, family, test)
    code, _, err = family_runs.run(args)
    if reason is None:
        assert code == 0, f"attnaudit {' '.join(args)}: exit {code}\n{err[-3000:]}"
        results = Path(family_runs.main / (f"results/defaults-{test}" if run is None else f"{run}/results"))
        assert (results / f"{test}.json").is_file()
    else:
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and "does not apply" in lines[0], err
        assert "Traceback" not in err


GENERATED_TEXT_ONLY = ("generation", "context")
"""Tests of generated text (``context``: an instruction-tuned decoder's generated answer to a bAbI story), which none of
the families above generates (every one of them refuses it in one line above); each one's ``--help`` example runs it
with its defaults on SmolLM2 (test_documented_commands)."""


def test_every_test_applies_to_some_family(family_runs: Workspace) -> None:
    for test in discover():
        if test in GENERATED_TEXT_ONLY:
            assert any("smollm2" in example for example in get_experiment(test).examples), test
            continue
        assert any(_why_not(family_runs, family, t) is None for family, t in CASES if t == test), test
