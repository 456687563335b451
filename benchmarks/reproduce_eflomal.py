"""The eflomal word-aligner baseline of the alignment reproduction, without the NMT model
(slow-ish: ~80 s per eflomal run on one core; not part of `make test`).

Usage:
    nice -n 5 .venv/bin/python benchmarks/reproduce_eflomal.py --data-dir ../shared/data

``benchmarks/reproduce_alignment.py`` reports eflomal in the same run as the attention AER; this
script gives the same baseline when that run's model is not at hand (training it takes over an
hour on 2 cores). It rebuilds the run's training pairs exactly as ``train_nmt`` does — the
``europarl-deen`` train split (RWTH gold sentences removed, 1,000 seeded dev pairs held out),
6k-entry BPE per side learnt on it, pairs of 60 or more subwords on either side dropped: 16,442
pairs — or takes them from the run when ``benchmarks/runs/nmt-deen-europarl-dev`` exists.
eflomal is trained on those pairs plus the 508 RWTH gold sentences and scored with the
alignment test's AER; the result goes to ``benchmarks/results/alignment_eflomal.json``.
Needs ``pip install 'attnaudit[align]'``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.algorithms.metrics import aer  # noqa: E402
from attnaudit.data.tasks import load_task  # noqa: E402
from attnaudit.data.word_alignments import SubwordTokenizer, read_rwth  # noqa: E402
from attnaudit.experiments.aligner_baseline import eflomal_baseline, training_pairs  # noqa: E402
from attnaudit.experiments.alignment import diagonal_links  # noqa: E402
from attnaudit.run import load_run  # noqa: E402
from benchmarks.common import ROOT, RUNS, write_result  # noqa: E402
from benchmarks.reproduce_alignment import SIZE  # noqa: E402


def run_pairs(data_dir: Path, run_dir: Path, seed: int) -> tuple[list, str]:
    """The NMT run's training pairs (from the run when it exists, else rebuilt) and how they were got."""
    if (run_dir / "metrics.json").exists():
        return training_pairs(load_run(run_dir, device="cpu", data_dir=data_dir)), f"taken from the run {run_dir}"
    data = load_task("europarl-deen", data_dir=data_dir, seed=seed)
    source = SubwordTokenizer.train((ex.tokens for ex in data.train), SIZE["source_vocab"])
    target = SubwordTokenizer.train((ex.target or [] for ex in data.train), SIZE["target_vocab"])
    stand_in = SimpleNamespace(
        data=lambda: data, collate=SimpleNamespace(source=source, target=target),
        info={"train": {"max_train_len": SIZE["max_train_len"]}},
    )
    shown = run_dir.resolve().relative_to(ROOT) if run_dir.resolve().is_relative_to(ROOT) else run_dir
    how = (f"rebuilt as train_nmt does (no run at {shown}): europarl-deen train split, seed {seed}, "
           f"BPE {SIZE['source_vocab']}/{SIZE['target_vocab']}, fewer than {SIZE['max_train_len']} subwords a side")
    return training_pairs(stand_in), how  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--run", type=Path, default=RUNS / "nmt-deen-europarl-dev")
    parser.add_argument("--runs", type=int, default=5, help="eflomal runs (it has no seed)")
    parser.add_argument("--seed", type=int, default=0, help="the dev split's seed (as the NMT run's)")
    args = parser.parse_args()
    start = time.perf_counter()
    train, how = run_pairs(args.data_dir, args.run, args.seed)
    gold = read_rwth(args.data_dir / "deen-alignment" / "DeEn")
    sure = {(n, s, t) for n, ex in enumerate(gold) for s, t in ex.meta["sure"]}
    possible = {(n, s, t) for n, ex in enumerate(gold) for s, t in ex.meta["possible"]}
    summary, rows = eflomal_baseline(train, gold, args.runs, sure, possible)
    diagonal = {(n, *link) for n, ex in enumerate(gold) for link in diagonal_links(len(ex.tokens), len(ex.target or []))}
    write_result(
        "alignment_eflomal",
        {
            "summary": summary,
            "runs": rows,
            "diagonal_baseline_aer": 100 * aer(diagonal, sure, possible),
            "train_pairs": len(train),
            "gold_pairs": len(gold),
            "notes": [
                f"training pairs {how}",
                (f"eflomal 2.0.0, default settings (HMM + fertility, 3 samplers), trained on the {len(train)} pairs "
                 f"plus the {len(gold)} RWTH gold sentences without their links (standard for unsupervised aligners); "
                 "words lower-cased by eflomal"),
                "AER in percent, corpus level, sure/possible (the alignment test's attnaudit.algorithms.metrics.aer)",
                ("fwd: each English word to at most one German word; rev: each German word to at most one English "
                 "word; grow-diag-final: Koehn et al. 2003"),
                f"eflomal seeds itself from /dev/urandom: mean, min and max over {args.runs} runs",
            ],
            "wall_seconds": time.perf_counter() - start,
        },
    )
    for key, value in summary.items():
        print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
