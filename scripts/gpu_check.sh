#!/usr/bin/env bash
# Everything the GPU shows, in one call of the device tool: the test suite on the GPU (real
# compiles, bf16, torch.compile), the bit-identity matrix, and the benchmarks against the
# peers. Tables and logs go under $OUT. STEPS picks a subset: STEPS=tests,verify,tune,bench.
# TESTS (files) and TESTS_K (a -k expression), VERIFY_ARGS (e.g. --family decode), TUNE_ARGS
# (e.g. C-A,C-B), BENCH_ARGS (e.g. --workload A,B; DeepSeek-V4's rows: --workload
# V4-CSA,V4-HCA,V4-X) narrow a step; JOBS sets the parallelism.
#   device run: bash scripts/gpu_check.sh        (carry .peers/py for the peers, .peers/fi for FlashInfer)
set -uo pipefail
OUT=${OUT:-/tmp/swattn-gpu}
mkdir -p "$OUT"
STEPS=${STEPS:-tests,verify,bench}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
status=0
# STEP_TIMEOUT (seconds, 0 = none) stops a step that runs long, so the later ones still run
# and every log written so far comes back.
limit() { if [[ ${STEP_TIMEOUT:-0} -gt 0 ]]; then timeout "$STEP_TIMEOUT" "$@"; else "$@"; fi; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit ${SWATTN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
} | tee "$OUT/env.txt"

if [[ ,$STEPS, == *,tests,* ]]; then
  echo "== tests"
  limit python3 -m pytest -q -p no:cacheprovider -n ${JOBS:-8} ${TESTS:-tests} ${TESTS_K:+-k "$TESTS_K"} \
    > "$OUT/pytest.log" 2>&1 || status=1
  tail -n 15 "$OUT/pytest.log"
fi
if [[ ,$STEPS, == *,verify,* ]]; then
  echo "== verify"
  limit python3 -m swattn verify --device cuda --jobs ${JOBS:-8} --out "$OUT" ${VERIFY_ARGS:-} 2> "$OUT/verify.log" | tail -n 3 || status=1
  grep -c '^BAD' "$OUT/verify.log" | sed 's/^/BAD rows: /'
fi
if [[ ,$STEPS, == *,tune,* ]]; then
  echo "== tune"
  limit python3 scripts/tune.py ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log" | grep -v '^$' || status=1
fi
if [[ ,$STEPS, == *,bench,* ]]; then
  echo "== bench"
  source scripts/peers_path.sh
  (export SWATTN_COMMIT=${SWATTN_COMMIT:-}
   limit python3 -m swattn.bench --out "$OUT" ${BENCH_ARGS:-} 2> "$OUT/bench.log") || status=1
  tail -n 5 "$OUT/bench.log"
fi
exit $status
