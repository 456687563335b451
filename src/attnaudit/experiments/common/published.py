"""The tagging study's published figures, and ``compare``: two models' attention and outputs, per instance."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch

from attnaudit.algorithms.metrics import jsd, kl, row_mean, tvd
from attnaudit.data.types import Example
from attnaudit.experiments.common.measures import max_attention
from attnaudit.models.interface import (
    AttentionModel,
    evaluation,
)
from attnaudit.run import Run
from attnaudit.training.adversary import EVAL_BATCH
from attnaudit.training.trainer import InterventionsFn

PUBLISHED_TAGGING = {
    "base_test_f1": 0.90,
    "f1@0.2": 0.90,
    "f1@3": 0.75,
    "breakpoint_kl": 0.33,
    "source": "CoNLL-2000 sequence-tagging attention study, 1-layer 4-head Transformer: Table 1 "
    "(original 0.90; adversary λ=0.2 0.90, λ=3 0.75) and the NLL-vs-KL figure (steep rise near KL ≈ 0.33)",
}


def compare(
    base: Run,
    other: AttentionModel,
    examples: Sequence[Example],
    interventions: InterventionsFn | None = None,
    batch_size: int = EVAL_BATCH,
) -> dict[str, np.ndarray]:
    """``other`` against the base model, one value per instance (both in eval mode, no gradient).

    Attention at the base's explained layer (same index in ``other``), averaged over heads
    and real query rows: ``jsd``, ``kl_base_other`` = KL(α_base ‖ α_other), ``kl_other_base``.
    Outputs (a tagger's averaged over real tokens): ``tvd`` of the predicted distributions,
    ``nll`` = −log p_other(base's predicted label), ``agreement`` = fraction of equal
    predicted labels. Also the base's and the other's ``max_attention`` / ``max_attention_other``
    (mean peak weight per row: 1 means one-hot attention), ``rows`` (real query rows) and
    ``outputs`` (predictions per instance: 1, or the tokens of a tagged sentence), the
    weights for token-level means.
    """
    layer = base.model.explained_layer
    tagging = base.task.task_type == "tagging"
    columns: dict[str, list[torch.Tensor]] = defaultdict(list)
    with evaluation(base.model), evaluation(other), torch.no_grad():
        for batch in base.batches(list(examples), batch_size):
            ours = base.model(batch)
            theirs = other(batch, interventions(batch) if interventions else ())
            mine, yours = ours.trace[layer], theirs.trace[layer]
            size, _, q, _ = mine.weights.shape
            rows = mine.query_mask.bool() if mine.query_mask is not None else mine.mask.new_ones(size, q, dtype=torch.bool)
            columns["jsd"].append(row_mean(jsd(yours.weights, mine.weights), rows))
            columns["kl_base_other"].append(row_mean(kl(mine.weights, yours.weights), rows))
            columns["kl_other_base"].append(row_mean(kl(yours.weights, mine.weights), rows))
            columns["max_attention"].append(max_attention(mine.weights, rows))
            columns["max_attention_other"].append(max_attention(yours.weights, rows))
            columns["rows"].append(rows.sum(-1).to(torch.float64))
            target = ours.logits.argmax(-1)
            nll = -theirs.logits.log_softmax(-1).gather(-1, target[..., None]).squeeze(-1)
            change = tvd(theirs.probs, ours.probs)
            agree = (theirs.logits.argmax(-1) == target).to(nll.dtype)
            if tagging:
                real = batch.mask.bool().to(nll.dtype)
                count = real.sum(-1).clamp_min(1.0)
                nll, change, agree = ((v * real).sum(-1) / count for v in (nll, change, agree))
                outputs = real.sum(-1)
            else:
                outputs = torch.ones_like(nll)
            columns["nll"].append(nll)
            columns["tvd"].append(change)
            columns["agreement"].append(agree)
            columns["outputs"].append(outputs.to(torch.float64))
    return {name: torch.cat(values).double().cpu().numpy() for name, values in columns.items()}
