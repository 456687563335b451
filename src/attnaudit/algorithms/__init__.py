"""Algorithms on tensors and arrays, no models: rank, divergence and task metrics; attention graphs (rollout, flow)."""
