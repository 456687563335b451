"""Upper bounds on the options that size the work, checked before anything is allocated or loaded.

One place knows what an option costs: each check estimates the memory the value asks for, from the
value and what is known before the model is loaded, and refuses a value the machine cannot hold in one
line that gives the estimate and the limit (exit 2). Counts that size the time (epochs, optimiser steps,
random orders, curve points, permutations...) are bounded by :func:`check_time`: the model passes they ask
for at the least, times the fastest pass there is (:data:`PASS_SECONDS`), against :data:`MAX_HOURS_ENV`. The checks are called where the values enter:
every test's options (:func:`attnaudit.experiments.experiment.make_options`: ``run``, ``--set``, sweeps),
``explain`` (``--steps``), model construction (:func:`attnaudit.models.build_model`) and the Ray engine
(workers).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from attnaudit.errors import AttnAuditError

SHARE = 0.5
"""The share of the memory available now that one allocation may ask for: the rest is the model,
the data and everything else the process and the machine hold."""
TRAINING_BYTES = 16
"""Bytes a float32 parameter costs in training: the weight, its gradient and Adam's two moments."""


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``; the physical memory where the kernel does not say)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def size(n: float) -> str:
    """``n`` bytes for a person: ``74.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_memory(option: str, value: Any, need: float, what: str, fix: str, share: float = SHARE) -> None:
    """Refuse ``option`` = ``value`` when ``need`` bytes (``what`` they hold) exceed ``share`` of the memory available."""
    limit = share * available_memory()
    if need > limit:
        raise AttnAuditError(
            f"{option} {value}: needs about {size(need)} of memory ({what}); {size(limit)} is the limit here "
            f"({share:.0%} of the {size(available_memory())} available): {fix}"
        )


PASS_SECONDS = 1e-4
"""Seconds one model pass (a forward, or a forward and backward step) takes at the fastest: below the smallest model's
pass on one example (a BiLSTM with embeddings and states of 4: 0.3 ms forward, 0.9 ms a training step on this project's
CPU, tests/reliability/test_time_bounds.py ``test_the_pass_floor_is_below_the_fastest_pass``); any real model on any
machine is slower, so a time estimate made with it is a lower bound and refuses no work that would really finish in time."""
MAX_HOURS_ENV = "ATTNAUDIT_MAX_HOURS"
"""The environment variable that sets the time limit in hours (one place for every command)."""
MAX_HOURS = 24.0
"""The default time limit: work estimated at more than a day (at :data:`PASS_SECONDS` a pass) is refused before it starts."""


def max_seconds() -> float:
    """The time limit: ``$ATTNAUDIT_MAX_HOURS`` hours (a positive number), else :data:`MAX_HOURS`."""
    raw = os.environ.get(MAX_HOURS_ENV, "").strip()
    if not raw:
        return MAX_HOURS * 3600
    try:
        hours = float(raw)
    except ValueError:
        hours = math.nan
    if not 0 < hours < math.inf:
        raise AttnAuditError(f"{MAX_HOURS_ENV}={raw!r}: give the time limit in hours, a number above 0 (e.g. 72)")
    return hours * 3600


def duration(seconds: float) -> str:
    """``seconds`` for a person: ``2.5 days``, ``3.0 h``, ``12 min``, ``40 s``."""
    for unit, length in (("years", 365 * 86400.0), ("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= length:
            return f"{seconds / length:,.1f} {unit}"
    return f"{seconds:.0f} s"


def check_time(option: str, value: Any, passes: float, what: str, fix: str) -> None:
    """Refuse ``option`` = ``value`` when the ``passes`` (``what`` they are) take longer than the time limit at
    :data:`PASS_SECONDS` each: the one line says the estimate, the limit and how to raise it."""
    need, limit = float(passes) * PASS_SECONDS, max_seconds()
    if need > limit:
        raise AttnAuditError(
            f"{option} {value}: at least {duration(need)} of work ({float(passes):,.0f} model passes: {what}, "
            f"{PASS_SECONDS * 1000:g} ms each at the fastest); {duration(limit)} is the limit "
            f"({MAX_HOURS_ENV}=HOURS raises it): {fix}"
        )


def count(value: Any) -> int:
    """``value`` when it is a positive int (a count to bound), else 0 (the option's own check refuses it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def epochs(value: Any, option: str = "--epochs") -> None:
    """Training ``epochs``: one optimiser step per epoch at the least (one batch)."""
    if count(value):
        check_time(option, value, count(value), "one training step per epoch at the least", "give fewer epochs")


def ig_steps(steps: int, option: str = "--steps") -> None:
    """Integrated Gradients' ``steps``: Captum places them at Gauss–Legendre nodes, which numpy's ``leggauss``
    finds as the eigenvalues of an ``steps × steps`` float64 matrix (8·steps² bytes: 74.5 GiB at 100,000)."""
    if isinstance(steps, int) and steps > 0:
        largest = int(math.sqrt(SHARE * available_memory() / 8))
        check_memory(option, steps, 8.0 * steps * steps, "Integrated Gradients' Gauss-Legendre nodes, a steps x steps matrix",
                     f"give at most {largest:,} (20-50 steps are the usual choice)")
        check_time(option, steps, steps, "one gradient per step for each instance", "20-50 steps are the usual choice")


def permutations(count: int, batch_size: int, option: str = "--permutations") -> None:
    """The permutation test keeps, per batch, each instance's output change and flip for every permutation
    (two float64 per instance and permutation)."""
    if isinstance(count, int) and isinstance(batch_size, int) and count > 0 and batch_size > 0:
        check_memory(option, count, 16.0 * count * batch_size, f"two numbers per permutation for each of a batch's {batch_size} instances",
                     "give fewer permutations (the published test uses 100) or a smaller --batch-size")
        check_time(option, count, count, "one pass per permutation for each batch", "give fewer permutations (the published test uses 100)")


BPE_ENTRY_BYTES = 66
"""Bytes the Hugging Face BPE trainer reserves per vocabulary entry before it reads a word (its hash tables:
``--source-vocab 2147483648`` asked for 141.7 GB and aborted the interpreter)."""


def bpe_vocabulary(entries: int, width: int, option: str) -> None:
    """A BPE vocabulary of ``entries``: the trainer's tables, then an embedding (and output) row of ``width`` per entry in training."""
    if isinstance(entries, int) and entries > 0:
        rows = TRAINING_BYTES * 2 * max(width, 1) if isinstance(width, int) else 0
        check_memory(option, entries, float(entries) * (BPE_ENTRY_BYTES + rows),
                     f"the BPE trainer's tables and two embedding rows of width {width} per entry in training",
                     "give a smaller vocabulary (8,000 is the default)")


def model_parameters(make: Callable[[], Any], what: str) -> int:
    """Build ``make()`` on PyTorch's ``meta`` device (shapes, no memory), count its parameters and refuse a model
    whose training would not fit (:data:`TRAINING_BYTES` a parameter); the count. The random state is untouched."""
    import torch

    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            module = make()
    except AttnAuditError:
        raise
    except Exception as exc:  # noqa: BLE001 - a family whose construction needs real tensors: its real build reports any fault
        if "overflow" in str(exc).lower():  # a size past what torch can address (--hidden-dim 2147483648): never buildable
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise AttnAuditError(f"model size: {what} with these sizes is past what torch can address ({first}); "
                                 "choose smaller sizes (--hidden-dim, --embed-dim, --d-model, --layers)") from exc
        return -1
    count = sum(p.numel() for p in module.parameters())
    check_memory("model size", f"{count:,} parameters", float(TRAINING_BYTES * count),
                 f"{what}: weights, gradients and Adam's two moments in float32",
                 "choose smaller sizes (--hidden-dim, --embed-dim, --d-model, --layers)")
    return count


def cores() -> int:
    """The CPU cores this process may run on (its affinity: a container or ``taskset`` limits them below
    ``os.cpu_count()``, the machine's count, which Ray and a process pool would otherwise fill)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def workers(count: int, offered: int | None = None, option: str = "--workers") -> None:
    """Refuse more workers than the machine (or the cluster, ``offered``) has CPU cores for."""
    cores_here = offered if offered is not None else cores()
    if count > cores_here:
        where = "in the cluster" if offered is not None else "here"
        raise AttnAuditError(f"{option} {count}: only {cores_here} CPU core(s) {where}; give at most {cores_here}")


def adversaries(count: int, batch_size: int, option: str = "--adversaries") -> None:
    """The adversarial search keeps, for each instance of a batch, ``count`` attention logits per key with
    their gradient and Adam's two moments: 16 bytes per adversary and instance at the least (one key, one
    head; 2,147,483,648 asked torch for 64 GiB)."""
    if isinstance(count, int) and isinstance(batch_size, int) and count > 0 and batch_size > 0:
        check_memory(option, count, 16.0 * count * batch_size,
                     f"at least four numbers per adversary for each of a batch's {batch_size} instances",
                     "give fewer adversaries (the published test uses 5) or a smaller --batch-size")


def resamples(count: int, option: str = "--resamples") -> None:
    """A percentile bootstrap draws every resample at once (scipy): an index and a value, 16 bytes, per
    resample and instance, and an interval needs two instances at the least (2147483648 asked numpy for 64 GiB)."""
    if isinstance(count, int) and count > 0:
        check_memory(option, count, 32.0 * count, "scipy's bootstrap: an index and a value per resample for each of at least two instances",
                     "give fewer resamples (1,000 is the default)")


def seeds(values: Any) -> None:
    """Every seed of a test's ``--seeds`` in range before any sub-run trains (``run diagnostic --seeds -1``
    trained the base sub-run, then refused the seed, leaving the sub-run in --out)."""
    from attnaudit.options import check_seed

    for seed in values if isinstance(values, (list, tuple)) else [values]:
        check_seed(seed, "--seeds")


def histogram_bins(bins: int, option: str = "--bins") -> None:
    """A histogram's ``bins``: its edges and counts, two float64 arrays of about ``bins`` each (sanity's eMPRT entropy)."""
    if isinstance(bins, int) and not isinstance(bins, bool) and bins > 0:
        check_memory(option, bins, 16.0 * (bins + 1), "a histogram's edges and counts", "give fewer bins (Quantus' default is 100)")


def per_instance(option: str, value: Any, what: str, fix: str) -> None:
    """A count of model passes per instance (random orders, curve points, repeats...): one instance at the least."""
    if count(value):
        check_time(option, value, count(value), what, fix)


TEST_OPTIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "epochs": lambda values: epochs(values["epochs"]),
    "steps": lambda values: per_instance("--steps", values["steps"], "one optimiser step per step for each batch",
                                         "give fewer steps (the published test uses 500)"),
    "adversary_steps": lambda values: per_instance("--adversary-steps", values["adversary_steps"], "one optimiser step per step for each batch",
                                                   "give fewer steps (100 is the default)"),
    "random_orders": lambda values: per_instance("--random-orders", values["random_orders"], "one erasure pass per order for each instance",
                                                 "give fewer orders (5 is the default)"),
    "curve_steps": lambda values: per_instance("--curve-steps", values["curve_steps"], "one pass per curve point for each instance",
                                               "give fewer points (10 is the default)"),
    "repeats": lambda values: per_instance("--repeats", values["repeats"], "one pass per repeat for each batch",
                                           "give fewer repeats (5 is the default)"),
    "bins": lambda values: histogram_bins(values["bins"]),  # an int (sanity's); faithfulness' bins are a list of percents
    "adversaries": lambda values: adversaries(values["adversaries"], int(values.get("batch_size") or 1)),
    "ig_steps": lambda values: ig_steps(values["ig_steps"], "--ig-steps"),
    "seeds": lambda values: seeds(values["seeds"]),
    "resamples": lambda values: resamples(values["resamples"]),
    "permutations": lambda values: permutations(values["permutations"], int(values.get("batch_size") or 1)),
}
"""A test option's bound by its name, given every option value of the test (defaults filled in)."""


def check_test_options(values: dict[str, Any]) -> None:
    """Every bounded option among a test's option ``values`` (all of them, defaults included)."""
    for name, check in TEST_OPTIONS.items():
        if name in values and values[name] is not None:
            check(values)


MAX_EVALUATIONS = 10**8
"""Perturbed inputs one instance may ask the model to run (a perturbation explainer's samples times its features):
past it the work, not the memory, is what no machine finishes."""


def perturbation_samples(samples: int, features: int = 1, regression: bool = False, option: str = "--samples") -> None:
    """A perturbation explainer's ``samples`` for an instance of ``features`` groups: at least 1; the coalitions of one
    instance (a float64 row of ``features + 2`` numbers per sample for the linear fit of ``lime``/``kernel_shap``
    and its least-squares copy; Shapley sampling's permutations are evaluated in bounded chunks) within memory;
    at most :data:`MAX_EVALUATIONS` model evaluations (``samples`` × ``features`` for Shapley sampling)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise AttnAuditError(f"{option} must be a whole number of at least 1, got {samples}")
    features = max(int(features), 1)
    if regression:
        check_memory(option, samples, 3 * 8.0 * samples * (features + 2),
                     f"the linear fit's {features + 2} float64 numbers per sample, copied for least squares",
                     "give fewer samples (a few hundred is usual) or fewer features (--segments)")
    evaluations = samples * (1 if regression else features)
    if evaluations > MAX_EVALUATIONS:
        raise AttnAuditError(f"{option} {samples}: {evaluations:,} model evaluations per instance; at most {MAX_EVALUATIONS:,} are run: "
                             "give fewer samples")


def occlusion_window(window: int, stride: int) -> None:
    """Occlusion's ``window`` and ``stride`` (in features): each at least 1, the stride at most the window (Captum's
    rule: a larger step would leave features no window covers)."""
    for name, value in (("--window", window), ("--stride", stride)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AttnAuditError(f"{name} must be a whole number of at least 1, got {value}")
    if stride > window:
        raise AttnAuditError(f"--stride {stride} is larger than --window {window}: features between windows would be left out; "
                             "give a stride of at most the window")


OCCLUSION_WINDOW = 3
"""Occlusion's window (in features) unless one is given; its stride is 1."""


def check_method_options(values: dict[str, Any]) -> None:
    """Every bounded option among the options offered to the explanation methods (``samples``; occlusion's
    ``window`` and ``stride``, the other taking its default), before the model loads."""
    if values.get("samples") is not None:
        perturbation_samples(values["samples"])
    if values.get("window") is not None or values.get("stride") is not None:
        window, stride = values.get("window"), values.get("stride")
        occlusion_window(OCCLUSION_WINDOW if window is None else window, 1 if stride is None else stride)
