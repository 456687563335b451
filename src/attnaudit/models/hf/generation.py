"""A Hugging Face model's own continuation of one sequence, with its key/value cache, and the next-token
distributions of a forced continuation in one teacher-forced pass.

Explaining a generated sequence needs, per step, the token and the distribution it came from. Both are
the model's own forward without interventions, so they run as the model runs them: generation reuses
the key/value cache (one token per pass after the prompt, as ``generate`` does) and a forced target is
one teacher-forced pass whose positions are the steps (a causal decoder's position ``t`` sees only the
tokens before it). Greedy or sampled from a seeded :class:`torch.Generator`, not the global one, so the
same seed gives the same tokens. A model whose forward returns no cache is rerun on the whole prefix.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnaudit.models.hf.passes import HFLayer
from attnaudit.models.interface import AttentionTrace


def input_device(hf: Any) -> torch.device:
    """Where inputs go: the input embeddings' device (a layer offloaded by accelerate reads its inputs where it runs)."""
    weight = hf.get_input_embeddings().weight
    return weight.device if weight.device.type != "meta" else torch.device("cpu")


def _row(ids: Sequence[int], device: torch.device) -> Tensor:
    return torch.tensor([list(ids)], dtype=torch.long, device=device)


def choose_token(probs: Tensor, sample: bool, generator: torch.Generator | None) -> int:
    """The next token: the most probable, or one drawn from ``probs`` with ``generator``."""
    if sample:
        return int(torch.multinomial(probs.float().cpu(), 1, generator=generator))
    return int(probs.argmax())


@torch.no_grad()
def continue_ids(
    hf: Any, encoder_decoder: bool, source: Sequence[int], start: int, count: int,
    eos: int | None, sample: bool = False, generator: torch.Generator | None = None, rows: list[Step] | None = None,
) -> tuple[list[int], Tensor]:
    """Up to ``count`` tokens after ``source`` (a decoder's prompt, an encoder-decoder's source whose decoder
    begins with ``start``; unused for a decoder) and the distribution ``(steps, V)`` each was chosen from; stops after ``eos``.

    ``rows``: a list that receives each step's :class:`Step`, the logits and every layer's attention row of the position
    that made it (transformers' ``output_attentions`` of a one-token pass; a decoder's prompt's last token runs alone after
    the others; an encoder-decoder's encoder weights are the source's whole matrices, once). Left empty where the model
    gives no key/value cache (a decoder) or no such weights."""
    device = input_device(hf)
    src = _row(source, device)
    out: list[int] = []
    probs: list[Tensor] = []
    past: Any = None
    fixed: dict[str, Any] = {}
    prefix = [start] if encoder_decoder else list(source)
    capture = rows is not None and (encoder_decoder or len(prefix) > 1)
    asked = {"output_attentions": True} if capture else {}
    encoder: list[Tensor] = []
    if encoder_decoder:
        encoded = hf.get_encoder()(input_ids=src, attention_mask=torch.ones_like(src), **asked)
        fixed = {"encoder_outputs": encoded, "attention_mask": torch.ones_like(src)}
        encoder = [w[0] for w in getattr(encoded, "attentions", None) or []]
        capture = capture and bool(encoder)
    if "logits_to_keep" in inspect.signature(hf.forward).parameters:
        fixed["logits_to_keep"] = 1  # the next token's logits alone, as ``generate`` asks (not the prompt's every position)
    if capture and not encoder_decoder:  # the prompt but its last token, whose pass gives the first step's row: (H, K), not (H, P, K)
        past = getattr(hf(**fixed, input_ids=_row(prefix[:-1], device), use_cache=True), "past_key_values", None)
        capture = past is not None
    for _ in range(count):
        fresh = prefix if past is None else prefix[-1:]
        key = "decoder_input_ids" if encoder_decoder else "input_ids"
        result = hf(**fixed, **{key: _row(fresh, device)}, past_key_values=past, use_cache=True, **(asked if capture else {}))
        past = getattr(result, "past_key_values", None)  # None: the next pass reads the whole prefix again
        if capture:
            capture = _keep_step(rows, result, len(prefix), len(source) if encoder_decoder else None, encoder)  # type: ignore[arg-type]
        distribution = result.logits[0, -1].float().softmax(-1)
        token = choose_token(distribution, sample, generator)
        probs.append(distribution.cpu())
        out.append(token)
        prefix.append(token)
        if token == eos:
            break
    return out, torch.stack(probs)


@dataclass
class Step:
    """One generated step: its logits ``(V,)`` and the attention of every layer (the model's order) at the position that
    made it: a decoder's row ``(H, K)`` per layer (K: the tokens up to it); an encoder-decoder's encoder layers' whole
    ``(H, S, S)`` matrices (the same each step), then per decoder block its self-attention row ``(H, t + 1)`` and its
    cross-attention row ``(H, S)``."""

    logits: Tensor
    weights: list[Tensor]


def _keep_step(rows: list[Step], result: Any, width: int, source: int | None = None, encoder: Sequence[Tensor] = ()) -> bool:
    """Append a one-token pass's :class:`Step` to ``rows`` (``width``: the decoder's tokens so far; ``source``: an
    encoder-decoder's source length); False (``rows`` emptied) where its weights are not one row per layer over those
    tokens (no weights, a sliding window's cache): the rows are then computed afresh."""
    if source is None:
        layers = [(w, width) for w in getattr(result, "attentions", None) or []]
    else:
        own, cross = getattr(result, "decoder_attentions", None) or [], getattr(result, "cross_attentions", None) or []
        layers = [pair for o, c in zip(own, cross) for pair in ((o, width), (c, source))] if len(own) == len(cross) else []
    if not layers or any(w is None or w.dim() != 4 or w.shape[3] != keys for w, keys in layers):
        rows.clear()
        return False
    rows.append(Step(result.logits[0, -1], [*encoder, *(w[0, :, -1] for w, _ in layers)]))
    return True


def generation_trace(steps: list[Step], labels: list[str], encoder_layers: int = 0) -> tuple[Tensor, AttentionTrace]:
    """The logits ``(T, V)`` and the trace of the steps' batch from the generation's own rows, as
    :meth:`~attnaudit.models.hf.model.HFModel.rows_forward` records it: a decoder's rows of its longest step (per layer the
    weights ``(T, H, 1, K)``, step t's row over its tokens, zero after); an encoder-decoder's batch of every step (its first
    ``encoder_layers`` the source's matrices, the same for each row; then each decoder layer's row of each step)."""
    count = len(steps)
    device = steps[0].logits.device
    decoder = encoder_layers == 0
    width = steps[-1].weights[0].shape[-1] if decoder else count  # the decoder's (longest) tokens
    rows = torch.arange(width - count, width, device=device)  # the positions that made the steps
    real = torch.arange(width, device=device)[None, :] <= rows[:, None]  # each row's keys so far
    trace = AttentionTrace()
    for layer, label in enumerate(labels):
        first = steps[0].weights[layer]
        if layer < encoder_layers:  # the source's self-attention: every query, the same matrix for each row
            ones = torch.ones(count, first.shape[-1], dtype=torch.bool, device=device)
            trace.layers.append(HFLayer(weights=first.expand(count, *first.shape), mask=ones, query_mask=ones, inputs=first.new_empty(0),
                                        name=label, allowed=ones[:, None, None, :]))
            continue
        own = decoder or (layer - encoder_layers) % 2 == 0  # self-attention over the decoder's tokens, or cross over the source
        weights = first.new_zeros(count, first.shape[0], 1, width if own else first.shape[-1])
        for t, step in enumerate(steps):
            weights[t, :, 0, : step.weights[layer].shape[-1]] = step.weights[layer]
        allowed = real if own else torch.ones(count, weights.shape[-1], dtype=torch.bool, device=device)
        mask = torch.ones(1, width, dtype=torch.bool, device=device) if decoder else allowed  # a decoder's: its longest step's keys
        trace.layers.append(HFLayer(weights=weights, mask=mask, inputs=weights.new_empty(0), name=label, rows=rows,
                                    allowed=allowed[:, None, None, :]))
    return torch.stack([step.logits for step in steps]), trace


@torch.no_grad()
def forced_distributions(hf: Any, encoder_decoder: bool, source: Sequence[int], start: int, target: Sequence[int]) -> Tensor:
    """The next-token distribution ``(len(target), V)`` before each token of ``target`` after ``source``: one
    teacher-forced pass (a decoder reads ``source + target[:-1]``; an encoder-decoder ``start + target[:-1]``)."""
    device = input_device(hf)
    if encoder_decoder:
        src = _row(source, device)
        logits = hf(input_ids=src, attention_mask=torch.ones_like(src), decoder_input_ids=_row([start, *target[:-1]], device),
                    use_cache=False).logits[0]
    else:
        logits = hf(input_ids=_row([*source, *target[:-1]], device), use_cache=False).logits[0, len(source) - 1 :]
    return logits.float().softmax(-1).cpu()
