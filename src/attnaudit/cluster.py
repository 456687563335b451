"""The Ray plumbing every ``--engine ray`` shares (the audit's shards, the sweep's jobs, ROAR's retrains): checking
the engine options before any work, connecting to a cluster or starting a local Ray bounded by the cores, waiting
on tasks in short waits (Ctrl-C gets through), cancelling them, and :func:`map_tasks`, one function over many
inputs as Ray tasks. Ray is imported only when an engine needs it (``pip install 'attnaudit[ray]'``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from attnaudit import bounds
from attnaudit.errors import AttnAuditError, error_line
from attnaudit.progress import is_quiet

ENGINES = ("local", "ray")
RAY_HINT = "pip install 'attnaudit[ray]'"


WAIT_SECONDS = 0.5
"""How long one ``ray.wait`` blocks: Ray's wait holds the main thread in its own code, where Python's Ctrl-C handler
cannot run; a short wait in a loop lets a KeyboardInterrupt through within this time (a sweep once ignored Ctrl-C
until its running job ended)."""


def wait_one(ray: Any, refs: list[Any]) -> list[Any]:
    """The refs of ``refs`` that are done, once at least one is (``ray.wait`` in short waits, see :data:`WAIT_SECONDS`)."""
    while True:
        done, _ = ray.wait(refs, num_returns=1, timeout=WAIT_SECONDS)
        if done:
            return list(done)


def import_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise AttnAuditError(f"--engine ray needs the ray package: {RAY_HINT}") from None
    return ray


def local_workers(workers: int | None) -> int:
    """The CPUs (and so at most the worker processes) of a local Ray: ``workers``, else one per core, never more
    than the cores (:func:`bounds.workers` refused more before)."""
    cores = bounds.cores()
    return min(workers or cores, cores)


def ray_logging() -> dict[str, Any]:
    """``ray.init``'s logging settings: Ray's INFO and WARNING lines ("Started a local Ray instance", its token notice)
    follow ``--quiet`` (only errors then); the workers' output never reaches the terminal (``log_to_driver``)."""
    import logging

    return {"log_to_driver": False, "logging_level": logging.ERROR if is_quiet() else logging.INFO}


def connect(ray: Any, address: str | None, workers: int | None) -> bool:
    """Connect to the Ray cluster at ``address``, or start a local Ray with ``workers`` CPUs (one per core by
    default, :func:`local_workers`) unless Ray is running in this process already; whether it was started here
    (then shut it down afterwards). A local Ray starts no more worker processes than its CPUs (Ray's soft limit)."""
    if ray.is_initialized():
        return False
    try:
        if address:
            ray.init(address=address, **ray_logging())
            if workers is not None:  # no more workers than the cluster has cores for
                bounds.workers(workers, offered=int(ray.cluster_resources().get("CPU", 0)) or 1)
        else:
            cpus = local_workers(workers)
            ray.init(num_cpus=cpus, include_dashboard=False, _system_config={"num_workers_soft_limit": cpus}, **ray_logging())
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise AttnAuditError(f"could not connect to Ray{f' at {address}' if address else ''}: {error_line(exc)}") from None
    return True


@contextmanager
def ray_session(address: str | None, workers: int | None) -> Iterator[Any]:
    """The ``ray`` module connected (:func:`connect`) for the block; shut down afterwards when started here."""
    ray = import_ray()
    started = connect(ray, address, workers)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def check_engine(engine: str, workers: int | None, address: str | None, pool: bool = False) -> None:
    """One line for an unknown engine, a worker count below 1, Ray options without Ray (``pool``: the local engine
    is a process pool, so ``--workers`` applies to it too), or no ray package."""
    if engine not in ENGINES:
        raise AttnAuditError(f"unknown engine {engine!r}; choose {' or '.join(ENGINES)}")
    if workers is not None and workers < 1:
        raise AttnAuditError(f"--workers must be at least 1, got {workers}")
    if workers is not None and not address:  # a local pool or Ray: no more workers than cores (a cluster's are its own)
        bounds.workers(workers)
    if engine != "ray" and address and pool:
        raise AttnAuditError("--address is for --engine ray")
    if engine != "ray" and (workers is not None or address) and not pool:
        raise AttnAuditError("--workers and --address are for --engine ray")
    if engine == "ray":
        if address:
            check_address(address)
        import_ray()


PROBE_SECONDS = 3.0
"""How long :func:`check_address` waits for a Ray head to accept a connection."""


def check_address(address: str) -> None:
    """A Ray ``--address`` (``host:port``, ``ray://host:port`` or ``auto``) parsed, and its host asked for a
    connection for at most :data:`PROBE_SECONDS`, before any work: one line, not Ray's retries and logs."""
    import socket

    if address == "auto":
        return
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AttnAuditError(f"--address {address!r} is not host:port (e.g. 127.0.0.1:6379), ray://host:port or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
    except OSError as exc:
        raise AttnAuditError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); "
                             "start one (ray start --head) or leave --address out for a local Ray") from None


def cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel Ray tasks now, the running ones by killing their worker (``force``): their checkpoints resume on the
    next run. A local Ray started here is shut down afterwards anyway; on a cluster this is what stops them."""
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001, S112 - a task that just finished or whose worker is gone: nothing to stop
            continue


def task_error(exc: Exception) -> Exception:
    """The task's own exception inside Ray's ``RayTaskError`` (whose message is Ray's header and the whole remote
    traceback, so its first line names only the task), else ``exc`` (a crashed worker has no other)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


def map_tasks(ray: Any, fn: Callable[..., Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any, Exception | None]]:
    """``fn(item)`` for every item as a Ray task (one CPU each, never retried) on the connected ``ray``; yields
    ``(item, result, None)``, or ``(item, None, error)`` when the task or its worker failed, as each one ends.
    Ctrl-C (or a caller that stops reading) cancels the tasks still pending."""
    remote = ray.remote(num_cpus=1, max_retries=0)(fn)
    pending = {remote.remote(item): item for item in items}
    try:
        while pending:
            for ref in wait_one(ray, list(pending)):
                item = pending.pop(ref)
                try:
                    yield item, ray.get(ref), None
                except Exception as exc:  # noqa: BLE001 - RayTaskError / WorkerCrashedError: reported with its item
                    yield item, None, task_error(exc)
    except BaseException:
        cancel(ray, list(pending))
        raise
