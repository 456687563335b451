"""A tiny audited Transformer whose test sentences hold hostile tokens, shared by the explorer tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from attnaudit.audit import audit
from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import TaskData
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train

HOSTILE = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>']


@pytest.fixture(scope="session")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """A two-layer, two-head Transformer whose test sentences hold the hostile tokens, audited with a few tests."""
    set_quiet(True)
    data = synthetic_task("classification", seed=0, n_train=80, n_dev=8, n_test=8)

    def inject(ex):
        tokens = list(ex.tokens)
        free = [i for i in range(len(tokens)) if i not in (ex.rationale or [])]
        tokens[free[0]], tokens[free[1]] = HOSTILE
        return replace(ex, tokens=tokens)

    data = TaskData(data.name, data.task_type, data.train, data.dev, [inject(e) for e in data.test], data.labels)
    root = tmp_path_factory.mktemp("explorer")
    run = train(data, "transformer", root / "run", epochs=1, embed_dim=8, d_model=8, heads=2, layers=2, d_ff=16, quiet_eval=True)
    result = audit(root / "audit", run=run, only=["importance", "permutation", "erasure", "adversarial"], limit=6, explore=4, figures=False,
                   test_options={"importance": {"methods": ["gradient"]}, "permutation": {"permutations": 3},
                                 "erasure": {"rankings": ["attention"], "random_orders": 1},
                                 "adversarial": {"adversaries": 1, "steps": 5, "report_epsilon": 0.5}})
    assert result.ok
    return run, root / "audit"
