"""Diagnose one Triton narrow case in its own process: python diag.py W IN OUT BM WARPS MODE N"""
import importlib, sys
import torch
import fusedmlp_xpu as fm
tb = importlib.import_module("fusedmlp_xpu.backends.triton")
W, IN, OUT, BM, WARPS, MODE, N = sys.argv[1:8]
W, IN, OUT, BM, WARPS, N = map(int, (W, IN, OUT, BM, WARPS, N))
tb._tuning_nvidia = lambda spec, mode: (BM, WARPS)
tb._tuning_cached.cache_clear()
bias = len(sys.argv) > 8
m = fm.FusedMLP(IN, OUT, W, 4, bias=bias, device="cuda", dtype=torch.float16, backend="triton")
x = torch.randn(N, IN, device="cuda", dtype=torch.float16, requires_grad=MODE == "bwd")
try:
    if MODE == "fwd":
        with torch.no_grad():
            y = m(x)
    else:
        y = m(x)
        y.backward(torch.randn_like(y))
    torch.cuda.synchronize()
    ref = m.to_sequential()(x.detach().float() if False else x.detach())
    print("OK", sys.argv[1:], (y.float() - ref.float()).norm().item() / ref.float().norm().item())
except Exception as e:
    print("FAIL", sys.argv[1:], type(e).__name__, str(e)[:300])
