"""The report's instance explorer: attention per layer and head, every explanation, every test's
effect, for each of the first ``explore`` instances, browsable offline in one file.

What the model gives (tokens, predictions, attention of every traced layer, the scores of every
default explanation that applies, from the registry :func:`attnaudit.explain.list_explanations`)
is computed once from the run and stored in ``results/explorer.json``; what the tests did to each
instance (their per-instance result rows, and the columns each test names in
:attr:`~attnaudit.experiments.experiment.AuditSettings.instance_effects`) is read from the results every
time the report is built, so ``attnaudit report`` picks up new results.

Size: attention is stored **8-bit per layer** (``q = round(255 · w / m)`` with ``m`` the
largest weight of that layer and instance, so every weight is off by at most ``m / 510``),
zlib-compressed and base64-encoded; explanation scores are rounded to 4 significant digits.
The page decodes them with the browser's own ``DecompressionStream`` (no library).

Safety: the data travels as JSON in ``<script type="application/json">`` with ``<``, ``>`` and
``&`` written as ``\\u003c``/``\\u003e``/``\\u0026`` (so no ``</script>`` can end it), and
``explorer.js`` builds the page with DOM nodes and ``textContent`` only.
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnaudit.data.types import Batch, Example, text_of
from attnaudit.errors import InputError
from attnaudit.experiments.experiment import Result, discover
from attnaudit.html_page import SIZE, esc, megabytes, page, round_sig, script_json
from attnaudit.io import read_json_object
from attnaudit.models.interface import evaluation
from attnaudit.run import Run

EXPLORE = 50
"""Instances the explorer shows by default (``--explore``)."""
BUDGET = 16_000_000
"""Bytes of attention data the explorer embeds at most; instances beyond it are left out (and said so)."""
EXPLORER = "explorer.json"
VERSION = 1
CHUNK = 8
"""Instances per batch (Integrated Gradients bounds its own passes' memory: :func:`attnaudit.explain.methods.ig.pass_rows`)."""
ENCODING = (
    "attention: 8-bit per layer and instance (q = round(255·w/m), m = the layer's largest weight; "
    "error ≤ m/510), zlib, base64; explanation scores: 4 significant digits"
)


# --------------------------------------------------------------------------- encoding


def quantise(weights: np.ndarray) -> tuple[np.ndarray, float]:
    """``weights`` (any shape, >= 0) as uint8 codes and the scale ``m`` (their maximum): ``w ≈ q · m / 255``."""
    weights = np.nan_to_num(np.asarray(weights, dtype=np.float64), nan=0.0)
    scale = float(weights.max()) if weights.size else 0.0
    if scale <= 0:
        return np.zeros(weights.shape, dtype=np.uint8), 0.0
    return np.clip(np.rint(weights / scale * 255), 0, 255).astype(np.uint8), scale


def dequantise(codes: np.ndarray, scale: float) -> np.ndarray:
    """The weights back from :func:`quantise`'s codes."""
    return codes.astype(np.float64) * (scale / 255)


def pack(codes: list[np.ndarray]) -> str:
    """uint8 arrays concatenated (C order), zlib-compressed, base64 (what ``explorer.js`` inflates)."""
    raw = b"".join(np.ascontiguousarray(c, dtype=np.uint8).tobytes() for c in codes)
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def unpack(blob: str) -> np.ndarray:
    """The bytes of :func:`pack` as one uint8 array."""
    return np.frombuffer(zlib.decompress(base64.b64decode(blob)), dtype=np.uint8)


# --------------------------------------------------------------------------- from the model


def readable(run: Run, pieces: list[str]) -> list[str]:
    """Byte-level BPE pieces of a decoder as text (``Ġcharming`` -> `` charming``); others unchanged."""
    tokenizer = run.model.tokenizer
    if not run.model.causal or tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_string"):
        return [str(p) for p in pieces]
    return [tokenizer.convert_tokens_to_string([str(p)]) for p in pieces]


def position_labels(run: Run, batch: Batch) -> list[list[str]]:
    """The text of every real position of each example: wordpieces (HF), else the words."""
    pieces = run.model.wordpieces(batch)
    if pieces is not None:
        return [readable(run, p) for p in pieces]
    lengths = batch.mask.reshape(batch.mask.shape[0], -1).sum(-1).tolist()
    return [list(map(str, ex.tokens[:n])) + [f"#{i}" for i in range(len(ex.tokens), n)] for ex, n in zip(batch.examples, lengths)]


def _layer_entry(record: Any, row: int, tokens: list[str], name: str, cross: bool, causal: bool) -> tuple[dict[str, Any], np.ndarray] | None:
    """One traced layer of instance ``row``: its description and (H, Q, K) weights over real
    queries and keys; None when its axes are not this instance's positions (HAN's word layer)."""
    weights, mask = record.weights, record.mask
    if weights.dim() != 4 or mask.dim() != 2 or weights.shape[0] != mask.shape[0] or weights.shape[3] != mask.shape[1]:
        return None
    keys = mask[row].bool()
    queries = record.query_mask[row].bool() if record.query_mask is not None else torch.ones(weights.shape[2], dtype=torch.bool)
    w = weights[row][:, queries.to(weights.device)][:, :, keys.to(weights.device)].detach().float().cpu().numpy()
    k_labels = tokens if len(tokens) == w.shape[2] else [f"k{i}" for i in range(w.shape[2])]
    if w.shape[1] == 1 and not cross:
        q_labels = ["⟨query⟩"]
    elif not cross and w.shape[1] == w.shape[2]:
        q_labels = k_labels
    else:
        q_labels = [f"q{i}" for i in range(w.shape[1])]
    info = {"name": name, "kind": "cross" if cross else "self", "causal": causal and not cross, "heads": w.shape[0],
            "queries": q_labels if q_labels is not k_labels else None, "q": w.shape[1], "k": w.shape[2]}
    return info, w


def attention_layers(run: Run, batch: Batch) -> list[tuple[list[str], list[dict[str, Any]], list[np.ndarray]]]:
    """Per example: position labels, layer descriptions and weights ``(H, Q, K)`` of every traced layer."""
    model = run.model
    with evaluation(model), torch.no_grad():
        trace = model(batch).trace
    labels = position_labels(run, batch)
    cross = set(model.cross_layers)
    out = []
    for row in range(len(batch.examples)):
        infos, arrays = [], []
        for index, record in enumerate(trace.layers):
            if record.weights.shape[0] != len(batch.examples):
                continue  # not one row per instance (HAN's word layer: one per sentence)
            entry = _layer_entry(record, row, labels[row], record.name or f"layer {index}", index in cross, model.causal)
            if entry is not None:
                infos.append(entry[0])
                arrays.append(entry[1])
        out.append((labels[row], infos, arrays))
    return out


def _predictions(run: Run, batch: Batch) -> list[dict[str, Any]]:
    """Predicted label and its probability per example (nothing without a trained head)."""
    if not run.model.trained_head or run.task.task_type not in ("classification", "pair"):
        return [{} for _ in batch.examples]
    with evaluation(run.model), torch.no_grad():
        probs = run.model(batch).probs.float().cpu()
    labels = run.labels or [str(i) for i in range(probs.shape[-1])]
    top = probs.max(-1)
    return [{"pred": labels[int(i)] if int(i) < len(labels) else str(int(i)), "p": round_sig(float(p))} for p, i in zip(top.values, top.indices)]


def _explanations(run: Run, examples: list[Example], indices: list[int]) -> dict[int, dict[str, Any]]:
    """Items, rationale and every default explanation's scores per instance index (classification/pair)."""
    from attnaudit.report.heatmaps import compute_heatmaps

    if run.task.task_type not in ("classification", "pair"):
        return {}
    found = {}
    for start in range(0, len(indices), CHUNK):
        for entry in compute_heatmaps(run, examples, indices[start : start + CHUNK], {}):
            entry["scores"] = {m: [round_sig(v) or 0.0 for v in values] for m, values in entry["scores"].items()}
            found[entry["index"]] = entry
    return found


def _text(example: Example) -> str:
    """The instance as searchable text: as written (:func:`~attnaudit.data.types.text_of`), then the second sentence or question (pair/QA),
    or the target (seq2seq), after ``‖``."""
    words = text_of(example)
    if example.query:
        return f"{words} ‖ {text_of(example, query=True)}"
    return f"{words} ‖ {' '.join(map(str, example.target))}" if example.target else words


def model_data(run: Run, examples: list[Example], explore: int, budget: int = BUDGET, explain: int | None = None) -> dict[str, Any]:
    """What ``explorer.json`` holds: the first ``explore`` instances with tokens, prediction, packed
    attention and explanation scores, within ``budget`` bytes of attention. ``explain``: explain only
    the first this many (None: all; the size benchmark measures attention alone with 0)."""

    indices = list(range(min(explore, len(examples))))
    explained = _explanations(run, examples, indices[:explain])
    instances: list[dict[str, Any]] = []
    notes: list[str] = []
    used = 0
    for start in range(0, len(indices), CHUNK):
        chunk = indices[start : start + CHUNK]
        batch = next(iter(run.batches([examples[i] for i in chunk], batch_size=len(chunk))))
        for (tokens, layers, arrays), prediction, index in zip(attention_layers(run, batch), _predictions(run, batch), chunk):
            codes, scales = zip(*(quantise(a) for a in arrays)) if arrays else ((), ())
            blob = pack(list(codes))
            if used + len(blob) > budget and instances:
                notes.append(f"{len(indices) - len(instances)} of the {len(indices)} requested instances left out: "
                             f"their attention would pass the {budget / 1e6:g} MB budget")
                break
            used += len(blob)
            for layer, scale in zip(layers, scales):
                layer["scale"] = scale
            example = examples[index]
            extra = explained.get(index, {})
            instances.append({
                "index": index, "text": _text(example), "gold": None if example.label is None else str(example.label),
                **prediction, "tokens": tokens, "layers": layers, "attention": blob,
                "items": readable(run, extra.get("items", [])), "rationale": extra.get("rationale", []), "scores": extra.get("scores", {}),
                **({"roles": extra["roles"]} if "roles" in extra else {}),
            })
        if notes:
            break
    from attnaudit.report.heatmaps import IG_STEPS, heatmap_methods, left_out_note

    listed = heatmap_methods(run) if explained else []
    methods = [{"name": m.name, "about": m.about + (f"; {IG_STEPS} steps here" if "steps" in m.options else "")}
               for m in listed]
    note = left_out_note(run) if listed else ""
    if note:
        notes.append(note)
    return {"version": VERSION, "requested": explore, "encoding": ENCODING, "labels": list(map(str, run.labels or [])),
            "causal": bool(run.model.causal), "methods": methods, "instances": instances, "notes": notes}


def load_model_data(path: Path) -> dict[str, Any]:
    """``explorer.json``, checked to have the shape the explorer reads (one-line error otherwise)."""
    data = read_json_object(path, {"version": int, "requested": int, "instances": list}, {"methods": list, "labels": list, "notes": list})
    if data["version"] != VERSION:
        raise InputError(path, f"explorer data version {data['version']}, expected {VERSION}")
    for number, instance in enumerate(data["instances"]):
        if not isinstance(instance, dict) or not isinstance(instance.get("attention"), str) or not isinstance(instance.get("layers"), list):
            raise InputError(path, f"instances[{number}] lacks its attention or layers")
    return data


# --------------------------------------------------------------------------- from the results


def _scalar(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return round_sig(float(value)) if isinstance(value, float) else value
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def instance_rows(results: dict[str, Result], shown: set[int]) -> tuple[list[dict[str, Any]], dict[int, dict[str, dict[str, Any]]]]:
    """Each test with per-instance rows (one row per instance index): its headline columns
    (``instance_effects``), and its row for every shown instance."""
    registry = discover()
    tests: list[dict[str, Any]] = []
    rows: dict[int, dict[str, dict[str, Any]]] = {}
    for name, result in results.items():
        indexed = [r for r in result.instances if isinstance(r.get("index"), int)]
        by_index = {r["index"]: r for r in indexed}
        if not indexed or len(by_index) != len(indexed):
            continue  # no per-instance rows, or several per instance (per layer/head)
        cls = registry.get(name)
        effects = [
            {"column": column, "about": about, "order": order}
            for column, (about, order) in (cls.settings.instance_effects if cls else {}).items()
            if any(column in r for r in indexed)
        ]
        tests.append({"name": name, "description": cls.description if cls else "", "effects": effects})
        for index in shown & set(by_index):
            rows.setdefault(index, {})[name] = {k: _scalar(v) for k, v in by_index[index].items() if k not in ("index", "source")}
    tests.sort(key=lambda t: not t["effects"])  # the tests that say what they did first
    return tests, rows


def instance_distributions(results: dict[str, Result], shown: set[int]) -> dict[int, dict[str, dict[str, list[float]]]]:
    """Per shown instance, per test with an ``instance_attention`` table, its attention distributions
    (``{"original": [...], "adversary": [...]}``), rounded to 4 significant digits."""
    registry = discover()
    found: dict[int, dict[str, dict[str, list[float]]]] = {}
    for name, result in results.items():
        table = registry[name].settings.instance_attention if name in registry else ""
        for row in result.tables.get(table, []) if table else []:
            if isinstance(row, dict) and row.get("index") in shown:
                lists = {k: [round_sig(float(v)) or 0.0 for v in values] for k, values in row.items()
                         if isinstance(values, list) and all(isinstance(v, (int, float)) for v in values)}
                found.setdefault(int(row["index"]), {})[name] = lists
    return found


def faithfulness_scores(row: dict[str, Any], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method its comprehensiveness and sufficiency (AOPC) in a faithfulness row
    (columns ``<method>_<mode>_aopc_comp`` / ``_aopc_suff``; the longest method name wins)."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in row.items():
        for measure in ("comp", "suff"):
            suffix = f"_aopc_{measure}"
            if not key.endswith(suffix):
                continue
            stem = key[: -len(suffix)]
            owners = [m for m in methods if stem.startswith(m + "_") and "_" not in stem[len(m) + 1 :]]
            if owners:
                method = max(owners, key=len)
                found.setdefault(method, {"mode": stem[len(method) + 1 :]})[measure] = value
    return found


def explorer_payload(model: dict[str, Any], results: dict[str, Result], initial: int | None = None) -> dict[str, Any]:
    """The embedded JSON: the model data joined with what the tests did to each shown instance."""
    shown = {int(i["index"]) for i in model["instances"]}
    tests, rows = instance_rows(results, shown)
    distributions = instance_distributions(results, shown)
    names = [m["name"] for m in model.get("methods", [])]
    instances = []
    for instance in model["instances"]:
        per_test = rows.get(int(instance["index"]), {})
        faith = faithfulness_scores(per_test["faithfulness"], names) if "faithfulness" in per_test else {}
        gold, pred = instance.get("gold"), instance.get("pred")
        correct = None if gold is None or pred is None else gold == pred
        instances.append({**instance, "correct": correct, "tests": per_test, "faithfulness": faith,
                          "distributions": distributions.get(int(instance["index"]), {})})
    return {**model, "tests": tests, "instances": instances, "initial": initial}


# --------------------------------------------------------------------------- HTML


def explorer_section(payload: dict[str, Any] | None, note: str) -> str:
    """The explorer's ``<section>``: the data block and a message for readers without JavaScript."""
    parts = ['<section id="explorer"><h2>Explorer</h2>']
    if not payload or not payload.get("instances"):
        parts.append(f'<p class="muted">{esc(note or "no instances to explore")}</p></section>')
        return "".join(parts)
    data = script_json(payload)
    parts.append(
        "<p>Pick an instance (search, filter, sort by what a test did to it); compare its explanations side by side; "
        "see its attention at any layer and head (head view: lines from each token to the tokens it attends; "
        "model view: every layer × head) and what each test did to it. "
        f"{len(payload['instances'])} instances; {esc(payload.get('encoding', ''))}.</p>"
        f'<p class="meta">explorer data: {megabytes(len(data.encode("utf-8")))} of this page\'s {SIZE}'
        f'{"".join(" · " + esc(n) for n in payload.get("notes", []))}</p>'
        '<noscript><p class="muted">The explorer needs JavaScript; the rest of the report does not.</p></noscript>'
        f'<script type="application/json" id="explorer-data">{data}</script>'
        '<div id="xp-root" class="xp"></div></section>'
    )
    return "".join(parts)


@dataclass
class Explorer:
    """The explorer of an audit (or run) as one page; shows inline in Jupyter (``_repr_html_``)."""

    payload: dict[str, Any]
    title: str = "attnaudit explorer"

    def html(self) -> str:
        """A standalone page holding only the explorer."""
        return page(self.title, explorer_section(self.payload, ""), bare=True)

    def save(self, path: str | Path) -> Path:
        from attnaudit.io import atomic_write_text

        return atomic_write_text(Path(path), self.html())

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{esc(self.html())}" sandbox="allow-scripts" '
                'style="width:100%;height:820px;border:1px solid #ddd"></iframe>')
