"""The zero-shot decoder audit: text-span items, sink/template shares, GQA norms and causal rollout.

A tiny random Llama causal LM (4 query heads sharing 2 key/value heads) with the tiny word-level
vocabulary of ``tiny_hf`` is loaded through ``load_hf`` as a zero-shot classifier. Items, shares
and norms are checked against hand computations written here (hand tokenisation, per-head
products of the model's own projection weights, prefix reruns for causality).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnaudit.algorithms.attention_graph import rollout
from attnaudit.audit import _plan
from attnaudit.data.types import Example
from attnaudit.experiments import run_test
from attnaudit.experiments.adversarial import adversarial_loop
from attnaudit.experiments.attention_search import Search, search_batch
from attnaudit.experiments.common.applies import resolve_layers
from attnaudit.experiments.common.passes import prepare
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.erasure import decode_erased, erase_items
from attnaudit.experiments.erasure import prepare as erasure_prepare
from attnaudit.experiments.experiment import get_experiment
from attnaudit.experiments.norms import position_shares
from attnaudit.experiments.permutation import permutation_loop, permute_batch
from attnaudit.experiments.shuffle import permute_rows
from attnaudit.explain import item_mask, list_explanations
from attnaudit.explain.helpers.norms import layer_norms
from attnaudit.explain.methods.attention import attention_importance
from attnaudit.hf import load_hf
from attnaudit.models.hf import ZeroShotCollator, text_items
from attnaudit.models.interface import AttentionLayer, Intervention
from attnaudit.run import Run
from tests.models.test_hf_decoder import save_llama_lm

PROMPTS = ["the {text} was", "a dog runs , {text} !", "{text} was"]
VERBALIZER = {"neg": "bad", "pos": "good"}


@pytest.fixture(scope="module")
def llama_lm(tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_llama_lm(tmp_path_factory.mktemp("llama-lm"), tiny_hf.vocab, seed=1)


def zero_shot(llama_lm: Path, tiny_hf: SimpleNamespace, prompt: str = PROMPTS[0]) -> Run:
    return load_hf(llama_lm, task=tiny_hf.task(), device="cpu", prompt=prompt, verbalizer=VERBALIZER)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_items_are_exactly_the_text_span(llama_lm: Path, tiny_hf: SimpleNamespace, prompt: str) -> None:
    run = zero_shot(llama_lm, tiny_hf, prompt)
    examples = run.data().test
    batch = next(run.batches(examples, batch_size=8))
    before = prompt.split("{text}")[0].split()
    for row, example in enumerate(examples):
        hand = before + example.tokens + prompt.split("{text}")[1].split()  # the word-level tokenisation by hand
        assert run.model.wordpieces(batch)[row] == hand
        expected = [False] * len(before) + [True] * len(example.tokens)
        expected += [False] * (batch.mask.shape[1] - len(expected))
        assert item_mask(run, batch)[row].tolist() == expected


def test_slow_tokenizer_route_counts_prompt_tokens() -> None:
    """Without offsets (a slow tokenizer), items are counted from the tokens before and through the span."""

    class Words:  # a tokenizer without offsets: one id per whitespace word
        is_fast = False

        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": list(range(len(text.split())))}

    filled = ["a b c d e", "x y"]
    spans = [(2, 5), (0, 1)]  # "b c", "x"
    items = text_items(Words(), filled, spans, width=6, max_len=64)
    assert items.tolist() == [[False, True, True, False, False, False], [True, False, False, False, False, False]]


def test_every_explanation_is_zero_outside_the_text(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    run = zero_shot(llama_lm, tiny_hf, PROMPTS[1])
    batch = next(run.batches(run.data().test, batch_size=8))
    outside = ~item_mask(run, batch)
    methods = list_explanations(run)
    assert {"attention", "gradient", "loo", "norms", "rollout"} <= {m.name for m in methods}
    for method in methods:
        scores = method(run, batch, steps=4, seed=0)
        assert torch.all(scores[outside] == 0), method.name
        assert torch.any(scores[~outside] != 0), method.name


def test_loo_removes_one_text_token_and_keeps_the_template(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    run = zero_shot(llama_lm, tiny_hf, PROMPTS[1])
    example = run.data().test[0]  # "the movie was good ."
    batch = run.collate([example])
    loo = list_explanations(run)
    scores = next(m for m in loo if m.name == "loo")(run, batch)[0]
    with torch.no_grad():
        full = run.model(batch).probs[0]
        start = len(PROMPTS[1].split("{text}")[0].split())
        for j in range(len(example.tokens)):
            kept = Example(tokens=example.tokens[:j] + example.tokens[j + 1 :], label=example.label)
            dropped = run.model(run.collate([kept])).probs[0]
            predicted = int(full.argmax())
            torch.testing.assert_close(scores[start + j], (full[predicted] - dropped[predicted]).abs(), rtol=0, atol=1e-6)


def test_importance_ranks_text_tokens_and_reports_accuracy(llama_lm: Path, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    run = zero_shot(llama_lm, tiny_hf)
    result = run_test("importance", run, out=tmp_path, device="cpu", plot=False)
    examples = run.data().test
    by_index = {row["index"]: row for row in result.instances}
    for index, row in by_index.items():
        assert row["length"] == len(examples[index].tokens)  # the template's "the" and "was" are not ranked
    assert len(by_index) < len(examples)  # "good" alone has one item: not ranked, still counted in the accuracy
    with torch.no_grad():
        predicted = [run.labels[p] for p in run.model(run.collate(examples)).logits.argmax(-1).tolist()]
    gold = [example.label for example in examples]
    assert result.summary["accuracy"] == pytest.approx(sum(p == g for p, g in zip(predicted, gold)) / len(gold))
    assert result.summary["majority_class"] == pytest.approx(max(gold.count("pos"), gold.count("neg")) / len(gold))
    assert any(row["statistic"] == "accuracy" for row in get_experiment("importance").verdict(result))


def hand_norms(run: Run, record: AttentionLayer, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖f_h(x_j)‖ (B,H,K), ‖Σ_h α_h f_h(x_j)‖ (B,Q,K))`` from the module's own weights: query head
    ``h`` reads key/value head ``h // (H / KV)`` (grouped-query attention)."""
    attention = run.model.structure.sites[layer].module
    heads, kv = run.model.config.heads, run.model.kv_heads
    dh = attention.v_proj.weight.shape[0] // kv
    x = record.inputs
    per_head = []
    for h in range(heads):
        g = h // (heads // kv)
        value = x @ attention.v_proj.weight[g * dh : (g + 1) * dh].T  # (B,K,dh); Llama has no value bias
        per_head.append(value @ attention.o_proj.weight[:, h * dh : (h + 1) * dh].T)  # (B,K,d)
    f = torch.stack(per_head, 1)  # (B,H,K,d)
    mixed = torch.einsum("bhqk,bhkd->bqkd", record.weights, f)
    return f.norm(dim=-1), mixed.norm(dim=-1)


def test_gqa_norms_and_sink_shares_equal_a_hand_computation(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    run = zero_shot(llama_lm, tiny_hf, PROMPTS[1])
    batch = next(run.batches(run.data().test, batch_size=8))
    with torch.no_grad():
        trace = run.model(batch).trace
    items = item_mask(run, batch)
    last = batch.mask.sum(1) - 1
    for layer, record in enumerate(trace.layers):
        with torch.no_grad():
            norms = layer_norms(run.model, record, layer)
            fx, summed = hand_norms(run, record, layer)
        real = batch.mask.bool()
        torch.testing.assert_close(norms.fx_norm * real[:, None], fx * real[:, None], rtol=1e-4, atol=1e-5)
        pairs = (real[:, :, None] & real[:, None, :])
        torch.testing.assert_close(norms.summed_norm * pairs, summed * pairs, rtol=1e-4, atol=1e-5)
        shares = position_shares(run.model, norms, record, items)
        for i in range(len(batch)):
            n, q = int(real[i].sum()), int(last[i])
            weight = record.weights[i].mean(0)  # (Q,K) head-averaged
            share = summed[i, :n, :n] / summed[i, :n, :n].sum(-1, keepdim=True)
            assert float(shares["sink_weight_share"][i]) == pytest.approx(float(weight[1:n, 0].mean()), abs=1e-6)
            assert float(shares["sink_norm_share"][i]) == pytest.approx(float(share[1:, 0].mean()), abs=1e-5)
            text = items[i, :n].clone()
            template = ~text
            template[0] = False
            assert float(shares["text_weight_share"][i]) == pytest.approx(float(weight[q, :n][text].sum()), abs=1e-6)
            assert float(shares["template_norm_share"][i]) == pytest.approx(float(share[q][template].sum()), abs=1e-5)
            for measure in ("weight", "norm"):  # first + template + text cover every key the last token reads
                total = sum(float(shares[f"{g}_{measure}_share"][i]) for g in ("first", "template", "text"))
                assert total == pytest.approx(1.0, abs=1e-5)


def test_norms_test_reports_positions_per_layer(llama_lm: Path, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    run = zero_shot(llama_lm, tiny_hf, PROMPTS[1])
    result = run_test("norms", run, out=tmp_path, device="cpu", plot=False)
    table = result.tables["positions"]
    assert [row["layer"] for row in table] == [0, 1]
    for row in table:
        assert 0 <= row["sink_weight_share"] <= 1 and 0 <= row["sink_norm_share"] <= 1
        assert row["first_weight_share"] + row["template_weight_share"] + row["text_weight_share"] == pytest.approx(1.0)
    assert result.summary["sink_weight_share"] == pytest.approx(sum(r["sink_weight_share"] for r in table) / 2)
    assert result.summary["sink_finding_holds"] == (result.summary["sink_norm_share"] < result.summary["sink_weight_share"])


def test_rollout_is_causal_and_reads_the_last_token(llama_lm: Path, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    run = zero_shot(llama_lm, tiny_hf)
    example = run.data().test[0]  # "the movie was good ."
    batch = run.collate([example])
    with torch.no_grad():
        weights = run.model(batch).trace.weights
    rolled = rollout(weights, "mean", 0.5, batch.mask)  # (B, L, T, T)
    n = batch.tokens.shape[1]
    assert torch.all(rolled.triu(1) == 0)  # a token only mixes with itself and earlier ones
    for cut in range(2, n):  # rolling out a prefix gives the same rows: later tokens never flow back
        prefix = ZeroShotCollator("{text}", run.model.tokenizer, run.labels, 64)
        sub = prefix([Example(tokens=run.model.wordpieces(batch)[0][:cut], label="pos")])
        with torch.no_grad():
            short = rollout(run.model(sub).trace.weights, "mean", 0.5, sub.mask)
        torch.testing.assert_close(short[0], rolled[0, :, :cut, :cut], rtol=1e-5, atol=1e-6)
    result = run_test("rollout", run, out=tmp_path, device="cpu", plot=False, limit=1, limit_order="first", flow_limit=1)
    maps = [m for m in result.tables["maps"] if m["method"] == "rollout" and m["layer"] == 1]
    assert maps[0]["items"] == example.tokens  # text tokens only
    last_row = rolled[0, 1, n - 1]
    items = item_mask(run, batch)[0]
    assert maps[0]["scores"] == pytest.approx(last_row[items].tolist(), abs=1e-6)
    assert any("last real token" in note for note in result.meta["notes"])
    assert {"gradient", "loo"} <= {row["importance"] for row in result.tables["layers"]}


def test_audit_takes_the_decoder_defaults() -> None:
    _, plain = _plan(None, None, {})
    _, decoder = _plan(None, None, {"permutation": {"permutations": 7}}, decoder=True)
    assert decoder["permutation"].permutations == 7  # --set still wins
    assert decoder["rollout"].flow_limit < plain["rollout"].flow_limit
    assert decoder["adversarial"].steps < plain["adversarial"].steps


def test_normaliser_swap_keeps_the_causal_mask(llama_lm: Path, tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    """Swapping sparsemax into a decoder: rows are distributions over the keys each query reads; the
    test's softmax row is the model itself."""
    run = zero_shot(llama_lm, tiny_hf)
    batch = run.collate(run.data().test)
    with torch.no_grad():
        swapped = run.model.decode(run.model.encode(batch), [Intervention(normaliser="sparsemax")])
    for record in swapped.trace:
        readable = record.mask[:, None, None, :] & torch.ones(record.weights.shape[2:], dtype=torch.bool).tril()
        assert torch.all(record.weights[~readable.expand_as(record.weights)] == 0)
        rows = record.weights.sum(-1)[record.mask[:, None, :].expand(-1, record.weights.shape[1], -1)]
        assert rows == pytest.approx(torch.ones_like(rows), abs=1e-5)
    result = run_test("activation-swap", run, out=tmp_path, device="cpu", plot=False)
    assert result.summary["accuracy_softmax"] == result.summary["accuracy_original"]
    assert result.summary["zero_fraction_original"] == 0.0  # softmax over the readable keys: no exact zeros


def test_shuffling_a_decoder_permutes_each_row_over_earlier_keys(
    llama_lm: Path, tiny_hf: SimpleNamespace, tmp_path: Path
) -> None:
    """The shuffle intervention at layer 0 gives exactly the causal permutation of the model's own weights;
    the audit's decoder setting (all layers at once) reports that one setting."""
    run = zero_shot(llama_lm, tiny_hf)
    batch = run.collate(run.data().test)
    with torch.no_grad():
        cache = run.model.encode(batch)
        base = run.model.decode(cache).trace[0]
        shuffle = Intervention(layer=0, weights=lambda w, m: permute_rows(w, m, seeded_generator(5), causal=True))
        shuffled = run.model.decode(cache, [shuffle])
    assert torch.equal(shuffled.trace[0].weights, permute_rows(base.weights, base.mask, seeded_generator(5), causal=True))
    result = run_test("shuffle", run, out=tmp_path, device="cpu", plot=False, per_layer=False, repeats=2)
    assert [row["setting"] for row in result.tables["settings"]] == ["all"]
    assert any("not run" in note for note in result.meta["notes"])
    full = run_test("shuffle", run, out=tmp_path / "each", device="cpu", plot=False, repeats=1)
    assert len(full.tables["settings"]) == run.model.num_attention_layers + 1


def test_last_layer_tests_rerun_the_predicting_token_only(llama_lm: Path, tiny_hf: SimpleNamespace) -> None:
    """At a decoder's last layer only the predicting token's row reaches the output: permutation,
    adversarial and erasure change that row (the one the ``attention`` explanation reads) and rerun
    that token alone, which equals the full model rerun with that row replaced."""
    run = zero_shot(llama_lm, tiny_hf, PROMPTS[1])
    examples = run.data().test[:5]
    model = run.model
    (layer,) = resolve_layers(model, "explained")
    batch = run.collate(examples)
    explained = prepare(model, batch, [layer])
    assert explained.reported.shape[2] == 1 and explained.cache.states.shape[1] == 1
    assert explained.query_rows.all()
    items = item_mask(run, batch)
    row = explained.reported[:, :, 0].mean(1) * items
    torch.testing.assert_close(row, attention_importance(model, batch), rtol=0, atol=1e-6)
    torch.testing.assert_close(explained.attention, attention_importance(model, batch), rtol=0, atol=1e-6)

    permuted = permute_batch(model, batch, [layer], 6, seed=1, indices=range(5))
    loop = permutation_loop(run, examples, [layer], 6, seed=1)
    np.testing.assert_allclose(permuted.changes.numpy(), loop, atol=1e-5)
    assert loop.max() > 0

    search = Search(adversaries=2, steps=5)
    found = search_batch(model, batch, layer, search, seed=2, indices=range(5))
    div, change = adversarial_loop(run, examples, layer, search, seed=2)
    np.testing.assert_allclose(found.jsd.numpy(), div, atol=1e-5)
    np.testing.assert_allclose(found.change.numpy(), change, atol=1e-5)

    erased = erasure_prepare(run, batch)
    removed = items & (torch.rand(items.shape, generator=torch.Generator().manual_seed(3)) < 0.5)
    with torch.no_grad():
        whole = model(batch, [Intervention(layer=layer, weights=erase_items(removed))]).probs
    torch.testing.assert_close(decode_erased(model, erased.cache, layer, removed), whole, rtol=0, atol=1e-6)
    given = decode_erased(model, erased.cache, layer, removed, erased.weights)  # the prepared weights erased
    torch.testing.assert_close(given, whole, rtol=0, atol=1e-6)
