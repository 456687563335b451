"""Our perturbation explainers on SmolLM2 against Captum's ``LLMAttribution`` with ``TextTokenInput``.

SmolLM2-135M-Instruct explains its next token after a ~30-token prompt (``--text``). On the same token ids,
the same baseline token (``--baseline``, every perturbed token replaced by it: Captum's ``TextTokenInput``
baselines), the same explained quantity (the probability of the predicted next token: ``attr_target="prob"``)
and the same seed (``torch.manual_seed`` before each Captum call; ours seeds itself per instance):

* ``occlusion`` (window 1, stride 1) against Captum ``FeatureAblation``;
* ``shapley`` (``--permutations`` orders) against ``ShapleyValueSampling``;
* ``kernel_shap`` (``--samples`` coalitions) against ``KernelShap``;
* ``lime`` (``--samples`` coalitions, least squares) against ``Lime(interpretable_model=SkLearnLinearRegression())``.

Captum's two linear fits are given float64 data (:class:`Float64Fit`: its own ``.float()`` casts alone move
KernelSHAP's coefficients by ~1e-4 on 34 features, the endpoint weights being 1e6; ours fit in float64); the draws,
weights and model outputs are Captum's. ``--samples`` above the token count keeps the least squares determined
(below it, the minimum-norm solution depends on the rounding).

Captum runs HF's model (a plain eager copy) once per perturbed prompt; ours batches the coalitions and continues
each from the unchanged prefix's keys and values. Agreement: max |ours − Captum| over the prompt's tokens, ≤
``TOLERANCE`` × the largest |attribution| (float32 on both sides, different batching). Timing: ``--repeats``
interleaved rounds of all eight (:func:`benchmarks.common.time_interleaved`, one untimed warm-up each), one torch
thread. Writes ``benchmarks/results/perturbation_captum.json``.
Run: ``nice -n 5 .venv/bin/python -m benchmarks bench_perturbation_captum``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPEATS, time_interleaved, write_result  # noqa: E402

TOLERANCE = 1e-4
"""Largest allowed ``|ours − Captum|`` over the largest ``|Captum attribution|``."""
TEXT = ("The Eiffel Tower was finished in 1889 for the World's Fair and still stands on the Champ de Mars "
        "in the capital of France, the city of")
METHODS = {
    "occlusion": "Captum `FeatureAblation`",
    "shapley": "Captum `ShapleyValueSampling`",
    "kernel_shap": "Captum `KernelShap`",
    "lime": "Captum `Lime` (least squares)",
}


def float64_fit() -> Any:
    """Captum's ``SkLearnLinearRegression`` fitting on float64 copies of the data Captum hands it."""
    from captum._utils.models.linear_model import SkLearnLinearRegression

    class Float64Fit(SkLearnLinearRegression):
        def fit(self, train_data: Any, **kwargs: Any) -> Any:
            return super().fit([tuple(t.double() for t in batch) for batch in train_data], **kwargs)

    return Float64Fit()


def captum_methods(peer: Any, tokenizer: Any, baseline: int, target: Tensor, samples: int, permutations: int,
                   seed: int) -> dict[str, Callable[[], Tensor]]:
    """Captum's four, each a zero-argument function giving the prompt's token attributions ``(T,)``."""
    from captum.attr import FeatureAblation, KernelShap, Lime, LLMAttribution, ShapleyValueSampling, TextTokenInput

    def call(method: Any, **kwargs: Any) -> Callable[[], Tensor]:
        def attribute() -> Tensor:
            torch.manual_seed(seed)
            inp = TextTokenInput(TEXT, tokenizer, baselines=baseline)
            with torch.no_grad():
                return LLMAttribution(method, tokenizer, attr_target="prob").attribute(inp, target=target, **kwargs).seq_attr
        return attribute

    kernel_shap = KernelShap(peer)
    kernel_shap.interpretable_model = float64_fit()
    return {
        "occlusion": call(FeatureAblation(peer)),
        "shapley": call(ShapleyValueSampling(peer), n_samples=permutations),
        "kernel_shap": call(kernel_shap, n_samples=samples),
        "lime": call(Lime(peer, interpretable_model=float64_fit()), n_samples=samples),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison, write the result file and return its content."""
    from attnaudit.explain import get_explanation
    from attnaudit.explain.generation import decoder_rows, encode_exactly
    from attnaudit.explain.helpers.perturbation import token_baseline
    from attnaudit.models.interface import language_model
    from attnaudit.resolve import name_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=48, help="kernel_shap's and lime's coalitions (both sides)")
    parser.add_argument("--permutations", type=int, default=1, help="shapley's random orders (both sides)")
    parser.add_argument("--baseline", default="unk", help="the token a perturbed token becomes: unk, pad or eos")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run = name_model(source="smollm2").load("cpu", None)
    model = language_model(run.model, "the comparison")
    with model.next_token_decision():
        ids = encode_exactly(model.tokenizer, TEXT)
        batch = decoder_rows(model, ids, [], 1)
        with torch.no_grad():
            target = model(batch).probs[0].argmax()
        peer = copy.deepcopy(model.hf).eval()
        peer.set_attn_implementation("eager")
        baseline = token_baseline(model, args.baseline)
        theirs = captum_methods(peer, model.tokenizer, baseline, target[None], args.samples, args.permutations, args.seed)
        options = {"occlusion": {"window": 1}, "shapley": {"samples": args.permutations}, "kernel_shap": {"samples": args.samples},
                   "lime": {"samples": args.samples}}
        fns: dict[str, Callable[[], Tensor]] = {}
        for name in METHODS:
            method, offered = get_explanation(name), {**options[name], "seed": args.seed, "baseline": args.baseline}
            fns[f"ours_{name}"] = lambda method=method, offered=offered: method(run, batch, **offered)[0]
            fns[f"peer_{name}"] = theirs[name]
        timing, out = time_interleaved(fns, args.repeats, ratios={name: (f"peer_{name}", f"ours_{name}") for name in METHODS})
    methods = {}
    for name, peer_name in METHODS.items():
        ours, captum = out[f"ours_{name}"].float().cpu(), out[f"peer_{name}"].float().cpu()
        diff, scale = float((ours - captum).abs().max()), float(captum.abs().max())
        methods[name] = {
            "peer": peer_name, "max_abs_diff": diff, "max_abs_attribution": scale, "agree": diff <= TOLERANCE * scale,
            "ratio": timing[name]["median"], "ours_s": timing["seconds"][f"ours_{name}"]["median"],
            "peer_s": timing["seconds"][f"peer_{name}"]["median"],
        }
    result = {
        "agree": all(m["agree"] for m in methods.values()),
        "methods": methods,
        "tolerance": f"max |ours − Captum| <= {TOLERANCE:g} × max |Captum attribution| (the prompt's tokens)",
        "timing": timing,
        "model": "SmolLM2-135M-Instruct (embedded GGUF, float32), next token",
        "text": TEXT,
        "tokens": len(ids),
        "explained_token": model.tokenizer.decode([int(target)]),
        "samples": args.samples,
        "permutations": args.permutations,
        "baseline": args.baseline,
        "seed": args.seed,
    }
    write_result("perturbation_captum", result)
    return result


if __name__ == "__main__":
    out = main()
    for name, record in out["methods"].items():
        print(f"{name}: ours {record['ours_s']:.2f}s vs {record['peer']} {record['peer_s']:.2f}s (ratio {record['ratio']:.2f}), "
              f"max |diff| {record['max_abs_diff']:.1e} of {record['max_abs_attribution']:.1e}; agree={record['agree']}")
    print(f"{out['tokens']} tokens, next token {out['explained_token']!r}; agree={out['agree']}")
