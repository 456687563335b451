"""inseq 0.7.1 attributions of generated (or forced) sequences, run with the inseq venv's python
(benchmarks/inseq_venv.sh). This file imports only that venv's packages, never attnaudit.

Two ways to run it:

* ``python benchmarks/inseq_worker.py REQUEST.json OUT.json``: one request, one answer file. The request
  holds ``model`` (a Hugging Face folder), ``prompts``, either ``max_new_tokens`` (greedy generation) or
  ``targets`` (one forced continuation per prompt), ``methods`` (inseq names: ``saliency``,
  ``integrated_gradients``, ``attention``, ...), ``n_steps`` (IG's steps), ``threads`` and optionally
  ``include_eos_baseline`` and ``repeats``. The answer has, per prompt, the source and target token ids
  inseq attributed and per method the attributions and the wall time of each ``model.attribute`` call.
* ``python benchmarks/inseq_worker.py --serve``: a persistent process (imports and model loading paid once)
  reading one JSON request per line on stdin and writing one JSON answer per line on stdout:
  ``{"op": "load", "model": FOLDER, "threads": N}``, then ``{"op": "attribute", "prompt": TEXT, "method": M,
  "max_new_tokens": N | "target": TEXT, "n_steps": S, "include_eos_baseline": B, "raw": B}`` (``raw`` False:
  times and ids only, no attributions, so a timed round sends no large answer), ``{"op": "quit"}``.

The attributions are inseq's **granular** ones, as ``model.attribute`` stores them before any aggregation:
``source_attributions`` ``(source_len, steps, ...)`` (encoder-decoders; None for decoder-only models) and
``target_attributions`` ``(prefix_len, steps, ...)`` (decoder-only models: the prompt and the generated tokens;
None for encoder-decoders unless ``attribute_target``); the trailing axes are the embedding dimension for
gradient methods (saliency: ``|∂p/∂e|`` elementwise; IG: ``(e − e') · ∫∂p/∂e``) and ``(layers, heads)`` for
``attention``. inseq's own view (``.aggregate()``: L2 over the embedding, then each step divided by its sum;
attention averaged over layers and heads) is applied by the caller. Entries a step cannot attribute are NaN
(JSON ``null``). The time of a call is that of ``model.attribute`` alone, generation included.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import inseq
import torch

MODELS: dict[str, Any] = {}


def versions() -> dict[str, str]:
    """The peer's package versions."""
    return {name: importlib.metadata.version(name) for name in ("inseq", "transformers", "torch", "captum")}


def load(folder: str, threads: int) -> Any:
    """The inseq model of ``folder`` (loaded once), in eval mode; greedy decoding with no forced end token
    (transformers' ``forced_eos_token_id`` would replace the last of ``max_new_tokens`` by ``</s>`` in Marian)."""
    torch.set_num_threads(threads)
    if folder not in MODELS:
        model = inseq.load_model(folder, "saliency")
        model.model.eval()
        model.model.generation_config.forced_eos_token_id = None
        MODELS[folder] = model
    return MODELS[folder]


def nested(tensor: torch.Tensor | None) -> list | None:
    """A tensor as nested lists with NaN as None (JSON has no NaN)."""
    if tensor is None:
        return None
    values = tensor.detach().float().tolist()

    def clean(x: Any) -> Any:
        if isinstance(x, list):
            return [clean(v) for v in x]
        return None if math.isnan(x) else x

    return clean(values)


def attribute(model: Any, prompt: str, method: str, max_new_tokens: int | None, target: str | None, n_steps: int,
              include_eos_baseline: bool, raw: bool, attribute_target: bool = False) -> dict[str, Any]:
    """One ``model.attribute`` call: the ids it attributed, its wall time and (``raw``) its granular attributions;
    ``attribute_target``: an encoder-decoder's earlier target tokens are attributed too (as attnaudit's are)."""
    kwargs: dict[str, Any] = {"method": method, "show_progress": False, "include_eos_baseline": include_eos_baseline}
    if attribute_target and model.is_encoder_decoder:
        kwargs["attribute_target"] = True
    if method in ("integrated_gradients", "layer_integrated_gradients"):
        kwargs["n_steps"] = n_steps
    if target is not None:
        kwargs["generated_texts"] = target if model.is_encoder_decoder else prompt + target
    else:
        kwargs["generation_args"] = {"max_new_tokens": max_new_tokens, "do_sample": False}
    start = time.perf_counter()
    out = model.attribute(prompt, **kwargs)
    seconds = time.perf_counter() - start
    sequence = out.sequence_attributions[0]
    answer: dict[str, Any] = {
        "seconds": seconds,
        "source_ids": [t.id for t in sequence.source],
        "target_ids": [t.id for t in sequence.target],
        "attr_pos_start": sequence.attr_pos_start,
        "attr_pos_end": sequence.attr_pos_end,
        "generated_text": out.info.get("generated_texts", [None])[0],
    }
    if raw:
        answer["source_attributions"] = nested(sequence.source_attributions)
        answer["target_attributions"] = nested(sequence.target_attributions)
        answer["kind"] = type(sequence).__name__
    return answer


def serve() -> None:
    """Answer one JSON request per stdin line on stdout until ``quit`` or the end of stdin (anything the
    libraries print goes to stderr, so stdout carries the answers alone)."""
    answers, sys.stdout = sys.stdout, sys.stderr
    model = None
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "quit":
                break
            if request["op"] == "load":
                model = load(request["model"], int(request.get("threads", 1)))
                answer: dict[str, Any] = {"ok": True, "versions": versions(), "threads": torch.get_num_threads(),
                                          "is_encoder_decoder": bool(model.is_encoder_decoder)}
            else:
                if model is None:
                    raise ValueError("load a model first")
                answer = attribute(model, request["prompt"], request["method"], request.get("max_new_tokens"), request.get("target"),
                                   int(request.get("n_steps", 50)), bool(request.get("include_eos_baseline", False)),
                                   bool(request.get("raw", True)), bool(request.get("attribute_target", False)))
                answer["ok"] = True
        except Exception as exc:  # the caller gets the failure as an answer and decides
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), file=answers, flush=True)


def run_file(request_path: Path, out_path: Path) -> None:
    """One request file: every prompt × method, ``repeats`` times (the last call's attributions kept)."""
    request = json.loads(request_path.read_text())
    model = load(request["model"], int(request.get("threads", 1)))
    targets = request.get("targets") or [None] * len(request["prompts"])
    prompts = []
    for prompt, target in zip(request["prompts"], targets):
        record: dict[str, Any] = {"prompt": prompt, "target": target, "methods": {}}
        for method in request["methods"]:
            calls = [attribute(model, prompt, method, request.get("max_new_tokens"), target, int(request.get("n_steps", 50)),
                               bool(request.get("include_eos_baseline", False)), raw=False)
                     for _ in range(max(int(request.get("repeats", 1)) - 1, 0))]
            calls.append(attribute(model, prompt, method, request.get("max_new_tokens"), target, int(request.get("n_steps", 50)),
                                   bool(request.get("include_eos_baseline", False)), raw=True))
            last = calls[-1]
            record["methods"][method] = {**last, "seconds": [c["seconds"] for c in calls]}
        prompts.append(record)
    out_path.write_text(json.dumps({"versions": versions(), "threads": torch.get_num_threads(), "prompts": prompts}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", nargs="?", type=Path)
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--serve", action="store_true", help="answer JSON lines on stdin (a persistent worker)")
    args = parser.parse_args()
    if args.serve:
        serve()
    elif args.request and args.out:
        run_file(args.request, args.out)
    else:
        parser.error("give REQUEST.json OUT.json, or --serve")


if __name__ == "__main__":
    main()
