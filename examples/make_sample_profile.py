"""Writes examples/sample-profile.json: a SAMPLE (not measured) profile built from the H200 step
times quoted in docs/design.md's engine facts (dummy Qwen3-4B + EAGLE-3, vLLM 0.26.0, V2 runner):
~4.5 ms at B=1 for every k, 11-14 ms at B=128 and 18-26 ms at B=256 for k=0..3, and the real jump
of k=2 at B=4 (~14.5 ms). Between those anchors T is interpolated linearly; three samples per cell
with a small fixed jitter. The profiler issue replaces it with a measured profile under profiles/.

    python examples/make_sample_profile.py
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from tabletune import __version__
from tabletune.schemas import AcceptanceProfile, Profile, ProfileMetadata, save_model
from tabletune.schemas.profile import Cell

# (B, ms) anchors per k, from docs/design.md; B=16 anchors give the gentle small-batch slope.
ANCHORS: dict[int, list[tuple[int, float]]] = {
    0: [(1, 4.5), (16, 5.0), (128, 11.0), (256, 18.0)],
    1: [(1, 4.5), (16, 5.2), (128, 12.0), (256, 20.5)],
    2: [(1, 4.5), (16, 5.5), (128, 13.0), (256, 23.0)],
    3: [(1, 4.5), (16, 5.8), (128, 14.0), (256, 26.0)],
}
JUMPS = {(4, 2): 14.5}  # no captured graph for that token count: a real jump, kept as is
GRID = (*range(1, 17), *range(24, 257, 8))


def main() -> None:
    rng = np.random.default_rng(20261130)
    cells = []
    for k, anchors in ANCHORS.items():
        xs, ys = zip(*anchors, strict=True)
        for b in GRID:
            step = JUMPS.get((b, k), float(np.interp(b, xs, ys)))
            samples = tuple(round(step * (1 + j), 4) for j in rng.normal(0, 0.004, 3))
            cells.append(
                Cell(batch_size=b, k=k, samples_ms=samples, step_ms=float(np.median(samples)))
            )
    profile = Profile(
        metadata=ProfileMetadata(
            gpu="NVIDIA H200 (sample: interpolated from docs/design.md figures, not measured)",
            engine_version="0.26.0",
            model="qwen3-4b (dummy weights)",
            drafter="qwen3-4b-eagle3 (dummy weights)",
            method="eagle3",
            num_speculative_tokens=3,
            model_runner="v2",
            max_num_seqs=256,
            created_at=datetime(2026, 11, 30, tzinfo=UTC),
            tool_version=__version__,
            sample=True,
            notes="SAMPLE profile: written by examples/make_sample_profile.py from the step "
            "times quoted in docs/design.md; use a measured profile from profiles/ for decisions.",
        ),
        batch_grid=GRID,
        ks=tuple(ANCHORS),
        cells=tuple(cells),
        acceptance=AcceptanceProfile(
            rates=(0.75, 0.55, 0.40),
            prompt_source="assumed: typical EAGLE-3 acceptance quoted in docs/design.md",
        ),
    )
    out = Path(__file__).with_name("sample-profile.json")
    save_model(profile, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
