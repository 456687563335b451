"""Hugging Face encoder-decoders (Marian, BART, T5) through the one model interface.

Tiny randomly initialised models of each family are built here (width 16, 4 heads; T5 with 2
encoder and 3 decoder layers and its relative position bias; no download) over a BPE tokenizer
learnt on the synthetic translation task, and compared with HF's own eager forward
(``attn_implementation="eager"``, ``output_attentions=True``): encoder self-attention, decoder
self-attention and cross-attention per layer.

Tolerances: HF's eager forward and ours do the same float32 operations in the same order, so
weights and logits agree to 1e-6 absolute.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import processors
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    MarianConfig,
    MarianMTModel,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.models.bart import modeling_bart
from transformers.models.marian import modeling_marian
from transformers.models.t5 import modeling_t5

from attnaudit.data.types import Batch
from attnaudit.data.word_alignments import SubwordTokenizer, synthetic_translation
from attnaudit.errors import AttnAuditError
from attnaudit.hf import load_hf
from attnaudit.models.hf import HFModel, HFSubwords, fresh_tokenizer
from attnaudit.models.hf import seq2seq_collator as collator
from attnaudit.models.hf.inputs import causal_allowed
from attnaudit.models.interface import Intervention, freeze_uniform
from tests.models.test_hf_decoder import real_rows

FAMILIES = ("marian", "bart", "t5")
MODULES = {"marian": modeling_marian, "bart": modeling_bart, "t5": modeling_t5}
ATOL = 1e-6


@pytest.fixture(scope="module")
def pairs() -> SimpleNamespace:
    """The synthetic translation task and a joint BPE tokenizer learnt on it (``##`` pieces inside words)."""
    data = synthetic_translation(seed=0, n_train=60, n_dev=4, n_test=6, lexicon_size=12)
    subwords = SubwordTokenizer.train([w for ex in data.train for w in (ex.tokens, ex.target or [])], 60)
    return SimpleNamespace(data=data, subwords=subwords)


def tokenizer(pairs: SimpleNamespace, family: str) -> object:
    """The tokenizer of ``family``: ``</s>`` appended; BART's also puts ``<s>`` first."""
    tok = fresh_tokenizer(pairs.subwords)
    if family == "bart":
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)]
        )
    return tok


def build(family: str, vocab: int, seed: int = 0) -> torch.nn.Module:
    """A tiny random encoder-decoder of ``family`` with its LM head (eval mode)."""
    torch.manual_seed(seed)
    ids = {"pad_token_id": 0, "eos_token_id": 3, "decoder_start_token_id": 0 if family != "bart" else 3}
    if family == "t5":
        config = T5Config(vocab_size=vocab, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=3, num_heads=4,
                          relative_attention_num_buckets=8, relative_attention_max_distance=16, **ids)
        return T5ForConditionalGeneration(config).eval()
    sizes = {"vocab_size": vocab, "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
             "decoder_attention_heads": 4, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "max_position_embeddings": 64}
    if family == "marian":
        return MarianMTModel(MarianConfig(decoder_vocab_size=vocab, **sizes, **ids)).eval()
    return BartForConditionalGeneration(BartConfig(bos_token_id=2, **sizes, **ids)).eval()


def wrap(family: str, pairs: SimpleNamespace) -> tuple[HFModel, torch.nn.Module, Batch]:
    """(our model, HF's own eager copy, a padded teacher-forced batch of the test pairs)."""
    tok = tokenizer(pairs, family)
    hf = build(family, len(tok))
    reference = copy.deepcopy(hf)
    reference.set_attn_implementation("eager")
    model = HFModel(hf, tok, "seq2seq", family, True).eval()
    batch = collator(model)(pairs.data.test)
    return model, reference, batch


def hf_forward(reference: torch.nn.Module, batch: Batch) -> object:
    with torch.no_grad():
        return reference(
            input_ids=batch.tokens, attention_mask=batch.mask.long(), decoder_input_ids=batch.target,
            decoder_attention_mask=batch.target_mask.long(), output_attentions=True, output_hidden_states=True,
        )


def hf_trace(out: object) -> list[torch.Tensor]:
    """HF's weights in our trace order: encoder layers, then per decoder block self, cross."""
    decoder = [w for pair in zip(out.decoder_attentions, out.cross_attentions) for w in pair]
    return [*out.encoder_attentions, *decoder]


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def test_weights_and_logits_equal_hf_eager(family: str, pairs: SimpleNamespace) -> None:
    """Encoder self-, decoder self- and cross-attention (B,H,Q,K) and the LM logits are HF's eager ones."""
    model, reference, batch = wrap(family, pairs)
    with torch.no_grad():
        ours = model(batch)
    theirs = hf_forward(reference, batch)
    (b, s), t = batch.tokens.shape, batch.target.shape[1]
    assert not batch.mask.all() and not batch.target_mask.all()  # both sides padded
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=ATOL)
    expected = hf_trace(theirs)
    n_enc = len(theirs.encoder_attentions)
    assert len(ours.trace) == len(expected) == n_enc + 2 * len(theirs.decoder_attentions)
    assert model.cross_layers == [n_enc + 2 * i + 1 for i in range(len(theirs.cross_attentions))]
    for index, (record, ref) in enumerate(zip(ours.trace.layers, expected)):
        shape = (b, 4, s, s) if index < n_enc else (b, 4, t, t) if (index - n_enc) % 2 == 0 else (b, 4, t, s)
        assert record.weights.shape == ref.shape == shape, record.name
        assert record.name == model.layer_name(index)
        torch.testing.assert_close(real_rows(record.weights, record.query_mask), real_rows(ref, record.query_mask), rtol=0, atol=ATOL)
    for index in model.cross_layers:  # the cross record weights the encoder output: inputs @ W_V + b_V are its values
        record = ours.trace[index]
        w_v, b_v, _, heads = model.value_output_maps(index)
        values = (record.inputs @ w_v + b_v).view(b, s, heads, -1).transpose(1, 2)
        torch.testing.assert_close(values, record.values, rtol=0, atol=1e-6)
        assert torch.equal(record.mask, batch.mask) and torch.equal(record.query_mask, batch.target_mask)


def test_untouched_outside_decode(family: str, pairs: SimpleNamespace) -> None:
    """Outside ``decode`` the registered function is HF's eager attention (T5's position bias included)."""
    model, reference, batch = wrap(family, pairs)
    mine, theirs = hf_forward(model.hf, batch), hf_forward(reference, batch)
    torch.testing.assert_close(mine.logits, theirs.logits, rtol=0, atol=ATOL)
    for a, b in zip(hf_trace(mine), hf_trace(theirs)):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def test_t5_relative_position_bias_is_in_every_layer(pairs: SimpleNamespace) -> None:
    """Our scores minus q·k are exactly T5's relative bias of the stack, in the later layers too."""
    model, _, batch = wrap("t5", pairs)
    model.keep_scores = True
    with torch.no_grad():
        trace = model(batch).trace
        encoder_bias = model.hf.encoder.block[0].layer[0].SelfAttention.compute_bias(batch.tokens.shape[1], batch.tokens.shape[1])
    assert encoder_bias.abs().max() > 0
    for record in trace.layers[:2]:
        queries = record.inputs @ model.hf.encoder.block[int(record.name[3:])].layer[0].SelfAttention.q.weight.t()
        queries = queries.view(*queries.shape[:2], 4, -1).transpose(1, 2)
        bias = record.scores - queries @ record.keys.transpose(-1, -2)
        real = batch.mask[:, None, None, :].expand_as(bias)
        torch.testing.assert_close(bias[real], encoder_bias.expand_as(bias)[real], rtol=0, atol=1e-5)


def replacing(original: Callable, target: torch.nn.Module, replace: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """HF's eager attention function with the weights of module ``target`` replaced by hand."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # noqa: ANN001, ANN202
        out, weights = original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if module is not target:
            return out, weights
        new = replace(weights)
        return (new @ value).transpose(1, 2).contiguous(), new

    return attention


def _streams(model: HFModel, theirs: object) -> list[tuple[int, torch.Tensor]]:
    """(trace index, HF's hidden state entering that layer) for each encoder layer and decoder
    self-attention layer (HF's hidden states say nothing of the state entering a cross-attention)."""
    n = model.first_decoder_layer
    blocks = (model.num_attention_layers - n) // 2
    return [(k, theirs.encoder_hidden_states[k]) for k in range(n)] + [
        (n + 2 * j, theirs.decoder_hidden_states[j]) for j in range(blocks)
    ]


def _reference_module(reference: torch.nn.Module, model: HFModel, index: int) -> torch.nn.Module:
    """The attention module of HF's copy at our trace index ``index``."""
    names = {id(m): n for n, m in model.hf.named_modules()}
    return reference.get_submodule(names[id([site.module for site in model.structure.sites][index])])


@pytest.mark.parametrize("form", ["tensor", "function"])
@pytest.mark.parametrize("where", ["encoder", "decoder-self", "cross"])
def test_weight_replacement_equals_replacement_by_hand(
    family: str, form: str, where: str, pairs: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacing one layer's weights (encoder layer 0, decoder self-attention of block 1, cross-attention
    of block 0) changes the output exactly as the same replacement in HF's eager code."""
    model, reference, batch = wrap(family, pairs)
    n = model.first_decoder_layer
    index = {"encoder": 0, "decoder-self": n + 2, "cross": n + 1}[where]
    (b, s), t = batch.tokens.shape, batch.target.shape[1]
    allowed = {
        "encoder": batch.mask[:, None, None, :].expand(b, 4, s, s),
        "decoder-self": causal_allowed(batch.target_mask)[:, None].expand(b, 4, t, t),
        "cross": batch.mask[:, None, None, :].expand(b, 4, t, s),
    }[where]
    if form == "tensor":
        given = torch.rand(allowed.shape, generator=torch.Generator().manual_seed(1)) * allowed
        given = given / given.sum(-1, keepdim=True)
        intervention, by_hand = Intervention(layer=index, weights=given), (lambda _w: given)
    else:
        # A tilt towards later keys, not a function of the weights' values alone: a tiny random
        # encoder's first layer attends almost uniformly, so squaring its weights changed the logits
        # by 6e-8 only, less than the agreement tolerance, and the test proved nothing there.
        def tilt(w: torch.Tensor, _mask: torch.Tensor | None = None) -> torch.Tensor:
            tilted = w * torch.arange(1, w.shape[-1] + 1, dtype=w.dtype)
            return tilted / tilted.sum(-1, keepdim=True)

        intervention, by_hand = Intervention(layer=index, weights=tilt), tilt
    module = MODULES[family]
    target = _reference_module(reference, model, index)
    monkeypatch.setattr(module, "eager_attention_forward", replacing(module.eager_attention_forward, target, by_hand))
    with torch.no_grad():
        base = model(batch)
        ours = model(batch, [intervention])
    theirs = hf_forward(reference, batch)
    # At width 16 Marian's and BART's decoders average the encoder's states almost uniformly, so a
    # replacement in the encoder moves the logits by ~1e-6 only; the residual streams it moves by
    # ~1e-3. So the states entering every later layer are compared with HF's too, and the
    # replacement must move them (or the logits) by far more than the tolerance.
    later = [(i, hf) for i, hf in _streams(model, theirs) if i > index]
    moved = max((model.residual_stream(ours.trace.layers[i]) - model.residual_stream(base.trace.layers[i])).abs().max()
                for i, _ in later) if later else torch.tensor(0.0)
    assert max(moved, (ours.logits - base.logits).abs().max()) > 100 * ATOL
    for i, hf in later:
        record = ours.trace.layers[i]
        real = record.mask if record.query_mask is None else record.query_mask
        torch.testing.assert_close(model.residual_stream(record)[real], hf[real], rtol=0, atol=ATOL)
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=ATOL)
    for record, ref in zip(ours.trace.layers, hf_trace(theirs)):
        torch.testing.assert_close(real_rows(record.weights, record.query_mask), real_rows(ref, record.query_mask), rtol=0, atol=ATOL)


def test_restart_at_layer_equals_full_pass(family: str, pairs: SimpleNamespace) -> None:
    """decode restarted at any encoder layer or decoder self-attention layer equals the full pass;
    a cross-attention layer is refused with the layer to restart at instead."""
    model, _, batch = wrap(family, pairs)
    total = model.num_attention_layers
    with torch.no_grad():
        cache = model.encode(batch)
        full = model.decode(cache)
        for layer in range(total):
            if layer in model.cross_layers:
                with pytest.raises(AttnAuditError, match=f"restart at layer {layer - 1}"):
                    model.cache_at(full.trace, layer, cache)
                continue
            restarted = model.decode(model.cache_at(full.trace, layer, cache))
            assert torch.equal(restarted.logits, full.logits), layer
            assert len(restarted.trace) == total - layer
            assert torch.equal(restarted.trace.weights[-1], full.trace.weights[-1])


def test_decoder_self_attention_stays_causal_under_interventions(family: str, pairs: SimpleNamespace) -> None:
    """No decoder weight above the diagonal or on padding, also frozen to uniform (then uniform over the
    keys each target token sees); cross-attention frozen to uniform is uniform over the real source tokens."""
    model, _, batch = wrap(family, pairs)
    allowed = causal_allowed(batch.target_mask)[:, None].float()
    with torch.no_grad():
        plain, uniform = model(batch).trace, model(batch, [freeze_uniform()]).trace
    n = model.first_decoder_layer
    for index in range(n, model.num_attention_layers, 2):
        assert (plain[index].weights * (1 - allowed)).abs().max() == 0
        expected = allowed / allowed.sum(-1, keepdim=True)
        torch.testing.assert_close(uniform[index].weights, expected.expand_as(uniform[index].weights))
        source = batch.mask[:, None, None, :].float()
        torch.testing.assert_close(uniform[index + 1].weights, (source / source.sum(-1, keepdim=True)).expand_as(uniform[index + 1].weights))


def test_gradient_reaches_source_embeddings(family: str, pairs: SimpleNamespace) -> None:
    """``encode(batch, embeddings)`` from ``embed(batch)`` equals ``forward`` and is differentiable in them."""
    model, _, batch = wrap(family, pairs)
    embeddings = model.embed(batch).detach().requires_grad_(True)
    out = model.decode(model.encode(batch, embeddings))
    with torch.no_grad():
        torch.testing.assert_close(out.logits, model(batch).logits, rtol=0, atol=ATOL)
    out.logits[batch.labels != -100].logsumexp(-1).sum().backward()
    assert embeddings.grad is not None and embeddings.grad[batch.mask].abs().sum() > 0


def test_collator_offsets_and_word_map(pairs: SimpleNamespace) -> None:
    """Source and labels carry the tokenizer's specials (BART: ``<s>`` first, so offsets (1, 1)); the word map
    sends every subword to its word, as the BPE tokenizer's own word ids do; ids decode back to the words."""
    for family, offsets in (("marian", (0, 0)), ("bart", (1, 1))):
        model, _, batch = wrap(family, pairs)
        collate = collator(model)
        assert collate.offsets == offsets
        example = pairs.data.test[0]
        ids, owners = collate.source.encode(example.tokens)
        assert (ids, owners) == tuple(pairs.subwords.encode(example.tokens))
        assert batch.tokens[0, offsets[0] : offsets[0] + len(ids)].tolist() == ids
        assert len(set(owners)) == len(example.tokens) and len(ids) > len(example.tokens)  # words split into pieces
        target_ids, _ = collate.target.encode(example.target or [])
        labels = batch.labels[0][batch.labels[0] != -100].tolist()
        assert labels[offsets[1] : offsets[1] + len(target_ids)] == target_ids and labels[-1] == 3
        assert batch.target[0, 1 : len(labels)].tolist() == labels[:-1]  # decoder input: labels shifted right
        assert collate.target.words(target_ids) == example.target


def test_slow_tokenizer_path_tokenises_word_by_word(pairs: SimpleNamespace) -> None:
    """A tokenizer without offsets (SentencePiece's) is read word by word, with the same word map."""
    tok = fresh_tokenizer(pairs.subwords)
    fast, slow = HFSubwords(tok), HFSubwords(_NoOffsets(tok))
    words = pairs.data.test[1].tokens
    assert slow.encode(words) == fast.encode(words)


class _NoOffsets:
    """A tokenizer stand-in that only tokenises (no offsets, ``is_fast`` False)."""

    is_fast = False

    def __init__(self, tok: object) -> None:
        self.tok = tok

    def __call__(self, text: str, **kwargs: object) -> object:
        return self.tok(text, **kwargs)


def test_alignment_runs_on_a_local_marian_folder(pairs: SimpleNamespace, tmp_path: Path) -> None:
    """The hub path (``--hf Helsinki-NLP/opus-mt-de-en``) with a tiny local Marian folder standing in: loads
    as a seq2seq run, and the alignment test's cross-attention word scores are the hand-merged weights."""
    from attnaudit.experiments import run_test
    from attnaudit.experiments.alignment import alignment_scores, word_scores

    folder = tmp_path / "opus-mt-stand-in"
    build("marian", len(pairs.subwords)).save_pretrained(folder, safe_serialization=True)
    fresh_tokenizer(pairs.subwords).save_pretrained(folder)
    run = load_hf(str(folder), task=pairs.data, device="cpu")
    assert isinstance(run.model, HFModel) and run.task.task_type == "seq2seq"
    examples = pairs.data.test[:3]
    scores = alignment_scores(run, examples, batch_size=2)
    batch = run.collate(examples)
    with torch.no_grad():
        cross = run.model(batch).trace[run.model.cross_layers[-1]].weights.mean(1)
    src, tgt = run.collate.source.encode(examples[1].tokens)[1], run.collate.target.encode(examples[1].target)[1]
    expected = word_scores(cross[1, : len(tgt), : len(src)], tgt, src)
    torch.testing.assert_close(scores[1]["output_weight"][len(run.model.cross_layers) - 1], expected)
    result = run_test("alignment", run, split="test", out=tmp_path / "out")
    assert result.summary["pairs"] == len(pairs.data.test) and result.summary["layers"] == 2


def test_hub_name_offline_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, a hub name not in the cache is one error naming what to pass instead."""
    from attnaudit.models.hf import loading as hf_loading

    monkeypatch.setattr(hf_loading, "_hub_reachable", lambda: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AttnAuditError, match=r"Helsinki-NLP/opus-mt-de-en.*attnaudit train-nmt --arch marian") as error:
        load_hf("Helsinki-NLP/opus-mt-de-en", task=None, device="cpu")
    assert "\n" not in str(error.value)


def test_classification_task_refused(pairs: SimpleNamespace, tmp_path: Path) -> None:
    """An encoder-decoder translates: a classification task is refused in one line."""
    folder = tmp_path / "marian"
    build("marian", len(pairs.subwords)).save_pretrained(folder, safe_serialization=True)
    fresh_tokenizer(pairs.subwords).save_pretrained(folder)
    with pytest.raises(AttnAuditError, match="runs on seq2seq tasks"):
        load_hf(str(folder), task="synthetic", device="cpu")


def test_teacher_forcing_is_hfs_own(family: str, pairs: SimpleNamespace) -> None:
    """Our decoder input is HF's ``shift_tokens_right(labels)``: the mean cross-entropy of our logits is
    the loss HF computes from ``labels`` alone."""
    model, reference, batch = wrap(family, pairs)
    with torch.no_grad():
        ours = torch.nn.functional.cross_entropy(model(batch).logits.flatten(0, 1), batch.labels.flatten())
        theirs = reference(input_ids=batch.tokens, attention_mask=batch.mask.long(), labels=batch.labels).loss
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_applicability_matches_our_nmt(pairs: SimpleNamespace) -> None:
    """Every test answers an HF encoder-decoder as it answers our own NMT model (both translate):
    alignment and identifiability run, the one-decision-per-instance tests and rollout say why not."""
    from attnaudit.data.word_alignments import Seq2SeqCollator
    from attnaudit.experiments.experiment import applicability
    from attnaudit.models.interface import ModelConfig
    from attnaudit.models.seq2seq import Seq2SeqTransformer
    from attnaudit.run import Run, TaskSpec

    spec = TaskSpec("synthetic-translation", "seq2seq", [])
    model, _, _ = wrap("marian", pairs)
    hf_run = Run(model=model, collate=collator(model), task=spec, info={"kind": "hf", "source": "tiny marian"})
    size = len(pairs.subwords)
    config = ModelConfig(model="nmt", task_type="seq2seq", vocab_size=size, num_labels=size, embed_dim=16, layers=2, d_model=16, d_ff=32)
    nmt_run = Run(model=Seq2SeqTransformer(config), collate=Seq2SeqCollator(pairs.subwords, pairs.subwords), task=spec, info={"kind": "nmt"})
    ours, theirs = applicability(hf_run), applicability(nmt_run)
    # generation reads and writes text through a tokenizer: a Hugging Face model's; our NMT model has none
    assert ours.pop("generation") is None and "Hugging Face" in str(theirs.pop("generation"))
    assert {k: v is None for k, v in ours.items()} == {k: v is None for k, v in theirs.items()}
    assert ours["alignment"] is None and ours["identifiability"] is None
    assert "encoder-decoder" in str(ours["rollout"]) and "per target word" in str(ours["permutation"])


def test_classification_head_refused(pairs: SimpleNamespace, tmp_path: Path) -> None:
    """``finetune`` adds classification heads; an encoder-decoder is refused in one line saying what trains one."""
    from attnaudit.hf import build_hf_model

    folder = tmp_path / "marian"
    build("marian", len(pairs.subwords)).save_pretrained(folder, safe_serialization=True)
    fresh_tokenizer(pairs.subwords).save_pretrained(folder)
    with pytest.raises(AttnAuditError, match="takes no classification head; train a translation model with attnaudit train-nmt"):
        build_hf_model(str(folder), "classification", num_labels=2)
