"""The architecture matrix: 48 Hugging Face families through the one adapter (no download: tiny random
configs built here, :mod:`attnaudit.architectures`).

For each: captured weights and the decision equal transformers' own eager forward; replacing one middle
layer's weights equals replacing them by hand inside eager's softmax; restarting at that layer equals the
full pass; and, from a saved folder, ``attnaudit explain`` and an audit of three tests (encoder-decoders:
the two that apply to them) run end to end. ``benchmarks/architecture_matrix.py`` writes the same as JSON
for the README's models table.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest
import torch

from attnaudit.architectures import (
    ARCHITECTURES,
    CHECKS,
    TOLERANCE,
    build_tiny,
    check,
    end_to_end,
    list_architectures,
    save_tiny,
    write_reviews,
)
from attnaudit.data.types import Batch
from attnaudit.models.hf import HFModel
from tests.fake_data import make_fake_data
from tests.reliability.helpers import cli

KINDS = {kind: list_architectures(kind) for kind in ("decoder", "encoder", "encoder-decoder")}


def test_the_catalogue_covers_the_families_asked_for() -> None:
    assert (len(KINDS["decoder"]), len(KINDS["encoder"]), len(KINDS["encoder-decoder"])) == (29, 11, 8)


@pytest.mark.parametrize("model_type", list_architectures())
def test_adapter_equals_eager(model_type: str) -> None:
    result = check(model_type)
    for name in CHECKS:
        assert result[name] is not None and result[name] <= TOLERANCE, (name, result[name])
    assert result["intervention_changes"], "the replaced weights changed nothing: the check would be empty"
    if ARCHITECTURES[model_type] != "encoder":  # the cached continuation and the forced pass equal the interface's steps
        assert result["generation"] <= TOLERANCE, result["generation"]
    assert result["causal"] == (ARCHITECTURES[model_type] == "decoder")
    if ARCHITECTURES[model_type] != "encoder-decoder":  # computing only the explanation rows changes nothing
        assert result["rows"] <= TOLERANCE, result["rows"]
        assert result["logits_only"] <= TOLERANCE, result["logits_only"]  # the read-rows cut changes no logit, no gradient


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("matrix")
    return write_reviews(root), make_fake_data(root / "data")


@pytest.mark.parametrize("model_type", list_architectures())
def test_explain_and_audit_end_to_end(model_type: str, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    reviews, data_dir = inputs
    folder = save_tiny(model_type, tmp_path / model_type)
    for line in end_to_end(model_type, folder, reviews, data_dir):
        done = cli(*shlex.split(line))
        assert done.returncode == 0, (line, done.stderr[-2000:])
    with (Path(f"{folder}-audit") / "summary.csv").open(encoding="utf-8") as handle:
        tests = {row["test"] for row in csv.DictReader(handle) if row["statistic"] not in ("skipped", "error")}
    expected = {"alignment", "identifiability"} if ARCHITECTURES[model_type] == "encoder-decoder" else {"importance", "permutation", "erasure"}
    assert expected <= tests
    if ARCHITECTURES[model_type] != "encoder":  # a generated (decoder) or forced (encoder-decoder) sequence, step by step
        steps = json.loads((Path(f"{folder}-explain") / "generation.json").read_text())["steps"]
        assert 1 <= len(steps) <= 2 and all(0 <= step["probability"] <= 1 for step in steps)


@pytest.mark.parametrize("model_type", list_architectures("decoder") + list_architectures("encoder"))
def test_value_output_maps_reproduce_the_values_and_the_attention_output(model_type: str) -> None:
    """Where projections were found, ``inputs @ W_V + b_V`` are the values per query head (a key/value head's
    repeated for the query heads that read it; the record keeps one per key/value head) and ``Σ_h Σ_j α_hij v_hj W_O^h + b_O`` is the output
    projection's output; where they were not (attention outside the interface), the model says why."""
    hf, tokenizer = build_tiny(model_type, "classifier" if ARCHITECTURES[model_type] == "encoder" else "lm")
    model = HFModel(hf, tokenizer, "classification", model_type, trained_head=False)
    if model.structure.route == "softmax":
        assert "not through the attention interface" in str(model.lacks("value_output"))
        return
    encoded = tokenizer(["the film was very good", "a bad movie"], padding=True, return_tensors="pt")
    batch = Batch(tokens=encoded["input_ids"], mask=encoded["attention_mask"].bool(), examples=[])
    output = model.attention_projections(1)[1]
    seen: list[torch.Tensor] = []
    handle = output.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        with torch.no_grad():
            record = model(batch).trace[1]
    finally:
        handle.remove()
    w_v, b_v, w_o, heads = model.value_output_maps(1)
    values = (record.inputs @ w_v + b_v).unflatten(-1, (heads, -1)).transpose(1, 2)  # (B,H,K,dh)
    groups = heads // record.values.shape[1]
    torch.testing.assert_close(values, record.values.repeat_interleave(groups, 1), rtol=1e-4, atol=1e-5)
    mixed = (record.weights @ values).transpose(1, 2).flatten(2)
    expected = mixed @ w_o + (output.bias if output.bias is not None else 0)
    shared = model.attention_projections(0)[1] is output  # ALBERT runs one layer's modules at every layer
    torch.testing.assert_close(expected, seen[int(shared)].reshape(expected.shape), rtol=1e-4, atol=1e-5)
