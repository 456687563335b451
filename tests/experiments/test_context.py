"""The ``context`` test: sentence scores of a generated answer against supporting facts and ablation effects, on a
tiny random decoder whose tokenizer carries a chat template, each measure recomputed by hand or with scipy/sklearn."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from attnaudit.algorithms.context_attribution import (
    ablation_masks,
    rank_correlation,
    recall_at_k,
    surrogate_weights,
    top1_hit,
    top_heads,
)
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import context
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.runner import make_options
from attnaudit.hf import load_hf
from attnaudit.models.interface import evaluation
from attnaudit.progress import set_quiet

set_quiet(True)

TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)
STORY = ["the film was good .", "a bad film .", "the acting was very good ."]


def chat_decoder(family: str, folder: Path) -> Path:
    """A tiny random decoder of ``family`` whose tokenizer carries :data:`TEMPLATE`."""
    from transformers import PreTrainedTokenizerFast

    from attnaudit.architectures import save_tiny

    folder = save_tiny(family, folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_decoder("llama", tmp_path_factory.mktemp("ctx") / "llama")


def example(sentences: list[str] = STORY, supporting: list[int] | None = None, label: str = "good") -> Example:
    meta = {"sentence_texts": sentences, "question": "was the film good ?", "source": "hand"}
    if supporting is not None or sentences:
        meta["supporting"] = [2] if supporting is None else supporting
    return Example(tokens=" ".join(sentences).split(), label=label, meta=meta)


def test_hits_recall_and_correlation_on_a_hand_checked_case() -> None:
    scores = [0.1, 0.7, 0.7, -0.2]  # ties go to the earlier sentence: ranking 1, 2, 0, 3
    assert top1_hit(scores, [1]) == 1.0 and top1_hit(scores, [2]) == 0.0
    assert recall_at_k(scores, [2, 3]) == 0.5  # top 2 = {1, 2}
    assert recall_at_k(scores, [0, 2, 3]) == pytest.approx(2 / 3)  # top 3 = {1, 2, 0}
    assert recall_at_k(scores, [3], k=4) == 1.0
    effect = [0.0, 1.0, 3.0, 2.0]
    assert rank_correlation(scores, effect) == pytest.approx(stats.spearmanr(scores, effect).statistic)
    assert rank_correlation(scores, effect) == pytest.approx(1 / math.sqrt(22.5))  # ranks (2, 3.5, 3.5, 1) vs (1, 2, 4, 3): Σdxdy 1, Σdx² 4.5, Σdy² 5
    assert math.isnan(rank_correlation([1, 2], [2, 1])) and math.isnan(rank_correlation([1, 1, 1], [1, 2, 3]))
    assert top_heads(np.array([[0.1, 0.5], [0.5, 0.2]]), 2).tolist() == [[0, 1], [1, 0]]


def test_the_surrogate_recovers_a_planted_linear_effect() -> None:
    rng = np.random.default_rng(0)
    masks = ablation_masks(6, 128, rng)
    assert masks.dtype == bool and 0.4 < masks.mean() < 0.6
    values = 0.5 + 2.0 * masks[:, 0] - 1.0 * masks[:, 3] + rng.normal(0, 0.01, 128)
    weights = surrogate_weights(masks, values, alpha=0.001)
    assert weights == pytest.approx([2.0, 0, 0, -1.0, 0, 0], abs=0.05)
    assert np.array_equal(ablation_masks(6, 8, np.random.default_rng(1)), ablation_masks(6, 8, np.random.default_rng(1)))


def test_the_summary_bootstrap_is_seeded() -> None:
    rng = np.random.default_rng(2)
    rows = [{"correct": float(rng.random() < 0.5), **{f"{m}_{k}": float(rng.random()) for m in ("chance", *context.METHODS)
                                                      for k in ("top1", "recall", "spearman", "first")}} for _ in range(30)]
    first, again, other = context.summarise(rows, 3, 200), context.summarise(rows, 3, 200), context.summarise(rows, 4, 200)
    assert first == again and first != other
    assert first["attention_top1_all"] == pytest.approx(np.mean([r["attention_top1"] for r in rows]))
    low, high = first["attention_top1_all_ci"]
    assert low <= first["attention_top1_all"] <= high
    assert "loo_spearman_all" not in first and first["correct_prompts"] == sum(r["correct"] for r in rows)


def test_the_prompt_is_the_tokenizers_own_chat_template(llama: Path) -> None:
    model = load_hf(str(llama), device="cpu").model
    ids, segments = context.render(model, STORY, "was the film good ?")
    user, _ = context.user_message(STORY, "was the film good ?")
    own = model.tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=True, add_generation_prompt=True)
    assert ids == list(own["input_ids"] if isinstance(own, dict) or hasattr(own, "keys") else own)
    for j, sentence in enumerate(STORY):
        words = model.tokenizer.decode([i for i, s in zip(ids, segments) if s == j]).split()
        assert words == sentence.split()


def test_every_score_recomputed_by_hand(llama: Path) -> None:
    """LOO from separately rendered prompts and transformers' eager forward; attention from its eager weights;
    the whole test twice with one seed gives the same rows."""
    run = load_hf(str(llama), device="cpu")
    model = run.model
    experiment = get_experiment("context")
    options = make_options(experiment, {"generate": 3, "ablations": 6, "heads": 2, "resamples": 50})
    result = experiment.run(run, [example(), example(STORY[:2] + ["the film was bad ."], [0], "bad")], options, seed=1)
    again = experiment.run(run, [example(), example(STORY[:2] + ["the film was bad ."], [0], "bad")], options, seed=1)
    assert result.instances == again.instances and result.summary == again.summary
    row, table = result.instances[0], [t for t in result.tables["sentences"] if t["index"] == 0]
    with model.next_token_decision():
        prompt, segments = context.render(model, STORY, "was the film good ?")
        answer = context.answer_of(model, model.continuation(prompt, 3)[0])
    model.hf.set_attn_implementation("eager")

    def logp(ids: list[int]) -> float:
        with torch.no_grad():
            logits = model.hf(input_ids=torch.tensor([ids + answer[:-1]])).logits[0, len(ids) - 1 :].log_softmax(-1)
        return float(logits[torch.arange(len(answer)), answer].sum())

    full = logp(prompt)
    assert row["answer_logp"] == pytest.approx(full, abs=1e-4)
    for j in range(3):
        without = context.render(model, [s for i, s in enumerate(STORY) if i != j], "was the film good ?")[0]
        assert table[j]["loo"] == pytest.approx(full - logp(without), abs=1e-4)
    with evaluation(model), torch.no_grad():
        weights = model.hf(input_ids=torch.tensor([prompt + answer[:-1]]), output_attentions=True).attentions
    rows = torch.stack([w[0, :, len(prompt) - 1 :, : len(prompt)] for w in weights]).mean(2)  # (L, H, P)
    by_sentence = torch.stack([rows[..., [s == j for s in segments]].sum(-1) for j in range(3)], -1)
    assert [t["attention"] for t in table] == pytest.approx(by_sentence.mean((0, 1)).tolist(), abs=1e-5)
    flat = by_sentence.sum(-1).flatten()  # the 2 heads (options.heads) with the most answer attention on the context
    top = flat.argsort(descending=True, stable=True)[:2]
    expected_heads = by_sentence.reshape(-1, 3)[top].mean(0)
    assert [t["attention_top_heads"] for t in table] == pytest.approx(expected_heads.tolist(), abs=1e-5)
    table_embeddings = model.hf.get_input_embeddings()
    with torch.enable_grad():
        shared = table_embeddings(torch.tensor(prompt)).detach().requires_grad_(True)  # one leaf for every step's prompt
        total = torch.zeros(())
        for t, token in enumerate(answer):
            rows = torch.cat([shared, table_embeddings(torch.tensor(answer[:t], dtype=torch.long))])[None]
            total = total + model.hf(inputs_embeds=rows).logits[0, -1].log_softmax(-1)[token]
        (grad,) = torch.autograd.grad(total, shared)
    tokens = (shared * grad).sum(-1).detach()
    hand = [float(tokens[[s == j for s in segments]].sum()) for j in range(3)]
    assert [t["input_x_gradient"] for t in table] == pytest.approx(hand, rel=1e-3, abs=1e-5)
    expected = {"top1": top1_hit([t["loo"] for t in table], [2]), "recall": recall_at_k([t["loo"] for t in table], [2])}
    assert row["loo_top1"] == expected["top1"] and row["loo_recall"] == expected["recall"]
    top = max(range(3), key=lambda j: (table[j]["attention"], -j))
    assert row["attention_top"] == top and row["attention_first"] == float(top == 0) and row["chance_first"] == 1 / 3
    assert row["attention_spearman"] == pytest.approx(rank_correlation([t["attention"] for t in table], [t["loo"] for t in table]), nan_ok=True)
    assert result.summary["prompts"] == 2 and 0 <= result.summary["accuracy"] <= 1


@pytest.mark.parametrize(("family", "pass_tokens"), [("llama", 512), ("llama", 20), ("qwen3", 512), ("gpt2", 512), ("bloom", 512), ("qwen2", 512)])
def test_the_lean_ablation_passes_match_one_forced_pass_per_prompt(family: str, pass_tokens: int, llama: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ablated prompt continued from the full pass's keys and values, read at the answer's rows, gives the
    log-probability of one teacher-forced pass over the whole ablated prompt (and so does the lean pass without a
    prefix): all prompts in one padded pass, or one or two per pass; on families that continue a prefix (llama, qwen3)
    and some that cannot (gpt2's position table, bloom's ALiBi, qwen2's sliding window), which run each prompt whole."""
    assert load_hf(str(llama), device="cpu").model.continues_prefix
    monkeypatch.setattr(context, "PASS_TOKENS", pass_tokens)
    model = load_hf(str(llama if family == "llama" else chat_decoder(family, tmp_path / family)), device="cpu").model
    story = STORY + ["the end was good .", "it was long ."]
    with model.next_token_decision():
        prompt, _ = context.render(model, story, "was the film good ?")
        answer = context.answer_of(model, model.continuation(prompt, 3)[0])
        answer = answer + [answer[0]] * (3 - len(answer))  # several answer tokens: several rows read per pass
        masks = [[True] * 5, [True, True, False, True, True], [False, True, True, True, True], [True, True, True, True, False],
                 *context.ablation_masks(5, 6, np.random.default_rng(0)).tolist()]
        prompts = [context.render(model, [s for s, k in zip(story, keep) if k], "was the film good ?")[0] for keep in masks]
        assert context.shared_length(prompts[0], prompt) == len(prompt)
        assert 0 < context.shared_length(prompts[2], prompt) < context.shared_length(prompts[1], prompt) < len(prompts[1])
        with evaluation(model), torch.no_grad():
            trace = model(context.padded(model, [prompt + answer[:-1]])).trace
        reference = context.answer_logprobs(model, prompts, answer)
        assert context.ablated_logprobs(model, trace, prompt, prompts, answer) == pytest.approx(reference, abs=1e-5)
        assert context.ablated_logprobs(model, None, prompt, prompts, answer) == pytest.approx(reference, abs=1e-5)
        groups = torch.tensor([0] * len(prompt))
        _, whole = context.gradient_scores(model, prompt, answer, groups, 1)
        assert whole == pytest.approx(reference[0], abs=1e-5)


def test_bad_input_is_refused_in_one_line(llama: Path, tmp_path: Path) -> None:
    run = load_hf(str(llama), device="cpu")
    experiment = get_experiment("context")
    options = make_options(experiment, {"ablations": 2, "resamples": 10})
    with pytest.raises(AttnAuditError, match="empty context"):
        experiment.run(run, [example([], [0])], options)
    with pytest.raises(AttnAuditError, match="supporting facts"):
        experiment.run(run, [Example(tokens=["a"], label="good", meta={"sentence_texts": ["a ."]})], options)
    with pytest.raises(AttnAuditError, match="reads"):
        experiment.run(run, [example(STORY * 200, [0])], options)
    with pytest.raises(AttnAuditError, match="--ablations"):
        experiment.run(run, [example()], make_options(experiment, {"ablations": -1}))
    from attnaudit.architectures import save_tiny

    plain = load_hf(str(save_tiny("llama", tmp_path / "plain")), device="cpu")
    plain.task.spec = "babi1"
    assert "chat template" in (experiment.why_not(plain) or "")
    assert "bAbI" in (experiment.why_not(run) or "")  # no task: no supporting facts


@pytest.mark.slow  # SmolLM2-135M on CPU: about a minute per question on a busy machine
def test_smollm2_on_babi_stories(shared_data: Path, tmp_path: Path) -> None:
    from attnaudit.experiments.runner import run_test

    for task, facts in (("babi1", 1), ("babi2", 2)):
        run = load_hf("smollm2", task=task, data_dir=shared_data, device="cpu")
        result = run_test("context", run, out=tmp_path / task, limit=2, seed=0, data_dir=shared_data, ablations=4, generate=6,
                          resamples=50)
        assert result.summary["prompts"] == 2 and (tmp_path / task / "context.json").exists()
        for row in result.instances:
            assert len(row["supporting"].split(",")) == facts and 1 <= row["answer_tokens"] <= 6
            assert all(0 <= row[f"{m}_top1"] <= 1 and 0 <= row[f"{m}_recall"] <= 1 for m in context.METHODS)
        example = run.examples("test", data_dir=shared_data)[0]
        ids, segments = context.render(run.model, example.meta["sentence_texts"], example.meta["question"])
        user, _ = context.user_message(example.meta["sentence_texts"], example.meta["question"])
        own = run.model.tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=True, add_generation_prompt=True)
        assert ids == list(own["input_ids"] if hasattr(own, "keys") else own)
        assert sorted(set(segments) - {-1}) == list(range(len(example.meta["sentence_texts"])))


def test_the_docs_table_is_generated_from_the_result() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks` is a folder of the checkout, not a package

    from benchmarks.reproduce_context import DOCS, results, stratified_order, table

    assert table(*results()) in DOCS.read_text()
    labels = ["a"] * 6 + ["b"] * 3 + ["c"] * 3
    order = stratified_order(labels, 0)
    assert sorted(order) == list(range(12)) and order == stratified_order(labels, 0) != stratified_order(labels, 1)
    for n in range(1, 13):  # every prefix is proportional to the labels' shares, up to one question each
        counts = {label: sum(labels[i] == label for i in order[:n]) for label in "abc"}
        assert all(abs(counts[label] - n * labels.count(label) / 12) <= 1 for label in "abc")
