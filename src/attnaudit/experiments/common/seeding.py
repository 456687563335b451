"""Per-instance seeded generators: a test's draws for an instance depend only on the seed and the instance."""

from __future__ import annotations

import numpy as np
import torch


def seeded_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from ``keys`` (e.g. seed, instance index) through a SeedSequence.

    Distinct key tuples give independent streams, so an instance's draws depend neither on
    batching nor on the other instances.
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))
