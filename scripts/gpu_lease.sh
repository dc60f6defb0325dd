#!/usr/bin/env bash
# One lease of a GPU (the workplace's device tool), run from the repository root there:
#   the environment, a cold and a warm start, the GEMM and launch figures, ResNet-18 training
#   against PyTorch, ResNet-50 LMS on with early write-back against lazy (session 39's
#   prediction: 1.13-1.25x), then the suite's CUDA tier with what time is left before DEADLINE.
# Logs and JSON go to $OUT (the device tool brings them back); the end of the output is a summary.
# Uses the machine's own python3 (numba, numba-cuda, PyTorch installed); nothing is installed.
set -u
export NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gpu-lease}
DEADLINE=${DEADLINE:-380}
BATCHES=${BATCHES:-32 64}
PARTS=${PARTS:-start kernels train writeback tier}      # which of the parts below run
PROFILE=${PROFILE:-}      # --profile (the host's time in training), --gpu-steps (the GPU's, per step)
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/minilms-numba-cache}   # empty: the first start is cold
mkdir -p "$OUT" "$NUMBA_CACHE_DIR"
left() { echo $(( DEADLINE - SECONDS )); }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import numba, numba_cuda, numpy; print('numba', numba.__version__, 'numba-cuda',
numba_cuda.__version__, 'numpy', numpy.__version__)"

part() { [[ " $PARTS " == *" $1 "* ]]; }

part start && timeout 150 python3 scripts/bench_cuda.py --only env start --model resnet18 --batches 8 \
    --json "$OUT/start.json" 2>&1 | tee "$OUT/start.log"
part kernels && timeout 60 python3 scripts/bench_cuda.py --only env gemm launch --json "$OUT/kernels.json" 2>&1 \
    | tee "$OUT/kernels.log"
# shellcheck disable=SC2086
part train && timeout 150 python3 scripts/bench_cuda.py --only train --batches $BATCHES $PROFILE \
    --json "$OUT/train.json" 2>&1 | tee "$OUT/train.log"
part writeback && timeout 180 python3 scripts/bench_cuda.py --only train --model resnet50 \
    --batches 32 --iters 5 --runs 2 --no-torch --write-back --json "$OUT/writeback.json" 2>&1 \
    | tee "$OUT/writeback.log"

if ! part tier; then
    :
elif [ "$(left)" -gt 30 ]; then
    timeout "$(left)" python3 -m pytest -k cuda -q -n 8 -p no:cacheprovider --maxfail=40 --runslow \
        -o addopts="" > "$OUT/tier.log" 2>&1
    echo "CUDA tier: exit $?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tier.log" | tail -40
else
    echo "CUDA tier: no time left ($(left) s)"
fi
