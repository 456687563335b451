"""Options that size the work are bounded before anything is allocated: one line with the estimate and the limit.

The cases of issue #47 (IG steps that asked numpy for 74.5 GiB, a hidden size of ten million, a billion
permutations, a thousand local Ray workers) and the estimates themselves against hand computations.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnaudit import bounds
from attnaudit.errors import AttnAuditError
from attnaudit.models import ModelConfig, build_model
from attnaudit.run import Run

from .helpers import assert_clean_failure, cli

GIB = 1 << 30


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("explain", "--run", "RUN", "--text", "a b", "--method", "ig", "--steps", "100000", "--out", "OUT"), "--steps 100000: needs about 74.5 GiB"),
        (("run", "importance", "RUN", "--ig-steps", "100000", "--out", "OUT"), "--ig-steps 100000: needs about 74.5 GiB"),
        (("run", "permutation", "RUN", "--permutations", "1000000000", "--out", "OUT"), "--permutations 1000000000: needs about"),
        (("train", "--task", "synthetic", "--model", "bilstm", "--hidden-dim", "10000000", "--epochs", "1", "--out", "OUT"), "model size"),
        (("sweep", "SWEEP", "--workers", "1000", "--out", "OUT"), "--workers 1000: only"),
    ],
    ids=["explain-steps", "ig-steps", "permutations", "hidden-dim", "workers"],
)
def test_an_option_the_machine_cannot_hold_is_one_line_before_any_work(
    args: tuple[str, ...], needle: str, trained: Run, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"runs:\n  - {trained.path}\ntests: [importance]\n", encoding="utf-8")
    out = tmp_path / "out"
    words = [{"RUN": str(trained.path), "OUT": str(out), "SWEEP": str(sweep)}.get(word, word) for word in args]
    before = sorted(p.name for p in Path(str(trained.path)).iterdir())
    line = assert_clean_failure(cli(*words), needle.split(":")[0], out=out)
    assert needle in line and "limit here" in line or "CPU core" in line
    assert not out.exists() and sorted(p.name for p in Path(str(trained.path)).iterdir()) == before


def test_ig_steps_estimate_is_the_gauss_legendre_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "available_memory", lambda: 20 * GIB)
    bounds.ig_steps(36_000)  # 8 * 36,000^2 bytes = 9.66 GiB: under half of 20 GiB
    with pytest.raises(AttnAuditError, match=r"--steps 37000: needs about 10\.2 GiB .* give at most 36,6"):
        bounds.ig_steps(37_000)


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 3))
def test_model_size_counts_the_parameters_without_allocating_them(embed: int, hidden: int, layers: int) -> None:
    config = ModelConfig(model="transformer", task_type="classification", vocab_size=50, num_labels=3, embed_dim=embed,
                         d_model=2 * hidden, heads=2, layers=layers)
    counted = bounds.model_parameters(lambda: build_model(config), "a transformer")
    assert counted == sum(p.numel() for p in build_model(config).parameters())


def test_a_model_is_refused_by_its_training_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "available_memory", lambda: 1 * GIB)  # limit: 512 MiB, i.e. 32 Mi parameters at 16 bytes
    small = ModelConfig(model="bilstm", task_type="classification", vocab_size=1000, num_labels=2, embed_dim=100, hidden_dim=100)
    assert build_model(small) is not None
    # 100 M embedding weights
    large = ModelConfig(model="bilstm", task_type="classification", vocab_size=1_000_000, num_labels=2, embed_dim=100, hidden_dim=100)
    with pytest.raises(AttnAuditError, match=r"model size 10\d,\d{3},\d{3} parameters: needs about 1\.\d GiB"):
        build_model(large)


def test_workers_beyond_the_cores() -> None:
    bounds.workers(os.cpu_count() or 1)
    with pytest.raises(AttnAuditError, match="only 4 CPU core"):
        bounds.workers(5, offered=4)


@given(st.floats(0, 2.0**60, allow_nan=False))
def test_sizes_read_back(n: float) -> None:
    number, unit = bounds.size(n).split()
    scale = 1024 ** ["B", "KiB", "MiB", "GiB", "TiB", "PiB"].index(unit)
    assert abs(float(number) * scale - n) <= 0.05 * scale + 0.5


def test_histogram_bins_are_bounded_by_their_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run sanity --bins 2147483648`` asked numpy for 16 GiB of histogram edges (found by the CLI fuzzer)."""
    monkeypatch.setattr(bounds, "available_memory", lambda: 20 * GIB)
    bounds.histogram_bins(100)
    bounds.check_test_options({"bins": [1.0, 5.0, 10.0]})  # faithfulness' bins are percents, not a count
    with pytest.raises(AttnAuditError, match=r"--bins 2147483648: needs about 32\.0 GiB"):
        bounds.check_test_options({"bins": 2147483648})
