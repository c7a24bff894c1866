export PYTHONPATH=. PYTHONUNBUFFERED=1
for args in "32 64 64 64 4 fwd 65536" "32 64 64 128 4 fwd 65536" "64 64 64 128 4 fwd 65536" "32 32 32 128 4 fwd 65536" "64 64 16 64 4 bwd 4096" "32 16 8 64 4 bwd 4096 b" "64 64 64 64 4 bwd 4096"; do
  python3 benchmarks/diag.py $args 2>&1 | tail -1
done
compute-sanitizer --tool memcheck --print-limit 5 python3 benchmarks/diag.py 32 64 64 128 4 fwd 1024 2>&1 | grep -vE "^=+ +(at|by) " | head -40
compute-sanitizer --tool memcheck --print-limit 5 python3 benchmarks/diag.py 32 16 8 64 4 bwd 1024 b 2>&1 | grep -vE "^=+ +(at|by) " | head -40
python3 -m pytest -x -q tests/test_correctness.py -k "triton and cuda and batch_shapes and grad" -p no:cacheprovider 2>&1 | grep -E "^E |Error|error" | head -30
