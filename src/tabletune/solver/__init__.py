"""The solver: pure functions and frozen data (no I/O, no logging, no settings)."""

from tabletune.solver.build import build_table, solve
from tabletune.solver.errors import SolverError
from tabletune.solver.estimator import (
    DEFAULT_PRIOR_WEIGHT,
    EstimatorState,
    estimate,
    observe,
    rebuild_step,
)
from tabletune.solver.evaluate import Evaluation, evaluate_table, predicted_gain, weighted_goodput
from tabletune.solver.model import StepTimes, goodput, goodput_matrix, interpolate_rows, tau
from tabletune.solver.problem import DEFAULT_CONFIDENCE, DEFAULT_STICKINESS, TableProblem
from tabletune.solver.ranges import Range, compress, dense_lookup, expand, ranges_from_lookup
from tabletune.solver.solution import RangeSummary, Solution

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_PRIOR_WEIGHT",
    "DEFAULT_STICKINESS",
    "EstimatorState",
    "Evaluation",
    "Range",
    "RangeSummary",
    "Solution",
    "SolverError",
    "StepTimes",
    "TableProblem",
    "build_table",
    "compress",
    "dense_lookup",
    "estimate",
    "evaluate_table",
    "expand",
    "goodput",
    "goodput_matrix",
    "interpolate_rows",
    "observe",
    "predicted_gain",
    "ranges_from_lookup",
    "rebuild_step",
    "solve",
    "tau",
    "weighted_goodput",
]
