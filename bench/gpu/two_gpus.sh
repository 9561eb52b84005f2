#!/usr/bin/env bash
# Two GPU jobs side by side on a host with two GPUs (the lent H200 x2), one job per GPU: each
# sees only its own GPU (CUDA_VISIBLE_DEVICES), serves on its own port and keeps its own vLLM
# compile cache (two cold starts writing one cache could tear it). The GPUs' clocks, power and
# temperature are logged once a second meanwhile (gpu_clocks.csv), so a slow window can be told
# from a throttled GPU, and so is the host's CPU (host_load.csv, bench/gpu/host_logger.py: busy,
# iowait and steal shares of all CPUs; each live_step_time.sh job logs its own vLLM's processes
# too, in its own host_load.csv). Everything the jobs write is packed into one archive, since a
# device call brings back at most 8 files.
#
# Usage, on the GPU host from the repository root, after `source .gpu-bundle/p3/device-setup.sh`:
#     JOB0="WARM_START=1 NAME=profile_fast_route bash bench/gpu/profile_fast.sh" \
#     JOB1="DRIVER_ARGS='--loads 192' bash bench/gpu/eval_traffic.sh" \
#     bash bench/gpu/two_gpus.sh
# Env: OUT (/tmp/two-gpus), BUDGET_S (570: handed to both jobs), JOB0 and JOB1 (shell commands,
# run with OUT, PORT, CUDA_VISIBLE_DEVICES and VLLM_CACHE_ROOT of their own). Results under
# $OUT: jobs.tgz (gpu0/ and gpu1/, each job's own files), gpu_clocks.csv, host_load.csv,
# two_gpus_log.txt.
# Exits non-zero when either job did.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/two-gpus}
BUDGET_S=${BUDGET_S:-570}
: "${JOB0:?JOB0 must name the first GPU's job}" "${JOB1:?JOB1 must name the second GPU's job}"
mkdir -p "$OUT"
exec > >(tee "$OUT/two_gpus_log.txt") 2>&1

nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv -l 1 >"$OUT/gpu_clocks.csv" 2>&1 &
clocks_pid=$!
python3 bench/gpu/host_logger.py --out "$OUT/host_load.csv" &
host_pid=$!
# Its header is written once it holds SIGTERM for its last row: a job shorter than its start-up
# (a dry run's) would otherwise stop it before it wrote anything.
for _ in $(seq 100); do [[ -s "$OUT/host_load.csv" ]] && break; sleep 0.1; done

pids=()
for gpu in 0 1; do
  job_var=JOB$gpu
  mkdir -p "$OUT/gpu$gpu"
  CUDA_VISIBLE_DEVICES=$gpu PORT=$((8000 + gpu)) VLLM_CACHE_ROOT="$HOME/.cache/vllm-gpu$gpu" \
    OUT="$OUT/gpu$gpu" BUDGET_S="$BUDGET_S" \
    bash -c "${!job_var}" >"$OUT/gpu$gpu/job_log.txt" 2>&1 &
  pids+=($!)
  echo "gpu$gpu: pid ${pids[-1]}: ${!job_var}"
done

rc=0
for gpu in 0 1; do
  wait "${pids[$gpu]}"
  job_rc=$?
  echo "gpu$gpu: exit $job_rc"
  tail -5 "$OUT/gpu$gpu/job_log.txt"
  (( job_rc != 0 )) && rc=$job_rc
done
kill "$clocks_pid" "$host_pid" 2>/dev/null
wait "$host_pid"  # it writes its last partial second on SIGTERM
(cd "$OUT" && tar czf jobs.tgz gpu0 gpu1 && rm -rf gpu0 gpu1)
exit "$rc"
