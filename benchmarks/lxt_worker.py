"""AttnLRP / CP-LRP relevances from the authors' library lxt 2.1, run with the lxt venv's python
(benchmarks/lxt_venv.sh: transformers 4.57.6, which lxt 2.1 is written for).

Usage: ``python benchmarks/lxt_worker.py CASE_DIR OUT.json [--repeats N]``. ``CASE_DIR`` (written by
:func:`benchmarks.lxt_case.write_case`) holds ``case.json`` (``family`` ``bert`` or ``llama``, the
config's keyword arguments, ``rule`` ``attnlrp`` or ``cp_lrp``, the token ids of each input and, for a
zero-shot causal LM, the ``verbalizer`` token ids) and
``weights.safetensors`` (the model's state dict). Each input is explained alone, unpadded, as in lxt's
examples: embeddings with ``requires_grad``, a forward from ``inputs_embeds``, a backward from the
predicted class's logit (a causal LM: the predicted next token's at the last position), relevance
``(embeddings × grad).sum(-1)``. ``OUT.json`` gets the relevances, the explained logits, the targets and
the seconds each of the ``N`` passes over all inputs took (timed from the first forward, the model
already built). This file imports only the lxt venv's packages, never attnaudit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM
from transformers.models.bert import modeling_bert
from transformers.models.llama import modeling_llama


def import_lxt() -> types.ModuleType:
    """``lxt.efficient``, imported with a stand-in ``torchvision`` (its ViT map imports one; the wheel for
    this torch is CUDA-linked), which is removed again at once (left in place it breaks transformers)."""
    names = ("torchvision", "torchvision.models", "torchvision.models.vision_transformer")
    stand_ins = [types.ModuleType(n) for n in names]
    stand_ins[0].models, stand_ins[1].vision_transformer, stand_ins[2].nn = stand_ins[1], stand_ins[2], torch.nn
    sys.modules.update(zip(names, stand_ins))
    try:
        import lxt.efficient as efficient
        import lxt.efficient.models.llama as lxt_llama
    finally:
        for name in names:
            sys.modules.pop(name, None)
    efficient.lxt_llama = lxt_llama
    return efficient


def build(case: dict, folder: Path) -> torch.nn.Module:
    """The patched model with the saved weights, in eval mode, in the case's dtype."""
    efficient = import_lxt()
    family, rule = case["family"], case["rule"]
    if family == "bert":
        if rule != "attnlrp":
            raise SystemExit("lxt 2.1 has no CP-LRP map for BERT")
        efficient.monkey_patch(modeling_bert)
        model = BertForSequenceClassification(BertConfig(**case["config"], attn_implementation="eager"))
    else:
        patch = efficient.lxt_llama.attnLRP if rule == "attnlrp" else efficient.lxt_llama.cp_LRP
        efficient.monkey_patch(modeling_llama, patch_map=patch)
        model = LlamaForCausalLM(LlamaConfig(**case["config"], attn_implementation="eager"))
    state = load_file(str(folder / "weights.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = bool(case["config"].get("tie_word_embeddings"))
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"weights do not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if tied:
        model.tie_weights()
    return model.to(getattr(torch, case.get("dtype", "float32"))).eval()


def explain(model: torch.nn.Module, ids: list[int], family: str, verbalizer: list[int] | None) -> tuple[list[float], float, int]:
    """lxt's recipe on one unpadded input: (relevance per token, explained logit, target id). A causal LM
    with a ``verbalizer`` (zero-shot classification) explains the largest of those next-token logits."""
    tokens = torch.tensor([ids])
    embeddings = model.get_input_embeddings()(tokens).detach().requires_grad_(True)
    if family == "bert":
        logits = model(inputs_embeds=embeddings, token_type_ids=torch.zeros_like(tokens)).logits[0]
    else:
        logits = model(inputs_embeds=embeddings, use_cache=False).logits[0, -1]
        logits = logits if verbalizer is None else logits[verbalizer]
    target = int(logits.argmax())
    logits[target].backward()
    return (embeddings * embeddings.grad).sum(-1)[0].tolist(), float(logits[target]), target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    case = json.loads((args.case / "case.json").read_text())
    torch.set_num_threads(int(case.get("threads", 1)))
    model = build(case, args.case)
    seconds, results = [], []
    for _ in range(max(args.repeats, 1)):
        start = time.perf_counter()
        results = [explain(model, ids, case["family"], case.get("verbalizer")) for ids in case["inputs"]]
        seconds.append(time.perf_counter() - start)
    out = {
        "relevance": [r for r, _, _ in results],
        "logits": [z for _, z, _ in results],
        "targets": [t for _, _, t in results],
        "seconds": seconds,
        "lxt_transformers": sys.modules["transformers"].__version__,
    }
    args.out.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
