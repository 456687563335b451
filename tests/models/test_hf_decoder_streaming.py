"""Streaming a decoder's layers (``decode(keep_layers, on_layer)``), the streaming rollout, the
``dtype`` option, and the pieces of ``benchmarks/bench_llm_scale.py`` that are not timings.

A tiny random Llama (4 layers, 4 query heads over 2 key/value heads, width 32) on a right-padded
batch of the 8 tiny sentences; references: the same model's full trace, and a rollout written
out here with numpy.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from attnaudit.algorithms.attention_graph import StreamingRollout, rollout
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.explain.helpers.rollout import layer_weights
from attnaudit.explain.methods.attention_rollout import rollout_importance
from attnaudit.hf import HFCollator, build_hf_model
from attnaudit.models.hf import HFModel

REPO = Path(__file__).resolve().parents[2]
LAYERS = 4


def word_tokenizer(vocab: list[str]) -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]")


def tiny_llama(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def decoder(tiny_hf: SimpleNamespace) -> tuple[HFModel, Batch]:
    tok = word_tokenizer(tiny_hf.vocab)
    model = HFModel(tiny_llama(len(tiny_hf.vocab)), tok, "classification", "tiny", trained_head=False).eval()
    batch = HFCollator(tok, ["neg", "pos"], "classification", 64, token_types=False)(tiny_hf.task().test)
    assert not batch.mask.all()  # padded: the rollout's mask matters
    return model, batch


def numpy_rollout(weights: list[torch.Tensor], mask: torch.Tensor) -> np.ndarray:
    """Abnar & Zuidema's rollout by hand: per example, heads averaged, ½I + ½A on real tokens, rows renormalised, multiplied."""
    out = []
    for b in range(mask.shape[0]):
        real = mask[b].numpy().astype(bool)
        product = None
        for layer in weights:
            a = 0.5 * np.eye(real.sum()) + 0.5 * layer[b].double().mean(0).numpy()[np.ix_(real, real)]
            a = a / a.sum(1, keepdims=True)
            product = a if product is None else a @ product
        full = np.zeros((mask.shape[1], mask.shape[1]))
        full[np.ix_(real, real)] = product
        out.append(full)
    return np.stack(out)


def test_keep_layers_keeps_only_those_and_on_layer_sees_every_layer(decoder: tuple[HFModel, Batch]) -> None:
    model, batch = decoder
    with torch.no_grad():
        full = model(batch)
        seen: list[tuple[int, torch.Tensor]] = []
        kept = model.decode(model.encode(batch), keep_layers=[1, -1], on_layer=lambda l, r: seen.append((l, r.weights)))
        none = model.decode(model.encode(batch), keep_layers=())
    assert [l for l, _ in seen] == list(range(LAYERS))
    for (_, weights), record in zip(seen, full.trace.layers):
        torch.testing.assert_close(weights, record.weights, rtol=0, atol=0)
    assert [r.name for r in kept.trace.layers] == ["layer1", f"layer{LAYERS - 1}"]
    torch.testing.assert_close(kept.trace[1].residual, full.trace[LAYERS - 1].residual, rtol=0, atol=0)
    assert len(none.trace) == 0
    torch.testing.assert_close(none.logits, full.logits, rtol=0, atol=0)


def test_dropped_layers_are_freed_before_the_next_layer_runs(decoder: tuple[HFModel, Batch]) -> None:
    """Streaming holds one layer's weights (and scores) at a time: when layer l starts computing,
    every earlier layer's tensors that the trace does not keep are already gone."""
    model, batch = decoder
    model.keep_scores = True
    refs: list[weakref.ref] = []
    alive_at_start: list[int] = []

    def watch(_layer: int, record: object) -> None:
        refs.extend([weakref.ref(record.weights), weakref.ref(record.scores)])  # type: ignore[attr-defined]

    def count(*_args: object) -> None:
        gc.collect()
        alive_at_start.append(sum(ref() is not None for ref in refs))

    with torch.no_grad():
        cache = model.encode(batch)
    hooks = [layer.register_forward_pre_hook(count) for layer in model.layers]
    try:
        with torch.no_grad():
            out = model.decode(cache, keep_layers=[0], on_layer=watch)
    finally:
        for hook in hooks:
            hook.remove()
    assert alive_at_start == [0, 2, 2, 2]  # only layer 0's pair, which the trace keeps
    assert len(out.trace) == 1


def test_streaming_rollout_equals_full_rollout_and_a_hand_written_one(decoder: tuple[HFModel, Batch]) -> None:
    model, batch = decoder
    with torch.no_grad():
        trace = model(batch).trace
        rolled = StreamingRollout()
        model.decode(model.encode(batch), keep_layers=(), on_layer=lambda _l, r: rolled.add(r.weights, r.mask))
    full = rollout(trace.weights, mask=batch.mask)[:, -1]
    assert rolled.layers == LAYERS
    torch.testing.assert_close(rolled.result, full, rtol=0, atol=1e-7)
    np.testing.assert_allclose(rolled.result.double().numpy(), numpy_rollout(list(trace.weights), batch.mask), atol=1e-6)


def test_streaming_rollout_checks_its_input() -> None:
    rolled = StreamingRollout()
    with pytest.raises(AttnAuditError, match="no attention layers"):
        _ = rolled.result
    rolled.add(torch.full((1, 2, 3, 3), 1 / 3))
    with pytest.raises(AttnAuditError, match="layer 1"):
        rolled.add(torch.full((1, 2, 4, 4), 1 / 4))


def test_rollout_explanation_of_a_decoder_streams_and_equals_the_full_trace(decoder: tuple[HFModel, Batch]) -> None:
    model, batch = decoder
    assert model.streams_layers
    with torch.no_grad():
        trace = model(batch).trace
    last = batch.mask.long().sum(1) - 1
    expected = rollout(layer_weights(trace, LAYERS - 1), mask=batch.mask)[:, -1][torch.arange(len(last)), last]
    got = rollout_importance(model, batch)
    for b, n in enumerate(batch.mask.sum(1).tolist()):
        torch.testing.assert_close(got[b, :n], expected[b, :n], rtol=0, atol=1e-7)


def test_dtype_loads_a_decoder_in_bfloat16(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    tiny_llama(len(tiny_hf.vocab)).save_pretrained(tmp_path / "llama", safe_serialization=True)
    word_tokenizer(tiny_hf.vocab).save_pretrained(tmp_path / "llama")
    full = build_hf_model(str(tmp_path / "llama"), "classification")
    half = build_hf_model(str(tmp_path / "llama"), "classification", dtype=torch.bfloat16)
    assert {p.dtype for p in full.parameters()} == {torch.float32}
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    batch = HFCollator(full.tokenizer, ["neg", "pos"], "classification", 64, token_types=False)(tiny_hf.task().test)
    with torch.no_grad():
        reference, out = full(batch), half(batch)
    assert out.logits.dtype == out.trace[0].weights.dtype == torch.bfloat16
    torch.testing.assert_close(out.logits.float(), reference.logits, rtol=0, atol=0.05)  # bfloat16 keeps 8 bits
    encoder = build_hf_model(str(tiny_hf.dir), "classification", dtype=torch.bfloat16)  # every family takes --dtype
    assert {p.dtype for p in encoder.parameters()} == {torch.bfloat16}


# -- benchmarks/bench_llm_scale.py, the parts that are not timings ----------------------------------


@pytest.fixture(scope="module")
def bench() -> object:
    sys.path.insert(0, str(REPO))
    from benchmarks import bench_llm_scale

    return bench_llm_scale


def test_stored_config_is_smollm2_135m(bench: object) -> None:
    settings = json.loads(bench.CONFIG.read_text(encoding="utf-8"))  # type: ignore[attr-defined]
    config = AutoConfig.for_model(settings.pop("model_type"), **{k: v for k, v in settings.items() if not k.startswith("_")})
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert (config.hidden_size, config.vocab_size, config.tie_word_embeddings) == (576, 49152, True)


def test_arguments_and_estimates(bench: object) -> None:
    args = bench.parse_args(["--lengths", "128,32,128", "--weights", "random", "--dtype", "bfloat16"])  # type: ignore[attr-defined]
    assert args.lengths == [32, 128] and args.repeats >= 5 and args.device == "cpu"
    with pytest.raises(SystemExit):
        bench.parse_args(["--lengths", "32,x"])  # type: ignore[attr-defined]
    model = SimpleNamespace(config=SimpleNamespace(heads=9), num_attention_layers=30)
    # all-layers rollout at T=2048 in float32: 3.1 × 30 layers × 9 heads × 2048² × 4 bytes ≈ 13 GiB
    assert bench.estimated_bytes("rollout", 2048, model, torch.float32) == int(3.1 * 30 * 9 * 2048**2 * 4)  # type: ignore[attr-defined]
    # streaming: 6 one-layer (9,2048,2048) tensors of 2 bytes, independent of the 30 layers
    assert bench.estimated_bytes("rollout_streaming", 2048, model, torch.bfloat16) == 6 * 9 * 2048**2 * 2  # type: ignore[attr-defined]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset needs Linux /proc")
def test_cpu_peak_memory_sees_a_known_allocation() -> None:
    """The benchmark's CPU measure, in a fresh child process as the benchmark runs it (with
    MALLOC_MMAP_THRESHOLD_ set): inside a long-lived test worker, freed memory that is still
    resident can serve the allocation and hide it."""
    size = 256 * 2**20
    code = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from benchmarks import bench_llm_scale as b\n"
        f"print(b.peak_bytes(lambda: torch.ones({size // 4}).sum(), torch.device('cpu')))"
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run([sys.executable, "-c", code, str(REPO)], env=env, capture_output=True, text=True, check=True)
    measured = int(done.stdout.split()[-1])
    assert 0.95 * size <= measured <= 1.3 * size


def test_bfloat16_weights_equal_hf_eager_in_bfloat16(decoder: tuple[HFModel, Batch]) -> None:
    """In bfloat16 our trace is HF's bit for bit (torch's bfloat16 softmax accumulates in float32, as HF's upcast does)."""
    model, batch = decoder
    model.to(torch.bfloat16)
    reference = copy.deepcopy(model.hf)
    reference.set_attn_implementation("eager")
    with torch.no_grad():
        ours = model(batch)
        theirs = reference(input_ids=batch.tokens, attention_mask=batch.mask.long(), output_attentions=True,
                           position_ids=(batch.mask.long().cumsum(1) - 1).clamp_min(0))
    rows = batch.mask.bool()
    for mine, ref in zip(ours.trace.weights, theirs.attentions):
        assert mine.dtype == ref.dtype == torch.bfloat16
        torch.testing.assert_close(mine.transpose(1, 2)[rows], ref.transpose(1, 2)[rows], rtol=0, atol=0)
