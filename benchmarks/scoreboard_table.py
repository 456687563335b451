"""``python -m benchmarks.scoreboard_table``: write the reproductions page's faithfulness scoreboard tables from
``benchmarks/results/scoreboard.json`` (``benchmarks/reproduce_scoreboard.py``).

Everything between ``<!-- scoreboard-table:start -->`` and ``<!-- scoreboard-table:end -->`` in
docs/sections/results.md is generated here, so the numbers cannot drift from the result file: the fine-tuned MiniLM
scoreboard in both removal modes with the SST phrase plausibility and the two published tables beside
it, then the SST BiLSTM and Transformer scoreboards, then SmolLM2 zero-shot beside MiniLM, each with
the wall and CPU seconds and load average it ran under. ``--check`` writes nothing and exits 1 when that page is stale.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.common` when run as a script

from attnaudit.io import atomic_write_text  # noqa: E402
from benchmarks.common import RESULTS, ROOT  # noqa: E402

README = ROOT / "docs" / "sections" / "results.md"
"""The page holding the scoreboard block (the README before it became a landing page; the name stayed)."""
RESULT = RESULTS / "scoreboard.json"
SMALL = RESULTS / "scoreboard_sst.json"
"""The BiLSTM and Transformer scoreboards when run apart (``reproduce_scoreboard.py --parts bilstm,transformer --name scoreboard_sst``)."""
DELETE_ONLY = RESULTS / "scoreboard_delete.json"
"""The MiniLM scoreboard with deletion only, for its cost (``reproduce_scoreboard.py --parts minilm --mode delete --name scoreboard_delete``)."""
DECODER = RESULTS / "scoreboard_smollm2.json"
"""SmolLM2 zero-shot (``reproduce_scoreboard.py --parts smollm2 --name scoreboard_smollm2``)."""
START = "<!-- scoreboard-table:start -->"
END = "<!-- scoreboard-table:end -->"
ALTI_REPO = {"alti": (0.269, 0.057), "ig": (0.223, 0.074), "gradient": (0.190, 0.075), "globenc": (0.161, 0.119),
             "rollout": (0.076, 0.179)}
"""ALTI repository, SST-2, fine-tuned RoBERTa: comprehensiveness / sufficiency (norm-rollout .168 / .135 has no counterpart here)."""
DECOMPX_TABLE = {"decompx": 0.627, "alti": 0.416, "ig": 0.340, "input_gradient": 0.310, "globenc": 0.307}
"""DecompX (Modarressi et al. 2023) Table 1, SST-2, BERT-base: AOPC with [MASK] replacement."""


def _num(value: Any) -> str:
    """Three decimals with a real minus sign; ``–`` when missing."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "–"
    return f"{value:.3f}".replace("-", "−")


def _ci(row: dict[str, Any], metric: str) -> str:
    return f"{_num(row.get(metric))} [{_num(row.get(f'{metric}_low'))}, {_num(row.get(f'{metric}_high'))}]"


def _by_mode(board: dict[str, Any], mode: str) -> dict[str, dict[str, Any]]:
    return {r["method"]: r for r in board["scoreboard"] if r["mode"] == mode}


def _subset(subset: dict[str, Any] | None) -> str:
    """`` (how chosen, of how many; label counts)`` where the result records its subset (older results do not)."""
    if not subset:
        return ""
    labels = ", ".join(f"{count} {label}" for label, count in subset.get("labels", {}).items())
    return f" ({subset['chosen']}, of {subset['of']:,}{'; ' + labels if labels else ''})"


def _timing(board: dict[str, Any]) -> str:
    text = f"{board['n']} sentences{_subset(board.get('subset'))}, {len(board['methods'])} methods: {board['wall_seconds']:,.0f} s wall"
    if board.get("cpu_seconds") is not None:
        text += f", {board['cpu_seconds']:,.0f} s CPU"
    if board.get("load_before") and board.get("load_after"):
        load = "/".join(f"{x:.1f}" for x in board["load_before"][:1] + board["load_after"][:1])
        text += f", load average {load} before/after"
    return text


def minilm_table(data: dict[str, Any]) -> list[str]:
    """MiniLM in both modes, plausibility, and the published numbers, ranked by deletion comprehensiveness."""
    board = data["minilm"]["scoreboard"]
    delete, mask = _by_mode(board, "delete"), _by_mode(board, "mask")
    plausible = _by_mode(data["minilm_sst_trees"], "delete") if "minilm_sst_trees" in data else {}
    lines = [
        "| rank | method | delete: AOPC comp. ↑ [95% CI] | delete: AOPC suff. ↓ | [MASK]: AOPC comp. ↑ | [MASK]: AOPC suff. ↓ "
        "| SST phrases AUPRC / F1 | ALTI repo comp. / suff. | DecompX AOPC |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for place, (name, row) in enumerate(sorted(delete.items(), key=lambda kv: -kv[1]["aopc_comp"]), 1):
        other, p = mask.get(name, {}), plausible.get(name, {})
        alti = ALTI_REPO.get(name)
        lines.append(
            f"| {place} | {name} | {_ci(row, 'aopc_comp')} | {_ci(row, 'aopc_suff')} | {_ci(other, 'aopc_comp')} "
            f"| {_ci(other, 'aopc_suff')} | {_num(p.get('auprc'))} / {_num(p.get('token_f1'))} "
            f"| {'–' if alti is None else f'{_num(alti[0])} / {_num(alti[1])}'} | {_num(DECOMPX_TABLE.get(name))} |"
        )
    lines += ["", f"MiniLM, GLUE dev: {_timing(board)}."]
    if "minilm_delete" in data:
        lines.append(f"MiniLM, deletion only (with the curves): {_timing(data['minilm_delete'])}.")
    if plausible:
        lines.append(f"Plausibility (AUPRC, token F1 against the SST treebank's polar phrases): {_timing(data['minilm_sst_trees'])}.")
    return lines


def small_models_table(data: dict[str, Any]) -> list[str]:
    """The SST BiLSTM and our Transformer, both modes, ranked by the Transformer's deletion comprehensiveness."""
    present = [(key, label) for key, label in (("sst_bilstm", "BiLSTM"), ("sst_transformer", "Transformer")) if key in data]
    if not present:
        return []
    boards = {key: data[key]["scoreboard"] for key, _ in present}
    header = "| method | " + " | ".join(f"{label}: delete comp. / suff. | {label}: `<unk>` comp. / suff." for _, label in present) + " |"
    lines = [header, "|---|" + "---|---|" * len(present)]
    # Ranked by the last model's deletion comprehensiveness; a method scored on an earlier model only
    # (input x gradient on the BiLSTM: not on a Transformer) follows, ranked by that model's.
    order: list[str] = []
    for key, _ in reversed(present):
        rows = _by_mode(boards[key], "delete")
        order += [name for name, _ in sorted(rows.items(), key=lambda kv: -kv[1]["aopc_comp"]) if name not in order]
    for name in order:
        cells = []
        for key, _ in present:
            for mode in ("delete", "mask"):
                row = _by_mode(boards[key], mode).get(name)
                cells.append("–" if row is None else f"{_num(row['aopc_comp'])} / {_num(row['aopc_suff'])}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for key, label in present:
        accuracy = data[key].get("test_accuracy")
        lines.append(f"{label} (SST test accuracy {_num(accuracy)}): {_timing(boards[key])}.")
    return lines


def decoder_table(data: dict[str, Any]) -> list[str]:
    """SmolLM2 zero-shot, deletion, ranked by comprehensiveness, beside MiniLM's deletion numbers."""
    if "smollm2" not in data:
        return []
    board = data["smollm2"]
    minilm = _by_mode(data["minilm"]["scoreboard"], "delete")
    lines = ["| rank | method | SmolLM2 zero-shot: delete AOPC comp. ↑ [95% CI] | SmolLM2: delete AOPC suff. ↓ [95% CI] "
             "| MiniLM (above): delete comp. / suff. |", "|---|---|---|---|---|"]
    delete = _by_mode(board, "delete")
    for place, (name, row) in enumerate(sorted(delete.items(), key=lambda kv: -kv[1]["aopc_comp"]), 1):
        other = minilm.get(name)
        beside = "–" if other is None else f"{_num(other['aopc_comp'])} / {_num(other['aopc_suff'])}"
        lines.append(f"| {place} | {name} | {_ci(row, 'aopc_comp')} | {_ci(row, 'aopc_suff')} | {beside} |")
    lines += ["", f"SmolLM2-135M-Instruct zero-shot, GLUE dev: {_timing(board)}."]
    return lines


def render(data: dict[str, Any]) -> str:
    """The generated README block, markers included."""
    lines = [START, "", *minilm_table(data), ""]
    for part in (small_models_table(data), decoder_table(data)):
        if part:
            lines += [*part, ""]
    return "\n".join([*lines, END])


def load() -> dict[str, Any]:
    """``scoreboard.json``, with the BiLSTM / Transformer parts of ``scoreboard_sst.json`` when it exists."""
    data = json.loads(RESULT.read_text(encoding="utf-8"))
    if SMALL.is_file():
        small = json.loads(SMALL.read_text(encoding="utf-8"))
        data.update({k: small[k] for k in ("sst_bilstm", "sst_transformer") if k in small})
    if DELETE_ONLY.is_file():
        data["minilm_delete"] = json.loads(DELETE_ONLY.read_text(encoding="utf-8"))["minilm"]["scoreboard"]
    if DECODER.is_file():
        data["smollm2"] = json.loads(DECODER.read_text(encoding="utf-8"))["smollm2"]
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md differs from the results; write nothing")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"error: {README}: no {START} … {END} block")
        return 2
    block = render(load())
    current = text[text.index(START): text.index(END) + len(END)]
    if args.check:
        if current != block:
            print(f"{README}: the scoreboard block differs from {RESULT}; run python -m benchmarks.scoreboard_table")
            return 1
        return 0
    atomic_write_text(README, text.replace(current, block))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
