"""``kernel_shap`` against shap's ``KernelExplainer`` (benchmarks/shap_worker.py in the shap venv) on a tiny random Llama.

The same model function (``p`` of the predicted next token), features (word spans, the rest always kept), masker
(a baseline token, or deletion) and background; with ``2^M`` samples both enumerate every coalition and must give
the exact Shapley values: max |ours − shap| ≤ 1e-5. Skips, naming the command that builds the venv, where it is absent.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks` is a folder of the checkout
from benchmarks.compare_shap import SHAP_INSTALL, TOLERANCE, Worker, ours, prepare, shap_python, theirs, word_spans  # noqa: E402

pytestmark = pytest.mark.skipif(shap_python() is None, reason=f"shap venv absent; build it with {SHAP_INSTALL}")
TEXT = "i really loved the boring movie"


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from attnaudit.architectures import save_tiny
    from attnaudit.hf import load_hf

    folder = save_tiny("llama", tmp_path_factory.mktemp("llama"), seed=0)
    python = shap_python()
    assert python is not None
    worker = Worker(python)
    worker.ask(op="load", model=str(folder), threads=1)
    yield SimpleNamespace(run=load_hf(str(folder), device="cpu"), folder=folder, worker=worker)
    worker.close()


@pytest.mark.parametrize("baseline", ["unk", "delete"])
def test_enumerated_kernel_shap_equals_shap(peer: SimpleNamespace, baseline: str) -> None:
    case = prepare(peer.run, TEXT, word_spans(TEXT), baseline)
    m = case["features"]
    assert m == 6
    mine = ours(peer.run, case, 1 << m, seed=0)
    answer = theirs(peer.worker, peer.folder, case, 1 << m, seed=0)
    assert answer["evaluations"] == 1 << m  # every coalition once (the background and the explained row included)
    assert max(abs(a - b) for a, b in zip(mine, answer["values"])) <= TOLERANCE
    assert max(abs(v) for v in answer["values"]) > 1e-4


def test_sampled_kernel_shap_is_near_shap(peer: SimpleNamespace) -> None:
    """Below 2^M samples the two draw differently (ours Captum's coalitions, shap its size enumeration): near, not equal."""
    case = prepare(peer.run, TEXT, word_spans(TEXT), "unk")
    exact = theirs(peer.worker, peer.folder, case, 1 << case["features"], seed=0)["values"]
    sampled = theirs(peer.worker, peer.folder, case, 40, seed=0)["values"]
    mine = ours(peer.run, case, 40, seed=0)
    scale = max(abs(v) for v in exact)
    assert max(abs(a - b) for a, b in zip(sampled, exact)) <= 0.5 * scale
    assert max(abs(a - b) for a, b in zip(mine, exact)) <= 0.5 * scale
