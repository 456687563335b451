"""Layer-wise relevance propagation as a modified backward pass (AttnLRP, CP-LRP), for every
Transformer family behind the one model interface, without a forked modeling file.

In the gradient × input formulation of LRP (Achtibat et al. 2024, "AttnLRP"), a linear layer's
ordinary gradient already is the ε-rule (with ε = 0; biases keep their share), so only the other
operations change their backward pass while :func:`relevance_rules` is active:

* **normalisation** (LayerNorm, RMSNorm): the denominator ``sqrt(var + eps)`` is a constant
  (the identity rule on the normalisation; both variants);
* **elementwise nonlinearities** (GELU, SiLU, tanh, ...): the identity rule, ``R_in = R_out``,
  i.e. the gradient becomes ``f(x) / x`` (:class:`IdentityRule`); both variants;
* **attention**: AttnLRP keeps the softmax's own gradient (its rule in gradient × input form) and
  applies the uniform rule to the two products ``Q Kᵀ`` and ``A V``: each factor receives half of
  the product's relevance, i.e. the gradients reaching ``q`` and ``k`` are divided by 4 and that
  reaching ``v`` by 2 (:func:`attention_operands`). CP-LRP (Ali et al. 2022) treats the attention
  weights as constants: ``q`` and ``k`` are detached;
* **gated feed-forward** (Llama's ``act(gate) · up``): AttnLRP halves the gradient of the product
  (uniform rule); CP-LRP detaches the gate, so the product is linear in ``up``.

Relevance is then ``input × gradient`` of the explained logit. Each family says where its norms,
activations and gates are (:meth:`~attnaudit.models.interface.AttentionModel.relevance_sites`); the
attention functions of our Transformer and of the Hugging Face adapters call
:func:`attention_operands`, which does nothing outside :func:`relevance_rules`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd import Function

from attnaudit.errors import AttnAuditError
from attnaudit.models.interface import AttentionModel, replaced_forwards

RULES = ("attnlrp", "cp_lrp")
_RULE: ContextVar[str | None] = ContextVar("attnaudit_lrp_rule", default=None)
ACTIVATIONS = (nn.GELU, nn.SiLU, nn.Tanh, nn.ReLU, nn.Sigmoid, nn.Mish, nn.ELU, nn.LeakyReLU, nn.Softplus)


class IdentityRule(Function):
    """``fn(x)`` forward; backward ``grad · fn(x) / x`` (0 where ``x = 0``), so ``x · grad`` passes the
    output's relevance ``fn(x) · grad`` on unchanged (AttnLRP's identity rule for elementwise maps)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        out = fn(x)
        ctx.save_for_backward(torch.where(x == 0, torch.zeros_like(out), out / torch.where(x == 0, torch.ones_like(x), x)))
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None


class ScaleGradient(Function):
    """The identity forward; backward multiplies the gradient by ``factor`` (the uniform rule's share)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.factor, None


def active_rule() -> str | None:
    """The LRP variant in force (``attnlrp``, ``cp_lrp``), or None outside :func:`relevance_rules`."""
    return _RULE.get()


def attention_operands(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-head ``q, k, v`` as the attention products should see them under the active rule: unchanged
    outside LRP; AttnLRP: gradients to ``q, k`` ÷ 4 and to ``v`` ÷ 2; CP-LRP: ``q, k`` detached."""
    rule = _RULE.get()
    if rule == "attnlrp":
        return ScaleGradient.apply(query, 0.25), ScaleGradient.apply(key, 0.25), ScaleGradient.apply(value, 0.5)
    if rule == "cp_lrp":
        return query.detach(), key.detach(), value
    return query, key, value


@dataclass
class RelevanceSites:
    """Where a model's backward pass changes under LRP: its normalisation modules, its elementwise
    activation modules, and ``gates``: ``(activation, consumer)`` pairs of a gated feed-forward block,
    whose ``consumer`` (Llama's ``down_proj``) reads ``activation(gate) · up``."""

    norms: list[nn.Module] = field(default_factory=list)
    activations: list[nn.Module] = field(default_factory=list)
    gates: list[tuple[nn.Module, nn.Module]] = field(default_factory=list)


def is_norm(module: nn.Module) -> bool:
    """LayerNorm, ``nn.RMSNorm`` or a Hugging Face RMSNorm (``weight`` and ``variance_epsilon``)."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or (
        hasattr(module, "variance_epsilon") and isinstance(getattr(module, "weight", None), Tensor)
    )


def is_activation(module: nn.Module) -> bool:
    """An elementwise activation module: torch's or one of ``transformers.activations``."""
    return isinstance(module, ACTIVATIONS) or type(module).__module__ == "transformers.activations"


def scan_sites(model: nn.Module) -> RelevanceSites:
    """The norms and activations among ``model``'s submodules (no gates: families add theirs)."""
    modules = list(model.modules())
    return RelevanceSites(norms=[m for m in modules if is_norm(m)], activations=[m for m in modules if is_activation(m)])


def frozen_norm(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """``module``'s normalisation with its denominator detached (the same values, linear backward)."""
    centred = not hasattr(module, "variance_epsilon") and isinstance(module, nn.LayerNorm)
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None) or torch.finfo(torch.float32).eps
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)

    def forward(x: Tensor) -> Tensor:
        z = x - x.mean(-1, keepdim=True) if centred else x
        spread = z.pow(2).mean(-1, keepdim=True)
        out = z / (spread + eps).sqrt().detach()
        out = out if weight is None else out * weight
        return out if bias is None else out + bias

    return forward


def _halve_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (ScaleGradient.apply(args[0], 0.5), *args[1:])


@contextmanager
def relevance_rules(model: AttentionModel, rule: str) -> Iterator[None]:
    """Within the block, ``model``'s forward passes carry ``rule``'s backward pass (see the module
    docstring); every change is undone on exit. ``model`` must offer ``relevance_sites()``."""
    if rule not in RULES:
        raise AttnAuditError(f"unknown LRP rule {rule!r}; choose {', '.join(RULES)}")
    if _RULE.get() is not None:
        raise AttnAuditError("LRP rules are already active; they do not nest")
    sites: RelevanceSites = model.relevance_sites()
    gate_acts = {id(act) for act, _ in sites.gates}
    forwards: dict[nn.Module, Callable[[Tensor], Tensor]] = {m: frozen_norm(m) for m in sites.norms}
    listed = {id(act) for act in sites.activations}
    for act in [*sites.activations, *(a for a, _ in sites.gates if id(a) not in listed)]:
        plain: Callable[[Tensor], Tensor] = type(act).forward.__get__(act)

        def detached(x: Tensor, plain: Callable[[Tensor], Tensor] = plain) -> Tensor:
            return plain(x.detach())

        def identity_rule(x: Tensor, plain: Callable[[Tensor], Tensor] = plain) -> Tensor:
            return IdentityRule.apply(x, plain)

        forwards[act] = detached if rule == "cp_lrp" and id(act) in gate_acts else identity_rule
    hooks = [consumer.register_forward_pre_hook(_halve_input) for _, consumer in sites.gates] if rule == "attnlrp" else []
    token = _RULE.set(rule)
    try:
        with replaced_forwards(forwards):
            yield
    finally:
        _RULE.reset(token)
        for hook in hooks:
            hook.remove()
