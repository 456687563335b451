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
from typing import Any

import torch
from torch import Tensor


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
    eos: int | None, sample: bool = False, generator: torch.Generator | None = None,
) -> tuple[list[int], Tensor]:
    """Up to ``count`` tokens after ``source`` (a decoder's prompt, an encoder-decoder's source whose decoder
    begins with ``start``; unused for a decoder) and the distribution ``(steps, V)`` each was chosen from; stops after ``eos``."""
    device = input_device(hf)
    src = _row(source, device)
    out: list[int] = []
    probs: list[Tensor] = []
    past: Any = None
    fixed: dict[str, Any] = {}
    if encoder_decoder:
        fixed = {"encoder_outputs": hf.get_encoder()(input_ids=src, attention_mask=torch.ones_like(src)),
                 "attention_mask": torch.ones_like(src)}
    prefix = [start] if encoder_decoder else list(source)
    if "logits_to_keep" in inspect.signature(hf.forward).parameters:
        fixed["logits_to_keep"] = 1  # the next token's logits alone, as ``generate`` asks (not the prompt's every position)
    for _ in range(count):
        fresh = prefix if past is None else prefix[-1:]
        key = "decoder_input_ids" if encoder_decoder else "input_ids"
        result = hf(**fixed, **{key: _row(fresh, device)}, past_key_values=past, use_cache=True)
        past = getattr(result, "past_key_values", None)  # None: the next pass reads the whole prefix again
        distribution = result.logits[0, -1].float().softmax(-1)
        token = choose_token(distribution, sample, generator)
        probs.append(distribution.cpu())
        out.append(token)
        prefix.append(token)
        if token == eos:
            break
    return out, torch.stack(probs)


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
