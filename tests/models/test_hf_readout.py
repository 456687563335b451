"""The last block's tail at the read rows alone (:mod:`attnaudit.models.hf.readout`).

Tiny random models of :mod:`attnaudit.architectures`: where the cut falls is found, not named (pre-norm decoders
after the attention's residual add, BERT after its attention module, Gemma 2 before its feed-forward), the tail's
linear layers then run on one row per example, and a logits-only pass (forward and input gradient) equals the
full one; where no cut saves work (OPT flattens positions, GPT-J runs attention and MLP in parallel, ALBERT shares
one layer module) the pass is the whole one. A toy model that pools every position keeps no cut.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from attnaudit.architectures import SENTENCES, build_tiny
from attnaudit.data.types import Batch
from attnaudit.errors import AttnAuditError
from attnaudit.models.hf import HFModel
from attnaudit.models.hf.readout import Cut, find_cut, read_rows_only
from attnaudit.models.interface import detach_weights, evaluation

CUTS = {
    "llama": "post_attention_layernorm", "gpt2": "ln_2", "gemma2": "pre_feedforward_layernorm", "bert": "attention",
    "distilbert": "sa_layer_norm", "modernbert": "mlp_norm", "qwen2_moe": "post_attention_layernorm",
    "opt": None, "gptj": None, "albert": None,
}


def tiny(model_type: str) -> tuple[HFModel, Batch]:
    head = "classifier" if model_type in ("bert", "distilbert", "modernbert", "albert") else "lm"
    hf, tokenizer = build_tiny(model_type, head)
    model = HFModel(hf, tokenizer, "classification", model_type, trained_head=True)
    encoded = tokenizer(list(SENTENCES), padding=True, return_tensors="pt")
    return model, Batch(tokens=encoded["input_ids"], mask=encoded["attention_mask"].bool(), examples=[])


def cut_name(model: HFModel) -> str | None:
    cut = model.read_cut()
    return None if cut is None else next(name for name, child in cut.block.named_children() if child is cut.module)


def rows_given(block: nn.Module, run: Any) -> list[int]:
    """Rows each linear layer of ``block`` is given during ``run()``, in call order."""
    seen: list[int] = []
    handles = [m.register_forward_pre_hook(lambda m, a: seen.append(a[0].numel() // m.in_features))
               for m in block.modules() if isinstance(m, nn.Linear)]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return seen


@pytest.mark.parametrize("model_type", sorted(CUTS))
def test_the_cut_is_found_and_changes_no_logit_and_no_gradient(model_type: str) -> None:
    model, batch = tiny(model_type)
    assert cut_name(model) == CUTS[model_type]
    with evaluation(model):
        embeddings = model.embed(batch).detach()
        outs = []
        for forward in (model.forward, model.logits_forward):
            given = embeddings.clone().requires_grad_(True)
            out = forward(batch, [detach_weights()], embeddings=given)
            (grad,) = torch.autograd.grad(out.logits.square().sum(), given)
            outs.append((out, grad))
    (full, grad), (fast, fast_grad) = outs
    torch.testing.assert_close(fast.logits, full.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(fast_grad, grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()))
    assert len(fast.trace) == 0 and len(full.trace) == model.num_attention_layers  # read for its logits: no trace kept


@pytest.mark.parametrize("model_type", ["llama", "bert", "gemma2"])
def test_the_tail_runs_on_one_row_per_example(model_type: str) -> None:
    """After the cut the last block's linear layers see one row per example; without it, every position."""
    model, batch = tiny(model_type)
    last = model.structure.blocks[-1]
    assert model.read_cut() is not None  # found on the dry batch first, outside the count
    with evaluation(model), torch.no_grad():
        full = rows_given(last, lambda: model(batch))
        fast = rows_given(last, lambda: model.logits_forward(batch))
    positions = batch.tokens.numel()
    assert set(full) == {positions}
    assert fast[: fast.count(positions)] == full[: fast.count(positions)]  # the attention's projections: every position
    assert fast.count(len(batch)) >= 2 and sum(fast) < sum(full)


class _Toy(nn.Module):
    """One block (attention-like mixing, then a feed-forward child) and a head that pools ``pool``."""

    def __init__(self, pool: str) -> None:
        super().__init__()
        self.block = nn.ModuleDict({"mix": nn.Linear(4, 4), "ff": nn.Linear(4, 4)})
        self.pool = pool

    def forward(self, x: Tensor) -> Tensor:
        block = self.block
        mixed = block["mix"](x.mean(1, keepdim=True).expand_as(x) + x)
        h = x + block["ff"](mixed)
        return h.mean(1) if self.pool == "mean" else h[:, 0]


@pytest.mark.parametrize(("pool", "found"), [("first", True), ("mean", False)])
def test_a_head_that_reads_every_position_keeps_no_cut(pool: str, found: bool) -> None:
    torch.manual_seed(0)
    toy, x = _Toy(pool), torch.randn(2, 5, 4)
    rows = torch.zeros(2, dtype=torch.long)

    def run(cut: Cut | None) -> Tensor:
        with read_rows_only(cut, rows):
            return toy(x)

    cut = find_cut([toy.block], toy.block["mix"], run)
    assert (cut is not None) == found
    if cut is not None:
        assert cut.module is toy.block["mix"]
        torch.testing.assert_close(run(cut), run(None))


def test_a_cut_meeting_states_without_positions_says_so() -> None:
    layer = nn.Linear(4, 4)
    with read_rows_only(Cut(layer, layer), torch.zeros(3, dtype=torch.long)), pytest.raises(AttnAuditError, match="layout"):
        layer(torch.randn(3, 4))
