"""shap's ``KernelExplainer`` on a causal LM's next-token probability, run with the shap venv's python
(benchmarks/shap_venv.sh). This file imports only that venv's packages (shap, transformers, torch, numpy), never
attnaudit.

``python benchmarks/shap_worker.py --serve``: a persistent process (imports and model loading paid once) reading
one JSON request per line on stdin and writing one JSON answer per line on stdout:

* ``{"op": "load", "model": FOLDER, "threads": N}``: ``AutoModelForCausalLM`` from a Hugging Face folder, float32, eval;
* ``{"op": "explain", "ids": [...], "groups": [...], "baseline": ID | null, "pad": ID, "target": ID,
  "nsamples": N, "seed": S, "batch_size": B}``: the prompt's token ids, each position's feature (-1: no feature,
  always kept; features numbered 0..M-1), the token a perturbed feature's tokens become (``null``: they are deleted,
  later tokens moving up; ``pad`` is then the one token of an input left empty), the explained next token;
  answers the ``M`` shap values, the expected value, the number of model evaluations and ``seconds`` (the
  explainer's construction and ``shap_values`` call, model included);
* ``{"op": "quit"}``.

The model function shap explains maps a coalition ``z ∈ {0,1}^M`` (1: the feature as in the prompt, 0: the
background's) to ``p(target | perturbed prompt)`` at the last real position; the background is the one row of
zeros (every feature perturbed) and the explained row the one of ones, so shap's masker is the baseline token
(or deletion) itself. ``l1_reg=False``: no feature selection, the plain Shapley-kernel fit. With ``nsamples ≥ 2^M − 2``
shap enumerates every coalition (exact Shapley values); below, it enumerates the smallest and largest coalition
sizes its budget covers and samples the rest (``np.random``, seeded with ``seed``).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from typing import Any

import numpy as np
import shap
import torch
from transformers import AutoModelForCausalLM

MODELS: dict[str, Any] = {}


def versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in ("shap", "transformers", "torch", "numpy")}


def load(folder: str, threads: int) -> Any:
    torch.set_num_threads(threads)
    if folder not in MODELS:
        MODELS[folder] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return MODELS[folder]


def value_function(model: Any, ids: list[int], groups: list[int], baseline: int | None, pad: int, target: int,
                   batch_size: int) -> Any:
    """``f(Z) -> (n,)`` float64: ``p(target)`` of each coalition row of ``Z`` ``(n, M)``, in batches of ``batch_size``."""
    tokens, feature = torch.tensor(ids), torch.tensor(groups)
    evaluations = [0]

    def f(z: Any) -> Any:
        present = torch.as_tensor(np.asarray(z) > 0.5)
        out = []
        for start in range(0, len(present), batch_size):
            part = present[start : start + batch_size]
            keep = torch.where(feature[None] >= 0, part[:, feature.clamp_min(0)], torch.ones((), dtype=torch.bool))
            if baseline is None:
                rows = [tokens[k] if k.any() else torch.tensor([pad]) for k in keep]
                width = max(len(r) for r in rows)
                batch = torch.full((len(rows), width), pad)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for r, row in enumerate(rows):
                    batch[r, : len(row)], mask[r, : len(row)] = row, 1
            else:
                batch = torch.where(keep, tokens[None], torch.tensor(baseline))
                mask = torch.ones_like(batch)
            with torch.no_grad():
                logits = model(input_ids=batch, attention_mask=mask).logits
            last = logits[torch.arange(len(batch)), mask.sum(1) - 1].float()
            out.append(last.softmax(-1)[:, target].double())
            evaluations[0] += len(batch)
        return torch.cat(out).numpy()

    f.evaluations = evaluations  # type: ignore[attr-defined]
    return f


def explain(model: Any, request: dict[str, Any]) -> dict[str, Any]:
    groups = request["groups"]
    count = max(groups) + 1
    f = value_function(model, request["ids"], groups, request["baseline"], request["pad"], request["target"], request.get("batch_size", 64))
    np.random.seed(request.get("seed", 0))
    start = time.perf_counter()
    explainer = shap.KernelExplainer(f, np.zeros((1, count)))
    values = explainer.shap_values(np.ones((1, count)), nsamples=request["nsamples"], l1_reg=False, silent=True)
    seconds = time.perf_counter() - start
    return {"values": np.asarray(values, dtype=np.float64).reshape(-1)[:count].tolist(),
            "expected_value": float(np.asarray(explainer.expected_value).reshape(-1)[0]),
            "evaluations": int(f.evaluations[0]), "seconds": seconds}


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "quit":
                print(json.dumps({"ok": True}), flush=True)
                return
            if request["op"] == "load":
                load(request["model"], request.get("threads", 1))
                answer: dict[str, Any] = {"versions": versions()}
            else:
                answer = explain(MODELS[request["model"]], request)
            print(json.dumps({"ok": True, **answer}), flush=True)
        except Exception as error:  # noqa: BLE001 - the caller prints it
            print(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}"}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] != ["--serve"]:
        raise SystemExit("usage: shap_worker.py --serve")
    serve()
