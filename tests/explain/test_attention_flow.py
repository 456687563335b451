"""Attention flow read at the explanation query against the networkx max-flow reference."""

from __future__ import annotations

import torch

from attnaudit.algorithms.attention_graph import flow_networkx
from attnaudit.explain.methods.attention_flow import flow_importance
from attnaudit.explain.methods.attention_rollout import rollout_importance


def test_flow_equals_the_networkx_reference_at_the_query(runs: dict) -> None:
    run, batch = runs["transformer"]
    small = run.collate([batch.examples[0], batch.examples[-1], batch.examples[2]])
    ours = flow_importance(run, small)
    with torch.no_grad():
        trace = run.model.eval()(small).trace
    reference = flow_networkx(list(trace.weights), mask=small.mask.bool())[:, -1]  # (B, T, T): last layer
    real = small.mask.bool()
    expected = (reference * real[:, :, None]).sum(1) / real.sum(1, keepdim=True)  # mean over real query rows
    torch.testing.assert_close(ours, expected * real, atol=1e-5, rtol=1e-4)
    # flow and rollout are different maps of the same graph: both non-negative over the same items
    assert ((ours > 0) == (rollout_importance(run, small) > 0)).all()
