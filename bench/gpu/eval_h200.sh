#!/usr/bin/env bash
# Issue 7 on real vLLM 0.26.0 (one H200), in ONE engine launch: fixed k, vLLM's documented table
# and our measured table across a closed-loop load sweep under two synthetic acceptance sets; the
# daemon's repair run from the documented table shrunk to a quarter; an acceptance switch mid-run.
#
# Usage, on the GPU host from the repository root, after `source .gpu-bundle/p3/device-setup.sh`
# (shared/gpu/README.md), with the tabletune wheel in $WHEELS and the daemon's pure-Python deps
# the host lacks (structlog, tenacity, apscheduler, tzlocal) as wheels in $WHEELS/wheels:
#     bench/gpu/eval_h200.sh PROFILE_JSON        # a measured H200 profile (profiles/...)
# Preparing $WHEELS here (this machine reaches PyPI, the GPU host does not):
#     .venv/bin/pip wheel --no-deps -w .gpu-bundle/p3/ .
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 -d .gpu-bundle/p3/wheels structlog tenacity "apscheduler<4" tzlocal
# Results: one JSON line per measurement window in $RESULTS_DIR/eval_h200_<stamp>.jsonl, the vLLM
# and daemon logs beside it ($RESULTS_DIR: bench/results/raw, ignored by git: raw windows and logs
# are not committed). `bench/gpu/eval_h200_report.py` turns the lines into
# bench/results/eval_h200.json and PNGs (those are committed).
#
# How each part is done:
# - One launch: the starting table holds every k (0..3) so the V2 runner captures graphs for all;
#   the TableTune plugin swaps the table at run time (PUT /tabletune/v1/table); the profiler's
#   engine hook (general plugin `tabletune_profiler`, reached through vLLM's /collective_rpc with
#   VLLM_SERVER_DEV_MODE=1) switches the synthetic acceptance rates at run time. That hook is
#   the "test-only engine hook" for the acceptance switch: it replaces the sampler's per-position
#   conditional rates, read every step outside the CUDA graphs, so the next step uses them.
# - Throughput: vLLM's own `vllm:generation_tokens_total` over a steady window (after a warm-up),
#   with the effective batch from `vllm:num_requests_running` and k from drafts per step
#   (bench/gpu/closed_loop.py). Arms are rotated per load. STAGGER=1 spreads the clients'
#   contexts from the start (steady load for the long repair/switch runs; see closed_loop.py).
# - Repair: `tabletune daemon` in direct-scrape mode against this server, with the operator
#   guide's settings (15 s cycle, exploration every 50 steps, hysteresis 2, prior decay), from the
#   quarter table; 5 s windows from the moment load and daemon start. Because this launch captured
#   every k, the daemon may use k=2 here (the emulator's "docs/4 + k=2" case).
# - Switch: the daemon runs with the measured table under realistic rates; SWITCH_BEFORE_S in,
#   the hook switches to the SWITCH_TO rates (very_low by default). Then, for the gap, the measured tables for both sets are
#   measured statically under the very low rates at that load.
#
# Time: ~100 s start-up, ~11 s per static measurement; defaults ~17 min in all. Order: realistic
# static, repair, switch, low static, so a run cut short still has the first parts.
set -euo pipefail
cd "$(dirname "$0")/../.."

PROFILE=${1:?usage: bench/gpu/eval_h200.sh PROFILE_JSON}
MODEL=${MODEL:-/tmp/models/qwen3-4b}
DRAFTER=${DRAFTER:-/tmp/models/qwen3-4b-eagle3}
PORT=${PORT:-8000}
URL="http://127.0.0.1:${PORT}"
PARTS=${PARTS:-"static-realistic repair switch static-low"}
REALISTIC_LOADS=${REALISTIC_LOADS:-"1 8 32 64 128 256"}
LOW_LOADS=${LOW_LOADS:-"1 32 128 256"}
WARMUP_S=${WARMUP_S:-3}
WINDOW_S=${WINDOW_S:-6}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-4096}
REPAIR_LOADS=${REPAIR_LOADS:-"32 128"}
REPAIR_S=${REPAIR_S:-60}
SWITCH_LOAD=${SWITCH_LOAD:-48}
SWITCH_BEFORE_S=${SWITCH_BEFORE_S:-60}
SWITCH_AFTER_S=${SWITCH_AFTER_S:-45}
WHEELS=${WHEELS:-.gpu-bundle/p3}
RESULTS_DIR=${RESULTS_DIR:-bench/results/raw}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
WORK=$(mktemp -d /tmp/tt-eval.XXXXXX)
mkdir -p "$RESULTS_DIR"
OUT="$RESULTS_DIR/eval_h200_${STAMP}.jsonl"
VLLM_LOG="$RESULTS_DIR/eval_h200_${STAMP}_vllm.log"
DAEMON_LOG="$RESULTS_DIR/eval_h200_${STAMP}_daemon.log"
declare -A RATES=([realistic]="0.75,0.55,0.40" [low]="0.50,0.25,0.12" [very_low]="0.30,0.10,0.03"
  [collapsed]="0.15,0.03,0.01")
SWITCH_TO=${SWITCH_TO:-very_low}
# Static references measured after each repair run at its load (the measured table always).
REPAIR_REFS=${REPAIR_REFS:-""}  # e.g. "k3|[[1,256,3]]"
REF_WARMUP_S=${REF_WARMUP_S:-$WARMUP_S}
DOCS='[[1,64,3],[65,128,1],[129,256,0]]'  # vLLM's documented EAGLE table, cut at max_num_seqs
QUARTER='[[1,16,3],[17,32,1],[33,128,0]]'

# TableTune (entry points included) and the daemon's missing deps into a private site dir.
python3 -m pip install -q --no-deps --no-index --no-compile --target "$WORK/site" \
  "$WHEELS"/tabletune-*.whl "$WHEELS"/wheels/*.whl
export PYTHONPATH="$WORK/site:${PYTHONPATH:-}"
python3 -c 'import apscheduler, structlog, tenacity, tabletune.daemon.service' || {
  echo "the daemon cannot be imported here: carry its deps as wheels in $WHEELS/wheels" >&2; exit 2; }

# The measured table per acceptance set, from the profile.
for set in "${!RATES[@]}"; do
  python3 - "${RATES[$set]}" "$WORK/acceptance-$set.json" <<'EOF'
import sys
from tabletune.schemas import AcceptanceProfile, save_model
rates = tuple(float(x) for x in sys.argv[1].split(","))
save_model(AcceptanceProfile(rates=rates, prompt_source="synthetic sampler (bench)"), sys.argv[2])
EOF
  python3 -m tabletune.cli.main solve --profile "$PROFILE" --acceptance "$WORK/acceptance-$set.json" \
    --json > "$WORK/measured-$set.json"
done
python3 - "$OUT" "$PROFILE" "$WORK" <<'EOF'
import json, os, subprocess, sys
from pathlib import Path
import vllm
out, profile, work = sys.argv[1:]
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()[0]
sets = sorted(p.stem.removeprefix("acceptance-") for p in Path(work).glob("acceptance-*.json"))
rates = {s: json.loads(Path(f"{work}/acceptance-{s}.json").read_text())["rates"] for s in sets}
measured = {s: json.loads(Path(f"{work}/measured-{s}.json").read_text()) for s in sets}
with open(out, "a") as f:
    f.write(json.dumps({"part": "meta", "gpu": gpu, "engine": "vllm", "engine_version": vllm.__version__,
                        "profile": profile, "rates": rates, "measured_tables": measured,
                        "env": {k: os.environ.get(k) for k in ("PARTS", "STAGGER", "OUTPUT_TOKENS", "SWITCH_TO")}}) + "\n")
EOF

# The one launch: every k in the starting table, synthetic sampler (realistic rates to start).
SPEC=$(printf '{"method":"eagle3","model":"%s","num_speculative_tokens":3,%s,%s,%s}' "$DRAFTER" \
  '"num_speculative_tokens_per_batch_size":[[1,16,3],[17,24,2],[25,32,1],[33,256,0]]' \
  '"rejection_sample_method":"synthetic"' "\"synthetic_acceptance_rates\":[${RATES[realistic]}]")
export VLLM_PLUGINS=tabletune_engine,tabletune_http,tabletune_metrics,tabletune_profiler
export VLLM_SERVER_DEV_MODE=1 VLLM_USE_V2_MODEL_RUNNER=1
export TABLETUNE_ADMIN_OPEN=loopback  # the daemon and this script push tables from this machine
python3 -m vllm.entrypoints.openai.api_server --model "$MODEL" --load-format dummy \
  --skip-tokenizer-init --max-num-seqs 256 --port "$PORT" --speculative-config "$SPEC" \
  > "$VLLM_LOG" 2>&1 &
VLLM_PID=$!
DAEMON_PID=""
cleanup() {
  [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null || true
  kill "$VLLM_PID" 2>/dev/null || true
  wait "$VLLM_PID" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1 600); do
  curl -sf "$URL/health" >/dev/null && break
  kill -0 "$VLLM_PID" 2>/dev/null || { tail -50 "$VLLM_LOG" >&2; exit 1; }
  sleep 1
done
curl -sf "$URL/health" >/dev/null || { tail -50 "$VLLM_LOG" >&2; exit 1; }
echo "engine up at $(date -u +%T)"

put_table() {
  curl -sf -X PUT -H 'Content-Type: application/json' -d "{\"table\": $1}" \
    "$URL/tabletune/v1/table" >/dev/null
}
static_settings() {  # no exploration, no hysteresis: each arm runs exactly its table
  curl -sf -X PUT -H 'Content-Type: application/json' \
    -d '{"exploration_interval": 0, "hysteresis": 0}' "$URL/tabletune/v1/settings" >/dev/null
}
set_rates() {  # the profiler's engine hook, through vLLM's dev-mode /collective_rpc
  local body
  body=$(python3 -c 'import json, sys
mode = {"kind": "synthetic", "rates": [float(x) for x in sys.argv[1].split(",")]}
print(json.dumps({"method": "tabletune_profiler_set_sampler", "args": [json.dumps(mode)]}))' "$1")
  curl -sf -X POST -H 'Content-Type: application/json' -d "$body" "$URL/collective_rpc" >/dev/null
}
drain() {  # wait until no request runs, so arms do not overlap
  local n
  for _ in $(seq 1 60); do
    n=$(curl -sf "$URL/metrics" | awk '/^vllm:num_requests_running/ {s+=$2} END {print s+0}')
    [ "${n%.*}" -eq 0 ] && return 0
    sleep 0.5
  done
}
measure() {  # measure LABEL_JSON B [WARMUP_S WINDOW_S COUNT]: closed loop, JSON lines to $OUT
  drain
  python3 bench/gpu/closed_loop.py "$URL" "$MODEL" "$2" "${3:-$WARMUP_S}" "${4:-$WINDOW_S}" \
    "${5:-1}" "$OUTPUT_TOKENS" "$1" | tee -a "$OUT"
}
start_daemon() {  # direct scrape of this server, the operator guide's settings
  rm -rf "$WORK/state"
  TABLETUNE_SOURCE__REPLICAS="$URL" TABLETUNE_PROFILE__PATHS="$PROFILE" \
    TABLETUNE_STATE__DIR="$WORK/state" TABLETUNE_SERVER__PORT=0 \
    python3 -m tabletune.cli.main daemon >> "$DAEMON_LOG" 2>&1 &
  DAEMON_PID=$!
}
stop_daemon() {
  kill "$DAEMON_PID" 2>/dev/null || true
  wait "$DAEMON_PID" 2>/dev/null || true
  DAEMON_PID=""
}
static_part() {  # static_part SET LOADS: fixed k, documented, measured; rotating order per load
  local set=$1 rotation=0 arm name table i
  set_rates "${RATES[$set]}"
  static_settings
  local arms=("k0|[[1,256,0]]" "k1|[[1,256,1]]" "k2|[[1,256,2]]" "k3|[[1,256,3]]" "docs|$DOCS"
    "measured|$(cat "$WORK/measured-$set.json")")
  for b in $2; do
    for i in "${!arms[@]}"; do
      arm=${arms[$(((i + rotation) % ${#arms[@]}))]}
      name=${arm%%|*}
      table=${arm#*|}
      put_table "$table"
      measure "{\"part\":\"static\",\"set\":\"$set\",\"arm\":\"$name\",\"table\":$table}" "$b"
    done
    rotation=$((rotation + 1))
  done
}

for part in $PARTS; do
  echo "== $part at $(date -u +%T)"
  case $part in
    static-realistic) static_part realistic "$REALISTIC_LOADS" ;;
    static-low) static_part low "$LOW_LOADS" ;;
    repair)
      set_rates "${RATES[realistic]}"
      for b in $REPAIR_LOADS; do
        put_table "$QUARTER"
        drain
        start_daemon  # the repair clock starts with load and daemon: no warm-up, 5 s windows
        measure "{\"part\":\"repair\",\"start_table\":$QUARTER}" "$b" 0 5 $((REPAIR_S / 5))
        stop_daemon
        static_settings
        for ref in "measured|$(cat "$WORK/measured-realistic.json")" $REPAIR_REFS; do
          put_table "${ref#*|}"
          measure "{\"part\":\"repair-reference\",\"set\":\"realistic\",\"arm\":\"${ref%%|*}\",\"table\":${ref#*|}}" \
            "$b" "$REF_WARMUP_S" "$WINDOW_S" 2
        done
      done
      ;;
    switch)
      set_rates "${RATES[realistic]}"
      put_table "$(cat "$WORK/measured-realistic.json")"
      drain
      start_daemon
      measure "{\"part\":\"switch\",\"switch_at_s\":$SWITCH_BEFORE_S,\"from\":\"realistic\",\"to\":\"$SWITCH_TO\"}" \
        "$SWITCH_LOAD" 0 5 $(((SWITCH_BEFORE_S + SWITCH_AFTER_S) / 5)) &
      load_pid=$!
      sleep "$SWITCH_BEFORE_S"
      set_rates "${RATES[$SWITCH_TO]}"
      echo "switched to $SWITCH_TO rates at $(date -u +%T)"
      wait "$load_pid"
      stop_daemon
      static_settings  # the references: each measured table, exactly, under the new rates
      for set in realistic "$SWITCH_TO"; do
        put_table "$(cat "$WORK/measured-$set.json")"
        measure "{\"part\":\"switch-reference\",\"set\":\"$SWITCH_TO\",\"table_for\":\"$set\"}" \
          "$SWITCH_LOAD" "$REF_WARMUP_S" "$WINDOW_S" 2
      done
      ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
echo "wrote $OUT at $(date -u +%T)"
