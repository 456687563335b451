"""``audit --segments`` on Ray workers: each worker loads the audited run with its collator segmenting as the
driver's does (``shards.Source.segments``), so a Ray audit with segments equals the one-process audit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnaudit.audit import audit
from attnaudit.data.types import Example
from attnaudit.explain.helpers.segments import segment_unit, segmented
from attnaudit.shards import Source
from tests.test_shards import ONE_BY_ONE, QUICK, _identical, run  # noqa: F401  (run: the module's fixture)


def test_a_worker_segments_as_the_driver_does(run, tmp_path: Path) -> None:  # noqa: F811
    loaded = Source(str(tmp_path / "subruns"), run=str(run.path), device="cpu", segments="sentence").load()
    assert segment_unit(loaded) == "sentence"
    words = run.examples("test", 1)[0].tokens[:4]
    text = f"{words[0]} {words[1]}. {words[2]} {words[3]}."
    example = Example(tokens=text.split(), meta={"text": text})
    theirs, ours = loaded.collate([example]), segmented(run, "sentence").collate([example])
    assert theirs.segments is not None and ours.segments is not None
    assert torch.equal(theirs.segments, ours.segments) and theirs.segments[0].tolist() == [0, 0, 1, 1]
    assert segment_unit(Source(str(tmp_path / "subruns"), run=str(run.path), device="cpu").load()) is None


@pytest.mark.slow  # starts a Ray cluster (~15 s), as tests/test_shards.py's Ray tests
def test_ray_workers_with_segments_give_the_same_summary(run, tmp_path: Path) -> None:  # noqa: F811
    ray = pytest.importorskip("ray")
    audit(tmp_path / "one", run=run, limit=6, test_options=ONE_BY_ONE, segments="word", **QUICK)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"num_workers_soft_limit": 2})
    try:
        result = audit(tmp_path / "ray", run=run, limit=6, test_options=ONE_BY_ONE, segments="word", engine="ray", workers=2, shard_size=3, **QUICK)
    finally:
        ray.shutdown()
    assert result.ok
    _identical(tmp_path / "one", tmp_path / "ray")
