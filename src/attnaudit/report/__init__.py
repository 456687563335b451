"""``attnaudit report DIR``: turn an audit folder (or a run's results) into ``DIR/report.html``.

It also rewrites ``DIR/summary.csv`` from the stored results, so both follow the current
verdict code.

``DIR`` is an audit output folder (``results/``, ``audit.json``), a run directory whose
``results/`` were written by ``attnaudit run``, or the folder given to ``attnaudit run --out``
(result JSON files directly in it). The heatmaps come from ``heatmaps.json`` beside the
results; when it is missing they are computed from the run (the audit's run, the run recorded
in the results, ``DIR/run``, or ``DIR`` itself) and saved there. The explorer's model data
(:mod:`attnaudit.report.explorer`) comes from ``explorer.json`` beside the results the same way.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnaudit.errors import AttnAuditError, InputError, warn
from attnaudit.experiments.experiment import Result, discover
from attnaudit.io import (
    JsonKinds,
    atomic_write_json,
    atomic_write_text,
    check_fields,
    read_json_object,
    writes_folder,
)
from attnaudit.report.explorer import (
    EXPLORE,
    EXPLORER,
    Explorer,
    explorer_payload,
    explorer_section,
    load_model_data,
    model_data,
)
from attnaudit.report.html import Section, render, subset_line
from attnaudit.report.summary import (
    AUDIT,
    SUMMARY,
    order_tests,
    summary_rows,
    write_summary,
)
from attnaudit.run import Run

RESULTS = "results"
HEATMAPS = "heatmaps.json"
REPORT = "report.html"
NOT_RESULTS = (HEATMAPS, AUDIT, EXPLORER)  # JSON files that sit beside results but are none


def _load_results(results_dir: Path) -> tuple[dict[str, Result], list[str]]:
    """Every ``<test>.json`` result in ``results_dir``; unreadable files become notes."""
    results, notes = {}, []
    for path in sorted(results_dir.glob("*.json")):
        if path.name in NOT_RESULTS:
            continue
        try:
            result = Result.load(path)
        except AttnAuditError as exc:
            notes.append(f"{path.name} skipped: {exc}")
            warn(f"{path}: skipped, not a readable result ({exc})")
            continue
        results[result.test] = result
    return results, notes


_TEXT = (str, type(None))
# The fields of audit.json and heatmaps.json the report reads, with their JSON types.
_AUDIT_FIELDS: dict[str, JsonKinds] = {
    "tests": list, "run": _TEXT, "hf": _TEXT, "model": _TEXT, "task": _TEXT, "split": _TEXT, "data_dir": _TEXT,
    "limit": (int, type(None)), "seed": (int, type(None)),
}
_AUDIT_ENTRY: dict[str, JsonKinds] = {"status": str, "reason": _TEXT, "error": _TEXT, "traceback": _TEXT}
_HEATMAP_FIELDS: dict[str, JsonKinds] = {"items": list, "scores": dict, "rationale": (list, type(None)), "tau": (float, type(None))}


def _read_audit(path: Path) -> dict[str, Any]:
    """``audit.json``, checked to have the shape the report reads (one-line error otherwise)."""
    info = read_json_object(path, optional=_AUDIT_FIELDS)
    for number, entry in enumerate(info.get("tests", [])):
        check_fields(path, entry, {"test": str}, _AUDIT_ENTRY, f"tests[{number}]")
    return info


def _read_heatmaps(path: Path) -> dict[str, Any]:
    """``heatmaps.json``, checked to have the shape the report draws (one-line error otherwise)."""
    data = read_json_object(path, {"instances": list}, {"selection": str, "note": str})
    for number, instance in enumerate(data["instances"]):
        where = f"instances[{number}]"
        check_fields(path, instance, optional=_HEATMAP_FIELDS, where=where)
        for method, values in instance.get("scores", {}).items():
            if not isinstance(values, list) or not all(type(v) in (int, float) for v in values):
                raise InputError(path, f"field '{where}.scores.{method}' must be an array of numbers")
    return data


def results_folder(directory: Path) -> Path:
    """``DIR/results``, or ``DIR`` itself when it holds result JSON files (``attnaudit run --out DIR``)
    and is not a run directory (whose ``config.json`` and ``metrics.json`` are no results)."""
    nested = directory / RESULTS
    if nested.is_dir() or (directory / "config.json").exists():
        return nested
    return directory if any(p.name not in NOT_RESULTS for p in directory.glob("*.json")) else nested


def _find_run(directory: Path, info: dict[str, Any], data_dir: str | Path | None, device: str) -> Run | None:
    """The run behind ``directory``, with the segments it was tested with (``info["segments"]``)."""
    from attnaudit.explain.helpers.segments import segmented

    found = _found_run(directory, info, data_dir, device)
    return None if found is None else segmented(found, info.get("segments"))


def _found_run(directory: Path, info: dict[str, Any], data_dir: str | Path | None, device: str) -> Run | None:
    """The run behind ``directory``: the recorded run (audit or results) or Hugging Face model, ``DIR/run``, or ``DIR``."""
    from attnaudit.run import load_run

    if info.get("hf") and not info.get("run"):
        from attnaudit.hf import load_hf

        options = {key: info[key] for key in ("max_length", "dtype", "device_map") if info.get(key) is not None}  # as the audit ran it
        return load_hf(info["hf"], task=info.get("task"), data_dir=data_dir or info.get("data_dir"), device=device, **options)
    for candidate in (info.get("run"), directory / "run", directory):
        if candidate and (Path(candidate) / "config.json").exists():
            return load_run(candidate, device=device, data_dir=data_dir or info.get("data_dir"))
    return None


def audited(run: Run, info: dict[str, Any], split: str, limit: int | None, data_dir: str | Path | None) -> list[Any]:
    """The examples the tests ran on: the recorded split, limit, seed and choice (results from before the
    stratified sample chose the first ones)."""
    return run.examples(info.get("split", split), info.get("limit", limit), data_dir=data_dir, seed=info.get("seed", 0),
                        order=info.get("limit_order", "first"))


def _heatmaps(
    results_dir: Path,
    run: Run | None,
    find: Callable[[], Run | None],
    info: dict[str, Any],
    split: str,
    limit: int | None,
    data_dir: str | Path | None,
    instances: int,
) -> tuple[dict[str, Any] | None, str]:
    """Heatmap data (computed from ``run`` when given, else loaded, else computed from the found run) and a note."""
    from attnaudit.report.heatmaps import heatmaps_for

    path = results_dir / HEATMAPS
    if run is None and path.exists():
        return _read_heatmaps(path), ""
    try:
        run = run or find()
        if run is None:
            return None, "no heatmaps: no run found next to the results to compute them from"
        if run.task.task_type not in ("classification", "pair"):
            return None, f"no heatmaps: a {run.task.task_type} model makes one decision per token, not one per instance"
        data = heatmaps_for(run, audited(run, info, split, limit, data_dir), results_dir, instances)
    except AttnAuditError as exc:
        return None, f"no heatmaps: {exc}"
    except Exception as exc:  # the report must still be written when an explanation method breaks
        return None, f"no heatmaps: computing them failed ({type(exc).__name__}: {exc})"
    atomic_write_json(path, data)
    return data, ""


def _explorer_data(
    results_dir: Path,
    run: Run | None,
    find: Callable[[], Run | None],
    info: dict[str, Any],
    split: str,
    limit: int | None,
    data_dir: str | Path | None,
    explore: int,
    store: bool = True,
) -> tuple[dict[str, Any] | None, str]:
    """The explorer's model data: computed from ``run`` when given; else the first ``explore``
    instances of ``explorer.json`` when it was computed for at least that many; else computed from
    the found run (and saved there when ``store``), falling back to the stored instances; and a note."""
    if explore == 0:
        return None, ""
    path = results_dir / EXPLORER
    stored = load_model_data(path) if run is None and path.exists() else None
    if stored is not None and stored["requested"] >= explore:
        return {**stored, "instances": stored["instances"][:explore]}, ""
    try:
        run = run or find()
        if run is None:
            raise AttnAuditError("no run found next to the results to read attention from")
        data = model_data(run, audited(run, info, split, limit, data_dir), explore)
    except Exception as exc:  # the report must still be written when the explorer cannot be computed
        reason = str(exc) if isinstance(exc, AttnAuditError) else f"computing its data failed ({type(exc).__name__}: {exc})"
        if stored is not None:
            shown = f"the {len(stored['instances'])} stored instances shown, not {explore}"
            return {**stored, "notes": [*stored.get("notes", []), f"{shown}: {reason}"]}, ""
        return None, f"no explorer: {reason}"
    if store:
        atomic_write_json(path, data)
    return data, ""


@writes_folder("directory", existing=True)
def build_report(
    directory: str | Path,
    run: Run | None = None,
    split: str = "test",
    limit: int | None = None,
    data_dir: str | Path | None = None,
    instances: int = 3,
    device: str = "auto",
    explore: int = EXPLORE,
) -> Path:
    """Write ``directory/report.html`` from its results (:func:`results_folder`; and ``audit.json`` when present).

    ``run`` (the audited run) computes fresh heatmaps; without it they are read from
    ``results/heatmaps.json`` or computed from the run found next to the results.
    ``instances``: most/least faithful instances shown (each). ``explore``: instances in the
    explorer (the first ones tested; 0: no explorer).
    """
    directory = Path(directory)
    if explore < 0:
        raise AttnAuditError(f"--explore must be >= 0, got {explore}")
    if not directory.is_dir():
        raise AttnAuditError(f"{directory}: {'not a directory' if directory.exists() else 'not found'}")
    for written in (REPORT, "summary.csv"):
        if (directory / written).is_dir():
            raise AttnAuditError(f"{directory / written}: is a directory; the report cannot be written there")
    results_dir = results_folder(directory)
    info = _read_audit(directory / AUDIT) if (directory / AUDIT).exists() else {}
    if not results_dir.is_dir() and not info:
        raise AttnAuditError(f"{directory}: no results/ folder (run `attnaudit audit` or `attnaudit run` first)")
    results, notes = _load_results(results_dir) if results_dir.is_dir() else ({}, [])
    if not results and not info.get("tests"):
        unreadable = f" ({len(notes)} unreadable file(s): {notes[0]})" if notes else ""
        raise AttnAuditError(f"{results_dir}: no test results to report{unreadable}")
    registry = discover()
    log = {entry["test"]: entry for entry in info.get("tests", [])}
    names = [e["test"] for e in info.get("tests", [])] or order_tests(results)
    names += [n for n in order_tests(results) if n not in names]
    rows = summary_rows(info.get("tests", []), results)
    write_summary(directory / SUMMARY, rows)
    sections = []
    for name in names:
        cls = registry.get(name)
        entry = log.get(name, {})
        section = Section(name=name, description=cls.description if cls else "", paper=cls.paper if cls else "")
        if entry.get("status") in ("skipped", "failed"):
            section.status = entry["status"]
            section.reason = entry.get("reason") or entry.get("error", "")
            section.traceback = entry.get("traceback", "")
        elif name in results:
            section.result = results[name]
            section.verdict = [{k: v for k, v in row.items() if k != "test"} for row in rows if row["test"] == name]
            section.measures = cls().token_measures(results[name]) if cls else {}
        else:
            continue
        sections.append(section)
    first = next(iter(results.values()), None)
    meta = first.meta if first else {}
    # without an audit.json, the results' own record says which run (split, instances) they came from
    source = info or {k: meta[k] for k in ("run", "split", "limit", "seed", "limit_order", "segments") if meta.get(k) is not None}
    find = functools.cache(lambda: _find_run(directory, source, data_dir, device))  # heatmaps and explorer share one load
    heatmaps, heatmap_note = _heatmaps(results_dir, run, find, source, split, limit, data_dir, instances)
    explored, explorer_note = _explorer_data(results_dir, run, find, source, split, limit, data_dir, explore)
    explorer = explorer_section(explorer_payload(explored, results) if explored else None, explorer_note) if explore else ""
    model = info.get("model") or meta.get("model")
    if info.get("hf"):
        kind = info.get("kind") if info.get("kind") in ("encoder", "decoder", "encoder-decoder") else "model"
        zero_shot = ", zero-shot by prompt and verbalizer" if info.get("zero_shot") else ""
        model = f"Hugging Face {kind} {'/'.join(Path(info['hf']).parts[-2:])} ({info.get('architecture', '?')}{zero_shot})"
    task = info.get("task") or meta.get("task")
    facts = [
        ("model", model),
        ("task", task),
        ("split", info.get("split") or meta.get("split")),
        ("instances", meta.get("n")),
        ("audited", subset_line(meta.get("subset"))),
        ("seed", info.get("seed", meta.get("seed"))),
        ("run", info.get("run") or meta.get("run")),
        ("generated", datetime.datetime.now().strftime("%Y-%m-%d %H:%M")),
    ]
    failed = [s.name for s in sections if s.status == "failed"]
    if failed:
        notes.append(f"{len(failed)} test(s) failed: {', '.join(failed)} (see their sections)")
    title = f"Attention faithfulness audit: {model or 'model'} on {task or 'task'}"
    page = render(title, facts, sections, heatmaps, heatmap_note, notes, results_dir, explorer)
    return atomic_write_text(directory / REPORT, page)


def show(
    source: str | Path | Run,
    instance: int | None = None,
    explore: int = EXPLORE,
    split: str = "test",
    limit: int | None = None,
    data_dir: str | Path | None = None,
    device: str = "auto",
) -> Explorer:
    """The report's explorer for an audit folder, a run directory or a :class:`Run`; in Jupyter it
    shows inline (``_repr_html_``), elsewhere ``.save(path)`` writes it as a page.

    ``instance``: the index (in the tested split) to open first; it must be among the first
    ``explore``. An audit's stored ``results/explorer.json`` is reused when it holds ``explore``
    instances; otherwise the data is computed from the run (the first ``explore`` instances of
    ``split``, ``limit``), and what the tests did comes from the results beside it.
    """
    if explore < 1:
        raise AttnAuditError(f"explore must be at least 1, got {explore}")
    results: dict[str, Result] = {}
    data: dict[str, Any] | None
    if isinstance(source, Run):
        data = model_data(source, source.examples(split, limit, data_dir=data_dir), explore)
        title = f"attnaudit explorer: {source.family}"
    else:
        directory = Path(source)
        if not directory.is_dir():
            raise AttnAuditError(f"{directory}: {'not a directory' if directory.exists() else 'not found'}")
        results_dir = results_folder(directory)
        info = _read_audit(directory / AUDIT) if (directory / AUDIT).exists() else {}
        results = _load_results(results_dir)[0] if results_dir.is_dir() else {}
        first = next(iter(results.values()), None)
        record = info or {k: first.meta[k] for k in ("run", "split", "limit") if first and first.meta.get(k) is not None}
        find = functools.partial(_find_run, directory, record, data_dir, device)
        data, note = _explorer_data(results_dir, None, find, record, split, limit, data_dir, explore, store=False)
        if data is None:
            raise AttnAuditError(f"{directory}: {note.removeprefix('no explorer: ')}")
        title = f"attnaudit explorer: {directory.name}"
    indices = [int(i["index"]) for i in data["instances"]]
    if instance is not None and instance not in indices:
        shown = f"{min(indices)}..{max(indices)}" if indices else "none"
        raise AttnAuditError(f"instance {instance} is not among the {len(indices)} explored instances ({shown}); raise explore")
    return Explorer(explorer_payload(data, results, instance), title)
