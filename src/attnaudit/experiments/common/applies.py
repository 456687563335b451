"""Why a family of tests does not apply to a model (single attention, Transformer or self-attention classifiers,
tagging), and the layers a test reads."""

from __future__ import annotations

from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import (
    AttentionModel,
)
from attnaudit.run import Run

TAGGING_REASON = (
    "a tagger predicts one label per token, each from its own attention row; Jain & Wallace's "
    "tests perturb the one attention distribution behind one prediction, and there is no single "
    "distribution/prediction pair to perturb here (changing one row changes many outputs at once)"
)


def single_attention_reason(run: Run) -> str | None:
    """Why the single-attention tests (permutation, adversarial) do not apply, or None."""
    if run.task.task_type == "tagging":
        return TAGGING_REASON
    if run.task.task_type == "seq2seq":
        return "a translation model has one attention distribution per target word, not one per prediction"
    return None


def transformer_classifier_reason(run: Run) -> str | None:
    """Why the key tests do not apply (None for a Transformer classifier)."""
    if run.family != "transformer":
        return (
            "the key tests (random, opposite and adversarial keys) train an MLP over the keys of the attnaudit "
            f"Transformer classifier's layers; this run is a {run.family!r} model"
        )
    return self_attention_classifier_reason(run)


def self_attention_classifier_reason(run: Run) -> str | None:
    """Why the normaliser swap and shuffling do not apply (None for a single-sentence classifier built
    of self-attention layers: the attnaudit Transformer or a Hugging Face encoder or decoder)."""
    if run.family not in ("transformer", "hf") or not run.model.self_attention:
        return (
            "the activation swap and shuffling tests change the weights of self-attention layers; "
            f"this run is a {run.family!r} model"
        )
    if run.task.task_type != "classification":
        return (
            "the sparse-attention tests score single-sentence classification accuracy; "
            f"this model was trained for task type {run.task.task_type!r}"
        )
    return None


def resolve_layers(model: AttentionModel, spec: str, allow_all: bool = True) -> list[int]:
    """Absolute attention-layer indices for ``spec``: ``explained``, ``all`` or an index."""
    n = model.num_attention_layers
    if spec == "explained":
        return [model.explained_layer % n]
    if spec == "all":
        if not allow_all:
            raise AttnAuditError("--layer all is not supported by this test; give 'explained' or one layer index")
        return list(range(n))
    try:
        index = int(spec)
    except ValueError:
        raise AttnAuditError(f"--layer must be 'explained', 'all' or a layer index, got {spec!r}") from None
    if not -n <= index < n:
        raise AttnAuditError(f"--layer {index} is out of range: this model has {n} attention layer(s)")
    return [index % n]
