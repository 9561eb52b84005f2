"""Profile: measured step times T(B, k) with the metadata that says where they hold."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tabletune.schemas.acceptance import AcceptanceProfile
from tabletune.schemas.shape import TimingShape
from tabletune.solver.model import StepTimes, interpolate_rows

PROFILE_SCHEMA_VERSION: Literal[1] = 1

# sigma of a normal distribution per median absolute deviation
MAD_TO_SIGMA = 1.4826


class CudaGraphCapture(BaseModel):
    """The engine's CUDA-graph capture sizes (token counts), which decide which (B, k) steps run
    a full graph, a piecewise one, or none (tabletune.profiler.cudagraphs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_capture_size: int = Field(ge=0, description="compilation_config.max_cudagraph_capture_size")
    capture_sizes: tuple[int, ...] = Field(description="compilation_config.cudagraph_capture_sizes")
    source: str = Field(description="where these came from: the engine's log, or vLLM's default")


class ProfileMetadata(BaseModel):
    """Where and how the step times were measured; a profile holds only for this setup."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str = Field(description="GPU name as the driver reports it")
    engine: str = Field(default="vllm")
    engine_version: str
    model: str
    drafter: str | None = None
    method: str = Field(description="speculative method, e.g. eagle3")
    num_speculative_tokens: int = Field(ge=1, description="K: the longest draft length")
    cudagraph_mode: str = Field(default="FULL_AND_PIECEWISE")
    model_runner: Literal["v1", "v2"] = "v2"
    max_num_seqs: int = Field(ge=1)
    created_at: datetime
    tool_version: str
    wall_time_s: dict[str, float] = Field(
        default_factory=dict, description="wall time of the run by phase (engine_start, ...)"
    )
    sample: bool = Field(default=False, description="true: not measured, an illustration")
    incomplete: bool = Field(default=False, description="true: the run was interrupted")
    notes: str = ""
    # Optional, added later; absent in older profiles.
    timing_method: Literal["request", "in-flight"] | None = Field(
        default=None,
        description="request: (t(1+n) - t(1)) / n of whole requests; in-flight: the plugin's "
        "step cells while B requests decode (None: older profiles, the request method)",
    )
    timing_shape: TimingShape | None = Field(
        default=None, description="prompt, context and prefill stream the steps were timed under"
    )
    cuda_graphs: CudaGraphCapture | None = Field(
        default=None, description="the engine's CUDA-graph capture sizes"
    )
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, description="the engine's, as its table view reported it"
    )


class Cell(BaseModel):
    """One (B, k) measurement: every raw sample kept, and the statistic the solver uses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int = Field(ge=1)
    k: int = Field(ge=0)
    samples_ms: tuple[float, ...] = Field(min_length=1)
    step_ms: float = Field(gt=0, description="the chosen statistic of samples_ms")
    noisy: bool = Field(default=False, description="stayed jumpy after re-measuring")
    # Optional, added later; absent in older profiles.
    context_tokens: float | None = Field(
        default=None, ge=0, description="mean context (prompt + generated) of the timed steps"
    )
    tokens_per_step: float | None = Field(
        default=None, ge=0, description="mean scheduled tokens per timed step (B*(1+k): decode)"
    )
    cuda_graph: Literal["full", "piecewise", "eager"] | None = Field(
        default=None,
        description="what vLLM's V2 runner dispatches a pure-decode step of this cell to, from "
        "the capture sizes (computed, not observed)",
    )
    note: str = Field(default="", description="why this cell stands out, where known")

    @model_validator(mode="after")
    def _positive(self) -> Cell:
        if any(not s > 0 for s in self.samples_ms):
            raise ValueError("samples_ms must all be > 0")
        return self

    @property
    def relative_sigma(self) -> float:
        """Uncertainty of ``step_ms`` relative to it: the samples' robust spread (1.4826 x the
        median absolute deviation, which one wild sample barely moves) over sqrt(n). A noisy
        cell stayed jumpy after re-measuring, so more samples did not settle it: it keeps its
        whole spread. One sample says nothing about spread (0)."""
        samples = np.asarray(self.samples_ms)
        spread = MAD_TO_SIGMA * float(np.median(np.abs(samples - np.median(samples))))
        sigma = spread if self.noisy else spread / math.sqrt(len(samples))
        return sigma / self.step_ms


class Profile(BaseModel):
    """Step times on a batch grid for each profiled k (a complete grid), plus an optional prior."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = PROFILE_SCHEMA_VERSION
    kind: Literal["tabletune.profile"] = "tabletune.profile"
    metadata: ProfileMetadata
    statistic: Literal["median", "mean", "min"] = "median"
    batch_grid: tuple[int, ...] = Field(min_length=1)
    ks: tuple[int, ...] = Field(min_length=1, description="the profiled draft lengths")
    cells: tuple[Cell, ...]
    acceptance: AcceptanceProfile | None = Field(
        default=None, description="a^prior measured with the profile, if any"
    )

    @model_validator(mode="after")
    def _complete(self) -> Profile:
        grid = self.batch_grid
        if list(grid) != sorted(set(grid)) or grid[0] < 1:
            raise ValueError("batch_grid must be strictly increasing positive integers")
        if list(self.ks) != sorted(set(self.ks)) or self.ks[0] < 0:
            raise ValueError("ks must be strictly increasing non-negative integers")
        big_k = self.metadata.num_speculative_tokens
        if self.ks[-1] > big_k:
            raise ValueError(f"ks holds {self.ks[-1]} > metadata.num_speculative_tokens={big_k}")
        if grid[-1] > self.metadata.max_num_seqs:
            raise ValueError(
                f"batch_grid reaches {grid[-1]} > metadata.max_num_seqs="
                f"{self.metadata.max_num_seqs}"
            )
        seen: set[tuple[int, int]] = set()
        for cell in self.cells:
            key = (cell.batch_size, cell.k)
            if key in seen:
                raise ValueError(f"cells: duplicate cell B={key[0]} k={key[1]}")
            if cell.batch_size not in grid or cell.k not in self.ks:
                raise ValueError(f"cells: B={key[0]} k={key[1]} is outside batch_grid x ks")
            seen.add(key)
        missing = [(b, k) for k in self.ks for b in grid if (b, k) not in seen]
        if missing:
            b, k = missing[0]
            raise ValueError(f"cells: {len(missing)} missing, first B={b} k={k}")
        if self.acceptance is not None and self.acceptance.max_k < self.ks[-1]:
            raise ValueError("acceptance has fewer rates than the longest profiled k")
        return self

    def step_matrix(self) -> np.ndarray:
        """T[k_index, b_index] in ms, rows in the order of ``ks``."""
        return self._cell_matrix(lambda cell: cell.step_ms)

    def uncertainty_matrix(self) -> np.ndarray:
        """Relative sigma_T / T per cell (``Cell.relative_sigma``), laid out as ``step_matrix``."""
        return self._cell_matrix(lambda cell: cell.relative_sigma)

    def off_graph_matrix(self) -> np.ndarray:
        """Which cells vLLM ran off the full CUDA graph (piecewise or eager, past the capture
        limit), laid out as ``step_matrix``; all False where the profile does not say."""
        return self._cell_matrix(lambda cell: cell.cuda_graph in ("piecewise", "eager")) > 0

    def _cell_matrix(self, value: Callable[[Cell], float]) -> np.ndarray:
        index_b = {b: i for i, b in enumerate(self.batch_grid)}
        index_k = {k: i for i, k in enumerate(self.ks)}
        matrix = np.zeros((len(self.ks), len(self.batch_grid)))
        for cell in self.cells:
            matrix[index_k[cell.k], index_b[cell.batch_size]] = value(cell)
        return matrix


def step_times_of(profile: Profile) -> StepTimes:
    """The solver's view of a profile's measured cells."""
    return StepTimes(grid=profile.batch_grid, ks=profile.ks, ms=profile.step_matrix())


def uncertainty_of(profile: Profile, max_batch: int) -> np.ndarray:
    """Relative sigma_T / T for B = 1..max_batch (rows follow ``ks``), interpolated between
    grid points as T is: the solver's ``TableProblem.uncertainty`` for this profile."""
    return interpolate_rows(profile.batch_grid, profile.uncertainty_matrix(), max_batch)
