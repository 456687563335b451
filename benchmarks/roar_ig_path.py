"""How far our Integrated Gradients ranks words like Madsen et al. (2022)'s, on the SST base run of the ROAR
reproduction (``benchmarks/reproduce_roar.py``).

Their IG (``nlproar/explain/importance_measures/integrated_gradient.py``) runs the model on the embedding scaled by
``s = i/n`` (``i = 1 … n``, a right Riemann sum, ``n = 50`` in their jobs) but takes the gradient of the gold logit
``z`` with respect to the *unscaled* embedding ``e``, which is ``s · ∇z(s e)``; it scores a word
``|1/n Σ_i s_i ∇z(s_i e) · e|``. Integrated Gradients proper (ours: ``ig``, ``score=logit``, zero baseline, Captum's
50 Gauss–Legendre nodes) is ``|∫₀¹ ∇z(s e) ds · e|``, without the weight ``s``: theirs leans towards the input end of
the path (at ``s = 1``, input × gradient). This measures what each difference does to the words the first
Recursive-ROAR step masks: for each test sentence and masking ratio (10 … 90 %), whether the top
``floor(k/100 · n)`` words agree, and the Spearman correlation per sentence, between the integral and theirs (written
out here as their code computes it), the integral and the unweighted right Riemann sum (the quadrature alone), our
``ig`` with the reproduction's options (``rule=riemann_right, weight=scale``) and theirs (a check: all agree), and
each IG and input × gradient (``gradient`` with ``attention=live, score=logit``, their input × gradient).

Run: ``python benchmarks/roar_ig_path.py --data-dir ../shared/data [--runs ../runs-roar]`` after the reproduction has
trained its base run (``roar-sst``); writes ``benchmarks/results/roar_ig_path.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.experiments.roar import item_scores  # noqa: E402
from attnaudit.explain.registry import EXPLANATIONS  # noqa: E402
from attnaudit.models.interface import evaluation  # noqa: E402
from attnaudit.run import Run, load_run  # noqa: E402
from benchmarks.common import RUNS, write_result  # noqa: E402
from benchmarks.reproduce_roar import MEASURES  # noqa: E402
from benchmarks.roar_gradient_norm import agreement  # noqa: E402


def riemann_paths(run: Run, examples: list[Any], steps: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per example, their scaled-gradient score and the unweighted right Riemann sum, both ``|Σ_d|`` per word:
    ``|1/n Σ_i s_i ∇z(s_i e)·e|`` and ``|1/n Σ_i ∇z(s_i e)·e|``, ``z`` the gold label's logit (attention live)."""
    theirs, plain = [], []
    with evaluation(run.model), torch.enable_grad():
        for batch in run.batches(examples, 64):
            e = run.model.embed(batch).detach()
            weighted, unweighted = torch.zeros(e.shape[:2]), torch.zeros(e.shape[:2])
            for i in range(1, steps + 1):
                s = i / steps
                scaled = (s * e).requires_grad_(True)
                logits = run.model.logits_forward(batch, embeddings=scaled).logits
                (grad,) = torch.autograd.grad(logits.gather(1, batch.labels[:, None]).sum(), scaled)
                step = (grad * e).sum(-1).detach()
                weighted += s * step / steps
                unweighted += step / steps
            for row, n in enumerate(batch.mask.sum(1).tolist()):
                theirs.append(weighted[row, :n].abs().numpy())
                plain.append(unweighted[row, :n].abs().numpy())
    return theirs, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    run = load_run(args.runs / "roar-sst", data_dir=args.data_dir)
    examples = run.data().split(args.split)
    ig = EXPLANATIONS["ig"]
    integral = item_scores(run, run.model, examples, ig, 0, {"score": "logit", "steps": args.steps}, gold=True)
    with_their_options = item_scores(run, run.model, examples, ig, 0, {**MEASURES["ig"][1], "steps": args.steps}, gold=True)
    method, settings = MEASURES["input_gradient"]
    x_grad = item_scores(run, run.model, examples, EXPLANATIONS[method], 0, settings, gold=True)
    theirs, plain = riemann_paths(run, examples, args.steps)
    pairs = {"integral_vs_theirs": (integral, theirs), "integral_vs_right_riemann": (integral, plain),
             "their_options_vs_theirs": (with_their_options, theirs), "theirs_vs_input_x_gradient": (theirs, x_grad),
             "integral_vs_input_x_gradient": (integral, x_grad)}
    result: dict[str, Any] = {"split": args.split, "steps": args.steps}
    for name, (a, b) in pairs.items():
        result[name] = agreement(list(zip(a, b)))
        same, rho = result[name]["same_masked_words"], result[name]["spearman"]
        print(f"{name}: same masked words at 10..90 % {', '.join(f'{v:.3f}' for v in same.values())}; "
              f"Spearman mean {rho['mean']:.3f} (min {rho['min']:.3f})")
    write_result("roar_ig_path", result)


if __name__ == "__main__":
    main()
