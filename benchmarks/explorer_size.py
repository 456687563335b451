"""How large the report's explorer gets for a model: measured attention bytes of ``--explore``
instances, plus explanation bytes measured on ``--explained`` of them and scaled.

    nice -n 5 .venv/bin/python -m benchmarks.explorer_size --hf smollm2 --task sst2 --data-dir ../shared/data

writes ``benchmarks/results/explorer_size_<model>.json``: the explorer's embedded bytes with
attention for all ``--explore`` instances (8-bit per layer, zlib, base64) and explanations for the
first ``--explained`` (every default method that applies), and the estimate for all of them
explained (explanation bytes per instance × instances). Explaining 50 texts with every method on
an LLM takes long on a CPU; attention alone needs one forward pass per text.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from attnaudit.hf import load_hf
from attnaudit.html_page import script_json
from attnaudit.report.explorer import EXPLORE, explorer_payload, model_data
from benchmarks.common import write_result


def size(data: dict[str, Any]) -> int:
    return len(script_json(explorer_payload(data, {})).encode("utf-8"))


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", default="smollm2")
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--explore", type=int, default=EXPLORE)
    parser.add_argument("--explained", type=int, default=2)
    args = parser.parse_args()
    run = load_hf(args.hf, task=args.task, data_dir=args.data_dir, device="cpu")
    examples = run.examples("test", args.explore, data_dir=args.data_dir)
    start = time.perf_counter()
    attention_only = model_data(run, examples, args.explore, explain=0)
    seconds_attention = time.perf_counter() - start
    start = time.perf_counter()
    explained = model_data(run, examples[: args.explained], args.explained)
    seconds_explained = time.perf_counter() - start
    head = {**attention_only, "instances": attention_only["instances"][: args.explained]}
    per_instance = (size(explained) - size(head)) / max(args.explained, 1)
    shown = len(attention_only["instances"])
    layers = attention_only["instances"][0]["layers"] if shown else []
    payload = {
        "model": args.hf, "task": args.task, "instances": shown, "explained": args.explained,
        "layers": len(layers), "heads": layers[0]["heads"] if layers else 0,
        "mean_tokens": sum(len(i["tokens"]) for i in attention_only["instances"]) / max(shown, 1),
        "attention_only_bytes": size(attention_only),
        "explanation_bytes_per_instance": round(per_instance),
        "estimated_bytes_all_explained": round(size(attention_only) + per_instance * shown),
        "methods": [m["name"] for m in explained["methods"]],
        "seconds_attention": round(seconds_attention, 1), "seconds_explained": round(seconds_explained, 1),
        "notes": attention_only["notes"],
    }
    write_result(f"explorer_size_{args.hf}", payload)
    return payload


if __name__ == "__main__":
    print(main())
