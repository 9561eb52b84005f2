#!/usr/bin/env bash
# shellcheck disable=SC2046  # logs prints flags, split on purpose
# Regenerates every committed users'-traffic report (bench/results/eval_traffic_*_h200.json and
# PNG; *_h100.json for launches an H100 ran) from the raw runs and logs kept under
# bench/results/gpu_raw/, with this checkout's eval_traffic_report.py: after a change to the
# report, run this and commit what moved.
#     bash bench/gpu/traffic_reports.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
RAW=bench/results/gpu_raw

report() {  # NAME RAW-FILE [flags...]: eval_traffic_NAME_<GPU>.json from the raw run (GPU: h200...)
  local name=$1 raw=$2
  shift 2
  "$PY" bench/gpu/eval_traffic_report.py "$RAW/$raw" --name "$name" "$@" | tail -1 \
    | sed "s|^wrote $PWD/||"
}

logs() {  # STAMP [GPU]: the GPU, host and GC logs a launch kept beside its raw run (GPU: h200)
  local gpu=${2:-h200}
  echo --gpu-clocks "$RAW/gpu_clocks_${gpu}_$1.csv.gz" --gpu-index 0 \
    --host-load "$RAW/host_load_${gpu}_$1.csv.gz" --gc-log "$RAW/gc_log_${gpu}_$1.txt.gz"
}

traced() {  # NAME STAMP [GPU]: a launch that kept its logs and step trace, its raw run named NAME
  local gpu=${3:-h200}
  report "$1" "eval_traffic_$1_${gpu}_$2.json" $(logs "$2" "$gpu") \
    --step-trace "$RAW/step_trace_${gpu}_$2.csv.gz"
}

table_pooled() {  # NAME PART REPORT...: the daemon's table at PART over launches of one commit
  local name=$1 part=$2
  shift 2
  "$PY" bench/gpu/table_pooled.py --name "$name" --part "$part" \
    $(printf 'bench/results/eval_traffic_%s_h200.json ' "$@") >/dev/null
  echo "bench/results/table_pooled_${name}_h200.json"
}

report chat_like eval_traffic_chat_like_h200_20261130T1852Z.json
report chat_like_b192 eval_traffic_chat_like_b192_h200_20261130T1932Z.json
report chat_like_b192_12s eval_traffic_chat_like_b192_12s_h200_20261130T2359Z.json \
  --gpu-clocks "$RAW/gpu_clocks_h200x2_20261130T2359Z.csv.gz" --gpu-index 1
report chat_like_b192_4s eval_traffic_chat_like_b192_4s_h200_20261201T0244Z.json \
  --gpu-clocks "$RAW/gpu_clocks_h200_20261201T0244Z.csv.gz" --gpu-index 0
report chat_like_b192_blocks eval_traffic_chat_like_b192_blocks_h200_20261201T0514Z.json \
  $(logs 20261201T0514Z)
report decode_heavy_b192_blocks eval_traffic_decode_heavy_b192_blocks_h200_20261201T0523Z.json \
  $(logs 20261201T0523Z)
report moe_chat_like_b192_blocks eval_traffic_moe_chat_like_b192_blocks_h200_20261201T0531Z.json \
  $(logs 20261201T0531Z)
report decode_heavy_b64_b128_blocks eval_traffic_decode_heavy_b64_b128_blocks_h200_20261201T0710Z.json \
  $(logs 20261201T0710Z)
report moe_decode_heavy_b192_blocks eval_traffic_moe_decode_heavy_b192_blocks_h200_20261201T0718Z.json \
  $(logs 20261201T0718Z)
report chat_like_b64_b128_blocks eval_traffic_chat_like_b64_b128_blocks_h200_20261201T0726Z.json \
  $(logs 20261201T0726Z)
# Launches on an H200 x2 host, one job a GPU (bench/gpu/two_gpus.sh): each job's logs carry
# both GPUs, and the report reads the job's own by the GPU its meta names.
logs_x2() {  # STAMP GPU: the logs one job of a two-GPU launch kept (GPU: its index)
  echo --gpu-clocks "$RAW/gpu_clocks_h200x2g$2_$1.csv.gz" --gpu-index "$2" \
    --host-load "$RAW/host_load_h200x2g$2_$1.csv.gz" --gc-log "$RAW/gc_log_h200x2g$2_$1.txt.gz"
}
report decode_heavy_b128_b96_trials_blocks \
  eval_traffic_decode_heavy_b128_b96_trials_blocks_h200_20261201T0954Z.json $(logs_x2 20261201T0954Z 0)
report long_context_b64_b16_blocks \
  eval_traffic_long_context_b64_b16_blocks_h200_20261201T0954Z.json $(logs_x2 20261201T0954Z 1)
report chat_like_b16_shape_change_blocks \
  eval_traffic_chat_like_b16_shape_change_blocks_h200_20261201T1003Z.json $(logs_x2 20261201T1003Z 0)
report decode_heavy_b160_b16_blocks \
  eval_traffic_decode_heavy_b160_b16_blocks_h200_20261201T1003Z.json $(logs_x2 20261201T1003Z 1)
report chat_like_b160_b256_blocks \
  eval_traffic_chat_like_b160_b256_blocks_h200_20261201T1011Z.json $(logs_x2 20261201T1011Z 0)
report decode_heavy_b256_long_context_b128_blocks \
  eval_traffic_decode_heavy_b256_long_context_b128_blocks_h200_20261201T1011Z.json \
  $(logs_x2 20261201T1011Z 1)
# One H200 again (2026-12-01 12:11, 12:19, 12:28 UTC; session 12's estimator run at 7178143).
report decode_heavy_b256_b128_blocks eval_traffic_decode_heavy_b256_b128_blocks_h200_20261201T1211Z.json \
  $(logs 20261201T1211Z)
report long_context_b192_chat_like_b96_blocks \
  eval_traffic_long_context_b192_chat_like_b96_blocks_h200_20261201T1219Z.json $(logs 20261201T1219Z)
report decode_heavy_b128_long_context_b96_blocks \
  eval_traffic_decode_heavy_b128_long_context_b96_blocks_h200_20261201T1228Z.json \
  $(logs 20261201T1228Z)
# One H200, 2026-12-01 14:35, 14:41, 14:48, 14:56 UTC (b000b32f; the second with trials on).
report decode_heavy_b256_shape_change_blocks \
  eval_traffic_decode_heavy_b256_shape_change_blocks_h200_20261201T1435Z.json $(logs 20261201T1435Z)
report decode_heavy_b256_b128_trials_blocks \
  eval_traffic_decode_heavy_b256_b128_trials_blocks_h200_20261201T1441Z.json $(logs 20261201T1441Z)
report decode_heavy_b256_long_context_b160_blocks \
  eval_traffic_decode_heavy_b256_long_context_b160_blocks_h200_20261201T1448Z.json \
  $(logs 20261201T1448Z)
report decode_heavy_b256_shape_change_again_blocks \
  eval_traffic_decode_heavy_b256_shape_change_again_blocks_h200_20261201T1456Z.json \
  $(logs 20261201T1456Z)
# One H200, 2026-12-01 16:27, 16:35, 16:43 UTC (0432a18a).
report decode_heavy_b128_shape_change_blocks \
  eval_traffic_decode_heavy_b128_shape_change_blocks_h200_20261201T1627Z.json $(logs 20261201T1627Z)
report decode_heavy_b256_44_rounds_blocks \
  eval_traffic_decode_heavy_b256_44_rounds_blocks_h200_20261201T1635Z.json $(logs 20261201T1635Z)
report chat_like_b192_shape_change_nightjar_blocks \
  eval_traffic_chat_like_b192_shape_change_nightjar_blocks_h200_20261201T1643Z.json \
  $(logs 20261201T1643Z)
# One H200, 2026-12-01 19:43, 19:52, 20:00 UTC (c6ca2d32; the first ran the default loads too).
report chat_like_b128_shape_change_blocks \
  eval_traffic_chat_like_b128_shape_change_blocks_h200_20261201T1943Z.json $(logs 20261201T1943Z)
report chat_like_b192_48_rounds_blocks \
  eval_traffic_chat_like_b192_48_rounds_blocks_h200_20261201T1952Z.json $(logs 20261201T1952Z)
report long_context_b192_56_rounds_blocks \
  eval_traffic_long_context_b192_56_rounds_blocks_h200_20261201T2000Z.json $(logs 20261201T2000Z)
# One H200, 2026-12-01 21:38, 21:47, 21:56 UTC (bd691295; settling after a change in the daemon).
report shape_change_settle_blocks \
  eval_traffic_shape_change_settle_blocks_h200_20261201T2138Z.json $(logs 20261201T2138Z)
report chat_like_b192_56_rounds_blocks \
  eval_traffic_chat_like_b192_56_rounds_blocks_h200_20261201T2147Z.json $(logs 20261201T2147Z)
report decode_heavy_b128_44_rounds_blocks \
  eval_traffic_decode_heavy_b128_44_rounds_blocks_h200_20261201T2156Z.json $(logs 20261201T2156Z)
# One H200, 2026-12-01 23:31, 23:39, 23:48 UTC (32f7a1ba; a thin k's spread as a share of its level).
report shape_change_spreads_blocks \
  eval_traffic_shape_change_spreads_blocks_h200_20261201T2331Z.json $(logs 20261201T2331Z)
report decode_heavy_b256_nightjar_spreads_blocks \
  eval_traffic_decode_heavy_b256_nightjar_spreads_blocks_h200_20261201T2339Z.json $(logs 20261201T2339Z)
report long_context_b192_spreads_blocks \
  eval_traffic_long_context_b192_spreads_blocks_h200_20261201T2348Z.json $(logs 20261201T2348Z)
# One H200, 2026-12-02 01:31, 01:39, 01:47 UTC (93a42cef; re-checks sparser; the daemon 200 s).
report decode_heavy_b256_explore_200s_blocks \
  eval_traffic_decode_heavy_b256_explore_200s_blocks_h200_20261202T0131Z.json $(logs 20261202T0131Z)
report decode_heavy_b128_explore_200s_blocks \
  eval_traffic_decode_heavy_b128_explore_200s_blocks_h200_20261202T0139Z.json $(logs 20261202T0139Z)
report decode_heavy_b16_explore_200s_blocks \
  eval_traffic_decode_heavy_b16_explore_200s_blocks_h200_20261202T0147Z.json $(logs 20261202T0147Z)
# One H200, 2026-12-02 03:38, 03:46, 03:55 UTC (e5e4c6ff; bursts priced, the guard's samples
# since a shift).
report decode_heavy_b256_priced_200s_blocks \
  eval_traffic_decode_heavy_b256_priced_200s_blocks_h200_20261202T0338Z.json $(logs 20261202T0338Z)
report long_context_b128_56_rounds_blocks \
  eval_traffic_long_context_b128_56_rounds_blocks_h200_20261202T0346Z.json $(logs 20261202T0346Z)
report shape_change_guard_blocks \
  eval_traffic_shape_change_guard_blocks_h200_20261202T0355Z.json $(logs 20261202T0355Z)
traced decode_heavy_b256_trace_blocks 20261202T0614Z
traced chat_like_b192_trace_blocks 20261202T0622Z
traced decode_heavy_b256_drafts_rule_blocks 20261202T0640Z
# The acceptance exploration priced (dda561f), decode-heavy B≈256 twice, then with the bandit.
traced decode_heavy_b256_priced_acceptance_blocks 20261202T0825Z
traced decode_heavy_b256_priced_acceptance_again_blocks 20261202T0833Z
traced decode_heavy_b256_nightjar_newest_blocks 20261202T0841Z
# A k its estimate oversold held to its run (1cd9e3d), decode-heavy B≈256 twice, then with the bandit.
traced decode_heavy_b256_hold_blocks 20261202T1035Z
traced decode_heavy_b256_hold_again_blocks 20261202T1043Z
traced decode_heavy_b256_hold_nightjar_blocks 20261202T1050Z
# After a shift a k on a few steps is unproven (6d27acf), decode-heavy B≈256, the daemon 200 s.
traced decode_heavy_b256_unproven_blocks 20261202T1301Z
# Arms rotated so each follows every other equally often, a rollback's hold ended by a shift
# (46eedb4): decode-heavy B≈256 (k0,k1,k3) and B≈128 (k0,k1,k3: its best k=2 not among them).
traced decode_heavy_b256_balanced_blocks 20261202T1708Z
traced decode_heavy_b128_balanced_blocks 20261202T1743Z
# An H100, 2026-12-06 17:23 and 17:32 UTC (2d48864: the shift check's bar 0.4; an H200 was asked
# for and an H100 came): the shape change decode-heavy -> chat-like at B=192 (no step trace: the
# PNG drawn there made the ninth file), decode-heavy B≈256 (k0,k1,k3, the bandit). Written as
# *_h100.json: the H200 summary below does not read them.
report shape_change_b192_blocks eval_traffic_shape_change_b192_blocks_h100_20261206T1723Z.json \
  $(logs 20261206T1723Z h100)
traced decode_heavy_b256_nightjar_blocks 20261206T1732Z h100
# The daemon's table over each commit's three launches at one load together (table_pooled.py).
table_pooled decode_heavy_b256_priced_acceptance decode-heavy-B256 \
  decode_heavy_b256_priced_acceptance{,_again}_blocks decode_heavy_b256_nightjar_newest_blocks
table_pooled decode_heavy_b256_hold decode-heavy-B256 decode_heavy_b256_hold{,_again,_nightjar}_blocks
# Issue 16's goals over every launch above (bench/results/eval_traffic_summary_h200.json + PNG).
"$PY" bench/gpu/traffic_summary.py >/dev/null
echo bench/results/eval_traffic_summary_h200.json
