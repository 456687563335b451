"""One command that answers "is this model's attention faithful?": every applicable test, one report.

``audit`` trains the model when needed (into ``OUT/run``), runs every registered test that
applies to it, cheap tests first, and writes

* ``OUT/results/<test>.json`` (+ CSV and figures) — each stored atomically as soon as the
  test finishes, with a hash of its options in ``meta["audit"]``;
* ``OUT/results/heatmaps.json`` — per-instance explanations for the report's heatmaps;
* ``OUT/summary.csv`` — one row per verdict statistic (test, statistic, value, published,
  interpretation), plus a row per skipped or failed test (rewritten by ``attnaudit report``);
* ``OUT/audit.json`` — what ran, what was skipped and why, errors;
* ``OUT/report.html`` — the self-contained report (:mod:`attnaudit.report`).
* ``OUT/shards/<test>/<k>.json`` — with ``--engine ray``, a test's finished shards until its result is stored
  (:mod:`attnaudit.shards`).

Re-running resumes: a stored result is loaded, not rerun, only when it names the same test
and its ``meta["fingerprint"]`` (:func:`~attnaudit.experiments.runner.fingerprint`: options,
split, limit, seed, the run's identity and weights, its data files, the package version)
recomputes to the same hash; any other stored result is recomputed, and the status line and
``audit.json`` say why. Every test starts from the same model weights and seed, so a resumed
audit ends with the numbers of an uninterrupted one. A failing test is recorded and the
others still run. The audited run directory is only read: the training-based tests' sub-runs
are written to ``OUT/subruns`` (earlier finished ones under ``RUN/subruns`` are reused), and
temporary files a killed audit left in ``OUT`` are removed when the next one starts.
"""

from __future__ import annotations

import time
import traceback
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import torch

from attnaudit.cluster import check_engine
from attnaudit.data.segments import check_unit
from attnaudit.data.subsets import check_order, describe
from attnaudit.errors import AttnAuditError, error_line, os_error_line, spelled, storage_full, unknown
from attnaudit.experiments.experiment import Experiment, Result, discover
from attnaudit.experiments.runner import fingerprint, make_options, run_test
from attnaudit.explain.helpers.segments import segment_unit, segmented
from attnaudit.explain.registry import Memo, memoised
from attnaudit.io import atomic_write_json, refuse_inside, remove_stray_tmp, writes_folder
from attnaudit.options import check_max_length, check_seed, parse_assignment
from attnaudit.progress import status
from attnaudit.report import build_report
from attnaudit.report.explorer import EXPLORE
from attnaudit.report.paradigms import PARADIGM_TESTS, disagreement, paradigm_rows
from attnaudit.report.summary import AUDIT, order_tests, summary_rows
from attnaudit.run import Run
from attnaudit.shards import Sharded, Source, engine_for

RESULTS = "results"
SHARDS = "shards"


@dataclass
class AuditResult:
    """What an audit produced: results by test, skips and failures with reasons, summary rows, report."""

    out: Path
    results: dict[str, Result] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    report: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.failed


def parse_settings(items: typing.Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["permutation.permutations=20", ...]`` -> ``{"permutation": {"permutations": 20}}``, typed per Options."""
    registry = discover()
    settings: dict[str, dict[str, Any]] = {}
    for item in items:
        test, option, value = parse_assignment(item, registry)
        settings.setdefault(test, {})[option] = value
    return settings


def _load_target(
    out: Path,
    task: str | None,
    model: str | None,
    run: Run | str | Path | None,
    hf: str | None,
    data_dir: str | Path | None,
    device: str,
    seed: int,
    train_options: dict[str, Any],
    hf_options: dict[str, Any] | None = None,
) -> Run:
    """The run to audit: given, loaded, a Hugging Face encoder, or trained into ``out/run``."""
    from attnaudit.resolve import name_model

    exactly_one = "audit needs exactly one of: --run RUN, --hf MODEL --task T, or --task T --model M"
    if model is None:
        named = name_model(hf, run, exactly_one=exactly_one)  # a run or a Hugging Face model
        if train_options:
            raise AttnAuditError(f"training options ({', '.join(sorted(train_options))}) only apply with --task/--model")
        if run is not None and task:  # as `run TEST RUN --task` refuses it: the task was once silently ignored
            raise AttnAuditError("--task applies with --hf or --model; a run directory is audited on the task it was trained on")
        if hf is not None and not task:
            raise AttnAuditError("--hf needs --task (the data to audit on)")
        return name_model(source=named, task=task if hf is not None else None, **(hf_options or {})).load(device, data_dir)
    if run is not None or hf is not None:
        raise AttnAuditError(exactly_one)
    if not task:
        raise AttnAuditError("--model needs --task (the data to train on)")
    from attnaudit.training.trainer import train

    options = {"seed": seed, **train_options}
    return train(task, str(model), out / "run", data_dir=data_dir, device=device, **options)


def _source(target: Run, hf: str | None, task: str | None, data_dir: str | Path | None, device: str,
            hf_options: dict[str, Any], segments: str | None = None) -> Source | None:
    """What a Ray worker loads to audit ``target`` (None when it is no saved run nor a Hugging Face model), its batches
    segmented by ``segments`` as the driver's are."""
    folder = str(target.subruns)
    data = str(data_dir) if data_dir else None
    if hf is not None:
        return Source(folder, hf=hf, task=task, data_dir=data, device=device, hf_options=hf_options, segments=segments)
    return Source(folder, run=str(target.path), data_dir=data, device=device, segments=segments) if target.path else None


def _plan(
    only: typing.Sequence[str] | None,
    skip: typing.Sequence[str] | None,
    test_options: dict[str, dict[str, Any]],
    decoder: bool = False,
) -> tuple[list[str], dict[str, Any]]:
    """Selected tests in order and their Options objects; rejects unknown names and options up front.

    ``decoder``: the audited model is a decoder-only LLM, whose tests take their ``settings.decoder_options``."""
    registry = discover()
    only = [_test_name("--only", n, registry) for n in only or ()]
    skip = [_test_name("--skip", n, registry) for n in skip or ()]
    test_options = {_test_name("--set", n, registry): v for n, v in test_options.items()}
    selected = [n for n in registry if (not only or n in only) and n not in skip]
    if not selected:
        raise AttnAuditError(f"no test left to run: --skip removes every test --only names ({', '.join(only)})")
    options = {}
    for name in selected:
        experiment = registry[name]()
        known = {f.name for f in fields(experiment.Options)}
        defaults = {**experiment.settings.options, **(experiment.settings.decoder_options if decoder else {})}
        values = {k: v for k, v in defaults.items() if k in known}
        values.update(test_options.get(name, {}))
        options[name] = make_options(experiment, values)
    return order_tests(selected), options


def _test_name(option: str, name: str, registry: typing.Iterable[str]) -> str:
    """A test's registered name (``-``/``_`` alike), or one line naming ``option`` and the closest test."""
    found = spelled(name, registry)
    if found is None:
        raise AttnAuditError(f"{option}: {unknown('test', name, registry)}")
    return found


def _refuse_unused_settings(target: Run, order: list[str], test_options: dict[str, dict[str, Any]]) -> None:
    """A ``--set`` for a test that is not selected, or is skipped on this model, would be silently
    ignored: refuse it (before any test runs)."""
    registry = discover()
    unselected = [name for name in test_options if name not in order]
    if unselected:
        raise AttnAuditError(f"--set: test(s) {', '.join(unselected)} not selected by --only/--skip; drop the --set or select the test")
    for name in test_options:
        reason = skip_reason(registry[name](), target)
        if reason:
            raise AttnAuditError(f"--set {name}.*: test {name!r} does not run on this {target.family} model ({reason})")


def _run_tests(
    order: list[str], options: dict[str, Any], target: Run, results_dir: Path, outcome: AuditResult,
    settings: dict[str, Any], memo: Memo,
) -> tuple[list[dict[str, Any]], tuple[str, OSError] | None]:
    """Run the tests in ``order``, each from the trained weights, sharing explanation scores in
    ``memo`` (:func:`~attnaudit.explain.registry.memoised`); the log, and the test whose result a full
    disk lost (the audit stops there)."""
    # weights offloaded by --device-map (meta tensors here) are read from their files at every pass: nothing to restore
    snapshot = {k: v.detach().clone() for k, v in target.model.state_dict().items() if v.device.type != "meta"}
    log: list[dict[str, Any]] = []
    lost: tuple[str, OSError] | None = None
    for number, name in enumerate(order, 1):
        target.model.eval()
        prefix = f"[{number}/{len(order)}] {name}"
        entry, full = _run_one(name, prefix, options[name], target, results_dir, outcome, **settings)
        log.append(entry)
        current = target.model.state_dict()
        if any(not torch.equal(current[k], v) for k, v in snapshot.items()):
            target.model.load_state_dict(snapshot, strict=False)  # every test starts from the trained weights (all kept in memory)
            memo.clear()  # scores of the changed weights
        if full is not None:  # a full disk: no later result could be stored either
            lost = (name, full)
            break
    target.model.eval()
    return log, lost


def skip_reason(experiment: Experiment, target: Run) -> str | None:
    """Why the audit skips ``experiment`` on ``target`` (None when it runs)."""
    if experiment.settings.transformers_only and not target.model.self_attention:
        return "the audit runs the activation and key tests on Transformers only"
    return experiment.why_not(target)


def runnable_tests(target: Run) -> list[str]:
    """The registered tests an audit of ``target`` runs (the rest it skips, saying why)."""
    return [name for name, cls in discover().items() if skip_reason(cls(), target) is None]


def _reusable(path: Path, name: str, expected: str) -> tuple[Result | None, str]:
    """The stored result of test ``name`` at ``path`` if its fingerprint hash is ``expected``;
    else None and why it is not reused ("" when there is none)."""
    if not path.exists():
        return None, ""
    try:
        result = Result.load(path)
    except AttnAuditError:
        return None, "stored result unreadable"
    if result.test != name:
        return None, f"stored result is of test {result.test!r}"
    stamp = result.meta.get("fingerprint")
    if not isinstance(stamp, dict) or stamp.get("hash") != expected:
        return None, "stored result was computed with other options, data, model or version"
    return result, ""


def audited_line(target: Run, split: str, limit: int | None, data_dir: str | Path | None, order: str, seed: int) -> str:
    """What the audit tests, said before the work starts: how many of the split's instances, chosen how, and where
    the split is a share held out of the user's file, that ``--split all`` audits every row (a model loaded by
    ``--hf`` was not trained on them)."""
    full = target.examples(split, None, data_dir=data_dir)
    chosen = target.examples(split, limit, data_dir=data_dir, seed=seed, order=order)
    subset = describe(split, full, chosen, limit, order, seed)
    which = "every split (train, dev and test)" if split == "all" else f"the {split} split"
    line = f"audited: {which}, {subset['n']} of its {subset['of']} instances ({subset['chosen']})"
    held_out = split in ("dev", "test") and any("split off" in note and split in note for note in target.data(data_dir).notes)
    if held_out and target.path is None:
        total = len(target.examples("all", None, data_dir=data_dir))
        line += f"; the {split} split is 10 % of the data ({total} instances): --split all audits every one"
    return line


@writes_folder("out")
def audit(
    out: str | Path,
    task: str | None = None,
    model: str | None = None,
    run: Run | str | Path | None = None,
    hf: str | None = None,
    only: typing.Sequence[str] | None = None,
    skip: typing.Sequence[str] | None = None,
    split: str = "test",
    limit: int | None = None,
    seed: int = 0,
    data_dir: str | Path | None = None,
    device: str = "auto",
    test_options: dict[str, dict[str, Any]] | None = None,
    heatmap_instances: int = 3,
    explore: int = EXPLORE,
    figures: bool = True,
    strict_options: bool = False,
    prompt: str | None = None,
    verbalizer: str | dict[str, str] | None = None,
    max_length: int | None = None,
    dtype: str | None = None,
    device_map: str | None = None,
    max_memory: str | None = None,
    chat: bool | None = None,
    system: str | None = None,
    items: str | None = None,
    limit_order: str = "stratified",
    engine: str = "local",
    workers: int | None = None,
    address: str | None = None,
    shard_size: int | None = None,
    segments: str | None = None,
    **train_options: Any,
) -> AuditResult:
    """Audit a model's attention with every applicable test and write ``out/report.html``.

    The model is ``run`` (a Run or run directory), ``hf`` (a Hugging Face encoder on
    ``task``), or trained now from ``task`` and ``model`` with ``train_options`` (the options
    of ``attnaudit train``) into ``out/run``. ``test_options`` overrides options per test,
    e.g. ``{"permutation": {"permutations": 20}}``. ``heatmap_instances``: the report shows
    this many most and this many least faithful instances (by τ(attention, gradient) when
    the importance test ran; else the first ``2 × heatmap_instances``). ``explore``: instances in
    the report's explorer (the first ones tested; 0: none). ``figures=False``
    skips the tests' plots (much faster on a busy CPU; the report then has tables only).
    ``strict_options`` refuses ``test_options`` for tests that will not run (the CLI's ``--set``;
    a preset shared by several audits, such as the demo's, may name more tests).
    ``prompt``/``verbalizer``: zero-shot classification with an ``hf`` causal LM (see :func:`load_hf`);
    ``max_length``: keep at most that many tokens of each text; ``dtype``: a decoder's parameter dtype
    (``float32`` or ``bfloat16``); ``device_map``/``max_memory``: its layers spread over devices, the CPU and disk
    (:func:`~attnaudit.hf.load_hf`); ``chat``/``system``/``items``: the prompt rendered by the tokenizer's chat template
    (:mod:`attnaudit.models.hf.chat`); all with ``hf`` only. ``limit``: audit that many examples of the split,
    a sample stratified by label drawn with ``seed`` (``limit_order="first"``: the first ones).
    ``engine="ray"``: the tests on ``workers`` Ray workers (the cluster at ``address``, else a local Ray),
    shardable tests in checkpointed shards of ``shard_size`` instances (:mod:`attnaudit.shards`; with
    ``engine="local"`` a ``shard_size`` computes the same shards in this process). ``segments``: the features every
    test's explanations and erasures and the report's heatmaps work with (``word``, ``sentence``, ...;
    :func:`~attnaudit.explain.helpers.segments.segmented`).
    """
    out = Path(out)
    check_seed(seed)
    if limit is not None and limit < 1:
        raise AttnAuditError(f"--limit must be at least 1, got {limit}")
    check_order(limit_order)
    if heatmap_instances < 0:
        raise AttnAuditError(f"--heatmaps must be >= 0, got {heatmap_instances}")
    if explore < 0:
        raise AttnAuditError(f"--explore must be >= 0, got {explore}")
    check_engine(engine, workers, address)
    if segments is not None:
        check_unit(segments)
    train_options = {k: v for k, v in train_options.items() if v is not None}
    order, options = _plan(only, skip, test_options or {})
    named = {"prompt": prompt, "verbalizer": verbalizer, "max_length": check_max_length(max_length), "dtype": dtype,
             "device_map": device_map, "max_memory": max_memory, "chat": chat or None, "system": system, "items": items}
    hf_options = {k: v for k, v in named.items() if v is not None}
    if hf_options and hf is None:
        given = "/".join("--" + k.replace("_", "-") for k in hf_options)
        raise AttnAuditError(f"{given} appl{'ies' if len(hf_options) == 1 else 'y'} with --hf only")
    refuse_inside(out, run.path if isinstance(run, Run) else run)
    target = segmented(_load_target(out, task, model, run, hf, data_dir, device, seed, train_options, hf_options), segments)
    if target.model.causal:
        order, options = _plan(only, skip, test_options or {}, decoder=True)
    if not target.examples(split, limit, data_dir=data_dir):  # a bad --split fails here, not in every test
        raise AttnAuditError(f"split {split!r} has no examples")
    if strict_options:
        _refuse_unused_settings(target, order, test_options or {})
    results_dir = out / RESULTS
    for folder, below in ((out, False), (results_dir, False), (out / "subruns", True), (out / SHARDS, True)):
        remove_stray_tmp(folder, recursive=below)  # left by a killed audit
    target = replace(target, subruns=out / "subruns")  # the audited run directory is only read
    outcome = AuditResult(out=out)
    status(f"auditing {target.family} on {target.task.spec or 'its data'}: {len(order)} test(s) -> {out}")
    status(audited_line(target, split, limit, data_dir, limit_order, seed))
    source = _source(target, hf, task, data_dir, device, hf_options, segment_unit(target)) if engine == "ray" else None
    with engine_for(engine, source, out / SHARDS, workers, address, shard_size) as compute, memoised(target.model) as memo:
        settings = {"split": split, "limit": limit, "seed": seed, "figures": figures, "data_dir": data_dir,
                    "limit_order": limit_order, "compute": compute}
        log, lost = _run_tests(order, options, target, results_dir, outcome, settings, memo)
        outcome.rows = summary_rows(log, outcome.results)
        _write_record(out, target, log, outcome, lost, (heatmap_instances, explore), split=split, limit=limit, seed=seed,
                      data_dir=data_dir, limit_order=limit_order)
    if any(name in outcome.results for name in PARADIGM_TESTS):  # the report's side-by-side view, in one line
        status(disagreement(paradigm_rows(outcome.results)))
    status(f"report: [bold]{outcome.report}[/]" + (f"; [red]{len(outcome.failed)} test(s) failed[/]" if outcome.failed else ""))
    return outcome


def _run_one(
    name: str,
    prefix: str,
    opts: Any,
    target: Run,
    results_dir: Path,
    outcome: AuditResult,
    *,
    split: str,
    limit: int | None,
    seed: int,
    figures: bool,
    data_dir: str | Path | None,
    limit_order: str,
    compute: Sharded | None,
) -> tuple[dict[str, Any], OSError | None]:
    """One test of an audit: skipped (with the reason), reused from a stored result whose
    fingerprint matches, or run and saved. Its ``audit.json`` entry is returned; a failure is
    recorded in ``outcome`` and the audit goes on, except after a full disk, which is returned."""
    experiment = discover()[name]()
    entry: dict[str, Any] = {"test": name, "options": asdict(opts) if is_dataclass(opts) and not isinstance(opts, type) else {}}
    start = time.perf_counter()
    try:
        reason = skip_reason(experiment, target)
        if reason:
            outcome.skipped[name] = reason
            entry.update(status="skipped", reason=reason)
            status(f"{prefix}: [yellow]skipped[/] ({reason})")
            return entry, None
        stamp = fingerprint(name, target, opts, split=split, limit=limit, seed=seed, figures=figures, data_dir=data_dir,
                            limit_order=limit_order)
        cached, stale = _reusable(results_dir / f"{name}.json", name, stamp["hash"])
        if cached is not None:
            outcome.results[name] = cached
            entry.update(status="cached", seconds=cached.meta.get("seconds"))
            status(f"{prefix}: stored result reused")
            return entry, None
        if stale:
            entry["recomputed"] = stale
        # run_test seeds every test with `seed`
        status(f"{prefix}: " + (f"[yellow]stored result not reused[/] ({stale}), running" if stale else "running"))
        result = run_test(
            name, target, split=split, limit=limit, seed=seed, out=results_dir, data_dir=data_dir, plot=figures,
            limit_order=limit_order, compute=compute, **entry["options"]
        )
        result.meta["audit"] = {"options_hash": stamp["hash"]}
        result.save(results_dir)
        if compute is not None:
            compute.done(name)
        outcome.results[name] = result
        entry.update(status="done", seconds=round(time.perf_counter() - start, 3))
        status(f"{prefix}: [green]done[/] in {time.perf_counter() - start:.1f}s")
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one failing test must not stop the audit; it is reported
        full = storage_full(exc)
        message = f"result lost: {os_error_line(full)}" if full else error_line(exc)
        outcome.failed[name] = message
        entry.update(status="failed", error=message, traceback=traceback.format_exc(limit=8))
        status(f"{prefix}: [red]failed[/]: {message}")
        return entry, full
    return entry, None


def _write_record(
    out: Path,
    target: Run,
    log: list[dict[str, Any]],
    outcome: AuditResult,
    lost: tuple[str, OSError] | None,
    shown: tuple[int, int],
    *,
    split: str,
    limit: int | None,
    seed: int,
    data_dir: str | Path | None,
    limit_order: str,
) -> None:
    """``audit.json`` and the report; after a full disk, as much of them as fits, then one line
    naming the lost test (the finished results stay). ``shown``: heatmap and explorer instances."""
    record: dict[str, Any] = {
        "run": str(target.path) if target.path else None,
        "model": target.family,
        "task": target.task.spec,
        "hf": target.info.get("source") if target.family == "hf" else None,
        "architecture": target.config.extra.get("hf_type") or target.family,  # llama, bert, ...; bilstm, transformer
        "kind": getattr(target.model, "kind", None),  # a Hugging Face model's: encoder, decoder or encoder-decoder
        "zero_shot": bool(target.config.extra.get("zero_shot")),  # a decoder classifying by prompt and verbalizer
        **{key: target.info[key] for key in ("max_length", "dtype", "device_map", "chat") if key in target.info},  # how it was loaded
        "split": split,
        "limit": limit,
        "limit_order": limit_order,
        "seed": seed,
        "data_dir": str(data_dir) if data_dir else None,
        **({"segments": unit} if (unit := segment_unit(target)) else {}),  # the report's views are rebuilt with them
        "tests": log,
    }
    try:
        atomic_write_json(out / AUDIT, record)
        outcome.report = build_report(out, run=target, split=split, limit=limit, data_dir=data_dir, instances=shown[0], explore=shown[1])
    except OSError:
        if lost is None:
            raise
    if lost is not None:
        name, error = lost
        report = "the report was updated" if outcome.report else "the report could not be rewritten (an earlier one is kept whole)"
        raise AttnAuditError(
            f"{os_error_line(error)}: the result of test {name!r} was lost and the audit stopped there; "
            f"{len(outcome.results)} finished result(s) are kept in {out / RESULTS}; {report}; "
            "free some space and rerun the same command to resume"
        )
