"""Erase-until-flip: batched (one decode per removal step for a whole batch) vs one instance at a time.

Both run in this process on the same trained model, the same test instances and the same
removal orders (the rankings are computed once, batched, and shared): the test's own search,
:func:`attnaudit.experiments.erasure.stacked_flip_steps` (every order of a padded batch stacked,
one decode per removal step for all of them), against the plain loop that encodes each instance
on its own and reruns decode once per removal step per instance and order.  Only the removal
loops are timed, with one batched forward pass over the same inputs, in ``--repeats``
interleaved rounds (:func:`benchmarks.common.time_interleaved`); cost is also given in
forward-pass equivalents (median loop time / median forward time).

Run: ``.venv/bin/python -m benchmarks.bench_erasure [--model bilstm] [--n 200] [--repeats 5]``
Writes ``benchmarks/results/erasure.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.data.synthetic import synthetic_task  # noqa: E402
from attnaudit.experiments.erasure import (  # noqa: E402
    DEFAULT_RANKINGS,
    Explained,
    flip_steps,
    importance_functions,
    prepare,
    ranking_orders,
    stacked_flip_steps,
)
from attnaudit.progress import set_quiet  # noqa: E402
from attnaudit.run import Run  # noqa: E402
from attnaudit.training.trainer import evaluate_examples, train  # noqa: E402
from benchmarks.common import (  # noqa: E402
    REPEATS,
    RUNS,
    headline,
    ratio_span,
    time_interleaved,
    write_result,
)

MODEL_OPTIONS: dict[str, dict[str, Any]] = {
    "bilstm": {"embed_dim": 64, "hidden_dim": 64},
    "han": {"embed_dim": 64, "hidden_dim": 64},
    "transformer": {"embed_dim": 64, "d_model": 64, "heads": 4, "layers": 2, "d_ff": 128},
}


def _task(model: str, n: int) -> Any:
    """Synthetic classification; HAN reads it as 5-token sentences."""
    task = synthetic_task("classification", seed=0, n_train=2000, n_dev=200, n_test=n)
    if model == "han":
        for example in task.train + task.dev + task.test:
            example.sentences = [example.tokens[i : i + 5] for i in range(0, len(example.tokens), 5)]
    return task


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bilstm", choices=sorted(MODEL_OPTIONS))
    parser.add_argument("--n", type=int, default=200, help="test instances")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--random-orders", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    set_quiet(True)
    wall = time.perf_counter()

    task = _task(args.model, args.n)
    start = time.perf_counter()
    run: Run = train(task, args.model, RUNS / f"erasure-{args.model}", epochs=5,
                     quiet_eval=True, **MODEL_OPTIONS[args.model])
    train_s = time.perf_counter() - start
    run.model.eval()
    examples = task.test  # a reloaded run has no data attached; the task is rebuilt above
    accuracy = evaluate_examples(run, examples)["accuracy"]
    functions = importance_functions(DEFAULT_RANKINGS)

    # Shared inputs: per batch the prepared cache and every removal order (computed once).
    start = time.perf_counter()
    batches: list[tuple[Explained, list[tuple[str, int, torch.Tensor]]]] = []
    offset = 0
    for batch in run.batches(examples, args.batch_size):
        indices = list(range(offset, offset + len(batch)))
        offset += len(batch)
        explained = prepare(run, batch)
        scores = {name: fn(run, batch) for name, fn in functions.items()}
        orders = [
            (ranking, r, order)
            for ranking in DEFAULT_RANKINGS
            for r, order in enumerate(ranking_orders(ranking, scores, explained, indices, 0, args.random_orders))
        ]
        batches.append((explained, orders))
    rankings_s = time.perf_counter() - start
    # One instance at a time: each encoded alone; its orders are the batched ones cut to its
    # own items (items are a prefix of the padded axis, so positions agree).
    singles = []
    for example in examples:
        explained = prepare(run, run.collate([example]).to(run.device))
        singles.append(explained)

    Outcome = tuple[list[tuple[str, int, int, bool]], int]

    def batched() -> Outcome:
        """(ranking, order, removed, flipped) per erasure run, and the decode calls made: every order of a
        batch in one stacked search, as the test runs them (:func:`stacked_flip_steps`)."""
        out, calls = [], 0
        for explained, orders in batches:
            results = stacked_flip_steps(run.model, explained, [order for *_, order in orders])
            calls += results[0].decode_calls
            for (ranking, r, _), steps in zip(orders, results):
                out += [(ranking, r, int(k), bool(f)) for k, f in zip(steps.removed.tolist(), steps.flipped.tolist())]
        return out, calls

    def one_at_a_time() -> Outcome:
        out, calls = [], 0
        index = 0
        for explained, orders in batches:
            size = len(explained.lengths)
            for ranking, r, order in orders:
                for b in range(size):
                    single = singles[index + b]
                    width = single.mask.shape[1]
                    steps = flip_steps(run.model, single, order[b : b + 1, :width])
                    calls += steps.decode_calls
                    out.append((ranking, r, int(steps.removed[0]), bool(steps.flipped[0])))
            index += size
        return out, calls

    with torch.no_grad():
        timing, out = time_interleaved(
            {"ours": batched, "peer": one_at_a_time, "forward": lambda: [run.model(b) for b in run.batches(examples, args.batch_size)]},
            args.repeats,
            warmup=("ours", "forward"),
        )
    (ours, ours_calls), (peer, peer_calls) = out["ours"], out["peer"]
    top = headline(timing)
    forward_s = timing["seconds"]["forward"]["median"]

    # Same multiset of (ranking, order, removed, flipped): the orders of rows differ between loops.
    agree = sorted(ours) == sorted(peer)
    flipped = sum(f for *_, f in ours)
    result = {
        "what": "erase-until-flip removal loops (S&S §5): batched vs one instance at a time",
        "model": args.model,
        "model_options": MODEL_OPTIONS[args.model],
        "n": len(examples),
        "test_accuracy": accuracy,
        "batch_size": args.batch_size,
        "rankings": DEFAULT_RANKINGS,
        "random_orders": args.random_orders,
        **top,
        "agree": agree,
        "timing": timing,
        "ours": "stacked_flip_steps: per batch, every order stacked, one decode per removal step for all of them",
        "peer": "per-instance loop: each instance encoded alone, one decode per removal step per instance and order",
        "decode_calls_ours": ours_calls,
        "decode_calls_peer": peer_calls,
        "forward_pass_s": forward_s,
        "forward_pass_equivalents_ours": top["ours_s"] / forward_s,
        "forward_pass_equivalents_peer": top["peer_s"] / forward_s,
        "erasure_runs": len(ours),
        "flipped_runs": flipped,
        "rankings_s": rankings_s,
        "train_or_load_s": train_s,
        "wall_s": time.perf_counter() - wall,
    }
    write_result("erasure", result)
    return result


if __name__ == "__main__":
    out = main()
    print(
        f"erase until flip ({out['model']}, n={out['n']}): batched {out['ours_s']:.2f}s "
        f"({out['decode_calls_ours']} decodes, {out['forward_pass_equivalents_ours']:.0f} forward passes), "
        f"one at a time {out['peer_s']:.2f}s ({out['decode_calls_peer']} decodes, "
        f"{out['forward_pass_equivalents_peer']:.0f} forward passes); ratio {ratio_span(out['timing']['ratio'])}, "
        f"agree={out['agree']}"
    )
