#!/usr/bin/env bash
# GPU evidence for the profiler (issue 4), ONE invocation on the H200 after device-setup.sh and
# the tabletune wheel (plugin + profiler) are installed to /tmp/site:
#   profile the dummy Qwen3-4B + EAGLE-3 shapes, K=3, B up to 256, in ONE vLLM launch: timing
#   with every guess rejected (sampler switched at run time by the profiler hook; in-flight by
#   default, TIMING=request for the request method), then acceptance under synthetic rates
#   0.75/0.55/0.40, which must come back within +-0.02. (bench/gpu/profile_fast.sh is the
#   in-flight job with the cross-check and a second grid.)
#
#   bash bench/gpu/profile_h200.sh [shape]      shape: qwen3-4b (default) | qwen3-30b-a3b
#
# Under $OUT: log.txt, profile.tgz (profile, acceptance, table, summary, raw samples, PNGs,
# vLLM log) and profile_h200_<shape>.json (the run's summary + the acceptance check).
# Env: TIMING (in-flight | request), DECODE_TOKENS (32: request method), REPEATS (3),
#      MAX_NUM_SEQS (256), PROFILE_TIME_LIMIT_S (540),
#      MODELS (/tmp/models), SERVER_MODULE and ENGINE_ARGS (a CPU dry run points them at a fake).
set -uo pipefail
shape=${1:-qwen3-4b}
OUT=${OUT:-/tmp/tt-out}
MODELS=${MODELS:-/tmp/models}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=/tmp/tt-profile-$shape
rm -rf "$work" && mkdir -p "$work" "$OUT"
name="h200-$shape-eagle3"
export PYTHONUNBUFFERED=1
rates=0.75,0.55,0.40
started=$(date +%s.%N)
# SIGINT at the limit: the profiler writes its partial samples and stops vLLM before exiting.
timeout -s INT "${PROFILE_TIME_LIMIT_S:-540}" python3 -m tabletune.cli.main profile \
  --model "$MODELS/$shape" --drafter "$MODELS/$shape-eagle3" --method eagle3 \
  --num-speculative-tokens 3 --max-num-seqs "${MAX_NUM_SEQS:-256}" \
  --server-module "${SERVER_MODULE:-vllm.entrypoints.openai.api_server}" \
  --engine-args "${ENGINE_ARGS:---load-format dummy --skip-tokenizer-init --max-model-len 4096}" \
  --timing "${TIMING:-in-flight}" \
  --decode-tokens "${DECODE_TOKENS:-32}" --repeats "${REPEATS:-3}" \
  --acceptance-synthetic-rates "$rates" --acceptance-max-tokens 256 \
  --notes "bench/gpu/profile_h200.sh $shape: dummy weights, one launch" \
  --output "$work/$name.json" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
ended=$(date +%s.%N)
python3 "$here/profile_h200_check.py" "$work/$name.summary.json" --rates "$rates" \
  --tolerance 0.02 --end-to-end-s "$(python3 -c "print($ended - $started)")" --exit-code "$rc" \
  >"$OUT/profile_h200_$shape.json"
check=$?
cat "$OUT/profile_h200_$shape.json"
tar czf "$OUT/profile.tgz" -C "$work" .
[[ $rc -ne 0 ]] && exit "$rc"
exit "$check"
