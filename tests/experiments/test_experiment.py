"""The result type round-trips through JSON/CSV and the registry validates options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from attnaudit.errors import AttnAuditError, InputError
from attnaudit.experiments.experiment import EXPERIMENTS, Experiment, Result, discover, register, summarise
from attnaudit.experiments.runner import make_options


def test_result_save_load_and_frames(tmp_path: Path) -> None:
    result = Result(
        test="demo",
        summary={"tau_mean": 0.3},
        instances=[{"id": 0, "tau": 0.1}, {"id": 1, "tau": float("nan")}],
        tables={"per_layer": [{"layer": 0, "jsd": 0.2}]},
        meta={"n": 2},
    )
    path = result.save(tmp_path)
    loaded = Result.load(path)
    assert loaded.summary == {"tau_mean": 0.3}
    assert loaded.instances[1]["tau"] is None  # strict JSON: NaN stored as null
    assert pd.read_csv(tmp_path / "demo.csv")["tau"].isna().tolist() == [False, True]
    assert loaded.frame("per_layer")["jsd"].tolist() == [0.2]
    with pytest.raises(AttnAuditError, match="no table 'missing'"):
        loaded.frame("missing")


def test_load_rejects_foreign_json(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"foo": 1}')
    with pytest.raises(InputError, match="not an attnaudit result"):
        Result.load(tmp_path / "x.json")


def test_options_are_validated() -> None:
    @register
    class Toy(Experiment):
        name = "toy-options"

        @dataclass
        class Options:
            k: int = 5
            lambdas: list[float] = field(default_factory=lambda: [0.0, 1.0])

    try:
        experiment = Toy()
        assert make_options(experiment, {"k": 3}).k == 3
        with pytest.raises(AttnAuditError, match="unknown option"):
            make_options(experiment, {"q": 1})
    finally:
        EXPERIMENTS.pop("toy-options")


def test_summarise_counts_nan_separately() -> None:
    stats = summarise([1.0, 3.0, float("nan")])
    assert stats == {"mean": 2.0, "std": 1.0, "median": 2.0, "n": 2, "n_nan": 1}


def test_every_registered_experiment_is_well_formed() -> None:
    for name, cls in discover().items():
        assert cls.name == name and cls.description, name


def test_make_options_refuses_non_finite_numbers() -> None:
    experiment = discover()["permutation"]()
    assert make_options(experiment, {"threshold": 0.1}).threshold == 0.1
    for bad in (float("nan"), float("inf")):
        with pytest.raises(AttnAuditError, match="threshold must be finite"):
            make_options(experiment, {"threshold": bad})
    with pytest.raises(AttnAuditError, match="lambdas must be finite"):
        make_options(discover()["global-adversary"](), {"lambdas": [0.1, float("nan")]})


def test_each_tests_own_audit_and_demo_settings_are_options_it_has() -> None:
    """audit_options, audit_decoder_options and demo_options live on the test: each names only fields of its Options and
    builds valid Options; the audit runs the cheap tests before the training-based ones."""
    from dataclasses import fields

    registry = discover()
    for name, cls in registry.items():
        known = {f.name for f in fields(cls.Options)}
        for values in (cls.settings.options, cls.settings.decoder_options, *cls.settings.demo.values()):
            assert set(values) <= known, (name, set(values) - known)
            make_options(cls(), values)
        make_options(cls(), {**cls.settings.options, **cls.settings.decoder_options})  # what a decoder audit builds
        assert set(cls.settings.demo) <= {"full", "quick"}, name
    assert registry["importance"].settings.rank < 50 < registry["uniform"].settings.rank
    assert registry["importance"].settings.ranks_instances == "tau_attention_vs_gradient"
    assert {n for n, c in registry.items() if c.settings.transformers_only} == {
        "activation-swap", "shuffle", "key-adversary", "random-keys", "opposite-keys"
    }
