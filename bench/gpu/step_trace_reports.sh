#!/usr/bin/env bash
# Regenerates the committed step-trace reports (bench/results/step_trace_*_h200.json, *_h100.json
# for launches an H100 ran) from the raw runs and engine step traces kept under
# bench/results/gpu_raw/ (STEP_TRACE=1 launches of bench/gpu/eval_traffic.sh), with this
# checkout's step_trace_report.py.
#     bash bench/gpu/step_trace_reports.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
RAW=bench/results/gpu_raw

trace_report() {  # NAME RAW-FILE STAMP [GPU]: step_trace_NAME_<GPU>.json (GPU: h200, h100...)
  local gpu=${4:-h200}
  "$PY" bench/gpu/step_trace_report.py "$RAW/$2" "$RAW/step_trace_${gpu}_$3.csv.gz" \
    --out "bench/results/step_trace_$1_${gpu}.json" >/dev/null
  echo "bench/results/step_trace_$1_${gpu}.json"
}

trace_report decode_heavy eval_traffic_decode_heavy_b256_trace_blocks_h200_20261202T0614Z.json \
  20261202T0614Z
trace_report chat_like eval_traffic_chat_like_b192_trace_blocks_h200_20261202T0622Z.json \
  20261202T0622Z
# The plugin counting by the drafts made (82db989), decode-heavy B≈256 again.
trace_report decode_heavy_drafts_rule \
  eval_traffic_decode_heavy_b256_drafts_rule_blocks_h200_20261202T0640Z.json 20261202T0640Z
# The acceptance exploration priced (dda561f), decode-heavy B≈256 twice, then with the bandit.
trace_report decode_heavy_priced_acceptance \
  eval_traffic_decode_heavy_b256_priced_acceptance_blocks_h200_20261202T0825Z.json 20261202T0825Z
trace_report decode_heavy_priced_acceptance_again \
  eval_traffic_decode_heavy_b256_priced_acceptance_again_blocks_h200_20261202T0833Z.json \
  20261202T0833Z
trace_report decode_heavy_nightjar_newest \
  eval_traffic_decode_heavy_b256_nightjar_newest_blocks_h200_20261202T0841Z.json 20261202T0841Z
# A k its estimate oversold held to its run (1cd9e3d), decode-heavy B≈256 twice, then with the bandit.
trace_report decode_heavy_hold \
  eval_traffic_decode_heavy_b256_hold_blocks_h200_20261202T1035Z.json 20261202T1035Z
trace_report decode_heavy_hold_again \
  eval_traffic_decode_heavy_b256_hold_again_blocks_h200_20261202T1043Z.json 20261202T1043Z
trace_report decode_heavy_hold_nightjar \
  eval_traffic_decode_heavy_b256_hold_nightjar_blocks_h200_20261202T1050Z.json 20261202T1050Z
trace_report decode_heavy_unproven \
  eval_traffic_decode_heavy_b256_unproven_blocks_h200_20261202T1301Z.json 20261202T1301Z
# The rotation balanced (46eedb4), decode-heavy B≈256 and B≈128.
trace_report decode_heavy_balanced \
  eval_traffic_decode_heavy_b256_balanced_blocks_h200_20261202T1708Z.json 20261202T1708Z
trace_report decode_heavy_b128_balanced \
  eval_traffic_decode_heavy_b128_balanced_blocks_h200_20261202T1743Z.json 20261202T1743Z
# Exploring over the three launches of each commit together (bench/gpu/exploring_pooled.py).
pooled() {  # NAME STAMP...: exploring_pooled_NAME_h200.json over those launches at one commit
  local name=$1 stamp args=()
  shift
  for stamp in "$@"; do
    args+=("$(ls "$RAW"/eval_traffic_*_h200_"$stamp".json)" "$RAW/step_trace_h200_$stamp.csv.gz")
  done
  "$PY" bench/gpu/exploring_pooled.py --name "$name" "${args[@]}" >/dev/null
  echo "bench/results/exploring_pooled_${name}_h200.json"
}
pooled decode_heavy_b256_priced_acceptance 20261202T0825Z 20261202T0833Z 20261202T0841Z
pooled decode_heavy_b256_hold 20261202T1035Z 20261202T1043Z 20261202T1050Z
# An H100 (an H200 was asked for), 2026-12-06 (2d48864): decode-heavy B≈256 with the bandit.
trace_report decode_heavy_nightjar \
  eval_traffic_decode_heavy_b256_nightjar_blocks_h100_20261206T1732Z.json 20261206T1732Z h100
