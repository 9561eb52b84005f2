"""The solver: pure functions and frozen data (no I/O, no logging, no settings)."""

from tabletune.solver.build import DEFAULT_STICKINESS, Solution, build_table, compress, expand
from tabletune.solver.errors import SolverError
from tabletune.solver.estimator import (
    DEFAULT_PRIOR_WEIGHT,
    EstimatorState,
    estimate,
    observe,
    rebuild_step,
)
from tabletune.solver.evaluate import Evaluation, evaluate_table, predicted_gain, weighted_goodput
from tabletune.solver.model import StepTimes, goodput, goodput_matrix, tau

__all__ = [
    "DEFAULT_PRIOR_WEIGHT",
    "DEFAULT_STICKINESS",
    "EstimatorState",
    "Evaluation",
    "Solution",
    "SolverError",
    "StepTimes",
    "build_table",
    "compress",
    "estimate",
    "evaluate_table",
    "expand",
    "goodput",
    "goodput_matrix",
    "observe",
    "predicted_gain",
    "rebuild_step",
    "tau",
    "weighted_goodput",
]
