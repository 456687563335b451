"""attnlrp and cp_lrp against the authors' library lxt 2.1 on the same tiny random models and inputs.

lxt runs in its own venv (it needs transformers 4.x; benchmarks/lxt_venv.sh builds it), on the weights
saved here, each input alone and unpadded; ours runs on a right-padded batch. Compared: the tiny random
BERT classifier of ``tiny_hf`` (AttnLRP; lxt 2.1 has no CP-LRP map for BERT) and a tiny random Llama
causal LM (grouped-query attention, RoPE, gated SiLU MLP, RMSNorm; AttnLRP and CP-LRP), all float32.
Tolerance: 1e-5 absolute per token (relevances here are up to ~0.4; measured max difference 3e-8 on
the Llama), and Spearman's rank correlation per input above 0.9999. Skips, naming the command that
builds the venv, where it is absent.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import spearmanr

from attnaudit.explain.helpers.lrp import lrp_relevance
from attnaudit.hf import HFCollator, load_hf
from attnaudit.models.hf import HFModel
from tests.models.test_hf_decoder import build, tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `benchmarks` is a folder of the checkout
from benchmarks.lxt_case import LXT_INSTALL, as_tensor, lxt_python, real_ids, run_lxt, write_case  # noqa: E402

pytestmark = pytest.mark.skipif(lxt_python() is None, reason=f"lxt venv absent; build it with {LXT_INSTALL}")


def model_and_batch(which: str, tiny_hf: SimpleNamespace) -> tuple:
    if which == "bert":
        run = load_hf(tiny_hf.dir, task=tiny_hf.task(), device="cpu")
        return run.model.eval(), run.collate(tiny_hf.task().test)
    tok = tokenizer(tiny_hf.vocab)
    model = HFModel(build("llama", len(tiny_hf.vocab), lm=True, seed=2), tok, "classification", "llama", True).eval()
    return model, HFCollator(tok, ["neg", "pos"], "classification", 64, token_types=False)(tiny_hf.task().test)


@pytest.mark.parametrize(("which", "rule"), [("bert", "attnlrp"), ("llama", "attnlrp"), ("llama", "cp_lrp")])
def test_relevances_equal_lxt(which: str, rule: str, tiny_hf: SimpleNamespace) -> None:
    model, batch = model_and_batch(which, tiny_hf)
    assert not batch.mask.all()  # ours padded, lxt's not
    with tempfile.TemporaryDirectory() as folder:
        theirs = run_lxt(write_case(model, real_ids(batch), rule, Path(folder)))
    with torch.no_grad():
        logits = model(batch).logits
    torch.testing.assert_close(torch.tensor(theirs["logits"]), logits.max(-1).values, rtol=0, atol=1e-5)
    assert theirs["targets"] == logits.argmax(-1).tolist()
    ours = (lrp_relevance(model, batch, rule) * batch.mask).double()
    torch.testing.assert_close(ours, as_tensor(theirs["relevance"], batch.tokens.shape[1]), rtol=0, atol=1e-5)
    ranked = [(row[real].numpy(), other) for row, other, real in zip(ours, theirs["relevance"], batch.mask) if len(other) > 2]
    assert ranked and all(spearmanr(a, b).statistic > 0.9999 for a, b in ranked)
