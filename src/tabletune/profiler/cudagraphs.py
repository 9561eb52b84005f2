"""Which (B, k) decode steps run a CUDA graph on vLLM 0.26's V2 runner, and which do not. Pure.

A pure-decode step of B requests at draft length k schedules B * (k + 1) tokens, all requests
with the same query length k + 1. The runner picks its graph like this
(``vllm/v1/worker/gpu/cudagraph_utils.py``, ``CudaGraphManager._init_candidates`` and
``dispatch``; capture sizes from ``VllmConfig._set_cudagraph_sizes``):

- capture sizes default to 1, 2, 4, then every 8 below 256, then every 16 up to
  ``max_cudagraph_capture_size``, which defaults to min(2 * max_num_seqs * (K + 1), 512,
  max_num_batched_tokens);
- for every capture size s and every query length q = k + 1 of a k in the starting table, a
  full graph of round_up(s, q) tokens (and round_up(s, q) / q requests) is captured, unless it
  exceeds the capture limit; and a piecewise graph of s tokens (the mixed routine);
- a step of t tokens looks only at the graphs of the smallest captured token count >= t (its
  "bucket"), takes the first whose query length and request count fit, else runs eager.

So some token counts land in a bucket that another k's rounding created and that holds no graph
for their own query length: k=0 at B=3 (bucket 3, made by k=2's round_up(1, 3)) runs eager, k=2
at B=4 (12 tokens, bucket 16: full graphs of q=1, 2, 4 and a piecewise one) runs piecewise.
Past the capture limit every step runs eager. The drafter's own graphs are not modelled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tabletune.errors import InputError

DEFAULT_CAPTURE_LIMIT = 512
"""vLLM 0.26's cap on the default max_cudagraph_capture_size"""

GraphMode = Literal["full", "piecewise", "eager"]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def default_max_capture_size(
    max_num_seqs: int, num_speculative_tokens: int, max_num_batched_tokens: int | None = None
) -> int:
    """``max_cudagraph_capture_size`` when the operator does not set it."""
    size = min(max_num_seqs * (1 + num_speculative_tokens) * 2, DEFAULT_CAPTURE_LIMIT)
    return size if max_num_batched_tokens is None else min(size, max_num_batched_tokens)


def capture_sizes_up_to(
    max_capture_size: int, max_num_batched_tokens: int | None = None
) -> tuple[int, ...]:
    """The default capture sizes for a limit (vLLM truncates the limit to the largest of them)."""
    if max_capture_size < 1:
        raise InputError(f"max_cudagraph_capture_size must be >= 1, got {max_capture_size}")
    sizes = [s for s in (1, 2, 4) if s <= max_capture_size]
    if max_capture_size >= 8:
        sizes += range(8, min(max_capture_size + 1, 256), 8)
    if max_capture_size >= 256:
        sizes += range(256, max_capture_size + 1, 16)
    if max_num_batched_tokens is not None and max_num_batched_tokens <= max_capture_size:
        sizes.append(max_num_batched_tokens)
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True)
class CaptureConfig:
    """The engine's capture sizes and where they came from."""

    max_capture_size: int
    capture_sizes: tuple[int, ...]
    source: str

    @classmethod
    def default(
        cls,
        *,
        max_num_seqs: int,
        num_speculative_tokens: int,
        max_capture_size: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> CaptureConfig:
        """What vLLM 0.26 computes (``max_capture_size`` as set by the operator, if any)."""
        limit = max_capture_size or default_max_capture_size(
            max_num_seqs, num_speculative_tokens, max_num_batched_tokens
        )
        if max_num_batched_tokens is not None:
            limit = min(limit, max_num_batched_tokens)
        sizes = capture_sizes_up_to(limit, max_num_batched_tokens)
        how = "set" if max_capture_size else "default"
        return cls(
            max_capture_size=sizes[-1],
            capture_sizes=sizes,
            source=f"vLLM 0.26's rule (limit {how}: max_num_seqs={max_num_seqs}, "
            f"K={num_speculative_tokens})",
        )


def _flag(args: Sequence[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of ``names`` in a vLLM command line (``--x v`` or ``--x=v``)."""
    found = None
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in names:
            found = value if equals else (args[index + 1] if index + 1 < len(args) else None)
    return found


def capture_config_from_args(
    args: Sequence[str], *, max_num_seqs: int, num_speculative_tokens: int
) -> CaptureConfig:
    """What vLLM 0.26 will capture, given its command line (``--max-num-batched-tokens``,
    ``--compilation-config``/``-cc`` with ``max_cudagraph_capture_size`` or
    ``cudagraph_capture_sizes``); InputError for a compilation config that is not JSON."""
    batched = _flag(args, ("--max-num-batched-tokens",))
    tokens = int(batched) if batched and batched.isdigit() else None
    config_text = _flag(args, ("--compilation-config", "-cc", "-O"))
    config: dict[str, object] = {}
    if config_text and config_text.lstrip().startswith("{"):
        try:
            loaded = json.loads(config_text)
        except json.JSONDecodeError as error:
            raise InputError(f"--compilation-config is not JSON: {error.msg}") from None
        config = loaded if isinstance(loaded, dict) else {}
    listed = config.get("cudagraph_capture_sizes")
    if isinstance(listed, list) and listed and all(isinstance(v, int) for v in listed):
        sizes = tuple(sorted({v for v in listed if tokens is None or v <= tokens}))
        return CaptureConfig(sizes[-1], sizes, "vLLM 0.26's rule (cudagraph_capture_sizes set)")
    limit = config.get("max_cudagraph_capture_size")
    return CaptureConfig.default(
        max_num_seqs=max_num_seqs,
        num_speculative_tokens=num_speculative_tokens,
        max_capture_size=limit if isinstance(limit, int) and limit > 0 else None,
        max_num_batched_tokens=tokens,
    )


_MAX_SIZE = re.compile(r"'max_cudagraph_capture_size': (\d+)")
_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([\d, ]*)\]")
_CAPTURED = re.compile(r"Graph capturing finished in (\d+(?:\.\d+)?) secs, took (\d+\.\d+) GiB")


def capture_config_from_log(text: str) -> CaptureConfig | None:
    """The capture sizes in vLLM's engine-config log line (``compilation_config={...}``)."""
    size, sizes = _MAX_SIZE.search(text), _SIZES.search(text)
    if size is None or sizes is None:
        return None
    listed = tuple(sorted(int(s) for s in sizes.group(1).split(",") if s.strip()))
    return CaptureConfig(int(size.group(1)), listed, "engine log")


@dataclass(frozen=True)
class CaptureCost:
    """What capturing took at start-up, from the log: seconds and GiB."""

    seconds: float
    gib: float


def capture_cost_from_log(text: str) -> CaptureCost | None:
    """vLLM logs ``Graph capturing finished in N secs, took X GiB`` (the last one wins)."""
    found = _CAPTURED.findall(text)
    if not found:
        return None
    seconds, gib = found[-1]
    return CaptureCost(float(seconds), float(gib))


@dataclass(frozen=True)
class Dispatch:
    mode: GraphMode
    tokens: int
    """the token count the step runs at (padded up to its graph's size)"""
    bucket: int | None
    """the captured token count whose graphs were considered (None: beyond every one)"""


@dataclass(frozen=True)
class _Graph:
    mode: GraphMode
    tokens: int
    requests: int | None  # None: any number (piecewise)
    query_len: int | None  # None: any (piecewise)


class GraphDispatch:
    """The target model's graph choice on vLLM 0.26's V2 runner (FULL_AND_PIECEWISE, no LoRA)."""

    def __init__(
        self,
        capture: CaptureConfig,
        *,
        max_num_seqs: int,
        num_speculative_tokens: int,
        table_ks: Sequence[int] | None,
    ) -> None:
        """``table_ks``: the k of the starting table's ranges in order (None: a static K)."""
        self.capture = capture
        self.max_num_seqs = max_num_seqs
        query_lens = [k + 1 for k in (table_ks or [num_speculative_tokens])]
        max_decode_tokens = max_num_seqs * (num_speculative_tokens + 1)
        by_tokens: dict[int, list[_Graph]] = {}
        full: set[_Graph] = set()
        for size in sorted(capture.capture_sizes):
            for q in query_lens:
                tokens = round_up(size, q)
                graph = _Graph("full", tokens, tokens // q, q)
                if (
                    tokens > max_decode_tokens
                    or tokens > capture.max_capture_size
                    or tokens // q > max_num_seqs
                    or graph in full
                ):
                    continue
                full.add(graph)
                by_tokens.setdefault(tokens, []).append(graph)
            by_tokens.setdefault(size, []).append(_Graph("piecewise", size, None, None))
        self._buckets = sorted(by_tokens)
        self._graphs = by_tokens
        self.graph_count = len(full) + len(capture.capture_sizes)
        """graphs captured at start: the full ones and one piecewise per capture size"""

    def bucket_of(self, tokens: int) -> int | None:
        for bucket in self._buckets:
            if bucket >= tokens:
                return bucket
        return None

    def decode_step(self, batch: int, k: int) -> Dispatch:
        """A step of ``batch`` requests each verifying ``k`` drafts (all query length k + 1)."""
        tokens = batch * (k + 1)
        bucket = self.bucket_of(tokens)
        if bucket is None:
            return Dispatch("eager", tokens, None)
        for graph in self._graphs[bucket]:
            if graph.query_len not in (None, k + 1):
                continue
            if graph.requests is not None and graph.requests < batch:
                continue
            return Dispatch(graph.mode, graph.tokens, bucket)
        return Dispatch("eager", tokens, bucket)

    def first_batch_beyond(self, k: int) -> int:
        """The smallest B whose B * (k + 1) tokens exceed the capture limit (graphs end there)."""
        return self.capture.max_capture_size // (k + 1) + 1

    def note(self, batch: int, k: int) -> str:
        """One line on a step that does not run a full graph ('' when it does)."""
        d = self.decode_step(batch, k)
        tokens = batch * (k + 1)
        limit = self.capture.max_capture_size
        if d.mode == "full":
            return ""
        if d.bucket is None:
            return (
                f"no CUDA graph: {tokens} tokens exceed max_cudagraph_capture_size {limit} "
                "(vLLM 0.26 V2 runner)"
            )
        what = "piecewise CUDA graph only" if d.mode == "piecewise" else "no CUDA graph"
        return (
            f"{what}: {tokens} tokens fall in the {d.bucket}-token bucket, which holds no full "
            f"graph for query length {k + 1} (vLLM 0.26 V2 runner)"
        )
