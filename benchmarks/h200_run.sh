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
    # -v names each result as it lands: a run cut by its time limit still says what failed
    tests) timeout ${TESTS_S:-480} python3 -m pytest -v -n 16 -rf --tb=short -p no:benchmark tests -p no:cacheprovider > "$OUT/tests.log" 2>&1
           echo "passed $(grep -c ' PASSED ' "$OUT/tests.log"), failed $(grep -c ' FAILED ' "$OUT/tests.log")"
           grep -E " FAILED | ERROR " "$OUT/tests.log" | sed 's/.* \(FAILED\|ERROR\) //' | sort -u | head -30; tail -1 "$OUT/tests.log" ;;
    sanitize) timeout ${SAN_S:-60} compute-sanitizer --tool memcheck python3 -m pytest -q -x tests/test_correctness.py -k "triton and cuda and odd_feature" -p no:cacheprovider > "$OUT/sanitizer.log" 2>&1; tail -4 "$OUT/sanitizer.log" ;;
    sweep) for w in 32 64 128; do for m in fwd bwd; do  # one process each: a fault ends one
             python3 benchmarks/sweep_narrow.py --width $w --mode $m 2>&1 | tee -a "$OUT/sweep.log" | grep -E "BEST|WRONG|Error"; done; done ;;
    profile) timeout 60 python3 -m fusedmlp_xpu.cli profile > "$OUT/profile.txt" 2>&1; cat "$OUT/profile.txt" | tail -14 ;;
    overhead) python3 benchmarks/overhead.py --profile --out "$OUT/overhead.json" > "$OUT/overhead.txt" 2>&1; grep -E " us$|failed" "$OUT/overhead.txt" ;;
    bench) timeout ${BENCH_S:-500} python3 -m fusedmlp_xpu.cli bench --suite narrow ${BENCH_ARGS:-} --out "$OUT/bench-narrow.json" 2>"$OUT/bench.log" | tee "$OUT/bench-summary.txt" ;;
    *) echo "unknown step $s" ;;
  esac
done
