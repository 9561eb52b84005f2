#!/usr/bin/env bash
# Every way of choosing k under users' traffic on real vLLM 0.26.0 (one H200), ONE launch:
# for each load (clients), the daemon with live step time from the documented table shrunk to a
# quarter, then fixed k=0..3, vLLM's documented table, the measured table and the daemon's table
# rotated (eval_traffic.py). The server, plugin and set-up are live_step_time.sh's (synthetic
# acceptance 0.75/0.55/0.40, max_num_seqs 256, max_model_len 4096); this only names the driver
# and its report.
#
# Usage, on the GPU host from the repository root, after `source .gpu-bundle/p3/device-setup.sh`
# with this branch's wheel (and the daemon's wheels in .gpu-bundle/p3/wheels) in .gpu-bundle/p3/:
#     bash bench/gpu/eval_traffic.sh                     # chat-like, loads 128,192,64
#     DRIVER_ARGS="--shape decode-heavy" bash bench/gpu/eval_traffic.sh
#     DRIVER_ARGS="--loads 192 --shape-change decode-heavy:chat-like:192" bash ...  # + a change
#     DRIVER_ARGS="--arms k0,k1,k2,k3,documented,measured,daemon,nightjar" bash ...  # + the bandit
# Results under $OUT: eval_traffic.json (every window's raw row), eval_traffic_h200.json (the
# report), live_step_time_run_log.txt, live_step_time_vllm_log.txt. Then, here:
#     .venv/bin/python bench/gpu/eval_traffic_report.py eval_traffic.json
# writes bench/results/eval_traffic_<shape>_h200.json and its PNG.
# A CPU dry run against the plugin-based stand-in (about two minutes):
#     WHEEL=none SERVER_MODULE=tests.support.vllm_stand_in PYTHONPATH=src:. BUDGET_S=240 \
#     TABLETUNE_SYNC_INTERVAL_S=0.2 DRIVER_ARGS="--loads 4,8 --warmup-s 1 --window-s 1 \
#       --settle-s 0.5 --daemon-s 4 --daemon-cycle-s 1 --max-model-len 4096" \
#     bash bench/gpu/eval_traffic.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export DRIVER=bench/gpu/eval_traffic.py
export REPORT=bench/gpu/eval_traffic_report.py
export OUT=${OUT:-/tmp/eval-traffic}
exec bash bench/gpu/live_step_time.sh
