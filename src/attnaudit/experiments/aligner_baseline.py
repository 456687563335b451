"""The statistical word-aligner baseline of the alignment test: eflomal (Östling & Tiedemann
2016), the tool a reader would use instead of attention to align words.

eflomal is trained, unsupervised, on the NMT run's own training pairs (the same word
tokenisation, the same length filter) plus the gold sentences being scored — the standard
practice for unsupervised aligners, which see the test sentences without their links. Its two
directional alignments are symmetrised (:func:`symmetrise`) and scored with the same
corpus-level AER as the attention alignments. eflomal has no seed option (its sampler seeds
itself from ``/dev/urandom``), so the baseline is run several times and reported as mean,
min and max. eflomal is optional: ``pip install 'attnaudit[align]'``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnaudit.algorithms.metrics import aer
from attnaudit.data.types import Example
from attnaudit.errors import AttnAuditError
from attnaudit.run import Run
from attnaudit.training.nmt import fits_length

Link = tuple[int, int]
SYMMETRISATIONS = ("fwd", "rev", "intersection", "grow_diag_final")
INSTALL = "pip install 'attnaudit[align]'  (or: pip install eflomal==2.0.0)"
_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def grow_diag_final(fwd: set[Link], rev: set[Link], source_len: int, target_len: int) -> set[Link]:
    """Koehn et al. (2003) grow-diag-final of two directional ``(source, target)`` link sets.

    Start from the intersection; repeatedly add a link of the union that neighbours (also
    diagonally) a chosen link when its source or its target word is still unaligned; finally
    add the remaining links of ``fwd``, then of ``rev``, whose source or target word is
    unaligned. Hand-written (the Moses pseudo-code, source words in the outer loop) because no
    installed library has it: eflomal ships no ``atools`` and NLTK (not a dependency) only has
    grow-diag-final-and on strings.
    """
    union = fwd | rev
    links = fwd & rev
    aligned_source = {s for s, _ in links}
    aligned_target = {t for _, t in links}

    def add(link: Link) -> None:
        links.add(link)
        aligned_source.add(link[0])
        aligned_target.add(link[1])

    grew = True
    while grew:
        grew = False
        for s in range(source_len):
            for t in range(target_len):
                if (s, t) not in links:
                    continue
                for ds, dt in _NEIGHBOURS:
                    new = (s + ds, t + dt)
                    if new in union and new not in links and (new[0] not in aligned_source or new[1] not in aligned_target):
                        add(new)
                        grew = True
    for directional in (fwd, rev):
        for link in sorted(directional):
            if link[0] not in aligned_source or link[1] not in aligned_target:
                add(link)
    return links


def symmetrise(fwd: set[Link], rev: set[Link], source_len: int, target_len: int) -> dict[str, set[Link]]:
    """The links of each of :data:`SYMMETRISATIONS` from eflomal's two directions."""
    return {
        "fwd": set(fwd),
        "rev": set(rev),
        "intersection": fwd & rev,
        "grow_diag_final": grow_diag_final(fwd, rev, source_len, target_len),
    }


def training_pairs(run: Run) -> list[Example]:
    """The pairs the NMT run was trained on: its task's train split minus the pairs longer than
    the run's ``max_train_len`` subwords on either side (``train_nmt``'s own filter)."""
    train = run.data().train
    limit = run.info.get("train", {}).get("max_train_len")
    if limit is None:
        return list(train)
    return [ex for ex in train if fits_length(run.collate, ex, limit)]


def _read_links(path: Path, first: int, count: int) -> list[set[Link]]:
    """``count`` lines of a Pharaoh ``i-j`` file (0-based, source first) from line ``first``."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if len(lines) < first + count:
        raise AttnAuditError(f"eflomal wrote {len(lines)} alignment lines, expected at least {first + count}")
    out = []
    for line in lines[first : first + count]:
        out.append({(int(s), int(t)) for s, t in (item.split("-") for item in line.split())})
    return out


def require_eflomal() -> Any:
    """The ``eflomal`` module, or a one-line error with the install command."""
    try:
        import eflomal
    except ImportError:
        raise AttnAuditError(f"--baseline eflomal needs the eflomal package: {INSTALL}") from None
    return eflomal


def eflomal_links(train: Sequence[Example], gold: Sequence[Example]) -> tuple[list[set[Link]], list[set[Link]]]:
    """One eflomal run on ``train + gold`` (words as given, one sentence a line): the forward
    and reverse ``(source, target)`` links of the ``gold`` pairs."""
    eflomal = require_eflomal()
    pairs = [*train, *gold]
    for ex in pairs:
        if not ex.tokens or not ex.target or any(" " in w for w in (*ex.tokens, *ex.target)):
            raise AttnAuditError(f"{ex.meta.get('source', 'a pair')}: eflomal needs non-empty sides of space-free words")
    with tempfile.TemporaryDirectory(prefix="attnaudit-eflomal-") as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        eflomal.Aligner().align(
            [" ".join(ex.tokens) for ex in pairs], [" ".join(ex.target or []) for ex in pairs],
            links_filename_fwd=str(fwd), links_filename_rev=str(rev),
        )
        if not (fwd.is_file() and rev.is_file()):
            raise AttnAuditError("eflomal wrote no alignment files")
        return _read_links(fwd, len(train), len(gold)), _read_links(rev, len(train), len(gold))


def eflomal_baseline(
    train: Sequence[Example], gold: Sequence[Example], runs: int,
    gold_sure: set[tuple[int, int, int]], gold_possible: set[tuple[int, int, int]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``runs`` eflomal runs scored against the gold links (``(sentence, source, target)``):
    summary entries ``eflomal_{symmetrisation}_{mean,min,max}`` (AER %) and one row per run
    and symmetrisation."""
    if runs < 1:
        raise AttnAuditError(f"--baseline-runs must be at least 1, got {runs}")
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for number in range(1, runs + 1):
        fwd, rev = eflomal_links(train, gold)
        predicted: dict[str, set[tuple[int, int, int]]] = {name: set() for name in SYMMETRISATIONS}
        for n, (ex, f, r) in enumerate(zip(gold, fwd, rev)):
            for name, links in symmetrise(f, r, len(ex.tokens), len(ex.target or [])).items():
                predicted[name] |= {(n, *link) for link in links}
        for name in SYMMETRISATIONS:
            rows.append({"run": number, "symmetrisation": name, "aer": 100 * aer(predicted[name], gold_sure, gold_possible),
                         "links": len(predicted[name])})
    summary: dict[str, Any] = {}
    for name in SYMMETRISATIONS:
        values = [r["aer"] for r in rows if r["symmetrisation"] == name]
        summary[f"eflomal_{name}_mean"] = statistics.fmean(values)
        summary[f"eflomal_{name}_min"] = min(values)
        summary[f"eflomal_{name}_max"] = max(values)
    summary["eflomal_runs"] = runs
    summary["eflomal_train_pairs"] = len(train)
    summary["eflomal_seconds"] = time.perf_counter() - start
    return summary, rows
