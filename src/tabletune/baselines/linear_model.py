"""TurboSpec/SmartSpec-style step-time model: linear in the work of the step, fitted once.

SmartSpec (arXiv 2406.14066) models a verification step as linear in the batched tokens and the
draft phase as k proposal steps, each linear in the batch size; context length is constant in a
closed-loop decode sweep, so it folds into the intercepts:

    T(B, k) ~= intercept + per_token * B * (k + 1) + k * (per_draft_step + per_draft_row * B)

Fitted by least squares to every profiled cell. It smooths away real jumps (cells without a
captured CUDA graph): that is the difference from TableTune, which uses the measured T as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tabletune.solver import SolverError, StepTimes


@dataclass(frozen=True)
class LinearStepModel:
    """Coefficients in ms of the model in the module docstring."""

    intercept: float
    per_token: float
    per_draft_step: float
    per_draft_row: float

    @staticmethod
    def features(batch_size: float, k: float) -> tuple[float, float, float, float]:
        return (1.0, batch_size * (k + 1.0), k, k * batch_size)

    @classmethod
    def fit(cls, step_times: StepTimes) -> LinearStepModel:
        """Least-squares fit to every measured (B, k) cell of a profile."""
        rows = []
        targets = []
        for k_index, k in enumerate(step_times.ks):
            for b_index, b in enumerate(step_times.grid):
                rows.append(cls.features(b, k))
                targets.append(step_times.ms[k_index, b_index])
        design = np.asarray(rows, dtype=float)
        if np.linalg.matrix_rank(design) < design.shape[1]:
            raise SolverError(
                "a linear step-time fit needs at least two draft lengths and two batch sizes"
            )
        coefficients, *_ = np.linalg.lstsq(design, np.asarray(targets, dtype=float), rcond=None)
        intercept, per_token, per_draft_step, per_draft_row = (float(c) for c in coefficients)
        return cls(intercept, per_token, per_draft_step, per_draft_row)

    def predict(self, batch_size: int, k: int) -> float:
        """Predicted step time in ms (floored at a microsecond: a fit may dip below zero)."""
        x = self.features(batch_size, k)
        value = (
            self.intercept * x[0]
            + self.per_token * x[1]
            + self.per_draft_step * x[2]
            + self.per_draft_row * x[3]
        )
        return max(value, 1e-3)
