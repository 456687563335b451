"""The same seed gives the same results, within a process and across processes (CPU).

Training (weights, metrics) and two tests (importance, permutation) are run twice with one
seed: once here, once in a fresh interpreter. Their JSON must be identical once the timing
fields are removed; the trained weights must be bit-identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnaudit.experiments.runner import run_test
from attnaudit.progress import set_quiet
from attnaudit.training.trainer import train

from .helpers import comparable, synthetic_rows, write_table

set_quiet(True)
TESTS = {"importance": {"methods": ["gradient", "loo"]}, "permutation": {"permutations": 8}}
MODELS = {
    "bilstm": {"embed_dim": 8, "hidden_dim": 8},
    "transformer": {"embed_dim": 8, "d_model": 8, "heads": 2, "layers": 2, "d_ff": 16},  # dropout 0.1 by default
}
SEED = 7


def produce(data: Path, root: Path) -> None:
    """Train each model with ``SEED`` (2 epochs) into ``root/<model>`` and run the tests on 12 instances."""
    for model, options in MODELS.items():
        run = train(f"csv:{data}", model, root / model, epochs=2, seed=SEED, quiet_eval=True, **options)
        for test, test_options in TESTS.items():
            run_test(test, run, limit=12, seed=SEED, out=root / model / "results", plot=False, **test_options)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_table(tmp_path_factory.mktemp("data") / "data.csv", synthetic_rows(150))


def test_same_seed_same_results_in_another_process(data: Path, tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    produce(data, here)
    script = f"from reliability.test_determinism import produce; from pathlib import Path; produce(Path({str(data)!r}), Path({str(there)!r}))"
    tests_dir = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # a fresh string-hash seed too
    proc = subprocess.run([sys.executable, "-c", script], cwd=tests_dir, capture_output=True, text=True, timeout=600,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for model in MODELS:
        a, b = here / model, there / model
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes(), model
        for name in ["metrics.json", *(f"results/{test}.json" for test in TESTS)]:
            first = comparable(json.loads((a / name).read_text()), here)
            second = comparable(json.loads((b / name).read_text()), there)
            assert first == second, f"{model}/{name}"
        assert json.loads((a / "results" / "permutation.json").read_text())["instances"]  # numbers were compared


def test_a_different_seed_changes_the_numbers(data: Path, tmp_path: Path) -> None:
    """Guards the test above against comparing constants."""
    runs = [train(f"csv:{data}", "bilstm", tmp_path / str(seed), epochs=1, seed=seed, quiet_eval=True, **MODELS["bilstm"]) for seed in (0, 1)]
    results = [run_test("permutation", run, limit=6, seed=0, out=tmp_path / f"r{i}", plot=False, permutations=4) for i, run in enumerate(runs)]
    assert results[0].instances != results[1].instances
