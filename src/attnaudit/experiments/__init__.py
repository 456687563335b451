"""Faithfulness tests: one module per test, registered by name (see :mod:`attnaudit.experiments.experiment`)."""

from attnaudit.experiments.experiment import EXPERIMENTS, Experiment, Result, discover, get_experiment, register
from attnaudit.experiments.runner import run_test

__all__ = ["EXPERIMENTS", "Experiment", "Result", "discover", "get_experiment", "register", "run_test"]
