#!/usr/bin/env bash
# Does raising vLLM's CUDA-graph capture limit remove the k=2 / k=3 cliffs at B~128-192?
# ONE launch (about 4-5 minutes with start-up): the set-up of profile_fast.sh with
# --compilation-config '{"max_cudagraph_capture_size": 1024}' (vLLM's default is 512 here:
# k=3 leaves full graphs from B=129, k=2 from B=171), then the in-flight method at
# B=128,136,...,192 x k=2,3 (3 windows per cell), no cross-check, no acceptance, one grid.
#
# Usage, on the GPU host from the repository root, as profile_fast.sh (its header says how):
#     bash bench/gpu/capture_size.sh
# Results under $OUT (default /tmp/capture-size): capture_size.json (start-up time, GPU memory
# after start, the engine log's capture sizes, capture time and graph memory, the run's
# profiler summary: step ms per cell and each cell's graph), capture_size_h200.json,
# capture_size_runs.tgz (run1/: the profile), the vLLM log excerpt. Compare with
# profile_fast.json of a default launch (its start-up, memory, and the same cells): the cells
# past B*(k+1)=512 should drop from 40-50 ms to the 10-15 ms of their neighbours. Env as profile_fast.sh; CAPTURE_SIZE (1024).
set -uo pipefail
cd "$(dirname "$0")/../.."
export CAPTURE_SIZE=${CAPTURE_SIZE:-1024}
export NAME=${NAME:-capture_size}
export OUT=${OUT:-/tmp/capture-size}
export BUDGET_S=${BUDGET_S:-420}
export DRIVER_ARGS="--batch-sizes 128,136,144,152,160,168,176,184,192 --ks 2,3 --runs 1 \
--no-cross-check --no-acceptance ${DRIVER_ARGS:-}"
exec bash bench/gpu/profile_fast.sh
