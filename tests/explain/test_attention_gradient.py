"""∂ŷ/∂α and α·∂ŷ/∂α on the explained layer against central finite differences."""

from __future__ import annotations

import pytest
import torch

from attnaudit.explain.methods.attention import attention_importance
from attnaudit.explain.methods.attention_gradient import attention_gradient, gradient_times_attention
from attnaudit.models import freeze_to


@pytest.mark.parametrize("family", ["bilstm", "han"])
def test_attention_gradient_matches_finite_differences(runs: dict, family: str) -> None:
    """∂ŷ/∂α on the explained layer against central differences of ŷ under frozen attention."""
    run, batch = runs[family]
    model = run.model.eval()
    layer = model.explained_layer
    grad = attention_gradient(run, batch)
    with torch.no_grad():
        out = model(batch)
        alpha = out.trace[layer].weights.double()
        pred = out.probs.argmax(-1, keepdim=True)
    model.double()
    try:
        eps = 1e-4
        for item in (0, 1):
            bump = torch.zeros_like(alpha)
            bump[..., item] = eps
            with torch.no_grad():
                up = model(batch, [freeze_to(alpha + bump, layer)]).probs.gather(1, pred)[:, 0]
                down = model(batch, [freeze_to(alpha - bump, layer)]).probs.gather(1, pred)[:, 0]
            torch.testing.assert_close(grad[:-1, item].double(), ((up - down) / (2 * eps))[:-1], atol=1e-5, rtol=1e-3)
    finally:
        model.float()
    torch.testing.assert_close(gradient_times_attention(model, batch), attention_importance(run, batch) * grad)
