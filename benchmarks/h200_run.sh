#!/usr/bin/env bash
# One device call: GPU test suite, tuning sweep, benchmark. Writes everything under $OUT.
# Usage (from the repo root on the GPU machine): bash benchmarks/h200_run.sh [steps...]
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
steps=${*:-"tests sanitize bench"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
for s in $steps; do
  case $s in
    tests) python3 -m pytest -q -n 8 tests -p no:cacheprovider > "$OUT/tests.log" 2>&1; tail -4 "$OUT/tests.log"; grep -E "^FAILED" "$OUT/tests.log" | head -20 ;;
    sanitize) compute-sanitizer --tool memcheck python3 -m pytest -q -x tests/test_correctness.py -k "triton and cuda and (odd or batch_shapes)" -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/sanitizer.log" ;;
    sweep) python3 benchmarks/sweep_narrow.py --out "$OUT/sweep.json" 2>&1 | grep -E "BEST|Error" | tee "$OUT/sweep.log" ;;
    bench) python3 -m fusedmlp_xpu.cli bench --suite narrow ${BENCH_ARGS:-} --out "$OUT/bench-narrow.json" 2>"$OUT/bench.log" | tee "$OUT/bench-summary.txt" ;;
    *) echo "unknown step $s" ;;
  esac
done
