"""``attnaudit finetune`` for decoder-only models: tiny random Llama, Qwen2 and GPT-2 causal LMs
(built here, saved as folders like a downloaded checkpoint) get a sequence-classification head
read at the last real token, train through the one loop, save and reload as ``hf`` runs.

References: HF's own base model and ``score`` layer run on each example alone (no padding, so
its last position is its last real token), safetensors files read back tensor by tensor, and
the loop's own history.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, Qwen2Tokenizer

import attnaudit.hf as hf_module
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.experiments import run_test
from attnaudit.models.hf import HFModel
from attnaudit.models.interface import evaluation
from attnaudit.run import load_run
from attnaudit.training.finetune import finetune, frozen_patterns
from tests.models.test_hf_decoder import build, tokenizer
from tests.reliability.helpers import assert_clean_failure, cli, write_table

FAMILIES = ("llama", "qwen2", "gpt2")
QWEN_CHARS = ["[PAD]", "[UNK]", "[SEP]", *string.ascii_lowercase, ".", ",", "!", "Ġ"]
"""Qwen2's byte-level pre-tokenizer writes a space as ``Ġ``."""
SETTINGS = {"epochs": 6, "lr": 3e-3, "batch_size": 2, "seed": 0, "device": "cpu"}


def causal_lm_folder(family: str, vocab: list[str], root: Path) -> Path:
    """A tiny random causal LM of ``family`` saved with its tokenizer (no classification head).

    transformers always loads a Qwen2 folder's tokenizer as ``Qwen2Tokenizer`` (byte-level BPE),
    so Qwen2 gets one over single characters (no merges) instead of the word-level one."""
    path = root / f"{family}-lm"
    if not (path / "config.json").exists():
        tok = tokenizer(vocab) if family != "qwen2" else Qwen2Tokenizer(
            vocab={c: i for i, c in enumerate(QWEN_CHARS)}, merges=[], unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]"
        )
        build(family, len(tok), lm=True).save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=FAMILIES)
def tuned(request: pytest.FixtureRequest, tiny_hf: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A fine-tuned run of each family, with the logits of the model at the moment it was saved."""
    root = tmp_path_factory.mktemp(request.param)
    source = causal_lm_folder(request.param, tiny_hf.vocab, root)
    batch = hf_module.HFCollator(AutoTokenizer.from_pretrained(source), ["neg", "pos"], "classification", 64, False)(tiny_hf.task().test)
    saved: list[torch.Tensor] = []
    original = hf_module.save_hf_run

    def recording_save(run, out, extra=None):  # type: ignore[no-untyped-def]
        with evaluation(run.model), torch.no_grad():  # the loop is in training mode (GPT-2 has dropout)
            saved.append(run.model(batch.to(run.device)).logits.clone())
        return original(run, out, extra)

    patch = pytest.MonkeyPatch()
    patch.setattr(hf_module, "save_hf_run", recording_save)
    try:
        finetune(tiny_hf.task(), root / "run", hf=str(source), **SETTINGS)
    finally:
        patch.undo()
    return SimpleNamespace(family=request.param, out=root / "run", source=source, batch=batch, saved=saved)


def test_loss_decreases_and_the_best_epoch_is_kept(tuned: SimpleNamespace) -> None:
    metrics = json.loads((tuned.out / "metrics.json").read_text())
    losses = [h["train_loss"] for h in metrics["history"]]
    training = metrics["training"]  # every epoch, or up to the first perfect dev accuracy (nothing later can be kept)
    assert len(losses) == {"epochs": SETTINGS["epochs"], "ceiling": training["selected_epoch"]}[training["stopped"]]
    assert losses[-1] < 0.7 * losses[0]
    assert metrics["best_dev"] == max(h["dev"]["accuracy"] for h in metrics["history"]) >= 0.75
    assert metrics["training"]["optimiser"]["frozen"] == []  # default: every parameter trains


def test_saved_run_reloads_with_identical_logits(tuned: SimpleNamespace) -> None:
    run = load_run(tuned.out, device="cpu")
    model = run.model
    assert isinstance(model, HFModel) and model.has_head and model.trained_head and model.hf_type == tuned.family
    with torch.no_grad():
        assert torch.equal(model(tuned.batch).logits, tuned.saved[-1])  # the last save is the kept epoch
    files = {p.suffix for p in tuned.out.rglob("*") if p.is_file()}
    assert ".safetensors" in files and not files & {".bin", ".pt", ".pkl", ".pth"}


def _left_padded(batch: Batch) -> Batch:
    left = Batch(tokens=batch.tokens.clone(), mask=batch.mask.clone())
    for i, n in enumerate(batch.mask.sum(1).tolist()):
        left.tokens[i] = batch.tokens[i].roll(batch.tokens.shape[1] - n)
        left.mask[i] = batch.mask[i].roll(batch.tokens.shape[1] - n)
    return left


def test_last_real_token_pooling_under_left_and_right_padding(tuned: SimpleNamespace) -> None:
    """Logits of a right- and a left-padded batch equal ``score(base(x_i)[-1])`` of each example alone."""
    model = load_run(tuned.out, device="cpu").model
    right = tuned.batch
    left = _left_padded(right)
    lengths = right.mask.sum(1)
    assert not right.mask[:, -1].all() and not left.mask[:, 0].all()  # both really padded
    assert torch.equal(model.explanation_rows(right.mask), lengths - 1)
    assert torch.equal(model.explanation_rows(left.mask), torch.full_like(lengths, right.tokens.shape[1] - 1))
    with torch.no_grad():
        by_hand = torch.stack([
            model.hf.score(model.hf.base_model(input_ids=right.tokens[i : i + 1, :n]).last_hidden_state[0, -1])
            for i, n in enumerate(lengths.tolist())
        ])
        for batch in (right, left):
            torch.testing.assert_close(model(batch).logits, by_hand, rtol=0, atol=1e-5)


def test_audited_like_an_encoder_run(tuned: SimpleNamespace, tiny_hf: SimpleNamespace) -> None:
    """A prediction test runs on the fine-tuned decoder; attention is read at the last real token."""
    run = load_run(tuned.out, device="cpu")
    run._data = tiny_hf.task()
    result = run_test("importance", run, split="test", out=tuned.out / "results", plot=False)
    assert result.summary and all(v == v for v in result.summary.values() if isinstance(v, float))


def test_train_layers_freezes_everything_before_the_last_layers(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    source = causal_lm_folder("llama", tiny_hf.vocab, tmp_path)
    finetune(tiny_hf.task(), tmp_path / "run", hf=str(source), train_layers=1, **SETTINGS)
    before, after = load_file(source / "model.safetensors"), load_file(tmp_path / "run" / "hf" / "model.safetensors")
    trained = {name for name in after if name.startswith(("model.layers.1.", "model.norm.", "score."))}
    for name in after.keys() - trained:
        assert torch.equal(after[name], before[name]), name  # embeddings and layer 0 untouched
    for name in trained - {"score.weight"}:
        assert not torch.equal(after[name], before[name]), name
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["finetune"]["trained_parameters"] == sum(after[name].numel() for name in trained)
    with pytest.raises(AttnAuditError, match="between 0 and the model's 2 layers"):
        finetune(tiny_hf.task(), tmp_path / "bad", hf=str(source), train_layers=3, **SETTINGS)


def test_frozen_patterns_of_each_family(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    """Head-only training (``train_layers=0``) freezes the embeddings (GPT-2: token and position) and every layer;
    a BERT with one trained layer keeps its embeddings and first layer."""
    expected = {
        "llama": {"hf.model.embed_tokens.weight", "hf.model.layers.0.*", "hf.model.layers.1.*"},
        "qwen2": {"hf.model.embed_tokens.weight", "hf.model.layers.0.*", "hf.model.layers.1.*"},
        "gpt2": {"hf.transformer.wte.weight", "hf.transformer.wpe.weight", "hf.transformer.h.0.*", "hf.transformer.h.1.*"},
    }
    for family, patterns in expected.items():
        model = hf_module.load_hf(causal_lm_folder(family, tiny_hf.vocab, tmp_path), num_labels=2, device="cpu").model
        assert set(frozen_patterns(model, 0)) == patterns
        assert frozen_patterns(model, None) == ()
    bert = hf_module.load_hf(tiny_hf.dir, device="cpu").model  # encoders too: the pooler trains with the head
    embeddings = {f"hf.bert.embeddings.{n}" for n, _ in bert.hf.bert.embeddings.named_parameters()}
    assert set(frozen_patterns(bert, 1)) == embeddings | {"hf.bert.encoder.layer.0.*"}


def test_same_seed_same_weights(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    """Two fine-tunings with one seed through the loop (head init, shuffling, dropout) give equal weights."""
    source = causal_lm_folder("gpt2", tiny_hf.vocab, tmp_path)
    for name in ("a", "b"):
        finetune(tiny_hf.task(), tmp_path / name, hf=str(source), **{**SETTINGS, "epochs": 2})
    a, b = (load_file(tmp_path / name / "hf" / "model.safetensors") for name in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = tmp_path / "c"
    finetune(tiny_hf.task(), other, hf=str(source), **{**SETTINGS, "epochs": 2, "seed": 1})
    assert not torch.equal(load_file(other / "hf" / "model.safetensors")["score.weight"], a["score.weight"])


def test_cli_bad_train_layers(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    source = causal_lm_folder("qwen2", tiny_hf.vocab, tmp_path)
    data = write_table(tmp_path / "tiny.csv", [("good fun movie", "pos"), ("bad plot", "neg")] * 4)
    for value, words in (("-1", "--train-layers must be at least 0"), ("3", "between 0 and the model's 2 layers")):
        proc = cli("finetune", "--hf", source, "--task", f"csv:{data}", "--out", tmp_path / "out", "--train-layers", value, "--quiet")
        assert words in assert_clean_failure(proc, "--train-layers", out=tmp_path / "out")
