"""``attnaudit demo``: the whole product in a few minutes on the built-in synthetic task.

1. Train a BiLSTM attention classifier and a small Transformer on the synthetic task
   (its label is the majority polarity of planted signal words, so the rationale is known).
2. Audit both with every applicable test at demo sizes, including the rationale test that
   scores each explanation against the planted words.
3. If the embedded MiniLM is installed, run the tests that need no classification head
   (norms, rollout) on a few built-in sentences.
4. Write ``OUT/index.html`` linking the three reports, with the rationale scores side by side.
"""

from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from attnaudit.audit import AuditResult, audit, runnable_tests
from attnaudit.data.types import Example, TaskData
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.experiment import discover
from attnaudit.io import (
    atomic_write_json,
    atomic_write_text,
    read_json_object,
    writes_folder,
)
from attnaudit.progress import status

# Sizes: the full demo finishes in minutes on 2 cores; --quick in seconds (for tests: tiny
# models, a handful of instances, and no figures, whose drawing would dominate its time).
MODELS: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "bilstm": {"embed_dim": 16, "hidden_dim": 16, "epochs": 3, "lr": 3e-3},
        "transformer": {"embed_dim": 32, "d_model": 32, "heads": 2, "layers": 2, "d_ff": 64, "epochs": 5, "lr": 3e-3},
    },
    "quick": {
        "bilstm": {"embed_dim": 8, "hidden_dim": 8, "epochs": 1, "lr": 3e-3},
        "transformer": {"embed_dim": 8, "d_model": 8, "heads": 2, "layers": 2, "d_ff": 16, "epochs": 1, "lr": 3e-3},
    },
}
LIMIT = {"full": 100, "quick": 6}
PRETRAINED_TESTS = ("norms", "rollout")

# Built-in sentences for the pretrained part; rationale = the words carrying the sentiment.
SENTENCES: list[tuple[str, str, list[int]]] = [
    ("the film was a wonderful surprise from start to finish .", "positive", [4]),
    ("a dull , lifeless script sinks the whole cast .", "negative", [1, 3]),
    ("i loved the music but the plot made no sense .", "positive", [1]),
    ("the acting is superb and the story is moving .", "positive", [3, 8]),
    ("this is the worst meal i have ever had .", "negative", [3]),
    ("the service was slow and the staff seemed bored .", "negative", [3, 8]),
]


def demo_options(size: str) -> dict[str, dict[str, Any]]:
    """The demo's per-test options at ``size`` (each test's ``settings.demo``), restricted to the option names that exist."""
    chosen = {}
    for name, cls in discover().items():
        if size in cls.settings.demo:
            known = {f.name for f in fields(cls.Options)}
            chosen[name] = {k: v for k, v in cls.settings.demo[size].items() if k in known}
    return chosen


def sentences_task() -> TaskData:
    """The built-in sentences as a test split (no training data: the pretrained model is not fine-tuned)."""
    examples = [
        Example(tokens=text.split(), label=label, rationale=rationale, meta={"source": f"demo-sentence:{i + 1}"})
        for i, (text, label, rationale) in enumerate(SENTENCES)
    ]
    return TaskData("demo-sentences", "classification", [], [], examples, ["negative", "positive"],
                    ["six hand-written review sentences; rationale = the sentiment words"])


def _pretrained(out: Path, options: dict[str, dict[str, Any]], figures: bool, seed: int, device: str) -> AuditResult | None:
    """Norms and rollout on MiniLM (when the embedded model is installed)."""
    from attnaudit.hf import load_hf

    try:
        run = load_hf("minilm", task=sentences_task(), device=device)
    except AttnAuditError as exc:
        status(f"pretrained part skipped: {exc}")
        return None
    tests = [t for t in PRETRAINED_TESTS if t in runnable_tests(run)]
    if not tests:
        status("pretrained part skipped: neither the norms nor the rollout test runs on MiniLM")
        return None
    return audit(out, run=run, only=tests, seed=seed, test_options={t: options.get(t, {}) for t in tests}, figures=figures)


def _rationale_rows(label: str, outcome: AuditResult) -> list[dict[str, Any]]:
    result = outcome.results.get("rationale")
    if result is None:
        return []
    return [{"model": label, **row} for row in result.tables.get("methods", [])]


def write_index(out: Path, audits: dict[str, AuditResult], seconds: float, size: str) -> Path:
    """``OUT/index.html``: one line per audited model with its report, plus the rationale scores."""
    from attnaudit.html_page import CSS, esc, fmt, table

    lines = []
    for label, outcome in audits.items():
        accuracy = ""
        metrics = out / "runs" / label / "metrics.json"
        if metrics.exists():
            accuracy = fmt(read_json_object(metrics, optional={"test": dict}).get("test", {}).get("accuracy"))
        ran = len(outcome.results)
        lines.append(
            f'<tr><td><a href="{esc(label)}/report.html">{esc(label)}</a></td><td class="num">{accuracy or "n/a"}</td>'
            f'<td class="num">{ran}</td><td class="num">{len(outcome.skipped)}</td><td class="num">{len(outcome.failed)}</td></tr>'
        )
    rows = [r for label, outcome in audits.items() for r in _rationale_rows(label, outcome)]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>attnaudit demo</title>'
        f"<style>{CSS}</style></head><body><main><h1>attnaudit demo</h1>"
        f'<p class="meta">synthetic classification task (label = majority polarity of planted signal words); '
        f"{esc(size)} sizes; finished in {seconds:.0f} s</p>"
        "<h2>Reports</h2><table><thead><tr><th>model</th><th>test accuracy</th><th>tests run</th>"
        f"<th>not applicable</th><th>failed</th></tr></thead><tbody>{''.join(lines)}</tbody></table>"
        "<h2>Which explanation finds the planted words?</h2>"
        "<p>Mean average precision (ap), ROC-AUC and precision@k of each explanation against the known rationale "
        "(rationale test); <i>random</i> is a random ranking.</p>"
        f"{table(rows)}</main></body></html>\n"
    )
    return atomic_write_text(out / "index.html", page)


@writes_folder("out")
def demo(out: str | Path = "demo-output", quick: bool = False, seed: int = 0, device: str = "auto") -> Path:
    """Run the demo into ``out`` and return the index page (resumable like ``audit``).

    ``seed`` seeds training and every test (the synthetic data itself is the fixed seed-0 task)."""
    from attnaudit.training.trainer import train

    start = time.perf_counter()
    out = Path(out)
    size = "quick" if quick else "full"
    options = demo_options(size)
    audits: dict[str, AuditResult] = {}
    for step, (family, settings) in enumerate(MODELS[size].items(), 1):
        status(f"[bold]demo {step}/3[/]: training a {family} on the synthetic task")
        run = train("synthetic", family, out / "runs" / family, seed=seed, device=device, quiet_eval=True, **settings)
        status(f"[bold]demo {step}/3[/]: auditing the {family}")
        audits[family] = audit(out / family, run=run, limit=LIMIT[size], seed=seed, test_options=options, figures=not quick)
    status("[bold]demo 3/3[/]: pretrained MiniLM (norms and rollout on built-in sentences)")
    pretrained = _pretrained(out / "minilm", options, not quick, seed, device)
    if pretrained is not None:
        audits["minilm"] = pretrained
    seconds = time.perf_counter() - start
    index = write_index(out, audits, seconds, size)
    atomic_write_json(
        out / "demo.json",
        {"seconds": round(seconds, 1), "size": size, "failed": {k: v.failed for k, v in audits.items() if v.failed}},
    )
    status(f"demo finished in {seconds:.0f} s: open [bold]{index}[/]")
    return index
