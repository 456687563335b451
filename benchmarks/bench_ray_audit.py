"""One SmolLM2 audit in one process against the same audit on a local Ray cluster of ``--workers`` workers.

The audit: SmolLM2-135M-Instruct zero-shot on ``--limit`` GLUE SST-2 dev sentences (a seeded sample stratified
by label), the tests ``--only`` (default: permutation and erasure, which Ray splits into checkpointed shards;
a test that runs whole gains nothing from more workers, and SST-2 has no rationales for the third shardable
test). Each round audits into a fresh folder, so nothing is reused; rounds alternate which side runs first.
Every round's ``summary.csv`` of the two sides is compared.
Ray's start (a local cluster, then the workers loading the model) is inside the timed Ray side: it is part
of what a user waits for; it is also timed alone, once (``ray_start_s``), so the JSON says what the shards took.

Writes ``benchmarks/results/ray_audit.json``.
Run: ``OMP_WAIT_POLICY=PASSIVE python -m benchmarks.bench_ray_audit --data-dir ../shared/data --repeats 5``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.audit import audit  # noqa: E402
from attnaudit.progress import set_quiet  # noqa: E402
from benchmarks.common import RUNS, headline, time_interleaved, write_result  # noqa: E402


def ray_start(workers: int, data_dir: str) -> float:
    """Seconds from nothing to a local Ray cluster with ``workers`` actors that have each loaded SmolLM2 on SST-2."""
    import ray

    from attnaudit.shards import Source, Worker

    with tempfile.TemporaryDirectory() as subruns:
        start = time.perf_counter()
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        try:
            source = Source(subruns=subruns, hf="smollm2", task="sst2", data_dir=data_dir)
            actors = [ray.remote(num_cpus=1)(Worker).remote(source) for _ in range(workers)]
            ray.get([actor.__ray_ready__.remote() for actor in actors])
            return time.perf_counter() - start
        finally:
            ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--only", default="permutation,erasure")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    set_quiet(True)
    only = [t.strip() for t in args.only.split(",") if t.strip()]
    folders = {"ours": RUNS / "ray-audit-ray", "peer": RUNS / "ray-audit-one"}
    common = {"hf": "smollm2", "task": "sst2", "limit": args.limit, "only": only, "data_dir": args.data_dir,
              "figures": False, "explore": 0}

    def run(side: str) -> str:
        shutil.rmtree(folders[side], ignore_errors=True)
        engine = {"engine": "ray", "workers": args.workers} if side == "ours" else {}
        audit(folders[side], **common, **engine)
        return (folders[side] / "summary.csv").read_text()

    timing, outputs = time_interleaved({"ours": lambda: run("ours"), "peer": lambda: run("peer")}, args.repeats, warmup=[])
    write_result("ray_audit", {
        "command": "python -m benchmarks.bench_ray_audit " + " ".join(sys.argv[1:]),
        "what": f"SmolLM2 zero-shot audit of {args.limit} SST-2 dev sentences, tests {', '.join(only)}; "
                f"ours: a local Ray cluster of {args.workers} workers (--engine ray), peer: one process",
        "timing": timing,
        **headline(timing),
        "sentences": args.limit, "workers": args.workers, "tests": only,
        "summary_equal": outputs["ours"] == outputs["peer"],
        "agree": outputs["ours"] == outputs["peer"],
        "ray_start_s": ray_start(args.workers, args.data_dir),
    })
    print(headline(timing), "summary equal:", outputs["ours"] == outputs["peer"])


if __name__ == "__main__":
    main()
