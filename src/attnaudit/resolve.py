"""Which model did the user name? The one resolver from what was typed to a loaded :class:`~attnaudit.run.Run`.

``--hf NAME|FOLDER|FILE.gguf`` or ``--run DIR``, exactly one (the CLI's ``tests``, ``explanations``, ``explain`` and
``run``; :func:`attnaudit.audit.audit`, and through it a sweep's rows and an audit's Ray workers), or one value that is
either (a :class:`Run`, a run directory, else a Hugging Face model: :func:`~attnaudit.explain.text.explain_text`'s
``source``). :func:`name_model` checks what was given and says which it is (:class:`Named`, nothing loaded yet, so a
caller can check its other arguments first); :meth:`Named.load` loads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnaudit.errors import AttnAuditError
from attnaudit.io import is_run_dir
from attnaudit.run import Run, load_run

EXACTLY_ONE = "give exactly one of --hf MODEL and --run RUN"


@dataclass(frozen=True)
class Named:
    """A model the user named: ``run`` (a :class:`Run` or a run directory) or ``hf`` (a Hugging Face model: ``smollm2``,
    ``minilm``, a folder, a ``.gguf`` file or a hub name) with ``options``, its loading options
    (:func:`attnaudit.hf.load_hf`'s ``task``, ``prompt``, ``verbalizer``, ``max_length``, ``dtype``, ...)."""

    hf: str | None = None
    run: Run | Path | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def load(self, device: str = "auto", data_dir: str | Path | None = None) -> Run:
        """The named model, loaded on ``device`` (a given :class:`Run` as it is)."""
        if isinstance(self.run, Run):
            return self.run
        if self.run is not None:
            return load_run(self.run, device=device, data_dir=data_dir)
        from attnaudit.hf import load_hf

        assert self.hf is not None  # name_model names exactly one
        return load_hf(self.hf, device=device, data_dir=data_dir, **self.options)

    def describe(self) -> str:
        """What the user named, for a result's record."""
        if isinstance(self.run, Run):
            return str(self.run.path or self.run.family)
        return str(self.run if self.run is not None else self.hf)


def name_model(
    hf: str | None = None,
    run: Run | str | Path | None = None,
    *,
    source: Named | Run | str | Path | None = None,
    exactly_one: str = EXACTLY_ONE,
    **options: Any,
) -> Named:
    """What was named: exactly one of ``hf`` and ``run`` (else the one-line error ``exactly_one``), or ``source``, one
    value that is either (a :class:`Run` or a run directory, else a Hugging Face model). ``options``: Hugging Face
    loading options (those given as None are dropped); given with a run, a one-line error names them."""
    if isinstance(source, Named):
        hf, run, options = source.hf, source.run, {**source.options, **options}
    elif source is not None:
        if isinstance(source, Run) or is_run_dir(Path(source)):
            run = source
        else:
            hf = str(source)
    if (hf is None) == (run is None):
        raise AttnAuditError(exactly_one)
    given = {k: v for k, v in options.items() if v is not None}
    if run is not None and given:
        flags = "/".join("--" + k.replace("_", "-") for k in given)
        raise AttnAuditError(f"{flags} appl{'ies' if len(given) == 1 else 'y'} with --hf only")
    return Named(hf=hf, run=run if isinstance(run, Run) or run is None else Path(run), options=given)


def load_model(
    hf: str | None = None,
    run: Run | str | Path | None = None,
    *,
    device: str = "auto",
    data_dir: str | Path | None = None,
    source: Named | Run | str | Path | None = None,
    **options: Any,
) -> Run:
    """:func:`name_model`, then :meth:`Named.load`: the Run the user named."""
    return name_model(hf, run, source=source, **options).load(device, data_dir)
