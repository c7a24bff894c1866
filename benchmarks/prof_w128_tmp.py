import sys, torch, triton
sys.path.insert(0, "benchmarks")
import sweep_narrow as sn
import fusedmlp_xpu as fm
from fusedmlp_xpu.backends import triton as tb
dev = torch.device("cuda")
for bias in (False, True):
    m = fm.FusedMLP(64, 64, 128, 4, bias=bias, device=dev, dtype=torch.float16, backend="triton")
    xs = [torch.randn(2**22, 64, device=dev, dtype=torch.float16, requires_grad=True) for _ in range(2)]
    gy = torch.randn(2**22, 64, device=dev, dtype=torch.float16)
    it = [0]
    def fn():
        it[0] += 1
        m(xs[it[0] % 2]).backward(gy)
    for own in (True, False):
        tb.OWN_PADDING = own
        sn._replan(m)
        ms = triton.testing.do_bench(fn, warmup=20, rep=200, return_mode="median")
        print(f"bias {bias} own {own}: {ms:.3f} ms", flush=True)
    for own in (True, False):
        tb.OWN_PADDING = own
        sn._replan(m)
        print(f"bias {bias} own {own}:", [(k[:22], v) for k, v in sn._profile_kernels(fn)], flush=True)
