"""The CUDA path, checked against the CPU path on the same machine: same seeds, same numbers.

For each family (BiLSTM, Transformer) it trains the built-in synthetic task on the CPU and on
the GPU with the same seed, runs a set of tests on both and compares their headline numbers;
then it runs a tiny random Llama (grouped-query attention) through the decoder adapter on both
devices and compares logits, captured weights and explanation scores. The GPU is not
bit-identical to the CPU (other kernels, other summation order), so each figure is reported with
its largest difference; the check fails when a figure moves by more than ``--tolerance``
(default 0.05 on the headline numbers, 1e-3 on logits/weights/scores).

Writes ``benchmarks/results/cuda_check.json`` (``--name``) (device name, torch version, every compared number,
wall time per device). Run on a machine with a GPU:
``python benchmarks/check_cuda.py --out /tmp/cuda-check``; without one it exits 2 saying so.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attnaudit.errors import AttnAuditError

HERE = Path(__file__).resolve().parent
TESTS = {
    "bilstm": ("importance", "permutation", "erasure", "adversarial", "uniform"),
    "transformer": ("importance", "permutation", "erasure", "norms", "rollout", "activation-swap", "shuffle"),
}
TRAIN = {"epochs": 3, "batch_size": 32, "seed": 0}


def numbers(summary: Any, prefix: str = "") -> dict[str, float]:
    """Every finite number of a nested summary, flattened to ``a.b.c`` keys."""
    found: dict[str, float] = {}
    if isinstance(summary, dict):
        for key, value in summary.items():
            found.update(numbers(value, f"{prefix}{key}."))
    elif isinstance(summary, bool) or "second" in prefix or "time" in prefix:
        return found
    elif isinstance(summary, (int, float)) and math.isfinite(summary):
        found[prefix.rstrip(".")] = float(summary)
    return found


def family_on(device: str, family: str, out: Path, limit: int) -> dict[str, Any]:
    """Train ``family`` on the synthetic task on ``device`` and run its tests; headline numbers and times."""
    from attnaudit.experiments.runner import run_test
    from attnaudit.training.trainer import train

    start = time.perf_counter()
    run = train("synthetic", family, out / f"{family}-{device.replace(':', '')}", device=device, **TRAIN)
    trained = time.perf_counter() - start
    found: dict[str, Any] = {"train_seconds": trained, "tests": {}}
    for name in TESTS[family]:
        begin = time.perf_counter()
        result = run_test(name, run, limit=limit, seed=0, device=device, plot=False, out=out / f"results-{family}-{device.replace(':', '')}")
        found["tests"][name] = {"seconds": time.perf_counter() - begin, "summary": numbers(result.summary)}
    return found


def compare(cpu: dict[str, Any], gpu: dict[str, Any]) -> dict[str, Any]:
    """Per test: the largest difference between the CPU and GPU headline numbers, relative to their
    size where that exceeds 1 (counts such as ``decode_calls``), absolute otherwise; timings left out."""
    rows = {}
    for name, on_cpu in cpu["tests"].items():
        a, b = on_cpu["summary"], gpu["tests"][name]["summary"]
        shared = sorted(set(a) & set(b))
        diffs = {k: abs(a[k] - b[k]) / max(1.0, abs(a[k]), abs(b[k])) for k in shared}
        worst = max(diffs, key=diffs.get) if diffs else None
        rows[name] = {
            "compared": len(shared),
            "max_diff": diffs[worst] if worst else 0.0,
            "worst": worst,
            "cpu_seconds": on_cpu["seconds"],
            "gpu_seconds": gpu["tests"][name]["seconds"],
        }
    return rows


def decoder_on(device: str) -> dict[str, torch.Tensor]:
    """A tiny random Llama (4 query heads, 2 key/value heads) through our decoder adapter on ``device``:
    logits, captured weights and four explanations of one padded batch."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    from attnaudit.data.types import Example
    from attnaudit.explain import get_explanation
    from attnaudit.hf import HFCollator
    from attnaudit.models.hf import HFModel

    words = ["[PAD]", "[UNK]", "[SEP]", *(f"w{i}" for i in range(61))]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, num_labels=2,
    )
    model = HFModel(LlamaForSequenceClassification(config), tok, "classification", "llama", trained_head=True)
    model.to(device).eval()
    generator = torch.Generator().manual_seed(1)
    texts = [[f"w{int(i)}" for i in torch.randint(0, 61, (n,), generator=generator)] for n in (12, 9, 5, 12)]
    batch = HFCollator(tok, ["neg", "pos"], "classification", 64, token_types=False)(
        [Example(tokens=t, label="pos") for t in texts]
    ).to(device)
    with torch.no_grad():
        out = model(batch)
    found = {"logits": out.logits, "weights": torch.stack([layer.weights for layer in out.trace.layers])}
    for method in ("gradient", "input_gradient", "rollout", "norms"):
        found[method] = get_explanation(method)(model, batch)
    return {k: v.detach().float().cpu() for k, v in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/attnaudit-cuda-check"), help="scratch folder for runs")
    parser.add_argument("--device", default="cuda", help="the GPU to check (cuda or cuda:N)")
    parser.add_argument("--limit", type=int, default=100, help="test instances per test")
    parser.add_argument("--tolerance", type=float, default=0.05, help="largest allowed change of a headline number")
    parser.add_argument("--name", default="cuda_check", help="result name: benchmarks/results/<name>.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device on this machine; run this check where a GPU is present", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE.parent))  # `benchmarks.common` when run as a script
    from benchmarks.common import write_result

    report: dict[str, Any] = {"device": torch.cuda.get_device_name(args.device), "families": {}, "decoder": {}}
    for family in TESTS:
        cpu = family_on("cpu", family, args.out, args.limit)
        gpu = family_on(args.device, family, args.out, args.limit)
        report["families"][family] = {
            "train_seconds": {"cpu": cpu["train_seconds"], "gpu": gpu["train_seconds"]},
            "tests": compare(cpu, gpu),
        }
    cpu_dec, gpu_dec = decoder_on("cpu"), decoder_on(args.device)
    report["decoder"] = {k: float((cpu_dec[k] - gpu_dec[k]).abs().max()) for k in cpu_dec}
    worst = max(row["max_diff"] for fam in report["families"].values() for row in fam["tests"].values())
    report["ok"] = worst <= args.tolerance and max(report["decoder"].values()) <= 1e-3
    write_result(args.name, report)
    print(f"device {report['device']}: largest headline difference {worst:.3g}, decoder {max(report['decoder'].values()):.3g}, ok={report['ok']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AttnAuditError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
