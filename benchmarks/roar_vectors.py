"""How much of input × gradient is the embedding rather than the gradient, for SST base runs of the ROAR reproduction
(``benchmarks/reproduce_roar.py``) that start from different embeddings (random, or ``--vectors minilm``).

Of Madsen et al. (2022)'s four measures, the two we reproduce worst on SST (input × gradient, IG) are the two that
weigh the embedding itself (``|Σ_d ∂z/∂e · e|``); the gradient (``‖∂z/∂e‖₂``), which never sees ``e``, reproduces. Their
embeddings start from fastText vectors, ours from a random table, whose rows all have nearly the same norm. This
measures, per base run, on the test split: the spread of the embedding norms of the words read (coefficient of
variation over word occurrences), and how far input × gradient ranks a sentence's words as the gradient's norm does
(the share of sentences where the first Recursive-ROAR step masks the same words at 10 … 90 %, as
``benchmarks/roar_gradient_norm.py`` counts them, and the mean Spearman correlation per sentence), and as the
embedding's norm does. All three come from the gold label's logit with the attention live, as theirs.

Run: ``python benchmarks/roar_vectors.py --data-dir ../shared/data --base random=../runs-ig4/roar-sst
--base minilm=../runs-vec/roar-sst-vectors-minilm``; writes ``benchmarks/results/roar_vectors.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.experiments.roar import masked_count, top_items  # noqa: E402
from attnaudit.run import Run, load_run  # noqa: E402
from benchmarks.common import write_result  # noqa: E402
from benchmarks.roar_gradient_norm import gold_gradients  # noqa: E402

RATIOS = list(range(10, 100, 10))


def scores(run: Run, examples: list[Any]) -> list[dict[str, np.ndarray]]:
    """Per example and word: input × gradient ``|g·e|``, the gradient's norm ``‖g‖₂`` and the embedding's ``‖e‖₂``, ``g``
    the gradient of the gold label's logit with respect to the word's embedding ``e`` (the attention live)."""
    return [{"product": (grad * embedding).sum(-1).abs().numpy(), "gradient": grad.norm(dim=-1).numpy(),
             "embedding": embedding.norm(dim=-1).numpy()} for grad, embedding in gold_gradients(run, examples)]


def alike(rows: list[dict[str, np.ndarray]], other: str) -> dict[str, Any]:
    """How far input × gradient ranks each sentence's words as ``other`` does: the share of sentences whose masked words
    are the same at each ratio, and the mean Spearman correlation over sentences of two words or more."""
    same = {r: float(np.mean([top_items(s["product"], masked_count(r, len(s["product"])))
                              == top_items(s[other], masked_count(r, len(s[other]))) for s in rows])) for r in RATIOS}
    rho = [float(spearmanr(s["product"], s[other]).statistic) for s in rows
           if len(s["product"]) > 1 and np.ptp(s["product"]) > 0 and np.ptp(s[other]) > 0]
    return {"same_masked_words": same, "spearman_mean": float(np.mean(rho)), "sentences": len(rho)}


def one_base(folder: Path, data_dir: Path | None, split: str) -> dict[str, Any]:
    run = load_run(folder, data_dir=data_dir)
    rows = scores(run, run.data().split(split))
    sizes = np.concatenate([s["embedding"] for s in rows])
    return {"vectors": run.info["train"].get("vectors"), "dimensions": int(run.model.embedding.weight.shape[1]),
            "sentences": len(rows), "embedding_norm": {"mean": float(sizes.mean()), "cv": float(sizes.std() / sizes.mean())},
            "product_vs_gradient": alike(rows, "gradient"), "product_vs_embedding": alike(rows, "embedding")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--base", action="append", required=True, help="NAME=FOLDER of a base run (repeat)")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    args = parser.parse_args()
    bases = dict(item.split("=", 1) for item in args.base)
    result: dict[str, Any] = {"split": args.split, "bases": {}}
    for name, folder in bases.items():
        part = one_base(Path(folder), args.data_dir, args.split)
        result["bases"][name] = part
        same = part["product_vs_gradient"]["same_masked_words"]
        print(f"{name}: embedding norm mean {part['embedding_norm']['mean']:.2f}, cv {part['embedding_norm']['cv']:.3f}; "
              f"x*grad vs grad: same words at 10/50/90 % {same[10]:.2f}/{same[50]:.2f}/{same[90]:.2f}, "
              f"Spearman {part['product_vs_gradient']['spearman_mean']:.3f}; "
              f"vs ||e||: Spearman {part['product_vs_embedding']['spearman_mean']:.3f}", flush=True)
    write_result("roar_vectors", result)


if __name__ == "__main__":
    main()
