"""Issue #44 item 3: ROAR's retrains of the SST BiLSTM trained together as one stacked model
(:mod:`attnaudit.training.together`) against one at a time (:func:`~attnaudit.training.adversary.train_variant`).

A base run with Madsen et al.'s SST preset (``madsen2022-sst``: 128 units per direction, 300-d embeddings, batch 32,
AMSGrad, best dev ROC-AUC) is trained first (or loaded from ``--base``). The K jobs stand for the retrains of one
Recursive-ROAR step over several seeds and methods: job ``k`` trains with seed ``k mod 5`` on SST with a random
``10·(1 + k mod 9)`` % of each sentence's words masked (drawn with seed ``k``), every split. Each way trains the K
jobs into fresh folders, ``--epochs`` epochs each (1 by default: every epoch costs the same), timed by
:func:`benchmarks.common.time_interleaved` (median, min and max of ``--repeats`` interleaved rounds). The last round's
sub-runs of both ways are compared: the largest weight difference and the test scores of each job.

Run: ``python benchmarks/bench_together.py --data-dir ../shared/data --device cuda --models 20 --repeats 5
--name together_cuda`` (writes ``benchmarks/results/NAME.json``). On a CPU stacking does not pay (see
``benchmarks/bench_batched_lstm.py``); ``--limit`` cuts every split for a smoke run.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ratio_span, time_interleaved, write_result  # noqa: E402


def jobs_of(base: Any, count: int, folder: Path) -> list[Any]:
    """The K jobs (seed, masked data) written into ``folder``."""
    from attnaudit.experiments.roar import item_groups, mask_token, masked_count, masked_data
    from attnaudit.training.adversary import Variant
    from attnaudit.training.together import Job

    data, token, jobs = base.data(), mask_token(base), []
    for k in range(count):
        rng, ratio = random.Random(k), 10 * (1 + k % 9)
        masks = {split: [rng.sample(range(n), masked_count(ratio, n)) for n in (len(item_groups(ex, False)) for ex in data.split(split))]
                 for split in ("train", "dev", "test")}
        jobs.append(Job(folder / f"job{k}", Variant({"kind": "bench-together", "job": k, "ratio": ratio}), k % 5,
                        masked_data(data, masks, token, False), f"job{k}"))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--base", type=Path, default=None, help="the base run folder (trained there when absent)")
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--limit", type=int, default=None, help="every split cut to N sentences (smoke runs)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--name", default="together")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 on both ways

    from attnaudit.data.subsets import limited
    from attnaudit.data.tasks import load_task
    from attnaudit.progress import set_quiet
    from attnaudit.training.adversary import train_variant
    from attnaudit.training.together import train_together
    from attnaudit.training.trainer import train
    from attnaudit.weights import load_tensors

    set_quiet(True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-together-"))
    data = load_task("sst", data_dir=args.data_dir)
    if args.limit:
        data = replace(data, **{s: limited(data.split(s), args.limit, 0) for s in ("train", "dev", "test")})
    base = train(data, "bilstm", args.base or scratch / "base", preset="madsen2022-sst", epochs=1, device=args.device, quiet_eval=True)
    base = replace(base, _data=data)  # a reloaded run would read the whole task from its spec
    rounds = [0, 0]

    def one_at_a_time() -> list[Path]:
        rounds[0] += 1
        folder = scratch / f"alone-{rounds[0]}"
        shutil.rmtree(scratch / f"alone-{rounds[0] - 1}", ignore_errors=True)
        return [train_variant(base, folder / job.out.name, job.variant, epochs=args.epochs, seed=job.seed, data=job.data).run.path
                for job in jobs_of(base, args.models, folder)]

    def together() -> list[Path]:
        rounds[1] += 1
        folder = scratch / f"together-{rounds[1]}"
        shutil.rmtree(scratch / f"together-{rounds[1] - 1}", ignore_errors=True)
        return [sub.run.path for sub in train_together(base, jobs_of(base, args.models, folder), epochs=args.epochs)]

    timing, outputs = time_interleaved({"separate": one_at_a_time, "together": together}, args.repeats,
                                       ratios={"speedup": ("separate", "together")}, warmup=[])
    difference, scores = 0.0, []
    for mine, theirs in zip(outputs["together"], outputs["separate"], strict=True):
        a, b = load_tensors(Path(mine) / "model.safetensors"), load_tensors(Path(theirs) / "model.safetensors")
        difference = max(difference, *(float((a[n] - b[n]).abs().max()) for n in a))
        scores.append({"together": _test(Path(mine)), "separate": _test(Path(theirs))})
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    write_result(args.name, {
        "device": device, "models": args.models, "epochs": args.epochs, "limit": args.limit, "preset": "madsen2022-sst",
        "timing": timing, "speedup": timing["speedup"]["median"], "max_weight_difference": difference, "test_scores": scores,
        "reading": "seconds to train the K jobs (each its own seed and masked data) one at a time and together; speedup "
                   "= separate / together per round; the last round's sub-runs compared job by job",
    })
    print(f"{args.models} retrains on {device}: together {ratio_span(timing['speedup'])} faster; "
          f"largest weight difference {difference:.2g}")
    shutil.rmtree(scratch, ignore_errors=True)


def _test(folder: Path) -> dict[str, float]:
    from attnaudit.io import read_json

    return {k: float(v) for k, v in read_json(folder / "metrics.json")["test"].items()}


if __name__ == "__main__":
    main()
