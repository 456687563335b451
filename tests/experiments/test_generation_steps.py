"""The ``generation`` test: the attention tests at every generated token, on tiny random decoders and
encoder-decoders, with its measures recomputed by hand where they have a closed form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import run_test
from attnaudit.experiments.generation_steps import Steps, eraser, generating_rows, replace_rows
from attnaudit.explain import get_explanation
from attnaudit.hf import load_hf
from attnaudit.models.zeroshot import next_token_decision
from attnaudit.progress import set_quiet

set_quiet(True)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from attnaudit.architectures import save_tiny

    return save_tiny("llama", tmp_path_factory.mktemp("gen") / "llama")


def prompts(folder: Path, lines: list[dict[str, str]]) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_rows_are_replaced_at_the_generating_query_only() -> None:
    weights = torch.rand(2, 3, 4, 5)
    query = torch.tensor([3, 1])
    rows = generating_rows(weights, query)
    assert torch.equal(rows[0], weights[0, :, 3]) and torch.equal(rows[1], weights[1, :, 1])
    changed = replace_rows(weights, query, torch.zeros_like(rows))
    assert changed[0, :, 3].abs().sum() == 0 and changed[1, :, 1].abs().sum() == 0
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 3] = keep[1, 1] = False
    assert torch.equal(changed[keep[:, None, :, None].expand_as(weights)], weights[keep[:, None, :, None].expand_as(weights)])


def test_a_decoder_is_tested_at_every_generated_token(llama: Path, tmp_path: Path) -> None:
    file = prompts(tmp_path, [{"prompt": "the film was very good"}, {"prompt": "a bad\nfilm", "target": " good film"}])
    run = load_hf(str(llama), device="cpu")
    options = {"prompts": str(file), "generate": 3, "permutations": 3, "normalisers": "softmax,sparsemax"}
    result = run_test("generation", run, out=tmp_path / "out", plot=False, **options)
    again = run_test("generation", run, out=tmp_path / "again", plot=False, **options)
    rows = result.instances
    assert [r["index"] for r in rows].count(1) == 2  # the forced target " good film": two tokens
    assert 1 <= [r["index"] for r in rows].count(0) <= 3
    assert all(r["softmax_tvd"] == pytest.approx(0.0, abs=1e-6) and r["softmax_token_change"] == 0 for r in rows)
    assert result.summary["tokens"] == len(rows) and result.summary["prompts"] == 2
    assert rows == again.instances  # same seed, same numbers
    for key in ("permutation_median_tvd", "erase_top_tvd", "comprehensiveness_attention", "sufficiency_input_gradient"):
        low, high = result.summary[f"{key}_ci"]
        assert low <= result.summary[key] <= high


def test_eraser_equals_deleting_the_top_tokens_by_hand(llama: Path) -> None:
    """Comprehensiveness of step t = p(y_t) − p(y_t | the prompt without its top-k attention tokens), sufficiency
    p(y_t) − p(y_t | those alone; special tokens stay), each probability recomputed with transformers' eager
    forward on the shortened token ids."""
    run = load_hf(str(llama), device="cpu")
    model = run.model
    source = model.tokenizer("the film was very good and long")["input_ids"]
    target = model.tokenizer(" good film", add_special_tokens=False)["input_ids"]
    with next_token_decision(model):
        steps = Steps(run, source, target)
        scores = [get_explanation("attention")(run, batch).float() for batch in steps.batches]
        comprehensiveness, sufficiency = eraser(steps, scores, 20.0)
    model.hf.set_attn_implementation("eager")
    try:
        for t in range(len(target)):
            ids = source + target[:t]
            values = scores[0][t, : len(ids)]
            special = set(model.tokenizer.all_special_ids)
            removable = [p for p, i in enumerate(ids) if i not in special]
            k = max(1, min(len(removable) - 1, -(-len(removable) * 20 // 100)))
            top = sorted(removable, key=lambda p: (-abs(float(values[p])), p))[:k]
            with torch.no_grad():
                full = model.hf(input_ids=torch.tensor([ids])).logits[0, -1].softmax(-1)[target[t]]
                kept = [i for p, i in enumerate(ids) if p not in top]
                without = model.hf(input_ids=torch.tensor([kept])).logits[0, -1].softmax(-1)[target[t]]
                alone_ids = [i for p, i in enumerate(ids) if p in top or p not in removable]
                alone = model.hf(input_ids=torch.tensor([alone_ids])).logits[0, -1].softmax(-1)[target[t]]
            assert comprehensiveness[t] == pytest.approx(float(full - without), abs=1e-5)
            assert sufficiency[t] == pytest.approx(float(full - alone), abs=1e-5)
    finally:
        model.hf.set_attn_implementation("attnaudit")


def test_an_encoder_decoder_is_tested_at_its_cross_attention(tmp_path: Path) -> None:
    from attnaudit.architectures import save_tiny

    folder = save_tiny("bart", tmp_path / "bart")
    file = prompts(tmp_path, [{"prompt": "the film was very good", "target": "a good"}])
    result = run_test("generation", load_hf(str(folder), device="cpu"), out=tmp_path / "out", plot=False,
                      prompts=str(file), permutations=2, normalisers="softmax")
    assert len(result.instances) == 2 and all(r["softmax_tvd"] == pytest.approx(0.0, abs=1e-6) for r in result.instances)


def test_bad_prompt_files_and_options_get_one_line(llama: Path, tmp_path: Path) -> None:
    from tests.reliability.helpers import cli

    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"prompt": "fine"}\n{"prompt": ""}\n')
    cases = {
        ("--prompts", str(empty)): "empty.jsonl:2",
        ("--prompts", str(prompts(tmp_path, [{"prompt": "a b"}])), "--layers", "some"): "--layers must be",
        (): "--hf needs --task (the data to run the test on) or --prompts",
    }
    for args, message in cases.items():
        out = tmp_path / "out"
        result = cli("run", "generation", "--hf", str(llama), *args, "--out", str(out))
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and not (out / "generation.json").exists()
    with pytest.raises(AttnAuditError, match="does not generate text"):
        run_test("generation", load_hf("minilm", task="synthetic", device="cpu"), out=tmp_path / "minilm", prompts=str(empty))
