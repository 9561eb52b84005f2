"""A profile's cells marked with the CUDA graph their pure-decode steps run, and why not a full
one where they do not (tabletune.profiler.cudagraphs); what was measured stays as it is. The
profiler does it to every profile it writes; profiles taken before can be marked after the fact
(``profiles/h200-qwen3-4b-eagle3.json`` was, with vLLM 0.26's default capture sizes)."""

from __future__ import annotations

from collections.abc import Sequence

from tabletune.profiler.cudagraphs import CaptureConfig, GraphDispatch
from tabletune.schemas.profile import CudaGraphCapture, Profile


def with_cuda_graphs(
    profile: Profile, capture: CaptureConfig, *, table_ks: Sequence[int] | None
) -> Profile:
    """``profile`` with each cell's ``cuda_graph`` and ``note``, the capture sizes in its
    metadata, and the cells without a full graph named in its notes. ``table_ks``: the k of
    the engine's starting table (None: a static K)."""
    meta = profile.metadata
    dispatch = GraphDispatch(
        capture,
        max_num_seqs=meta.max_num_seqs,
        num_speculative_tokens=meta.num_speculative_tokens,
        table_ks=table_ks,
    )
    cells = tuple(
        cell.model_copy(
            update={
                "cuda_graph": dispatch.decode_step(cell.batch_size, cell.k).mode,
                "note": dispatch.note(cell.batch_size, cell.k),
            }
        )
        for cell in profile.cells
    )
    off = sorted(
        ((c.k, c.batch_size, c.cuda_graph) for c in cells if c.cuda_graph != "full"),
    )
    notes = meta.notes
    if off:
        notes += ("; " if notes else "") + (
            "cells without a full CUDA graph (vLLM 0.26 V2 dispatch, see each cell's note): "
            + ", ".join(f"B={b} k={k} {mode}" for k, b, mode in off)
        )
    graphs = CudaGraphCapture(
        max_capture_size=capture.max_capture_size,
        capture_sizes=capture.capture_sizes,
        source=capture.source,
    )
    return profile.model_copy(
        update={
            "cells": cells,
            "metadata": meta.model_copy(update={"cuda_graphs": graphs, "notes": notes}),
        }
    )
