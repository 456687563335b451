"""``--device-map``: a model whose layers accelerate keeps on the CPU and offloads to disk explains, generates and
is tested as the same model in memory; what reads weights is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnaudit.architectures import save_tiny
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.runner import run_test
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
from attnaudit.progress import set_quiet

set_quiet(True)
METHODS = ["attention", "rollout", "input_gradient", "ig", "loo"]


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny llama and a device map keeping its embeddings, first layer and head on the CPU, the rest on disk."""
    root = tmp_path_factory.mktemp("placed")
    folder = save_tiny("llama", root / "llama")
    layers = {f"model.layers.{i}": "cpu" if i == 0 else "disk" for i in range(3)}
    mapping = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", **layers, "model.norm": "cpu", "lm_head": "cpu"}
    device_map = root / "device_map.json"
    device_map.write_text(json.dumps(mapping))
    return folder, device_map


def test_offloaded_layers_give_the_same_explanations(placed: tuple[Path, Path]) -> None:
    folder, device_map = placed
    offloaded = load_hf(str(folder), device_map=str(device_map))
    assert offloaded.model.offloaded and offloaded.info["device_map"]["model.layers.1"] == "disk"
    kept = explain_text(load_hf(str(folder), device="cpu"), "the film was very good", METHODS, generate=2, steps=4)
    moved = explain_text(offloaded, "the film was very good", METHODS, generate=2, steps=4)
    assert [s["id"] for s in moved.steps] == [s["id"] for s in kept.steps]
    for method in METHODS:
        for ours, theirs in zip(moved.scores[method], kept.scores[method]):
            assert ours == pytest.approx(theirs, abs=1e-5), method
    with pytest.raises(AttnAuditError, match="device-map keeps model.layers.1"):
        explain_text(offloaded, "the film was very good", ["alti"])


def test_an_offloaded_model_is_tested_as_in_memory(placed: tuple[Path, Path], tmp_path: Path) -> None:
    folder, device_map = placed
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the film was very good"}\n')
    options = {"prompts": str(prompts), "generate": 2, "permutations": 2, "adversary_steps": 3, "normalisers": "sparsemax"}
    kept = run_test("generation", load_hf(str(folder), device="cpu"), out=tmp_path / "kept", plot=False, **options)
    moved = run_test("generation", load_hf(str(folder), device_map=str(device_map)), out=tmp_path / "moved", plot=False, **options)
    assert json.dumps(kept.summary) == json.dumps(moved.summary)


def test_auto_placement_from_the_command_line(placed: tuple[Path, Path], tmp_path: Path) -> None:
    """accelerate fills the CPU's budget in order (embeddings, layer 0) and puts the rest on disk."""
    from tests.reliability.helpers import cli

    folder, _ = placed
    placement = load_hf(str(folder), device_map="auto", max_memory="cpu=100KiB").info["device_map"]
    assert placement["model.layers.0"] == "cpu" and placement["model.layers.2"] == "disk"
    result = cli("explain", "--hf", str(folder), "--text", "the film was", "--generate", "1", "--method", "attention",
                 "--device-map", "auto", "--max-memory", "cpu=100KiB", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "generation.json").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (("--device-map", "everywhere"), "--device-map must be one of auto"),
    (("--device-map", "auto", "--max-memory", "cpu:2GiB"), "--max-memory takes device=size pairs"),
    (("--max-memory", "cpu=2GiB"), "--max-memory applies with --device-map"),
    (("--device-map", "BAD"), "bad.json: --device-map needs an object of module name -> device"),
])
def test_bad_placements_get_one_line(placed: tuple[Path, Path], tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    from tests.reliability.helpers import cli

    folder, _ = placed
    bad = tmp_path / "bad.json"
    bad.write_text('{"model.layers.0": ["cpu"]}')
    args = tuple(str(bad) if a == "BAD" else a for a in args)
    result = cli("explain", "--hf", str(folder), "--text", "the film", *args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_an_audit_of_an_offloaded_model_equals_the_one_in_memory(placed: tuple[Path, Path], tmp_path: Path) -> None:
    """``audit --device-map`` gives the in-memory audit's summary and records the placement, which the report reloads."""
    from attnaudit.audit import audit

    folder, device_map = placed
    options = {"task": "synthetic", "only": ["permutation", "importance"], "limit": 6, "figures": False, "explore": 0}
    kept = audit(tmp_path / "kept", hf=str(folder), device="cpu", **options)
    moved = audit(tmp_path / "moved", hf=str(folder), device_map=str(device_map), **options)
    assert kept.rows == moved.rows
    record = json.loads((tmp_path / "moved" / "audit.json").read_text())
    assert record["device_map"]["model.layers.2"] == "disk"
