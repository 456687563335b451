"""How far our stand-in for Madsen et al. (2022)'s gradient ranks words like theirs, on the SST base run of the ROAR
reproduction (``benchmarks/reproduce_roar.py``).

Their gradient is the norm of the gold logit's gradient with respect to the one-hot input, ``‖∂z/∂e · Eᵀ‖₂`` (``E``
the embedding matrix, one row per word of the vocabulary); ours (``input_gradient``, ``reduction=l2``) is its norm
over the embedding, ``‖∂z/∂e‖₂``. The two rank a sentence's words alike when ``EᵀE`` is a multiple of the identity,
which a random embedding nearly is. This measures it where it matters: for each test sentence and masking ratio
(10 … 90 %), whether the words the first Recursive-ROAR step masks (the top ``floor(k/100 · n)``, ties to the earlier
word) are the same under both, and the Spearman correlation of the two scores per sentence. Both come from one
gradient, so any difference is the ``Eᵀ`` alone.

Run: ``python benchmarks/roar_gradient_norm.py --data-dir ../shared/data [--runs ../runs-roar]`` after the
reproduction has trained its base run (``roar-sst``); writes ``benchmarks/results/roar_gradient_norm.json``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.experiments.roar import masked_count, top_items  # noqa: E402
from attnaudit.models.interface import evaluation  # noqa: E402
from attnaudit.run import Run, load_run  # noqa: E402
from benchmarks.common import RUNS, write_result  # noqa: E402

RATIOS = list(range(10, 100, 10))


def gold_gradients(run: Run, examples: list[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per example, ``(g, e)``: each word's embedding ``e`` and the gradient ``g`` of the gold label's logit with respect
    to it (the attention live), ``(n, d)`` each, detached."""
    with evaluation(run.model), torch.enable_grad():
        for batch in run.batches(examples, 64):
            embeddings = run.model.embed(batch).detach().requires_grad_(True)
            logits = run.model.logits_forward(batch, embeddings=embeddings).logits
            (grad,) = torch.autograd.grad(logits.gather(1, batch.labels[:, None]).sum(), embeddings)
            for row, n in enumerate(batch.mask.sum(1).tolist()):
                yield grad[row, :n].detach(), embeddings[row, :n].detach()


def both_norms(run: Run, examples: list[Any], matrix: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per example, ``(‖g‖₂, ‖g·Eᵀ‖₂)`` per word, ``g`` the gradient of the gold label's logit with respect to the
    word's embedding (the attention live), ``matrix`` the embedding matrix ``E``."""
    return [(grad.norm(dim=-1).numpy(), (grad @ matrix.T).norm(dim=-1).numpy()) for grad, _ in gold_gradients(run, examples)]


def agreement(pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """The share of examples whose masked words agree at each ratio, and the Spearman correlation per example
    (examples of two words or more) as mean, median and minimum."""
    same = {r: float(np.mean([top_items(a, masked_count(r, len(a))) == top_items(b, masked_count(r, len(b))) for a, b in pairs]))
            for r in RATIOS}
    rho = [float(spearmanr(a, b).statistic) for a, b in pairs if len(a) > 1 and np.ptp(a) > 0 and np.ptp(b) > 0]
    return {"same_masked_words": same, "spearman": {"mean": float(np.mean(rho)), "median": float(np.median(rho)),
                                                    "min": float(np.min(rho)), "n": len(rho)}, "n": len(pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    args = parser.parse_args()
    run = load_run(args.runs / "roar-sst", data_dir=args.data_dir)
    matrix = run.model.embedding.weight.detach()  # the BiLSTM's vocabulary embeddings: the E of their definition
    result = agreement(both_norms(run, run.data().split(args.split), matrix))
    eig = torch.linalg.eigvalsh(matrix.T @ matrix)
    result.update({"split": args.split, "vocabulary": int(matrix.shape[0]), "dimensions": int(matrix.shape[1]),
                   "gram_condition": float(eig.max() / eig.min())})
    print(f"same masked words at 10..90 %: {', '.join(f'{v:.3f}' for v in result['same_masked_words'].values())}; "
          f"Spearman mean {result['spearman']['mean']:.3f} (min {result['spearman']['min']:.3f}); cond(EᵀE) {result['gram_condition']:.1f}")
    write_result("roar_gradient_norm", result)


if __name__ == "__main__":
    main()
