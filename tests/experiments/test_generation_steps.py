"""The ``generation`` test: the attention tests at every generated token, on tiny random decoders and
encoder-decoders, with its measures recomputed by hand where they have a closed form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnaudit.errors import AttnAuditError
from attnaudit.experiments.attention_search import Search, search_batch
from attnaudit.experiments.generation_steps import Steps, erase_until_change, eraser, generating_rows, replace_rows
from attnaudit.experiments.runner import run_test
from attnaudit.explain import get_explanation
from attnaudit.hf import load_hf
from attnaudit.models.interface import Intervention, evaluation
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
    assert json.dumps(rows) == json.dumps(again.instances)  # same seed, same numbers (NaN included)
    assert all(0 <= r["adversaries_within_epsilon"] <= 3 for r in rows)
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
    with model.next_token_decision():
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


def test_erase_until_change_equals_erasing_one_key_at_a_time(llama: Path) -> None:
    """The share of keys erased (most attended first) before the token changes, against whole-model passes that
    erase the top 1, 2, ... keys of the generating row one count at a time."""
    run = load_hf(str(llama), device="cpu")
    model = run.model
    source = model.tokenizer("the film was very good and long")["input_ids"]
    target = model.tokenizer(" good film bad", add_special_tokens=False)["input_ids"]
    with model.next_token_decision(), evaluation(model), torch.no_grad():
        steps = Steps(run, source, target)
        batch, layer = steps.batches[0], steps.explained_layer
        shares = erase_until_change(model, batch, layer, "top", torch.Generator())
        base = model(batch).probs.argmax(-1)
        last = batch.mask.sum(1) - 1
        for b in range(len(batch)):
            real = int(batch.mask[b].sum())
            row = steps.explained[0][b, :, int(last[b])].mean(0)[:real]
            order = row.argsort(descending=True).tolist()
            expected = float("nan")
            for count in range(1, real):
                def erase(weights: torch.Tensor, _mask: torch.Tensor, b: int = b, drop: list[int] = order[:count]) -> torch.Tensor:
                    out = weights.clone()
                    out[b, :, int(last[b]), drop] = 0.0
                    out[b, :, int(last[b])] /= out[b, :, int(last[b])].sum(-1, keepdim=True)
                    return out

                if int(model(batch, [Intervention(layer=layer, weights=erase)]).probs[b].argmax()) != int(base[b]):
                    expected = count / real
                    break
            assert shares[b].item() == pytest.approx(expected, nan_ok=True)


def test_adversaries_stay_within_epsilon_on_the_whole_model(llama: Path) -> None:
    """Each reported adversary, put back into a full pass of the model, moves the next-token distribution by
    the TVD the search reported (the search reruns from the explained layer at one position)."""
    run = load_hf(str(llama), device="cpu")
    model = run.model
    source = model.tokenizer("the film was very good")["input_ids"]
    with model.next_token_decision(), evaluation(model):
        steps = Steps(run, source, model.tokenizer(" good film", add_special_tokens=False)["input_ids"])
        batch, layer = steps.batches[0], steps.explained_layer
        outcome = search_batch(model, batch, layer, Search(adversaries=2, steps=20, epsilon=0.05, report_epsilon=0.05), 0, [0, 1])
        last = batch.mask.sum(1) - 1
        with torch.no_grad():
            base = model(batch).probs
            for a in range(2):
                def put(weights: torch.Tensor, _mask: torch.Tensor, a: int = a) -> torch.Tensor:
                    return replace_rows(weights, last, outcome.weights[:, a, :, 0, : weights.shape[-1]])

                moved = 0.5 * (model(batch, [Intervention(layer=layer, weights=put)]).probs - base).abs().sum(-1)
                assert torch.allclose(moved, outcome.change[:, a], atol=1e-5)


def test_an_encoder_decoder_is_tested_at_its_cross_attention(tmp_path: Path) -> None:
    from attnaudit.architectures import save_tiny

    folder = save_tiny("bart", tmp_path / "bart")
    file = prompts(tmp_path, [{"prompt": "the film was very good", "target": "a good"}])
    result = run_test("generation", load_hf(str(folder), device="cpu"), out=tmp_path / "out", plot=False,
                      prompts=str(file), permutations=2, normalisers="softmax", adversary_steps=5)
    assert len(result.instances) == 2 and all(r["softmax_tvd"] == pytest.approx(0.0, abs=1e-6) for r in result.instances)
    assert all(0 < r["erase_until_change_top"] <= 1 or r["erase_until_change_top"] != r["erase_until_change_top"] for r in result.instances)
    # BART's embedding LayerNorm makes Σ_d ∂z/∂e vanish: the default input_gradient is left out, and said
    assert any(n.startswith("input_gradient not scored: it does not apply to this model: its input embeddings reach the decision only "
                            "through LayerNorms") for n in result.meta["notes"])
    assert "comprehensiveness_attention" in result.summary and not any("input_gradient" in key for key in result.summary)


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


def test_a_decoder_loaded_with_a_task_generates_from_the_task_texts(llama: Path, tmp_path: Path) -> None:
    """`run generation --hf LLM --task T` (as documented): the task makes the decoder a zero-shot classifier for the
    other tests; generation reads its language model, prompts being the split's texts, and leaves the classifier as it was."""
    run = load_hf(str(llama), task="synthetic", device="cpu")
    model = run.model
    assert model.config.extra["output"] == "verbalizer"
    before = (model.trained_head, model.config.num_labels, model.verbalizer_ids.tolist(), dict(model.config.extra))
    result = run_test("generation", run, out=tmp_path / "out", plot=False, limit=2, generate=2, permutations=2, adversaries=0)
    assert result.summary["prompts"] == 2 and 2 <= result.summary["tokens"] <= 4
    assert (model.trained_head, model.config.num_labels, model.verbalizer_ids.tolist(), dict(model.config.extra)) == before
    with torch.no_grad():
        assert run.model(next(iter(run.batches(run.examples("test", 2), batch_size=2)))).logits.shape == (2, 2)


def test_run_generation_with_task_from_the_cli(llama: Path, tmp_path: Path) -> None:
    from tests.reliability.helpers import cli

    out = tmp_path / "out"
    result = cli("run", "generation", "--hf", str(llama), "--task", "synthetic", "--limit", "1", "--generate", "1",
                 "--permutations", "1", "--adversaries", "0", "--methods", "attention", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "generation.json").read_text())["summary"]["prompts"] == 1
