"""ferret-xai's side of ``benchmarks/reproduce_ferret.py``: run by the ferret venv's python, never imported by attnaudit.

ferret 0.4.2 needs transformers < 5 and numpy < 2, so it runs in its own virtual environment
(``benchmarks/ferret_venv.sh``) and talks to the benchmark through JSON files:

* ``measure JOB OUT``: JOB holds the model folder (``save_pretrained`` output of the fine-tuned
  run), the sentences with our token ids, predicted class, our explanation scores per method and
  our ``k`` per bin. OUT receives ferret's token ids and logits for every sentence, ferret's AOPC
  evaluators applied to OUR scores (its defaults, and at our ``k`` per bin),
  whether ferret's decode → re-tokenise changed a perturbed input, and ferret's own Gradient and
  Integrated Gradients explanations with its default AOPC evaluations.
* ``serve JOB``: loads the model once, then for every line read on stdin does the timed work
  (both explainers and both evaluators with defaults on every sentence) and prints one JSON line
  ``{"seconds": ...}``, so the benchmark can interleave ferret's rounds with ours.

Only the standard library, numpy, torch, transformers and ferret are imported here.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
import torch

EXPLAINERS = {"gradient": "GradientExplainer", "ig": "IntegratedGradientExplainer"}


def load(job: dict[str, Any]) -> tuple[Any, Any]:
    """The fine-tuned model and its tokenizer from the run's ``hf`` folder (transformers 4.x)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(int(job.get("threads", 1)))
    model = AutoModelForSequenceClassification.from_pretrained(job["model_dir"], use_safetensors=True)
    model.eval()
    return model, AutoTokenizer.from_pretrained(job["model_dir"])


def tools(model: Any, tokenizer: Any) -> dict[str, Any]:
    """ferret's explainers (×input, its defaults) and AOPC evaluators."""
    from ferret import (
        AOPC_Comprehensiveness_Evaluation,
        AOPC_Sufficiency_Evaluation,
        GradientExplainer,
        IntegratedGradientExplainer,
    )

    return {
        "gradient": GradientExplainer(model, tokenizer, multiply_by_inputs=True),
        "ig": IntegratedGradientExplainer(model, tokenizer, multiply_by_inputs=True),
        "comp": AOPC_Comprehensiveness_Evaluation(model, tokenizer),
        "suff": AOPC_Sufficiency_Evaluation(model, tokenizer),
    }


def explanation(text: str, tokenizer: Any, scores: list[float], target: int, name: str) -> Any:
    """A ferret Explanation carrying given scores (one per wordpiece, [CLS] and [SEP] included)."""
    from ferret.explainers.explanation import Explanation

    tokens = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
    return Explanation(text, tokens, np.asarray(scores, dtype=np.float64), name, target)


def retokenised(tokenizer: Any, ids: np.ndarray) -> bool:
    """Whether decoding ``ids`` and tokenising the text again (what ferret does) gives other ids."""
    again = tokenizer(tokenizer.decode(ids))["input_ids"][1:-1]
    return list(again) != [int(i) for i in ids]


def at_k(t: dict[str, Any], tokenizer: Any, sentence: dict[str, Any], scores: list[float]) -> dict[str, Any]:
    """ferret's comprehensiveness and sufficiency of ``scores`` at each of our ``k``, and whether
    ferret's decode → re-tokenise changed each perturbed input.

    ``only_pos=True``: ferret 0.4.2's ``only_pos=False`` path fails for ``k ≥ 2`` under numpy 1.26
    (``id_top_k == []`` on an array raises ValueError). Both select the same top ``k`` when the
    scores are positive, which the benchmark checks (our gradient and IG scores are ``|·|``).
    """
    from ferret.evaluators.utils_from_soft_to_discrete import _get_id_tokens_top_k

    expl = explanation(sentence["text"], tokenizer, scores, sentence["target"], "given")
    inner = np.asarray(tokenizer(sentence["text"])["input_ids"][1:-1])
    out: dict[str, Any] = {"comp": [], "suff": [], "comp_changed": [], "suff_changed": []}
    for k in sentence["ks"]:
        args = {"remove_first_last": True, "only_pos": True, "removal_args": {"based_on": "k", "thresholds": [int(k)]}}
        for key in ("comp", "suff"):
            out[key].append(float(t[key].compute_evaluation(expl, target=sentence["target"], **args).score))
        top = np.asarray(_get_id_tokens_top_k(np.asarray(scores[1:-1]), int(k), only_pos=True))
        for key, ids in (("comp", np.delete(inner, top)), ("suff", inner[np.sort(top)])):
            changed = retokenised(tokenizer, ids)
            out[f"{key}_changed"].append(changed)
            if changed and "example" not in out:
                again = tokenizer(tokenizer.decode(ids))["input_ids"][1:-1]
                out["example"] = {"kept": tokenizer.convert_ids_to_tokens([int(i) for i in ids]),
                                  "decoded": tokenizer.decode(ids), "retokenised": tokenizer.convert_ids_to_tokens(again)}
    return out


def default_retokenised(tokenizer: Any, text: str, scores: list[float]) -> bool:
    """Whether any input of ferret's default AOPC (its own rationale selection, repeated sets
    skipped) is changed by decode → re-tokenise."""
    from ferret.evaluators.utils_from_soft_to_discrete import (
        _check_and_define_get_id_discrete_rationale_function,
        parse_evaluator_args,
    )

    _, only_pos, removal, _ = parse_evaluator_args({})
    select = _check_and_define_get_id_discrete_rationale_function(removal["based_on"])
    inner = np.asarray(tokenizer(text)["input_ids"][1:-1])
    last = None
    for v in removal["thresholds"]:
        top = select(np.asarray(scores[1:-1]), v, only_pos)
        if top is None or (last is not None and set(top) == last):
            continue
        last = set(top)
        if retokenised(tokenizer, np.delete(inner, top)) or retokenised(tokenizer, inner[np.sort(top)]):
            return True
    return False


def defaults(t: dict[str, Any], expl: Any, target: int) -> dict[str, float]:
    """ferret's AOPC comprehensiveness and sufficiency with its default arguments."""
    return {key: float(t[key].compute_evaluation(expl, target=target).score) for key in ("comp", "suff")}


def own(t: dict[str, Any], method: str, text: str, target: int, steps: int) -> Any:
    """ferret's own explanation of ``target`` by ``method`` (IG with ``steps`` steps)."""
    args = {"call_args": {"n_steps": steps}} if method == "ig" else {}
    return t[method](text, target=target, **args)


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Everything the benchmark compares (see the module docstring)."""
    from importlib.metadata import version

    import ferret
    import transformers

    model, tokenizer = load(job)
    t = tools(model, tokenizer)
    sentences = job["sentences"]
    texts = [s["text"] for s in sentences]
    with torch.no_grad():
        logits = [model(**tokenizer(text, return_tensors="pt")).logits[0].tolist() for text in texts]
    out: dict[str, Any] = {
        "versions": {"ferret-xai": version("ferret-xai"), "ferret.__version__": ferret.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__, "torch": torch.__version__},
        "attn_implementation": model.config._attn_implementation,
        "ids": [tokenizer(text)["input_ids"] for text in texts],
        "logits": logits,
        "given": {},
        "own": {},
        "seconds": {},
    }
    for method in job["methods"]:
        tic = time.perf_counter()
        rows = []
        for s in sentences:
            scores = s["scores"][method]
            rows.append({"bins": at_k(t, tokenizer, s, scores),
                         "default": defaults(t, explanation(s["text"], tokenizer, scores, s["target"], method), s["target"]),
                         "default_retokenised": default_retokenised(tokenizer, s["text"], scores)})
        out["given"][method] = rows
        out["seconds"][f"given_{method}"] = time.perf_counter() - tic
        tic = time.perf_counter()
        rows = []
        for s in sentences:
            expl = own(t, method, s["text"], s["target"], job["ig_steps"])
            rows.append({"scores": np.asarray(expl.scores, dtype=float).tolist(), "tokens": list(expl.tokens),
                         "default": defaults(t, expl, s["target"])})
        out["own"][method] = rows
        out["seconds"][f"own_{method}"] = time.perf_counter() - tic
    return out


def serve(job: dict[str, Any]) -> None:
    """One timed round per stdin line: both explainers + both default evaluators on every sentence."""
    model, tokenizer = load(job)
    t = tools(model, tokenizer)
    sentences = job["sentences"]
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        tic = time.perf_counter()
        for s in sentences:
            for method in job["methods"]:
                defaults(t, own(t, method, s["text"], s["target"], job["ig_steps"]), s["target"])
        print(json.dumps({"seconds": time.perf_counter() - tic}), flush=True)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("measure", "serve"):
        sys.exit("usage: ferret_worker.py measure JOB.json OUT.json | serve JOB.json")
    with open(sys.argv[2], encoding="utf-8") as handle:
        job = json.load(handle)
    if sys.argv[1] == "serve":
        serve(job)
        return
    result = measure(job)
    with open(sys.argv[3] + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    import os

    os.replace(sys.argv[3] + ".tmp", sys.argv[3])


if __name__ == "__main__":
    main()
