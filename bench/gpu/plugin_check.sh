#!/usr/bin/env bash
# GPU evidence for the TableTune vLLM plugin (issue 3), on vLLM 0.26.0 (see docs/plugin.md).
# Runs ON the GPU host after `source .gpu-bundle/p3/device-setup.sh` and the tabletune wheel
# installed into /tmp/site. Dummy Qwen3-4B + EAGLE-3 shapes, V2 runner, synthetic acceptance.
#
#   bench/gpu/plugin_check.sh main   # 1) start without the compat fix (must crash with
#                                    #    ZeroDivisionError), 2) start with all three plugins:
#                                    #    per-k, counters, acceptance, invalid PUTs, exploration,
#                                    #    throughput arm A
#   bench/gpu/plugin_check.sh ab     # throughput arm B: only the compat fix (tabletune_engine)
# Results: $OUT/plugin_*.json and short log excerpts.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/plugin-out}
mkdir -p "$OUT"
mode=${1:-main}
export PYTHONUNBUFFERED=1
TABLE='[[1,1,0],[2,2,1],[3,3,2],[4,256,3]]'
RATES='[0.75,0.55,0.40]'
SPEC="{\"method\":\"eagle3\",\"model\":\"/tmp/models/qwen3-4b-eagle3\",\"num_speculative_tokens\":3,\"num_speculative_tokens_per_batch_size\":$TABLE,\"rejection_sample_method\":\"synthetic\",\"synthetic_acceptance_rates\":$RATES}"
ARGS=(--model /tmp/models/qwen3-4b --served-model-name qwen3-4b --load-format dummy
      --skip-tokenizer-init --max-num-seqs 256 --max-model-len 4096 --port 8000
      --speculative-config "$SPEC")
CONFIG="{\"vllm_args\":\"--load-format dummy --skip-tokenizer-init --max-num-seqs 256 --max-model-len 4096\",\"speculative_config\":$SPEC,\"VLLM_USE_V2_MODEL_RUNNER\":\"${VLLM_USE_V2_MODEL_RUNNER:-}\"}"
ALL=tabletune_engine,tabletune_http,tabletune_metrics

# Start vLLM in its own process group (so it can be stopped by id): start LOG [ENV=VAL ...]
start() {
  local log=$1; shift
  env "$@" setsid python3 -m vllm.entrypoints.openai.api_server "${ARGS[@]}" >"$log" 2>&1 &
  echo $!
}
stop() {  # stop PID's process group and wait until the GPU is free again
  kill -TERM -- "-$1" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$1" 2>/dev/null
  sleep 3
}
excerpt() {  # excerpt LOG DEST: plugin lines, errors, and the last lines
  { grep -E "tabletune|Loaded endpoint plugin|plugin|ZeroDivisionError|_init_candidates|cudagraph_utils|Traceback|Error" "$1" | head -80
    echo "----- last 30 lines -----"; tail -30 "$1"; } >"$2"
}

if [[ $mode == main ]]; then
  echo "== 1. start WITHOUT the compat fix (TABLETUNE_COMPAT_FIX=0): expect ZeroDivisionError"
  t0=$(date +%s)
  pid=$(start /tmp/vllm_nofix.log VLLM_PLUGINS=$ALL TABLETUNE_COMPAT_FIX=0)
  python3 "$here/plugin_check.py" wait --pid "$pid" --timeout 240; ready=$?
  stop "$pid"
  crashed=$(grep -c "ZeroDivisionError" /tmp/vllm_nofix.log)
  excerpt /tmp/vllm_nofix.log "$OUT/plugin_compat_nofix_log.txt"
  echo "no-fix start: ready=$((1 - ready)) ZeroDivisionError lines=$crashed after $(( $(date +%s) - t0 ))s"

  echo "== 2. start WITH the plugin (all three entry points)"
  t0=$(date +%s)
  pid=$(start /tmp/vllm_main.log VLLM_PLUGINS=$ALL TABLETUNE_ADMIN_TOKEN=tt-secret-0123456789abcdef TABLETUNE_SYNC_INTERVAL_S=1)
  if python3 "$here/plugin_check.py" wait --pid "$pid" --timeout 300; then
    startup=$(( $(date +%s) - t0 ))
    echo "ready after ${startup}s"
    TABLETUNE_SYNC_INTERVAL_S=1 python3 "$here/plugin_check.py" main --token tt-secret-0123456789abcdef --label A \
      --config "{\"config\":$CONFIG,\"startup_s\":$startup,\"nofix_zero_division_lines\":$crashed,\"nofix_ready\":$((1 - ready)),\"plugins\":\"$ALL\"}" \
      --out "$OUT/plugin_check.json"
    echo "main check exit: $?"
  else
    echo "vLLM with the plugin did not become ready"
  fi
  stop "$pid"
  excerpt /tmp/vllm_main.log "$OUT/plugin_main_log.txt"
else
  echo "== throughput arm B: only tabletune_engine (the compat fix; V2 + table + EAGLE cannot start without it)"
  t0=$(date +%s)
  pid=$(start /tmp/vllm_b.log VLLM_PLUGINS=tabletune_engine)
  if python3 "$here/plugin_check.py" wait --pid "$pid" --timeout 300; then
    startup=$(( $(date +%s) - t0 ))
    python3 "$here/plugin_check.py" throughput --label B \
      --config "{\"config\":$CONFIG,\"startup_s\":$startup,\"plugins\":\"tabletune_engine\"}" \
      --out "$OUT/plugin_ab_B.json"
  else
    echo "vLLM (arm B) did not become ready"
  fi
  stop "$pid"
  excerpt /tmp/vllm_b.log "$OUT/plugin_b_log.txt"
fi
