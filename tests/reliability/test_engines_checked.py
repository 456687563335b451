"""Engines and placements are checked before any work: a Ray address that is malformed or where nothing answers,
a device map or memory budget naming a device this machine lacks, a device map naming a module the model lacks.
Each is one line (exit 2 through the CLI), before a model is loaded or a test runs, and leaves no folder."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnaudit.cluster import PROBE_SECONDS, check_address, check_engine
from attnaudit.errors import AttnAuditError
from attnaudit.hf import load_hf
from attnaudit.run import Run

from .helpers import assert_clean_failure, cli


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("address", ["not-an-address", "127.0.0.1", "ray://127.0.0.1:99999", ":6379", "host:port"])
def test_a_malformed_ray_address_is_one_line(address: str) -> None:
    with pytest.raises(AttnAuditError, match=r"is not host:port \(e\.g\. 127\.0\.0\.1:6379\), ray://host:port or auto"):
        check_address(address)


def test_a_ray_address_where_nothing_answers_is_refused_within_the_probe() -> None:
    address = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(AttnAuditError, match=rf"--address {address}: no Ray cluster answers there"):
        check_engine("ray", None, address)
    assert time.monotonic() - start < PROBE_SECONDS + 2  # Ray's own connection retries took over 200 s


def test_a_ray_address_that_answers_passes_the_probe() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_address(f"127.0.0.1:{server.getsockname()[1]}")
        check_address(f"ray://127.0.0.1:{server.getsockname()[1]}")
    check_address("auto")  # Ray finds a running cluster itself


def test_the_audit_with_a_dead_address_writes_nothing(trained: Run, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    proc = cli("audit", "--run", trained.path, "--engine", "ray", "--address", f"127.0.0.1:{closed_port()}", "--only", "importance", "--out", out)
    assert_clean_failure(proc, "--address", out=out)
    assert not out.exists()  # no lock, no audit.json, no report


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="a machine without GPUs")
@pytest.mark.parametrize(("mapping", "memory"), [({"": "cuda:0"}, None), ({"": "tpu"}, None), ({"": 9}, None), ({"": "cpu"}, "0=1GiB")],
                         ids=["cuda", "tpu", "index", "max-memory"])
def test_a_device_this_machine_lacks_is_refused_before_loading(mapping: dict, memory: str | None, tiny_hf: SimpleNamespace,
                                                              tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps(mapping), encoding="utf-8")
    with pytest.raises(AttnAuditError, match=r"which this machine does not have \(no GPU\); use cpu, disk"):
        load_hf(tiny_hf.dir, device_map=str(path), max_memory=memory)
    assert not list(tmp_path.glob("attnaudit-offload-*"))


def test_a_device_map_naming_a_module_the_model_lacks_is_refused(tiny_hf: SimpleNamespace, tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"nothing.here": "cpu"}), encoding="utf-8")
    with pytest.raises(AttnAuditError, match=r"names module 'nothing\.here', which .* does not have; its top-level modules: bert, classifier"):
        load_hf(tiny_hf.dir, device_map=str(path))
    path.write_text(json.dumps({"bert": "cpu", "classifier": "cpu", "dropout": "cpu"}), encoding="utf-8")
    assert load_hf(tiny_hf.dir, device_map=str(path)).model is not None
