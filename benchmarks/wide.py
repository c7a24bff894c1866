"""Wide-MLP benchmark (wide-gelu, wide-swiglu): see fusedmlp_xpu/bench_wide.py.

On the H200:  python benchmarks/wide.py --out benchmarks/h200-wide.json
CPU smoke:    TRITON_INTERPRET=1 python benchmarks/wide.py --tiny --out /tmp/wide-tiny.json
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fusedmlp_xpu.bench_wide import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
