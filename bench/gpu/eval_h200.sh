#!/usr/bin/env bash
# Issue 7 on real vLLM 0.26.0 (one H200): fixed k, vLLM's documented table and our measured table
# across a closed-loop load sweep, under two synthetic acceptance sets; the daemon's repair run
# from the documented table shrunk to a quarter; an acceptance switch mid-run. ONE engine launch.
#
# STATUS: NOT YET RUN. Written in a session without device time; no number in this repository
# comes from it. After a run: commit bench/results/eval_h200_*.jsonl and update bench/README.md.
#
# Usage, on the GPU host from the repository root, after `source p3/device-setup.sh`
# (shared/gpu/README.md):
#     bench/gpu/eval_h200.sh PROFILE_JSON        # a measured H200 profile (profiles/...)
#
# How each part is done:
# - One launch: the starting table holds every k (0..3) so the V2 runner captures graphs for all;
#   the TableTune plugin swaps the table at run time (PUT /tabletune/v1/table); the profiler's
#   engine hook (general plugin `tabletune_profiler`, reached through vLLM's /collective_rpc with
#   VLLM_SERVER_DEV_MODE=1) switches the synthetic acceptance rates at run time. That hook is
#   the "test-only engine hook" for the acceptance switch: it replaces the sampler's per-position
#   conditional rates, read every step outside the CUDA graphs, so the next step uses them.
# - Throughput: vLLM's own `vllm:generation_tokens_total` over a steady window (after a warm-up),
#   with the effective batch from `vllm:num_requests_running` and k from drafts per step.
# - Load: B concurrent clients, each sending one long request (ignore_eos, OUTPUT_TOKENS) after
#   another; ONE aiohttp client configuration for every arm (no connection limit); arms are
#   interleaved per load in a rotating order.
# - Repair: `tabletune daemon` in direct-scrape mode against this server, exploration every 50
#   steps and prior decay on; throughput every 5 s at each load vs the measured table's.
# - Switch: at one high load with the daemon running, rates go realistic -> low mid-run.
#
# Time: ~100 s start-up, then per static measurement WARMUP_S + WINDOW_S + drain (~17 s by
# default): 5 loads x 6 arms x 2 sets ~ 17 min; repair 3 x 90 s; switch ~ 2.5 min. To fit a
# 10-minute command limit, run parts separately (one launch each), e.g.
#     PARTS=static SETS=realistic bench/gpu/eval_h200.sh P;  PARTS=static SETS=low ...;
#     PARTS="repair switch" ...
set -euo pipefail
cd "$(dirname "$0")/../.."

PROFILE=${1:?usage: bench/gpu/eval_h200.sh PROFILE_JSON}
MODEL=${MODEL:-/tmp/models/qwen3-4b}
DRAFTER=${DRAFTER:-/tmp/models/qwen3-4b-eagle3}
PORT=${PORT:-8000}
URL="http://127.0.0.1:${PORT}"
LOADS=${LOADS:-"1 8 32 128 256"}
SETS=${SETS:-"realistic low"}
PARTS=${PARTS:-"static repair switch"}
WARMUP_S=${WARMUP_S:-5}
WINDOW_S=${WINDOW_S:-10}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-4096}
REPAIR_LOADS=${REPAIR_LOADS:-"16 128 256"}
REPAIR_S=${REPAIR_S:-90}
SWITCH_LOAD=${SWITCH_LOAD:-256}
REALISTIC="0.75,0.55,0.40"
LOW="0.50,0.25,0.12"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
WORK=$(mktemp -d /tmp/tt-eval.XXXXXX)
OUT="bench/results/eval_h200_${STAMP}.jsonl"
mkdir -p bench/results

# TableTune itself, with its entry points, into a private site dir (no registry on this host).
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$WORK/site" .
export PYTHONPATH="$WORK/site:${PYTHONPATH:-}"
case " $PARTS " in
  *" repair "* | *" switch "*)
    python3 - <<'EOF' || { echo "the daemon's dependencies are missing on this host: add" \
  "apscheduler structlog tenacity rich prometheus-api-client to shared/gpu/carry-requirements.txt" >&2; exit 2; }
import apscheduler, structlog, tenacity, rich, prometheus_api_client  # noqa: F401
EOF
    ;;
esac

# Tables: the measured one per acceptance set from the profile, the documented one, fixed k.
for set in realistic low; do
  rates=$([ "$set" = realistic ] && echo "$REALISTIC" || echo "$LOW")
  python3 - "$rates" "$WORK/acceptance-$set.json" <<'EOF'
import sys
from tabletune.schemas import AcceptanceProfile, save_model
rates = tuple(float(x) for x in sys.argv[1].split(","))
save_model(AcceptanceProfile(rates=rates, prompt_source="synthetic sampler (bench)"), sys.argv[2])
EOF
  python3 -m tabletune.cli.main solve --profile "$PROFILE" --acceptance "$WORK/acceptance-$set.json" --json \
    > "$WORK/measured-$set.json"
done
DOCS='[[1,64,3],[65,128,1],[129,256,0]]'
QUARTER='[[1,16,3],[17,32,1],[33,128,0]]'

# The one launch: every k in the starting table, synthetic sampler (realistic rates to start).
SPEC=$(printf '{"method":"eagle3","model":"%s","num_speculative_tokens":3,%s,%s,%s}' "$DRAFTER" \
  '"num_speculative_tokens_per_batch_size":[[1,16,3],[17,24,2],[25,32,1],[33,256,0]]' \
  '"rejection_sample_method":"synthetic"' "\"synthetic_acceptance_rates\":[${REALISTIC}]")
export VLLM_PLUGINS=tabletune_engine,tabletune_http,tabletune_metrics,tabletune_profiler
export VLLM_SERVER_DEV_MODE=1 VLLM_USE_V2_MODEL_RUNNER=1
python3 -m vllm.entrypoints.openai.api_server --model "$MODEL" --load-format dummy \
  --skip-tokenizer-init --max-num-seqs 256 --port "$PORT" --speculative-config "$SPEC" \
  > "$WORK/vllm.log" 2>&1 &
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
  kill -0 "$VLLM_PID" 2>/dev/null || { tail -50 "$WORK/vllm.log" >&2; exit 1; }
  sleep 1
done
curl -sf "$URL/health" >/dev/null || { tail -50 "$WORK/vllm.log" >&2; exit 1; }

# The closed-loop client and the /metrics reader, shared by every arm.
cat > "$WORK/closed_loop.py" <<'EOF'
"""B clients in a closed loop: warm-up, then COUNT windows of WINDOW s, one JSON line each."""
import asyncio, json, sys, time

import aiohttp

url, model, batch, warmup, window, count, out_tokens, label = sys.argv[1:9]
batch, warmup, window = int(batch), float(warmup), float(window)
count, out_tokens = int(count), int(out_tokens)
PROMPT = list(range(1000, 1032))  # 32 token ids (dummy weights: content does not matter)


def scrape(text):
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name in ("vllm:generation_tokens_total", "vllm:spec_decode_num_drafts_total",
                    "vllm:spec_decode_num_draft_tokens_total", "vllm:num_requests_running"):
            values[name] = values.get(name, 0.0) + float(value)
    return values


async def client(session, stop):
    body = {"model": model, "prompt": PROMPT, "max_tokens": out_tokens, "ignore_eos": True,
            "temperature": 0.0}
    while not stop.is_set():
        try:
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
        except aiohttp.ClientError:
            await asyncio.sleep(0.1)


async def one_window(session, started):
    async with session.get(f"{url}/metrics") as r:
        before = scrape(await r.text())
    t0 = time.monotonic()
    running = []
    while time.monotonic() - t0 < window:
        await asyncio.sleep(min(1.0, window))
        async with session.get(f"{url}/metrics") as r:
            running.append(scrape(await r.text()).get("vllm:num_requests_running", 0.0))
    async with session.get(f"{url}/metrics") as r:
        after = scrape(await r.text())
    async with session.get(f"{url}/tabletune/v1/table") as r:
        table = (await r.json()).get("table")
    elapsed = time.monotonic() - t0
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
    draft_tokens = delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
    print(json.dumps({
        "label": json.loads(label), "batch": batch, "window_s": elapsed,
        "window_end_s": time.monotonic() - started, "table": table,
        "tokens_per_s": delta.get("vllm:generation_tokens_total", 0.0) / elapsed,
        "mean_running": sum(running) / max(1, len(running)),
        "mean_k": draft_tokens / drafts if drafts else 0.0,
    }), flush=True)


async def main():
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)  # the same client for every arm
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()
        tasks = [asyncio.create_task(client(session, stop)) for _ in range(batch)]
        await asyncio.sleep(warmup)
        for _ in range(count):
            await one_window(session, started)
        stop.set()
        for task in tasks:
            task.cancel()  # closing the connections aborts the requests in vLLM
        await asyncio.gather(*tasks, return_exceptions=True)


asyncio.run(main())
EOF

put_table() {
  curl -sf -X PUT -H 'Content-Type: application/json' -d "{\"table\": $1}" "$URL/tabletune/v1/table" >/dev/null
}
set_rates() {  # the profiler's engine hook, through vLLM's dev-mode /collective_rpc
  local body
  body=$(python3 -c 'import json, sys
mode = {"kind": "synthetic", "rates": [float(x) for x in sys.argv[1].split(",")]}
print(json.dumps({"method": "tabletune_profiler_set_sampler", "args": [json.dumps(mode)]}))' "$1")
  curl -sf -X POST -H 'Content-Type: application/json' -d "$body" "$URL/collective_rpc" >/dev/null
}
drain() {  # wait until no request runs, so arms do not overlap
  for _ in $(seq 1 60); do
    n=$(curl -sf "$URL/metrics" | awk '/^vllm:num_requests_running/ {s+=$2} END {print s+0}')
    [ "${n%.*}" -eq 0 ] && return 0
    sleep 1
  done
}
measure() {  # measure LABEL_JSON B [WARMUP_S WINDOW_S COUNT]: closed loop, JSON lines to $OUT
  drain
  python3 "$WORK/closed_loop.py" "$URL" "$MODEL" "$2" "${3:-$WARMUP_S}" "${4:-$WINDOW_S}" \
    "${5:-1}" "$OUTPUT_TOKENS" "$1" | tee -a "$OUT"
}
curl -sf -X PUT -H 'Content-Type: application/json' \
  -d '{"exploration_interval": 0, "hysteresis": 0}' "$URL/tabletune/v1/settings" >/dev/null

# 1. Static arms: fixed k, documented, measured; per acceptance set, per load, rotating order.
case " $PARTS " in *" static "*) ;; *) SETS="" ;; esac
for set in $SETS; do
  rates=$([ "$set" = realistic ] && echo "$REALISTIC" || echo "$LOW")
  set_rates "$rates"
  measured=$(cat "$WORK/measured-$set.json")
  arms=("k0|[[1,256,0]]" "k1|[[1,256,1]]" "k2|[[1,256,2]]" "k3|[[1,256,3]]" "docs|$DOCS" "measured|$measured")
  rotation=0
  for b in $LOADS; do
    for i in "${!arms[@]}"; do
      arm=${arms[$(( (i + rotation) % ${#arms[@]} ))]}
      name=${arm%%|*}; table=${arm#*|}
      put_table "$table"
      measure "{\"part\":\"static\",\"set\":\"$set\",\"arm\":\"$name\",\"table\":$table}" "$b"
    done
    rotation=$((rotation + 1))
  done
done

# 2. Repair: the daemon from the documented table / 4, realistic rates, at a few loads.
case " $PARTS " in *" repair "*) ;; *) REPAIR_LOADS="" ;; esac
set_rates "$REALISTIC"
start_daemon() {
  TABLETUNE_SOURCE__REPLICAS="$URL" TABLETUNE_PROFILE__PATHS="$PROFILE" \
  TABLETUNE_ESTIMATOR__PRIOR_DECAY=true TABLETUNE_PLUGIN__EXPLORATION_INTERVAL=50 \
  TABLETUNE_STATE__DIR="$WORK/state" TABLETUNE_SERVER__PORT=0 \
    python3 -m tabletune.cli.main daemon > "$WORK/daemon.log" 2>&1 &
  DAEMON_PID=$!
}
for b in $REPAIR_LOADS; do
  put_table "$QUARTER"
  rm -rf "$WORK/state"
  start_daemon  # the repair clock starts with the load: no warm-up, 5 s windows
  measure "{\"part\":\"repair\"}" "$b" 0 5 $((REPAIR_S / 5))
  kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true; DAEMON_PID=""
done

# 3. Switch: the daemon runs with the measured table under realistic rates; 60 s in, the
#    hook switches the sampler to the low rates; 5 s windows throughout.
case " $PARTS " in *" switch "*) ;; *) echo "wrote $OUT"; exit 0 ;; esac
set_rates "$REALISTIC"
put_table "$(cat "$WORK/measured-realistic.json")"
rm -rf "$WORK/state"
start_daemon
measure "{\"part\":\"switch\",\"switch_at_s\":$((WARMUP_S + 60))}" "$SWITCH_LOAD" "$WARMUP_S" 5 24 &
LOAD_PID=$!
sleep $((WARMUP_S + 60))
set_rates "$LOW"
wait "$LOAD_PID"
echo "wrote $OUT (vLLM log: $WORK/vllm.log, daemon log: $WORK/daemon.log)"
