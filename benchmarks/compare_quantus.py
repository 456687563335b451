"""Quantus against attnaudit's sanity-check measures: the same arrays, the same numbers (≤ 1e-6), and the time of each.

Run in a Python that has Quantus (it imports attnaudit's ``algorithms.randomisation`` from ``src/``, which needs only
numpy, scipy and torch): ``/tmp/venv-quantus/bin/python benchmarks/compare_quantus.py``; from attnaudit's venv,
``python -m benchmarks.compare_quantus --python /tmp/venv-quantus/bin/python`` re-runs it there. The venv:
``python3 -m venv /tmp/venv-quantus && /tmp/venv-quantus/bin/pip install quantus`` (Quantus 0.6.0 with torch 2.13 CPU
here). Never part of ``make test``; tests/experiments/test_sanity.py runs a small ``--check`` of it where such a
Python exists.

Arrays: ``--n`` instances of seeded random explanation pairs, lengths 3–60 (text lengths), normal scores (no ties),
plus the same with every third score duplicated (ties) for the rank correlation. Compared per instance:

* Spearman ρ of absolute scores: ours ``spearman_abs(a, b)`` against Quantus'
  ``functions.similarity_func.correlation_spearman(|a|, |b|)`` (MPRT's default similarity);
* top-k intersection: ours ``topk_intersection(a, b, k)`` against Quantus' ``TopKIntersection(k).evaluate_batch`` with
  ``a_batch = |a|`` and ``s_batch`` the mask of the top k of ``|b|`` (its fraction of a's top k inside the mask), on
  the instances of at least k items (Quantus asserts k below the input size) and untied scores (its sort is not stable);
* eMPRT's complexity: ours ``discrete_entropy(a, bins)`` against Quantus' ``functions.complexity_func.discrete_entropy``
  of ``|a|`` with ``n_bins = bins`` (the function ``EfficientMPRT`` applies per instance), and the relative rise
  ``(H_random − H_original) / H_original`` on pairs.

Timing: ``--repeats`` interleaved rounds (order alternating), each computing every measure on every instance once by
each library; median, min and max per library and measure. Writes ``benchmarks/results/quantus.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "quantus.json"
TOLERANCE = 1e-6


def arrays(n: int, seed: int, ties: bool) -> list[tuple[Any, Any, Any]]:
    """``n`` seeded pairs ``(a, b, a_random)`` of one length each (3–60)."""
    import numpy as np

    rng = np.random.default_rng([seed, int(ties)])
    out = []
    for _ in range(n):
        size = int(rng.integers(3, 61))
        a, b, c = rng.normal(size=size), rng.normal(size=size), rng.normal(size=size) * rng.uniform(0.1, 3)
        if ties:
            a[::3], b[1::3] = a[0], b[1]
        out.append((a, b, c))
    return out


def measures(k: int, bins: int) -> tuple[dict[str, Callable[..., float]], dict[str, Callable[..., float]]]:
    """Each measure as ``fn(a, b, c) -> float``, ours and Quantus'."""
    import numpy as np
    import quantus
    from quantus.functions.complexity_func import discrete_entropy as q_entropy
    from quantus.functions.similarity_func import correlation_spearman

    from attnaudit.algorithms.randomisation import discrete_entropy, relative_rise, spearman_abs, topk_intersection

    metric = quantus.TopKIntersection(k=k, abs=False, normalise=False, disable_warnings=True)

    def q_topk(a: Any, b: Any, _c: Any) -> float:
        mask = np.zeros((1, a.size), dtype=bool)
        mask[0, np.argsort(-np.abs(b))[:k]] = True
        return float(metric.evaluate_batch(a_batch=np.abs(a)[None], s_batch=mask)[0])

    def q_rise(a: Any, _b: Any, c: Any) -> float:
        before = q_entropy(a=np.abs(a), x=np.abs(a), n_bins=bins)
        return float((q_entropy(a=np.abs(c), x=np.abs(c), n_bins=bins) - before) / before)

    ours = {
        "spearman": lambda a, b, _c: spearman_abs(a, b),
        "topk": lambda a, b, _c: topk_intersection(a, b, k),
        "entropy": lambda a, _b, _c: discrete_entropy(a, bins),
        "emprt_rise": lambda a, _b, c: relative_rise(discrete_entropy(a, bins), discrete_entropy(c, bins)),
    }
    theirs = {
        "spearman": lambda a, b, _c: float(correlation_spearman(np.abs(a), np.abs(b))),
        "topk": q_topk,
        "entropy": lambda a, _b, _c: float(q_entropy(a=np.abs(a), x=np.abs(a), n_bins=bins)),
        "emprt_rise": q_rise,
    }
    return ours, theirs


def cases(n: int, seed: int, k: int) -> dict[str, list[tuple[Any, Any, Any]]]:
    """The instances each measure is compared on (top-k: untied, at least k items)."""
    plain, tied = arrays(n, seed, False), arrays(n, seed, True)
    return {"spearman": plain + tied, "topk": [t for t in plain if t[0].size >= k], "entropy": plain + tied, "emprt_rise": plain}


def compare(n: int, seed: int, k: int, bins: int, repeats: int) -> dict[str, Any]:
    ours, theirs = measures(k, bins)
    chosen = cases(n, seed, k)
    agreement = {}
    for name, items in chosen.items():
        mine = [ours[name](*t) for t in items]
        other = [theirs[name](*t) for t in items]
        diffs = [abs(x - y) for x, y in zip(mine, other)]
        agreement[name] = {"instances": len(items), "max_abs_difference": max(diffs), "agree": max(diffs) <= TOLERANCE}
    times: dict[str, dict[str, list[float]]] = {name: {"attnaudit": [], "quantus": []} for name in chosen}
    for round_ in range(repeats):
        order = [("attnaudit", ours), ("quantus", theirs)]
        for library, fns in order if round_ % 2 == 0 else order[::-1]:
            for name, items in chosen.items():
                start = time.perf_counter()
                for t in items:
                    fns[name](*t)
                times[name][library].append(time.perf_counter() - start)
    timing = {
        name: {lib: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)} for lib, v in libs.items()}
        | {"quantus_over_attnaudit": statistics.median(libs["quantus"]) / statistics.median(libs["attnaudit"])}
        for name, libs in times.items()
    }
    return {"agreement": agreement, "all_agree": all(a["agree"] for a in agreement.values()), "timing": timing}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="a Python with Quantus: re-run this script there")
    parser.add_argument("--n", type=int, default=200, help="instances per case")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 unless every measure agrees to 1e-6")
    args = parser.parse_args(argv)
    if args.python:
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--python")
        del rest[i : i + 2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        return subprocess.run([args.python, str(Path(__file__).resolve()), *rest], env=env).returncode
    if args.repeats < 5 and not args.check:
        parser.error("--repeats must be at least 5")
    sys.path.insert(0, str(ROOT / "src"))
    try:
        import quantus  # noqa: F401
    except ImportError:
        print("quantus is not installed in this Python; give --python /path/to/venv-with-quantus/bin/python", file=sys.stderr)
        return 0
    result = compare(args.n, args.seed, args.k, args.bins, args.repeats)
    versions = {name: importlib.metadata.version(name) for name in ("quantus", "numpy", "scipy", "torch")}
    result.update(
        settings={"n": args.n, "k": args.k, "bins": args.bins, "repeats": args.repeats, "seed": args.seed, "tolerance": TOLERANCE},
        versions=versions, python=platform.python_version(), machine=platform.machine(), cpus=os.cpu_count(),
        threads={key: os.environ.get(key) for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}, commit=commit(),
        load_average=list(os.getloadavg()),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, row in result["agreement"].items():
        t = result["timing"][name]
        print(f"{name:11s} n={row['instances']:4d} max|Δ|={row['max_abs_difference']:.2e} "
              f"attnaudit {t['attnaudit']['median_s'] * 1e3:.1f} ms, quantus {t['quantus']['median_s'] * 1e3:.1f} ms")
    return 0 if result["all_agree"] or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
