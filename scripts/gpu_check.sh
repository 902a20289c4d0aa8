#!/usr/bin/env bash
# GPU checks, on a machine with a CUDA GPU. Runs in under 8 minutes (the steps' limits add up to 475 s):
#   1. every GPU test on real CUDA (no simulator): tests/test_accel_cuda.py (Numba-CUDA kernels,
#      CuPy RawKernels, cuBLAS linear, GPT-2 `cuda` Ops parity) and the differential suite's
#      numba_cuda / cupy entries; then (step llama-tests) tests/test_accel_llama_cuda.py: the LLaMA
#      family's `cuda` Ops (logits, padded batches, cached decoding, the graph-captured decode
#      step) vs the numpy backend for every family, rope_rotate / glu_gate / kv_write vs their twins;
#   2. `python -m refimpl verify` for the numba_cuda and cupy backends (the parity table);
#   3. the command line: `python -m refimpl generate --backend cuda` on the shipped model, greedy,
#      token-identical to `--backend numpy` (needs .cache/gpt2.tiktoken: scripts/fetch_data.py);
#   4. the GPU benchmarks (benchmarks/gpu.py --quick): ceilings, fused attention vs torch SDPA,
#      bandwidth kernels, launch costs, GPT-2 small decode vs HF generate (logits / token parity);
#   5. llama: a SmolLM-135M-shaped decode on the `cuda` backend vs HF generate on the GPU
#      (benchmarks/llama_gpu.py: prompt-logit parity, then timings; llama_gpu.json).
# Usage: bash scripts/gpu_check.sh [STEP...]   (STEP: bench tests llama-tests verify cli llama; default all;
#        results under $OUT, default ./gpu_check_out)
# Needs python3 with numpy, numba + numba-cuda, cupy, torch (CUDA), transformers, pytest,
# hypothesis: the device image has them all. Every step runs even if an earlier one fails;
# the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export NUMBA_ENABLE_CUDASIM=0 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
status=0
steps=" ${*:-bench tests llama-tests verify cli llama} "
step() {  # step NAME TIMEOUT_S CMD...: run with a time limit, log to $OUT/NAME.log, remember failures
  local name=$1 limit=$2; shift 2
  case "$steps" in *" $name "*) ;; *) return 0 ;; esac
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

{
  nvidia-smi
  "$PY" - <<'PY'
import numba, numpy, sys
from numba import cuda
print("python", sys.version.split()[0], "numpy", numpy.__version__, "numba", numba.__version__,
      "numba.cuda", getattr(cuda, "implementation", "?"), "available", cuda.is_available())
try:
    import cupy
    print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())
    from importlib.metadata import version
    print("numba-cuda", version("numba-cuda"), "torch", version("torch"), "transformers", version("transformers"))
except Exception as e:
    print("cupy unavailable:", e)
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step bench 150 "$PY" -m benchmarks.gpu --quick --out "$OUT"
step tests 140 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_accel_cuda.py \
  tests/test_accel_differential.py -k "not differential or numba_cuda or cupy" -rs
step llama-tests 60 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_accel_llama_cuda.py -rs
step verify 40 bash -c "'$PY' -m refimpl verify --backend numba_cuda && '$PY' -m refimpl verify --backend cupy"
step cli 40 bash -c "set -e; for b in numpy cuda; do
    '$PY' -m refimpl generate --prompt 'ROMEO:' --max-new-tokens 40 --greedy --no-eos --backend \$b > /tmp/cli_\$b.txt
    echo \"--- --backend \$b:\"; cat /tmp/cli_\$b.txt; done
  cmp /tmp/cli_numpy.txt /tmp/cli_cuda.txt && echo 'cuda output identical to numpy output'"
step llama 45 "$PY" -m benchmarks.llama_gpu --out "$OUT"
echo "gpu_check: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED); results in $OUT"
exit $status
