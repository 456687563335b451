"""Faithfulness tests: one module per test, registered by name (see ``base``)."""

from attnaudit.experiments.experiment import (
    EXPERIMENTS,
    Experiment,
    Result,
    discover,
    get_experiment,
    register,
    run_test,
)

__all__ = ["EXPERIMENTS", "Experiment", "Result", "discover", "get_experiment", "register", "run_test"]
