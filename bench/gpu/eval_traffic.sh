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
#
# Recipe for one load in a 10-minute launch, interleaved blocks (a "switchback" design; run
# 2026-12-01, three launches: 5-10 blocks fit, docs/results.md "Users' traffic"): every arm in
# the same seconds. Visits of 1 s (a 0.25 s settle after the table, the plugin syncing every
# 0.05 s so that settle is allowed: one utility call into the engine core per ~step, as the
# profiler runs it, every arm alike) rotated through the arms, 8 rounds pooled per block: per
# block each arm's tokens over its seconds, over the best fixed k's. A stall of the engine hits
# every arm of a block alike but for two visits at most (at most 2/N of its depth is left, N
# rounds a block).
#     BUDGET_S=535 TABLETUNE_SYNC_INTERVAL_S=0.05 GC_DEBUG=1 DRIVER_ARGS="--loads chat-like:192 \
#       --arms k1,k2,k3,daemon --window-s 1 --settle-s 0.25 --rounds 64 --rounds-per-block 8" \
#       bash bench/gpu/eval_traffic.sh           # 40-56 rounds ran (5-7 blocks of 8)
# The numbers, from the driver's own estimate (load_needs_s): the load needs 64 s (warm-up 6,
# the daemon's 36 one-second windows 45, its stop 3, the drain 10) + 6 s a round (4 arms x
# (1 + 0.25 + 0.25 per window: scrapes, view, PUT)); what is left for it is BUDGET_S - 25 - ~5
# (set-up) - the engine's start. What the launches showed: block ratios of arms running one
# and the same k still ranged 11-28 % (the steps' host time varies second by second with what
# they carry), so the report also judges the daemon by the k its steps ran (by_k_mix).
# --rounds is a ceiling: the driver runs as many
# whole blocks (whole pairs of rounds without blocks) as fit what is left (rounds planned vs
# run in the JSON) and skips the load only when not one fits; --rounds-per-block must be even
# (an order and its reverse) and --rounds a multiple of it.
# Without blocks (--rounds-per-block 1, the default, today's design): one window per arm per
# round, paired per round, e.g. --window-s 4 --settle-s 1.5 --rounds 16 (run 2026-12-01: 14
# rounds, ratios spanning 59 %).
# What --settle-s waits for after a table is put in: not the table itself (the PUT returns once
# the engine has it, and the next step runs it: fixed k, the documented, measured and daemon
# tables alike), but the plugin's step cells in /metrics, which lag by up to one sync interval
# (TABLETUNE_SYNC_INTERVAL_S, 1 s unless set; a smaller --settle-s is refused), so a window's k
# mix is of its arm alone. vLLM's token counters, which tokens/s comes from, do not lag. The
# closed loop's requests take a few seconds to settle into the new k's mix; the rotation puts
# every arm right after every other equally often (twice over len(arms) pairs of rounds, a
# zigzag order and its reverse: eval_traffic.py's rotations), so that is not waited for.
# Launches up to 2026-12-02 13:01 UTC (6d27acf) rotated plainly (each arm only ever after its
# two neighbours in --arms).
# Results under $OUT: eval_traffic.json (every window's raw row, with its start and end in
# UTC), eval_traffic_h200.json (the report), gpu_clocks.csv (nvidia-smi once a second),
# host_load.csv (bench/gpu/host_logger.py once a second: the host's busy, iowait and steal
# shares; per process of vLLM's group its role, CPU, run-queue wait and context switches),
# live_step_time_run_log.txt, live_step_time_vllm_log.txt. Then, here:
#     .venv/bin/python bench/gpu/eval_traffic_report.py eval_traffic.json
# writes bench/results/eval_traffic_<shape>_<gpu>.json and its PNG (the GPU and host logs beside
# the raw file are read on their own: --gpu-clocks CSV --gpu-index N and --host-load CSV for
# ones kept elsewhere). Its per-load ``stalls`` tells a window where the GPU waited on the host
# by cause (bench/README.md, "Users' traffic"): the engine core's CPU near 1.0 without run-queue
# wait or steal, its own work (a GC pause...); run-queue wait and involuntary switches,
# contention in the VM; steal, the hypervisor.
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
