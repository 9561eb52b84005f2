#!/usr/bin/env bash
# Live step time on real vLLM 0.26.0 (one H200), ONE launch, under 9 minutes including start-up:
# fixed k=2 vs k=3 throughput next to the plugin's engine-side step cells, the plugin's counters
# against vLLM's, the step-timing overhead A/B, and neighbour exploration (live_step_time.py).
#
# Usage, on the GPU host from the repository root, after `source .gpu-bundle/p3/device-setup.sh`
# (shared/gpu/README.md) with this branch's wheel in .gpu-bundle/p3/:
#     bash bench/gpu/live_step_time.sh
# Preparing the wheel here (this machine reaches PyPI, the GPU host does not):
#     .venv/bin/pip wheel --no-deps -w .gpu-bundle/p3/ .
# Results under $OUT: live_step_time.json (meta, every window's raw row, the counters, summary),
# live_step_time_h200.json (the report's goals), live_step_time_vllm_log.txt (log excerpt),
# live_step_time_run_log.txt (this script's output), gpu_clocks.csv (where nvidia-smi exists:
# every GPU every GPU_CLOCKS_MS; meta.gpu_clocks names the job's GPUs), host_load.csv (the
# host's CPU every HOST_LOAD_S, bench/gpu/host_logger.py: busy, iowait and steal shares of all
# CPUs and, per process of vLLM's group, its role (engine_core, api_server, worker...), CPU,
# run-queue wait and context switches; meta.host_load names it and the group). Then, here:
#     .venv/bin/python bench/gpu/live_step_time_report.py live_step_time.json
# writes bench/results/live_step_time_h200.json.
#
# Set-up: dummy Qwen3-4B + EAGLE-3 shapes, V2 runner, K=3, starting table [[1,1,0],[2,2,1],
# [3,3,2],[4,256,3]] (every k captured), synthetic acceptance 0.75/0.55/0.40, max_num_seqs 256,
# all three plugin entry points, sync every 1 s, 128 closed-loop clients sending token ids.
# Env: OUT (/tmp/live-step-time), MODELS (/tmp/models), WHEEL (the newest
# .gpu-bundle/p3/tabletune-*.whl; "none": the tabletune already importable), BUDGET_S (525: this
# script from start to the report), PORT (8000), COMMIT (git rev-parse HEAD; pass it where the
# checkout has no .git, else "unknown"; meta.code is bench/gpu/code_fingerprint.py's hash of the
# daemon, profiles and driver this tree holds, which the summaries pool launches by),
# SERVER_MODULE (vLLM's api_server), DRIVER_ARGS (more
# flags for live_step_time.py), TARGET (qwen3-4b: a config folder under MODELS; also the served
# model name), DRAFTER ($TARGET-eagle3), TP (1: --tensor-parallel-size), GC_DEBUG (0; 1: vLLM logs
# its engine core's garbage collections, kept as gc_log.txt), STEP_TRACE (0; 1: a line per
# engine step, kept as step_trace.<pid>.csv.gz), HOST_LOAD_S (1: the
# host log's interval), GPU_CLOCKS_MS (1000: the GPU log's; for 1 s windows 250 and
# HOST_LOAD_S=0.25 put a few samples wholly inside each). A CPU dry run of this script
# against the plugin-based stand-in (about a minute):
#     WHEEL=none SERVER_MODULE=tests.support.vllm_stand_in PYTHONPATH=src:. BUDGET_S=200 \
#     DRIVER_ARGS="--clients 6 --warmup-s 1 --window-s 0.8 --settle-s 1.0 --rounds 2 \
#       --overhead-rounds 3 --neighbour-interval 4 --neighbour-window-s 1.2" \
#     TABLETUNE_SYNC_INTERVAL_S=0.2 bash bench/gpu/live_step_time.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
started=$(date +%s)
OUT=${OUT:-/tmp/live-step-time}
MODELS=${MODELS:-/tmp/models}
WHEEL=${WHEEL:-$(ls -t .gpu-bundle/p3/tabletune-*.whl 2>/dev/null | head -1)}
SERVER_MODULE=${SERVER_MODULE:-vllm.entrypoints.openai.api_server}
# Another driver of the same launch (bench/gpu/live_daemon.py) and its report ("none": none).
DRIVER=${DRIVER:-bench/gpu/live_step_time.py}
REPORT=${REPORT:-bench/gpu/live_step_time_report.py}
# Pure-Python wheels the host lacks (the daemon's: structlog, tenacity, apscheduler, tzlocal...).
EXTRA_WHEELS=${EXTRA_WHEELS:-.gpu-bundle/p3/wheels}
SYNC_S=${TABLETUNE_SYNC_INTERVAL_S:-1}
BUDGET_S=${BUDGET_S:-525}
PORT=${PORT:-8000}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
TARGET=${TARGET:-qwen3-4b}
DRAFTER=${DRAFTER:-$TARGET-eagle3}
TP=${TP:-1}
HOST_LOAD_S=${HOST_LOAD_S:-1}
GPU_CLOCKS_MS=${GPU_CLOCKS_MS:-1000}
[[ $TP =~ ^[1-9][0-9]*$ ]] || { echo "TP must be a positive integer, got '$TP'" >&2; exit 2; }
# The loggers' intervals, checked before anything starts (nvidia-smi and the host logger run in
# the background, where a bad value would only show as a missing log after the launch).
[[ $GPU_CLOCKS_MS =~ ^[1-9][0-9]*$ ]] \
  || { echo "GPU_CLOCKS_MS must be a positive integer (ms), got '$GPU_CLOCKS_MS'" >&2; exit 2; }
[[ $HOST_LOAD_S =~ ^[0-9]+([.][0-9]+)?$ ]] \
  && python3 -c 'import sys; sys.exit(not 0.05 <= float(sys.argv[1]) <= 60)' "$HOST_LOAD_S" \
  || { echo "HOST_LOAD_S must be seconds within 0.05..60, got '$HOST_LOAD_S'" >&2; exit 2; }
mkdir -p "$OUT"
exec > >(tee "$OUT/live_step_time_run_log.txt") 2>&1
export PYTHONUNBUFFERED=1
work=$(mktemp -d /tmp/tt-live.XXXXXX)

# TableTune (entry points included) into a private site dir, first on the path.
if [[ $WHEEL != none ]]; then
  [[ -f $WHEEL ]] || { echo "no tabletune wheel (WHEEL=$WHEEL)" >&2; exit 2; }
  extra=()
  [[ -d $EXTRA_WHEELS ]] && extra=("$EXTRA_WHEELS"/*.whl)
  python3 -m pip install -q --no-deps --no-index --no-compile --target "$work/site" "$WHEEL" \
    "${extra[@]}" || exit 2
  export PYTHONPATH="$work/site:${PYTHONPATH:-}"
fi
python3 -c 'import tabletune.plugin.step_timer' || { echo "tabletune not importable" >&2; exit 2; }

TABLE='[[1,1,0],[2,2,1],[3,3,2],[4,256,3]]'
RATES='[0.75,0.55,0.40]'
SPEC="{\"method\":\"eagle3\",\"model\":\"$MODELS/$DRAFTER\",\"num_speculative_tokens\":3,\"num_speculative_tokens_per_batch_size\":$TABLE,\"rejection_sample_method\":\"synthetic\",\"synthetic_acceptance_rates\":$RATES}"
ARGS=(--model "$MODELS/$TARGET" --served-model-name "$TARGET" --load-format dummy
      --skip-tokenizer-init --max-num-seqs 256 --max-model-len 4096 --port "$PORT"
      --speculative-config "$SPEC")
(( TP > 1 )) && ARGS+=(--tensor-parallel-size "$TP")

# The GPUs' clocks, power, temperature, utilization and throttle reasons once a second while
# this runs (every GPU of the host; meta names the job's by CUDA_VISIBLE_DEVICES, which
# two_gpus.sh sets), so a slow window can be told from a throttled or idle GPU
# (eval_traffic_report.py reads it). Stopped by its own id at exit.
CLOCKS=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active
clocks_pid=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu="$CLOCKS" --format=csv -lms "$GPU_CLOCKS_MS" \
    >"$OUT/gpu_clocks.csv" 2>&1 &
  clocks_pid=$!
fi
host_pid=
# Both loggers by their own ids; the host logger writes its last partial second on SIGTERM and
# is waited for, so its file is whole before the report reads it.
stop_loggers() {
  [[ -n $clocks_pid ]] && kill "$clocks_pid" 2>/dev/null
  [[ -n $host_pid ]] && kill "$host_pid" 2>/dev/null && wait "$host_pid"
  clocks_pid= host_pid=
}
trap stop_loggers EXIT

# vLLM in its own process group, so it is stopped by its id.
# GC_DEBUG=1: vLLM logs each garbage collection of its engine core with its duration
# (VLLM_GC_DEBUG); those lines are kept as gc_log.txt (meta.gc_log; eval_traffic_report.py
# sets them beside the windows, bench/gpu/gc_log.py). STEP_TRACE=1: the engine core writes a
# line per step (TABLETUNE_STEP_TRACE, src/tabletune/plugin/step_trace.py), kept gzipped as
# step_trace.<pid>.csv.gz (bench/gpu/step_trace_report.py reads it beside the windows).
env VLLM_PLUGINS=tabletune_engine,tabletune_http,tabletune_metrics VLLM_USE_V2_MODEL_RUNNER=1 \
  TABLETUNE_ADMIN_OPEN=loopback VLLM_GC_DEBUG="$([[ ${GC_DEBUG:-0} == 1 ]] && echo 1)" \
  TABLETUNE_SYNC_INTERVAL_S="$SYNC_S" \
  TABLETUNE_STEP_TRACE="$([[ ${STEP_TRACE:-0} == 1 ]] && echo "$work/step_trace")" \
  setsid python3 -m "$SERVER_MODULE" "${ARGS[@]}" \
  >"$work/vllm.log" 2>&1 &
vllm_pid=$!
launched=$(date +%s)
stop_vllm() {
  kill -TERM -- "-$vllm_pid" 2>/dev/null
  for _ in $(seq 1 20); do kill -0 "$vllm_pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$vllm_pid" 2>/dev/null
  { grep -E "tabletune|Loaded|plugin|Traceback|Error|Asynchronous scheduling|max_num_batched_tokens" \
      "$work/vllm.log" | head -80
    echo "----- last 30 lines -----"; tail -30 "$work/vllm.log"; } >"$OUT/live_step_time_vllm_log.txt"
  if [[ ${GC_DEBUG:-0} == 1 ]]; then grep "GC took" "$work/vllm.log" >"$OUT/gc_log.txt"; fi
  for trace in "$work"/step_trace.*.csv; do
    [[ -f $trace ]] && gzip -c "$trace" >"$OUT/$(basename "$trace").gz"
  done
}
# The host's CPU once a second beside the GPU log (bench/gpu/host_logger.py, host_load.csv):
# the host's busy, iowait and steal shares and, process by process in vLLM's group, CPU,
# run-queue wait and context switches, so a window where the GPU waited on the host can be
# told by cause (eval_traffic_report.py reads it).
python3 bench/gpu/host_logger.py --out "$OUT/host_load.csv" --pgid "$vllm_pid" \
  --interval-s "$HOST_LOAD_S" &
host_pid=$!
trap 'stop_vllm; stop_loggers' EXIT

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
(( TP > 1 )) && gpu="$TP x $gpu"
engine=$(python3 -c 'from importlib.metadata import version; print(version("vllm"))' 2>/dev/null \
  || python3 -c 'import vllm; print(vllm.__version__)' 2>/dev/null || echo unknown)
meta=$(python3 -c 'import json, sys
device, engine, commit, table, rates, spec, args = sys.argv[1:8]
print(json.dumps({"device": device, "engine": "vllm", "engine_version": engine, "commit": commit,
  "target": sys.argv[10], "tensor_parallel_size": int(sys.argv[11]),
  "starting_table": json.loads(table), "synthetic_rates": json.loads(rates),
  "speculative_config": json.loads(spec), "vllm_args": args,
  "server_module": sys.argv[8],
  "env": {"VLLM_USE_V2_MODEL_RUNNER": "1", "TABLETUNE_SYNC_INTERVAL_S": sys.argv[9]},
  "gpu_clocks": {"path": "gpu_clocks.csv", "job_gpus": sys.argv[13] or None,
                 "utc_offset": sys.argv[14], "interval_ms": int(sys.argv[18])}
                if sys.argv[12] else None,
  "host_load": {"path": "host_load.csv", "pgid": int(sys.argv[15]),
                "interval_s": float(sys.argv[16])},
  "gc_log": {"path": "gc_log.txt", "utc_offset": sys.argv[14]}
            if sys.argv[17] == "1" else None,
  "code": sys.argv[19]}))' \
  "$gpu" "$engine" "$COMMIT" "$TABLE" "$RATES" "$SPEC" "${ARGS[*]}" "$SERVER_MODULE" "$SYNC_S" \
  "$TARGET" "$TP" "$clocks_pid" "${CUDA_VISIBLE_DEVICES:-}" "$(date +%z)" "$vllm_pid" \
  "$HOST_LOAD_S" "${GC_DEBUG:-0}" "$GPU_CLOCKS_MS" "$(python3 bench/gpu/code_fingerprint.py)")

# The driver's budget: what is left of BUDGET_S, less ~25 s for stopping vLLM and the report.
# It keeps to it (parts that no longer fit are skipped); `timeout` is the last resort, and the
# JSON written after the last finished part stays.
now=$(date +%s)
budget=$((BUDGET_S - (now - started) - 25))
name=$(basename "$DRIVER" .py)
timeout -s INT $((budget + 20)) python3 "$DRIVER" \
  --base "http://127.0.0.1:$PORT" --pid "$vllm_pid" --out "$OUT/$name.json" \
  --meta "$meta" --started-s $((now - launched)) --budget-s "$budget" \
  --sync-interval-s "$SYNC_S" --model "$TARGET" ${DRIVER_ARGS:-}
rc=$?
stop_vllm
stop_loggers
trap - EXIT
if [[ $REPORT != none ]]; then
  python3 "$REPORT" "$OUT/$name.json" --out "$OUT/${name}_h200.json" || { [ "$rc" -eq 0 ] && rc=3; }
  # A device call brings back at most 8 files (with GC_DEBUG's and STEP_TRACE's logs the PNG
  # was the ninth and the step trace was left there): it is drawn here from the raw run instead.
  rm -f "$OUT/${name}_h200.png"
fi
echo "done in $(( $(date +%s) - started )) s (driver exit $rc)"
exit "$rc"
