#!/usr/bin/env bash
# The fast profiler on real vLLM 0.26.0 (one H200), ONE launch (two with WARM_START=1), under
# 9 minutes including start-up (profile_fast.py): an in-flight grid B=1..256 (dense to 16, then
# every 8) x k=0..3, 3 windows per cell; the request method on 8 batch sizes x 4 k in the same
# launch (do both methods agree on pure decode?); acceptance under synthetic rates; a second
# in-flight grid (do two profiles in a row give the same table?).
#
# Usage, on the GPU host from the repository root, after `source .gpu-bundle/p3/device-setup.sh`
# (shared/gpu/README.md) with this branch's wheel in .gpu-bundle/p3/:
#     bash bench/gpu/profile_fast.sh
# Preparing the wheel here (this machine reaches PyPI, the GPU host does not):
#     .venv/bin/pip wheel --no-deps -w .gpu-bundle/p3/ .
# Results under $OUT: profile_fast.json (meta with device, engine version, date, commit, start-up
# time and GPU memory; each run's profiler summary; both tables; errors and skipped parts; the
# report's summary), profile_fast_h200.json (the goals) and profile_fast_h200.png,
# profile_fast_runs.tgz (run1/ and run2/: each run's profile, summary, table, raw windows; the
# profile's paths name those folders), profile_fast_vllm_log.txt (log excerpt),
# profile_fast_run_log.txt (this script's output). Then, here:
#     .venv/bin/python bench/gpu/profile_fast_report.py profile_fast.json
# writes bench/results/profile_fast_h200.json and its PNG.
#
# Set-up: dummy Qwen3-4B + EAGLE-3 shapes (config folders, --load-format dummy, no tokenizer),
# V2 runner, K=3, max_num_seqs 256, the profiler's starting table [[1,1,3],[2,2,2],[3,3,1],
# [4,256,0]] (every k captured), the standard sampler at start (the profiler hook switches it:
# every guess rejected for timing, synthetic 0.75/0.55/0.40 for acceptance), all three plugin
# entry points and the profiler hook (VLLM_SERVER_DEV_MODE=1), the plugin's sync every 0.05 s.
# Env: OUT (/tmp/profile-fast), MODELS (/tmp/models), WHEEL (the newest
# .gpu-bundle/p3/tabletune-*.whl; "none": the tabletune already importable), BUDGET_S (525: this
# script from start to the report), PORT (8000), COMMIT (git rev-parse HEAD; pass it where the
# checkout has no .git), SERVER_MODULE (vLLM's api_server), SYNC_S (0.05), CAPTURE_SIZE (unset:
# vLLM's default; N: --compilation-config max_cudagraph_capture_size N), NAME (profile_fast:
# the result files' stem), TARGET (qwen3-4b: a config folder under MODELS), DRAFTER
# ($TARGET-eagle3), TP (1: --tensor-parallel-size; the device names the GPU count and the
# memory is summed over them), DRIVER_ARGS (more flags for profile_fast.py), WARM_START (0;
# 1: start vLLM once to fill its compile cache, time that cold start to /health, stop it by its process
# group, start it again and profile that warm engine: the JSON records both start times and the
# report judges the grid with the warm start, the cold one reported too; WARM_NEEDS_S (250):
# less left after the cold start and that engine is profiled instead). A CPU dry run against
# the plugin-based stand-in (about a minute; tests/integration/test_profile_fast_dry_run.py):
#     WHEEL=none SERVER_MODULE=tests.support.vllm_stand_in PYTHONPATH=src:. BUDGET_S=200 \
#     DRIVER_ARGS="--max-num-seqs 8 --dense-until 4 --grid-step 4 --cross-check 1,8 \
#       --window-steps 8" bash bench/gpu/profile_fast.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
started=$(date +%s)
OUT=${OUT:-/tmp/profile-fast}
MODELS=${MODELS:-/tmp/models}
WHEEL=${WHEEL:-$(ls -t .gpu-bundle/p3/tabletune-*.whl 2>/dev/null | head -1)}
SERVER_MODULE=${SERVER_MODULE:-vllm.entrypoints.openai.api_server}
SYNC_S=${SYNC_S:-0.05}
BUDGET_S=${BUDGET_S:-525}
PORT=${PORT:-8000}
NAME=${NAME:-profile_fast}
# The target and its drafter (config folders under MODELS) and the tensor-parallel size.
TARGET=${TARGET:-qwen3-4b}
DRAFTER=${DRAFTER:-$TARGET-eagle3}
TP=${TP:-1}
[[ $TP =~ ^[1-9][0-9]*$ ]] || { echo "TP must be a positive integer, got '$TP'" >&2; exit 2; }
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT"
exec > >(tee "$OUT/${NAME}_run_log.txt") 2>&1
export PYTHONUNBUFFERED=1
work=$(mktemp -d /tmp/tt-fast.XXXXXX)

# TableTune (entry points included) into a private site dir, first on the path.
if [[ $WHEEL != none ]]; then
  [[ -f $WHEEL ]] || { echo "no tabletune wheel (WHEEL=$WHEEL)" >&2; exit 2; }
  python3 -m pip install -q --no-deps --no-index --no-compile --target "$work/site" "$WHEEL" \
    || exit 2
  export PYTHONPATH="$work/site:${PYTHONPATH:-}"
fi
python3 -c 'import tabletune.profiler.inflight' || { echo "tabletune not importable" >&2; exit 2; }

TABLE='[[1,1,3],[2,2,2],[3,3,1],[4,256,0]]'
SPEC="{\"method\":\"eagle3\",\"model\":\"$MODELS/$DRAFTER\",\"num_speculative_tokens\":3,\"num_speculative_tokens_per_batch_size\":$TABLE,\"rejection_sample_method\":\"standard\"}"
ARGS=(--model "$MODELS/$TARGET" --served-model-name "$TARGET" --load-format dummy
      --skip-tokenizer-init --max-num-seqs 256 --max-model-len 4096 --port "$PORT"
      --speculative-config "$SPEC")
(( TP > 1 )) && ARGS+=(--tensor-parallel-size "$TP")
if [[ -n ${CAPTURE_SIZE:-} ]]; then
  ARGS+=(--compilation-config "{\"max_cudagraph_capture_size\": $CAPTURE_SIZE}")
fi

# vLLM in its own process group, so it is stopped by its id.
start_vllm() {  # $1: its log
  env VLLM_PLUGINS=tabletune_engine,tabletune_http,tabletune_metrics,tabletune_profiler \
    VLLM_SERVER_DEV_MODE=1 VLLM_USE_V2_MODEL_RUNNER=1 TABLETUNE_ADMIN_OPEN=loopback \
    TABLETUNE_SYNC_INTERVAL_S="$SYNC_S" setsid python3 -m "$SERVER_MODULE" "${ARGS[@]}" \
    >"$1" 2>&1 &
  vllm_pid=$!
  launched=$(date +%s.%N)
}
stop_group() {  # every process of vLLM's group (the engine core too: its GPU memory goes)
  kill -TERM -- "-$vllm_pid" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 -- "-$vllm_pid" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- "-$vllm_pid" 2>/dev/null
  sleep 2
}
answers() {  # /health answers within $1 s (0: vLLM died or never answered)
  local until=$(( $(date +%s) + $1 ))
  while (( $(date +%s) < until )); do
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
      "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    kill -0 "$vllm_pid" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
since() { python3 -c 'import sys, time; print(round(time.time() - float(sys.argv[1]), 1))' "$1"; }

# Whether vLLM's compile cache already holds something (an earlier launch on this host): such
# a start is warm even without WARM_START.
cache_dir=${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}/torch_compile_cache
compile_cache_found=false
[[ -n $(ls -A "$cache_dir" 2>/dev/null) ]] && compile_cache_found=true

# Warm start: a first launch fills the compile cache; its time to /health is the cold start.
# When what is left of BUDGET_S no longer holds a second start and a grid (WARM_NEEDS_S), the
# cold engine is profiled instead (meta.warm_start false: judged as a cold start).
cold_start_s=null
before_s=0
restart=1
if [[ ${WARM_START:-0} == 1 ]]; then
  start_vllm "$work/vllm.log"
  trap stop_group EXIT
  if answers $((BUDGET_S - 60)); then cold_start_s=$(since "$launched"); fi
  if [[ $cold_start_s != null ]] \
      && (( BUDGET_S - ($(date +%s) - started) < ${WARM_NEEDS_S:-250} )); then
    restart=0
    echo "cold start: ${cold_start_s} s to /health; no time left for a warm start: profiling it"
    cold_start_s=null
  else
    stop_group
    mv "$work/vllm.log" "$work/vllm-cold.log"
    before_s=$(( $(date +%s) - started ))
    echo "cold start: ${cold_start_s} s to /health; stopped; ${before_s} s of the budget used"
  fi
  trap - EXIT
fi
(( restart )) && start_vllm "$work/vllm.log"
stop_vllm() {
  stop_group
  { grep -E "tabletune|Loaded|plugin|Traceback|Error|Graph capturing|max_cudagraph_capture_size|Capturing CUDA" \
      "$work/vllm.log" | cut -c1-600 | head -80
    echo "----- last 30 lines -----"; tail -30 "$work/vllm.log" | cut -c1-600; } \
    >"$OUT/${NAME}_vllm_log.txt"
}
trap stop_vllm EXIT

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
(( TP > 1 )) && gpu="$TP x $gpu"
engine=$(python3 -c 'from importlib.metadata import version; print(version("vllm"))' 2>/dev/null \
  || python3 -c 'import vllm; print(vllm.__version__)' 2>/dev/null || echo unknown)
# GPU memory once vLLM answers (weights, KV cache, graphs), for the capture-size comparison.
( answers 600 || exit 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null \
    | awk '{s += $1} END {if (NR) print s}' \
    >"$work/memory_mib" ) &
memory_pid=$!
meta=$(python3 -c 'import json, sys
device, engine, commit, table, spec, args, module, sync, capture, target, tp, cache = sys.argv[1:13]
print(json.dumps({"device": device, "engine": "vllm", "engine_version": engine, "commit": commit,
  "target": target, "tensor_parallel_size": int(tp), "compile_cache_found": cache == "true",
  "starting_table": json.loads(table), "speculative_config": json.loads(spec), "vllm_args": args,
  "server_module": module, "capture_size": capture or None,
  "env": {"VLLM_USE_V2_MODEL_RUNNER": "1", "TABLETUNE_SYNC_INTERVAL_S": sync}}))' \
  "$gpu" "$engine" "$COMMIT" "$TABLE" "$SPEC" "${ARGS[*]}" "$SERVER_MODULE" "$SYNC_S" \
  "${CAPTURE_SIZE:-}" "$TARGET" "$TP" "$compile_cache_found")

# The driver's budget: what is left of BUDGET_S, less ~25 s for stopping vLLM and the report.
# It keeps to it (parts that no longer fit are skipped); `timeout` is the last resort, and the
# JSON written after the last finished part stays.
now=$(date +%s)
budget=$((BUDGET_S - (now - started) - 25))
timeout -s INT $((budget + 20)) python3 bench/gpu/profile_fast.py \
  --base "http://127.0.0.1:$PORT" --pid "$vllm_pid" --out "$OUT/$NAME.json" \
  --meta "$meta" --started-s "$(since "$launched")" --budget-s "$budget" \
  --cold-start-s "$cold_start_s" --before-s "$before_s" \
  --vllm-log "$work/vllm.log" --model-path "$MODELS/$TARGET" \
  --drafter-path "$MODELS/$DRAFTER" --sync-interval-s "$SYNC_S" \
  --memory-file "$work/memory_mib" ${DRIVER_ARGS:-}
rc=$?
kill "$memory_pid" 2>/dev/null
stop_vllm
trap - EXIT
python3 bench/gpu/profile_fast_report.py "$OUT/$NAME.json" --out "$OUT/${NAME}_h200.json" \
  || { [ "$rc" -eq 0 ] && rc=3; }
# Each run's folder packed into one archive: a device call brings back at most 8 files, and the
# runs' 13 files (the raw windows among them) were left behind on 2026-12-01.
runs=$(cd "$OUT" && ls -d run[0-9]* 2>/dev/null)
if [[ -n $runs ]]; then
  # shellcheck disable=SC2086  # folder names without spaces, one word each
  tar -czf "$OUT/${NAME}_runs.tgz" -C "$OUT" --remove-files $runs || { [ "$rc" -eq 0 ] && rc=4; }
fi
echo "done in $(( $(date +%s) - started )) s (driver exit $rc)"
exit "$rc"
