#!/usr/bin/env bash
# One device call: GPU test suite, tuning sweep, benchmark. Writes everything under $OUT:
# the measurements appended to one results table, $OUT/results.jsonl (one run id a step,
# <machine>-<step>-<stamp>), logs beside it. Back here, add the runs to the machine's table:
#   python -m fusedmlp_xpu.bench.results add OUT/results.jsonl
# benchmarks/README.md says what each step measures and which run it recorded last.
# Usage (from the repo root on the GPU machine): bash benchmarks/h200_run.sh [steps...]
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
T="$OUT/results.jsonl"; STAMP=${STAMP:-$(date -u +%Y%m%d-%H%M%S)}; M=${MACHINE:-h200}
steps=${*:-"tests sanitize bench bench-wide"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
# SMI=1: the SM clock, power and throttle reasons every 200 ms of the run, in $OUT/smi.csv
if [ "${SMI:-0}" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 200 > "$OUT/smi.csv" 2>/dev/null &
  trap 'kill %1 2>/dev/null' EXIT
fi
for s in $steps; do
  case $s in
    # -v names each result as it lands: a run cut by its time limit still says what failed
    tests) timeout ${TESTS_S:-560} python3 -m pytest -v -n 16 -rf --tb=short --durations=40 -p no:benchmark tests -p no:cacheprovider > "$OUT/tests.log" 2>&1
           echo "passed $(grep -c ' PASSED ' "$OUT/tests.log"), failed $(grep -c ' FAILED ' "$OUT/tests.log")"
           grep -E " FAILED | ERROR " "$OUT/tests.log" | sed 's/.* \(FAILED\|ERROR\) //' | sort -u | head -30; tail -1 "$OUT/tests.log" ;;
    # memcheck (SAN_TOOL) over the Triton cases, one process by default (twice, 8 sanitized xdist
    # workers printed nothing in 140-170 s on the H200); SAN_N workers; SAN_FILES and SAN_K
    # (-k) narrow it: -k matches more than test names (-k "tma and cuda" took narrow cases)
    # without PyTorch's caching allocator (its pools hide out-of-bounds reads from memcheck)
    sanitize) PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_S:-300} compute-sanitizer --tool ${SAN_TOOL:-memcheck} --target-processes all python3 -m pytest -q -n ${SAN_N:-0} -p no:cacheprovider ${SAN_FILES:-tests/test_correctness.py tests/test_launch.py tests/test_wide.py tests/test_gated.py} -k "${SAN_K:-triton and cuda}" > "$OUT/sanitizer.log" 2>&1
              grep -E "ERROR SUMMARY|Program hit|Invalid" "$OUT/sanitizer.log" | sort | uniq -c | head; tail -2 "$OUT/sanitizer.log" ;;
    split) timeout ${SPLIT_S:-240} python3 benchmarks/sweep_narrow.py --split --out "$T" --run "$M-sweep-split-$STAMP" 2>&1 | tee "$OUT/sweep-split.log" | grep -E "BEST|WRONG|Error| us  |cuBLAS|kernel by kernel" ;;
    persistent) timeout ${PERS_S:-240} python3 benchmarks/sweep_narrow.py --persistent ${PERS_ARGS:-} --out "$T" --run "$M-sweep-persistent-$STAMP" 2>&1 | tee "$OUT/sweep-persistent.log" | grep -v Warn | grep -E "^W|BEST" ;;
    padding) timeout ${PAD_S:-240} python3 benchmarks/sweep_narrow.py --padding ${PAD_ARGS:-} --out "$T" --run "$M-sweep-padding-$STAMP" 2>&1 | tee "$OUT/sweep-padding.log" | grep -v Warn | grep -E "^W|BEST|^ +[0-9.]+ us" ;;
    one-kernel) timeout ${ONE_S:-300} python3 benchmarks/sweep_narrow.py --one-kernel ${ONE_ARGS:-} --out "$T" --run "$M-sweep-one-kernel-$STAMP" 2>&1 | tee "$OUT/sweep-one-kernel.log" | grep -v Warn | grep -E "^W|BEST|WRONG|Error|^ +[0-9.]+ us" ;;
    stages) timeout ${STAGES_S:-240} python3 benchmarks/sweep_narrow.py --stages --out "$T" --run "$M-sweep-stages-$STAMP" 2>&1 | tee "$OUT/sweep-stages.log" | grep -E "BEST|WRONG|Error" ;;
    sweep) for w in 32 64 128; do for m in fwd bwd; do  # one process each: a fault ends one
             python3 benchmarks/sweep_narrow.py --width $w --mode $m 2>&1 | tee -a "$OUT/sweep.log" | grep -E "BEST|WRONG|Error"; done; done ;;
    profile) timeout 60 python3 -m fusedmlp_xpu.cli profile > "$OUT/profile.txt" 2>&1; cat "$OUT/profile.txt" | tail -14 ;;
    overhead) python3 benchmarks/overhead.py --out "$T" --run "$M-overhead-$STAMP" > "$OUT/overhead.txt" 2>&1
              python3 benchmarks/overhead.py --wide --profile --out "$T" --run "$M-overhead-wide-$STAMP" >> "$OUT/overhead.txt" 2>&1
              grep -E " us$|lean launches|hook|Error" "$OUT/overhead.txt" ;;
    # one JSON per config: a run cut by its time limit keeps the configs it finished
    bench) for c in ${BENCH_CONFIGS:-narrow-w64 paper-table1 narrow-w32 narrow-w128}; do
             timeout ${BENCH_S:-150} python3 -m fusedmlp_xpu.cli bench --suite narrow --config $c ${BENCH_ARGS:-} --out "$T" --run "$M-bench-$c-$STAMP" > "$OUT/bench-$c.txt" 2>/dev/null
             echo "$c rc=$?"; grep -E " 4194304 | 131072 " "$OUT/bench-$c.txt" | grep -v eager; done ;;
    # the whole narrow suite in one process, one JSON (written after every case, so a run
    # cut by its time limit keeps the cases it finished)
    suite) timeout ${SUITE_S:-560} python3 -m fusedmlp_xpu.cli bench --suite narrow ${BENCH_ARGS:-} --out "$T" --run "$M-bench-narrow-$STAMP" > "$OUT/bench-narrow.txt" 2> "$OUT/bench-narrow.log"
           echo "suite rc=$?"; grep -E " 4194304 | 131072 " "$OUT/bench-narrow.txt" | grep -v eager; grep -c '^\[' "$OUT/bench-narrow.log" ;;
    # device time per kernel of the wide train steps: ours, eager, bare (KERNELS_ARGS: --inference)
    kernels) timeout ${KERNELS_S:-150} python3 benchmarks/wide_kernels.py ${KERNELS_ARGS:-} --out "$T" --run "$M-wide-kernels-$STAMP" 2>&1 | grep -v -E "Warn|USDT" | tee "$OUT/wide-kernels.txt" | grep -E "^wide|^ +[0-9.]+ " | awk '/^wide/{n=0} {if (n++ < 12) print}' ;;
    bench-wide) timeout ${BENCH_S:-240} python3 -m fusedmlp_xpu.cli bench --suite wide --out "$T" --run "$M-bench-wide-$STAMP" > "$OUT/bench-wide.txt" 2>/dev/null; tail -20 "$OUT/bench-wide.txt" ;;
    # the second-order path: its GPU tests (one log, -v: a cut run says what failed), the
    # kernel's tunings (benchmarks/second_order.py) at 2^18 and 2^20 rows
    second-order) timeout ${SO_TESTS_S:-300} python3 -m pytest -v -n 8 -rf --tb=short -p no:cacheprovider tests/test_second_order.py tests/test_softplus_beta.py > "$OUT/so-tests.log" 2>&1
                  echo "passed $(grep -c ' PASSED ' "$OUT/so-tests.log"), failed $(grep -c ' FAILED ' "$OUT/so-tests.log")"; grep -E " FAILED | ERROR " "$OUT/so-tests.log" | head -10; tail -1 "$OUT/so-tests.log"
                  ;& # and on to the sweep
    so-sweep) for r in 262144 1048576; do timeout ${SO_S:-150} python3 benchmarks/second_order.py --rows $r --out "$T" --run "$M-so-kernel-$r-$STAMP" ${SO_ARGS:-} 2>&1 | grep -v Warn; done
              # the fastest tuning at 2^20 rows that passed its check, for the steps that follow
              best=$(python3 -c "import sys; from fusedmlp_xpu.bench import results as R; t=[r for r in R.documents(R.read(sys.argv[1]))[sys.argv[2]]['tunings'] if r['ok']]; print(min(t, key=lambda r: r['ms'])['spelling'] if t else '')" "$T" "$M-so-kernel-1048576-$STAMP" 2>/dev/null)
              [ -n "$best" ] && export FUSEDMLP_SECOND_ORDER_TUNING=$best; echo "second-order tuning for later steps: ${best:-the default}" ;;
    # narrow train steps recomputing (the Gluon backward) against saving z, and eager
    # (RC_ARGS: --nets, --rows, --dtype)
    recompute) timeout ${RC_S:-200} python3 benchmarks/narrow_recompute.py ${RC_ARGS:-} --out "$T" --run "$M-narrow-recompute-$STAMP" 2>&1 | grep -vi warn | tee "$OUT/narrow-recompute.txt" ;;
    # whole training steps, one JSON per config (STEPS_ARGS: --batch, --dtype, --steps)
    steps) for c in ${STEPS_CONFIGS:-sdf-eikonal loop-image}; do
             timeout ${STEPS_S:-280} python3 -m fusedmlp_xpu.cli bench --suite steps --configs $c ${STEPS_ARGS:-} --out "$T" --run "$M-steps-$c-$STAMP" > "$OUT/steps-$c.txt" 2>&1
             echo "$c rc=$?"; grep -vE "Warn|warn" "$OUT/steps-$c.txt" | tail -14; done ;;
    # the cuda backend: its tests, the shared forward cases and NaN pattern with it forced,
    # racecheck, the forward beside triton (CUDA_CONFIGS), and fusedmlp bench's host time
    # from Python with both forced (the measurement MEASURED_WINS in backends/cuda.py waits on)
    cuda) timeout ${CUDA_TESTS_S:-200} python3 -m pytest -v -n 8 -rf --tb=short -p no:cacheprovider tests/test_cuda_backend.py tests/test_nan.py tests/test_correctness.py -k "test_cuda_backend or inference_only or cuda-cuda" > "$OUT/cuda-tests.log" 2>&1
          echo "passed $(grep -c ' PASSED ' "$OUT/cuda-tests.log"), failed $(grep -c ' FAILED ' "$OUT/cuda-tests.log")"; grep -E "^FAILED" "$OUT/cuda-tests.log" | head -10
          PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool racecheck python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "forward_widths and relu" 2>&1 | grep -E "RACECHECK SUMMARY|passed|failed" | sort | uniq -c
          for c in ${CUDA_CONFIGS:-narrow-w64 narrow-w128}; do for dt in float16 bfloat16; do
            timeout 60 python3 benchmarks/cuda_forward.py --config $c --dtype $dt --tunings wg4 wg3 --out "$T" --run "$M-cuda-fwd-$c-$dt-$STAMP" 2>&1 | grep -E "^triton|^cuda"; done; done
          timeout 150 python3 -m fusedmlp_xpu.cli bench --suite narrow --config narrow-w64 --mode inference --backends triton cuda --passes 2 --out "$T" --run "$M-bench-cuda-narrow-w64-$STAMP" 2>/dev/null | grep -E "^narrow" | grep -v eager ;;
    # the cuda backend's backward (FUSEDMLP_CUDA_BACKWARD=1, off by default until this
    # passes): its GPU tests and the shared suite's cases with cuda forced (their training
    # cases train it where it can), then the backward and train step beside triton
    # (CUDA_BWD_CONFIGS; benchmarks/cuda_backward.py checks against float64 first)
    cuda-bwd) FUSEDMLP_CUDA_BACKWARD=1 timeout ${CUDA_BWD_TESTS_S:-240} python3 -m pytest -v -n 8 -rf --tb=short -p no:cacheprovider tests/test_cuda_backward.py tests/test_correctness.py -k "test_cuda_backward or cuda-cuda" > "$OUT/cuda-bwd-tests.log" 2>&1
          echo "passed $(grep -c ' PASSED ' "$OUT/cuda-bwd-tests.log"), failed $(grep -c ' FAILED ' "$OUT/cuda-bwd-tests.log")"; grep -E "^FAILED|Timeout" "$OUT/cuda-bwd-tests.log" | head -10; tail -1 "$OUT/cuda-bwd-tests.log"
          for c in ${CUDA_BWD_CONFIGS:-narrow-w64}; do for dt in float16 bfloat16; do
            timeout 120 python3 benchmarks/cuda_backward.py --config $c --dtype $dt --out "$T" --run "$M-cuda-bwd-$c-$dt-$STAMP" 2>&1 | grep -E "floor|^triton|^cuda|^host"; done; done ;;
    # its memcheck and racecheck on one case each (--report-api-errors no: on the H200 memcheck
    # counted 34 failed cuGetProcAddress lookups, driver API probes, as errors; the kernel
    # is compiled with -lineinfo, so hazards name source lines)
    cuda-bwd-san) for tool in memcheck racecheck; do
            FUSEDMLP_CUDA_BACKWARD=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool $tool --report-api-errors no python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backward.py -k "against_float64 and fp16 and widths0 and 1037" > "$OUT/cuda-bwd-$tool.log" 2>&1
            grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|passed|failed" "$OUT/cuda-bwd-$tool.log" | sort | uniq -c | head -6; done ;;
    # racecheck and synccheck over the backward's kernel shapes (2 chains, 3 chains, odd
    # widths loaded element by element), every hazard with both accesses' source lines
    # (NVRTC's -lineinfo); RACE_K narrows the cases. --num-cuda-barriers: the sanitizer
    # takes the count of mbarriers a kernel uses from nvcc's module data, which NVRTC's
    # inline-PTX barriers lack; without it synccheck overflowed its table of barriers
    # racecheck with one configuration a process, launched twice (cuda_bwd_probe.py --one:
    # several configurations in one process once gave reports that one alone did not)
    cuda-bwd-race-one) for i in ${RACE_CASES:-0 1 2 3 4}; do
            FUSEDMLP_CUDA_BACKWARD=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${RACE_S:-40} compute-sanitizer --tool racecheck --report-api-errors no --print-limit 50 python3 benchmarks/cuda_bwd_probe.py --one $i --launches 2 > "$OUT/race-one-$i.log" 2>&1
            echo "racecheck case $i rc=$?"; grep -E "SUMMARY|launched" "$OUT/race-one-$i.log"
            grep -E "Race reported|access at" "$OUT/race-one-$i.log" | sed 's/0x[0-9a-f]*/0x_/g' | sort | uniq -c | sort -rn | head -6; done ;;
    cuda-bwd-race) for tool in racecheck synccheck; do
            FUSEDMLP_CUDA_BACKWARD=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${RACE_S:-150} compute-sanitizer --tool $tool --report-api-errors no --num-cuda-barriers ${SAN_BARRIERS:-16} --print-limit 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backward.py -k "${RACE_K:-against_float64 and fp16 and 1037 and (widths0 or widths2 or widths6 or widths7)}" > "$OUT/cuda-bwd-$tool.log" 2>&1
            echo "$tool rc=$?"; grep -E "SUMMARY|passed|failed" "$OUT/cuda-bwd-$tool.log" | sort | uniq -c | head -6
            grep -E "(Race reported|access at|Barrier error|Warning|Error:)" "$OUT/cuda-bwd-$tool.log" | sed 's/0x[0-9a-f]*/0x_/g' | sort | uniq -c | sort -rn | head -24; done ;;
    # the wide sweep, one process a dtype (WIDE_DTYPES), both configs on released models' d/hidden
    # and the Llama prefill; no new shape past SWEEP_S - 45 s, so a cut run keeps what it timed
    wide-sweep) for dt in ${WIDE_DTYPES:-bfloat16 float16}; do
            timeout ${SWEEP_S:-280} python3 -m fusedmlp_xpu.bench.wide --sweep --llama --dtype $dt --stop-s $(( ${SWEEP_S:-280} - 45 )) --out "$T" --run "$M-wide-sweep-$dt-$STAMP" > "$OUT/wide-sweep-$dt.txt" 2>&1
            echo "wide sweep $dt rc=$?"
            python3 benchmarks/wide_routes.py "$T" "$M-wide-sweep-$dt-$STAMP" 2>&1 | tail -30; done ;;
    # the sdf-eikonal step at EIK_ROWS (fp16, EIK_STEPS steps, no compile) with the second
    # order's default form and with FUSEDMLP_SECOND_ORDER_TUNING=each of EIK_TUNINGS (e.g.
    # 16x4x2m), then host_step.py's cProfile of the fused step at the first of EIK_ROWS
    eikonal) for tu in default ${EIK_TUNINGS:-}; do
             b=""; for r in ${EIK_ROWS:-65536 262144 1048576}; do b="$b --batch $r"; done
             ( [ $tu != default ] && export FUSEDMLP_SECOND_ORDER_TUNING=$tu
               timeout ${EIK_S:-120} python3 -m fusedmlp_xpu.cli bench --suite steps --configs sdf-eikonal $b --dtype float16 --steps ${EIK_STEPS:-100} --compile none --out "$T" --run "$M-steps-sdf-eikonal-so-$tu-$STAMP" > "$OUT/eikonal-$tu.txt" 2>&1 )
             echo "eikonal $tu rc=$?"; grep -E "^sdf-eikonal .*(eager|fused) " "$OUT/eikonal-$tu.txt"
             python3 -c "import sys; from fusedmlp_xpu.bench import results as R
p = {}
for m in R.documents(R.read(sys.argv[1])).get(sys.argv[2], {}).get('records', []):
    if 'paired_python_ms' in m: p.setdefault(m['N'], {})[m['variant']] = m['paired_python_ms']
for n, v in sorted(p.items()):
    print(f'  {n} rows: fused {eager / fused:.3f}x eager from Python, paired' if (eager := v.get('eager')) and (fused := v.get('fused')) else f'  {n} rows: {v}')" "$T" "$M-steps-sdf-eikonal-so-$tu-$STAMP"; done
           r0=$(echo ${EIK_ROWS:-65536} | cut -d' ' -f1)
           timeout ${HOST_S:-60} python3 benchmarks/host_step.py --config sdf-eikonal --batch $r0 --steps 50 --out "$T" --run "$M-host-step-sdf-eikonal-$r0-$STAMP" > "$OUT/eikonal-host.txt" 2>&1
           echo "host step rc=$?"; grep -E "ms a step|Error" "$OUT/eikonal-host.txt" ;;
    # train steps from Python and from a CUDA graph, triton and cuda forced side by side
    cuda-bwd-bench) FUSEDMLP_CUDA_BACKWARD=1 timeout 200 python3 -m fusedmlp_xpu.cli bench --suite narrow --config narrow-w64 --mode train --backends triton cuda --out "$T" --run "$M-bench-cuda-train-narrow-w64-$STAMP" 2>/dev/null | grep -E "^narrow" | grep -v eager ;;
    # narrow-w128 train steps at 2^20 and 2^22 rows with the split backward's g stored whole
    # (FUSEDMLP_G_CHUNK_MB=0) and in chunks (the default): time and peak memory beside eager
    w128-mem) for mb in 0 256; do
             FUSEDMLP_G_CHUNK_MB=$mb timeout ${W128_S:-200} python3 -m fusedmlp_xpu.cli bench --suite narrow --config narrow-w128 --mode train --batch 1048576 --batch 4194304 --backends triton --compile none --out "$T" --run "$M-w128-train-gchunk$mb-$STAMP" > "$OUT/w128-gchunk$mb.txt" 2>&1
             echo "g chunk $mb MiB rc=$?"
             python3 -c "import sys; from fusedmlp_xpu.bench import results as R
for m in R.documents(R.read(sys.argv[1])).get(sys.argv[2], {}).get('records', []):
    print(m['backend'], m['N'], m['dtype'], m['timing'], m['pass'], round(m['median_ms'], 3), m.get('x_floor') and round(m['x_floor'], 2), m.get('peak_mem_MB') and round(m['peak_mem_MB']))" "$T" "$M-w128-train-gchunk$mb-$STAMP"; done ;;
    # the AOTInductor package of tests/test_deploy.py loaded from Python in children that
    # differ in one thing each, with a native backtrace of the first that dies (gdb)
    aoti) timeout ${AOTI_S:-300} python3 benchmarks/aoti_probe.py --out "$T" --run "$M-aoti-probe-$STAMP" > "$OUT/aoti-probe.txt" 2>&1
          echo "aoti probe rc=$?"; grep -v -E "Warning|warn|return cls" "$OUT/aoti-probe.txt" | tail -24 ;;
    *) echo "unknown step $s" ;;
  esac
done
