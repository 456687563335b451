"""Are erased inputs in distribution? MaSF (Madsen et al. 2024) on inputs with tokens masked.

Erasure metrics (ERASER, AOPC, deletion curves) read a model's output on inputs with tokens replaced by the
mask token. Whether such inputs are in distribution decides whether the drop measures faithfulness or
distribution shift. This test asks MaSF (:mod:`attnaudit.algorithms.masf`): fitted on the per-layer max-pooled
hidden states of the validation split as the model was trained on it (a masked fine-tune's: masked at a
per-example ratio from U[0, 1), :mod:`attnaudit.training.masking`; otherwise as written), it gives each test
input masked at 0, 10, ..., 100 % of its maskable tokens (real, not special) a p-value; the share below
``level`` is the share judged out of distribution. Tokens are masked in a seeded random order (``random``) or
an explanation's (its highest scores first). For an ordinary fine-tune the share rises with the ratio; for a
masked fine-tune it stays near ``level`` (Madsen et al. 2024, Fig. 3).

Hidden states are those entering each attention layer (the one model interface's trace), max-pooled over the
real positions: the embeddings and every layer's input, the model's last output aside.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnaudit.algorithms.masf import MaSF
from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register
from attnaudit.explain import EXPLANATIONS, applying
from attnaudit.io import read_json_object
from attnaudit.models.interface import AttentionModel, evaluation
from attnaudit.run import Run
from attnaudit.training.masking import mask_batch

RANDOM = "random"
"""Masking in a seeded random order, the baseline every explanation's order is read against."""


def max_pooled(model: AttentionModel, batch: Batch) -> np.ndarray:
    """``(B, L, D)``: per attention layer, the states entering it max-pooled over each row's real positions."""
    with evaluation(model), torch.no_grad():
        trace = model(batch).trace
    pooled = [layer.inputs.float().masked_fill(~layer.mask.bool()[..., None], -torch.inf).amax(1) for layer in trace]
    if len({p.shape[-1] for p in pooled}) != 1:
        raise AttnAuditError("in-distribution: the model's attention layers read states of different widths (e.g. HAN); MaSF needs one")
    return torch.stack(pooled, 1).double().cpu().numpy()


def masked_by_order(batch: Batch, order: torch.Tensor, maskable: torch.Tensor, ratio: float, mask_id: int) -> Batch:
    """``batch`` with the first ``round(ratio · n)`` of each row's ``n`` maskable positions in ``order`` ``(B, T)``
    (position indices, most important first) replaced by ``mask_id``."""
    tokens = batch.tokens.clone()
    for row in range(tokens.shape[0]):
        allowed = [int(p) for p in order[row].tolist() if bool(maskable[row, p])]
        chosen = allowed[: int(round(ratio * len(allowed)))]
        tokens[row, chosen] = mask_id
    return Batch(**{**batch.__dict__, "tokens": tokens})


def fine_tuned_with_masking(run: Run) -> bool:
    """Whether the run folder records masked fine-tuning (``finetune --masking``)."""
    config = run.path / "config.json" if run.path is not None else None
    if config is None or not config.is_file():
        return False
    return bool(read_json_object(config).get("finetune", {}).get("masking"))


@register
class InDistribution(Experiment):
    """MaSF p-values of inputs with 0-100 % of their tokens masked, per masking order."""

    name = "in-distribution"
    description = (
        "are erased inputs in distribution? MaSF p-values of test inputs with 0-100 % of their tokens masked "
        "(random order or an explanation's), against the validation split as the model was trained on it"
    )
    paper = "Madsen et al. 2024"
    examples = ("runs/minilm-sst2 --methods random,gradient --ratios 0,50,100 --reference 32 --limit 8 --data-dir ../shared/data",)
    settings = AuditSettings(rank=45, options={"reference": 64, "ratios": [0.0, 50.0, 100.0]})

    @dataclass
    class Options:
        methods: list[str] = field(default_factory=lambda: [RANDOM], metadata={
            "help": "Masking orders: random (seeded) and/or explanation methods (their highest scores masked first)."})
        ratios: list[float] = field(default_factory=lambda: [float(r) for r in range(0, 101, 10)], metadata={
            "help": "Percentages of each input's maskable tokens masked (0-100)."})
        reference: int = field(default=200, metadata={"help": "Validation instances MaSF is fitted on (a seeded sample)."})
        level: float = field(default=0.05, metadata={"help": "p-values below it count as out of distribution."})
        batch_size: int = field(default=16, metadata={"help": "Instances per batch."})

    def applies(self, run: Run) -> str | None:
        if run.task.task_type not in ("classification", "pair"):
            return f"it masks the inputs of one decision per instance; a {run.task.task_type} model makes one per token"
        tokenizer = run.model.tokenizer
        if tokenizer is None or getattr(tokenizer, "mask_token_id", None) is None:
            return "it replaces tokens by a mask token, which this model's vocabulary has not (a Hugging Face encoder's has)"
        return None

    @classmethod
    def explanation_choices(cls) -> list[str]:
        return [RANDOM, *EXPLANATIONS]

    def _check(self, run: Run, options: Any) -> dict[str, Any]:
        """Options checked before any work; the explanation methods among ``methods``."""
        if not options.methods:
            raise AttnAuditError("--methods: give random and/or explanation methods")
        if not options.ratios or any(not 0 <= r <= 100 for r in options.ratios):
            raise AttnAuditError(f"--ratios are percentages from 0 to 100, got {', '.join(f'{r:g}' for r in options.ratios)}")
        for ok, message in ((options.reference >= 6, f"--reference must be at least 6, got {options.reference}"),
                            (0 < options.level < 1, f"--level must be in (0, 1), got {options.level}"),
                            (options.batch_size >= 1, f"--batch-size must be at least 1, got {options.batch_size}")):
            if not ok:
                raise AttnAuditError(message)
        named = [m for m in options.methods if m != RANDOM]
        return applying(named, run.model, "--methods", [])[0] if named else {}

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        methods = self._check(run, options)
        tokenizer: Any = run.model.tokenizer  # applies() checked it has a mask token
        mask_id, specials = int(tokenizer.mask_token_id), sorted(set(tokenizer.all_special_ids))
        masked_training = fine_tuned_with_masking(run)
        test = self._fit(run, options, seed, mask_id, specials, masked_training)
        rows: list[dict[str, Any]] = []
        generator = torch.Generator().manual_seed(seed)
        for first in range(0, len(examples), options.batch_size):
            batch = next(iter(run.batches(examples[first : first + options.batch_size], batch_size=options.batch_size)))
            maskable = batch.mask.bool() & ~torch.isin(batch.tokens, torch.tensor(specials, device=batch.tokens.device))
            orders = {RANDOM: torch.stack([torch.randperm(batch.tokens.shape[1], generator=generator) for _ in range(len(batch))])}
            for name, method in methods.items():
                orders[name] = method(run.model, batch, seed=seed).detach().cpu().argsort(dim=-1, descending=True, stable=True)
            for name, order in orders.items():
                for ratio in options.ratios:
                    p = test.p_values(max_pooled(run.model, masked_by_order(batch, order, maskable.cpu(), ratio / 100, mask_id)))
                    rows += [{"index": first + b, "order": name, "ratio": ratio, "p_value": float(p[b]), "ood": bool(p[b] < options.level)}
                             for b in range(len(batch))]
        return self._result(rows, options, masked_training)

    def _fit(self, run: Run, options: Any, seed: int, mask_id: int, specials: list[int], masked_training: bool) -> MaSF:
        """MaSF fitted on a seeded sample of the dev split, masked as in training when the model was fine-tuned so."""
        dev = list(run.examples("dev"))
        if len(dev) < 6:  # three parts of at least two (p-values then no smaller than 1/3: a few hundred make them useful)
            raise AttnAuditError(f"in-distribution fits MaSF on the dev split, which has {len(dev)} instances (at least 6 needed)")
        chosen = random.Random(seed).sample(dev, min(options.reference, len(dev)))
        states = []
        for batch in run.batches(chosen, batch_size=options.batch_size):
            states.append(max_pooled(run.model, mask_batch(batch, mask_id, specials, seed) if masked_training else batch))
        return MaSF.fit(np.concatenate(states), seed=seed)

    def _result(self, rows: list[dict[str, Any]], options: Any, masked_training: bool) -> Result:
        table = []
        for order in dict.fromkeys(r["order"] for r in rows):
            for ratio in options.ratios:
                mine = [r for r in rows if r["order"] == order and r["ratio"] == ratio]
                table.append({"order": order, "ratio": ratio, "ood_share": float(np.mean([r["ood"] for r in mine])),
                              "p_value_median": float(np.median([r["p_value"] for r in mine])), "n": len(mine)})
        summary = {f"ood_share_{t['order']}_{t['ratio']:g}": t["ood_share"] for t in table}
        reference = "the masked validation split (a masked fine-tune)" if masked_training else "the validation split as written"
        notes = [f"MaSF fitted on {reference}; out of distribution: p < {options.level:g}",
                 "expected share at 0 % masking: about the level (in distribution by construction)"]
        return Result(test=self.name, summary={**summary, "masked_training": masked_training}, instances=rows,
                      tables={"shares": table}, meta={"notes": notes, "csv_tables": ["shares"]})

    def plot(self, result: Result, directory: Path) -> list[Path]:
        from attnaudit.plotting import pyplot, save_figure

        plt = pyplot()
        table = result.tables.get("shares", [])
        fig, ax = plt.subplots(figsize=(5, 3.4), layout="constrained")
        for order in dict.fromkeys(t["order"] for t in table):
            mine = [t for t in table if t["order"] == order]
            ax.plot([t["ratio"] for t in mine], [t["ood_share"] for t in mine], marker="o", label=order)
        ax.set_xlabel("tokens masked (%)")
        ax.set_ylabel("share judged out of distribution")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
        return save_figure(fig, directory, "in_distribution")

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        s = result.summary
        shares = {k: v for k, v in s.items() if k.startswith(f"ood_share_{RANDOM}_")}
        if not shares:
            return []
        top = max(shares, key=lambda k: float(k.rsplit("_", 1)[1]))
        value = shares[top]
        word = "out of distribution" if value > 0.5 else "mostly in distribution"
        return [{"statistic": f"share out of distribution at {top.rsplit('_', 1)[1]} % random masking", "value": value, "published": "",
                 "interpretation": f"erased inputs are {word} for this model"
                 + ("" if s.get("masked_training") else "; masked fine-tuning (finetune --masking) makes them in distribution")}]
