"""The cuda backend's forward kernel (kernels/cuda/fused_mlp_forward.cu) at a sweep of
tunings, beside the triton backend, in one process on one input. Writes JSON.

    PYTHONPATH=. python benchmarks/cuda_forward.py [--out T.jsonl]
        [--config narrow-w64] [--rows 4194304] [--dtype float16] [--tunings 1x16 2x8 4x8]

A tuning is MTxWARPS (the mma.sync kernel, fused_mlp_forward.cu: 16-row tiles a warp,
warps a CTA) or wgN (the wgmma kernel, fused_mlp_forward_sm90.cu, Hopper only: N
warpgroups a CTA), either with sS for S x/y buffers a warp (x copied S - 1 row blocks
ahead; default 2); cuda_build.ForwardConfig; the package's own choice is
cuda_build.forward_config. Each configuration is compiled by NVRTC for
the device, run once into a NaN-filled output and checked against the float64 reference
(error over the output's scale within the suite's tolerance of the dtype) before it is
timed; a wrong one is reported WRONG and not timed. Times: device events, back-to-back
calls, the median of --repeats runs after warm-up. Floor: x read and y written once at
the copy rate of the device (a device-to-device copy of the same bytes, timed here).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import torch

from fusedmlp_xpu import dispatch
from fusedmlp_xpu.bench import configs
from fusedmlp_xpu.backends import cuda as cuda_backend, cuda_build
from fusedmlp_xpu.bench.results import RunWriter
from fusedmlp_xpu.bench.tools import add_output_arguments, calls_ms, environment
from fusedmlp_xpu.spec import MLPSpec

SCHEMA = "fusedmlp-bench-cuda-forward/1"
DEFAULT_TUNINGS = ("1x16", "2x8", "wg2", "wg3", "wg4")
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def parse_tuning(text: str) -> tuple[int, int, str, int]:
    """(16-row tiles a warp, warps a CTA, kernel family, x/y buffers a warp) of a
    --tunings word: MTxWARPS or wgN, with sS for S buffers (default 2)."""
    t = text.lower()
    t, _, s = t.partition("s")
    try:
        stages = int(s) if s else 2
        if t.startswith("wg"):
            mt, warps, family = 1, 4 * int(t[2:]), "wgmma"
        else:
            (mt, warps), family = (int(v) for v in t.split("x")), "mma"
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--tunings: {text!r} is not MTxWARPS or wgN (optionally sS)") from None
    if not (1 <= mt <= 8 and 1 <= warps <= 32 and 2 <= stages <= 8):
        raise argparse.ArgumentTypeError(
            f"--tunings: {text!r} out of range (MT 1-8, WARPS 1-32, S 2-8)")
    return mt, warps, family, stages


def median_ms(device, fn, repeats: int, target_ms: float = 20.0) -> float:
    fn(0)
    torch.cuda.synchronize(device)
    one = calls_ms(device, fn, 3)
    n = max(3, min(200, int(target_ms / max(one, 1e-3))))
    calls_ms(device, fn, n)  # warm-up at the timed length
    return statistics.median(calls_ms(device, fn, n, lead=True) for _ in range(repeats))


def copy_ms(device, nbytes: int, repeats: int) -> float:
    """ms of a device-to-device copy that reads and writes nbytes in all."""
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float16)
    dst = torch.empty_like(src)
    return median_ms(device, lambda i: dst.copy_(src), repeats)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_arguments(p)
    p.add_argument("--config", default="narrow-w64", choices=sorted(configs.CONFIGS))
    p.add_argument("--rows", type=int, default=2**22)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--tunings", nargs="+", type=parse_tuning, default=None)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    writer = RunWriter(args.out, args.run, "benchmarks/cuda_forward.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "cuda-forward")
    if not torch.cuda.is_available():
        p.error("needs an NVIDIA GPU")
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    cfg = configs.get(args.config)
    spec_widths = ((cfg.in_features,) + (cfg.hidden_features,) * cfg.hidden_layers
                   + (cfg.out_features,))
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(args.rows, cfg.in_features, device=device, dtype=dtype, generator=gen)
    weights, biases = [], []
    for k, n in zip(spec_widths[:-1], spec_widths[1:]):
        weights.append((torch.randn(n, k, device=device, generator=gen) / k ** 0.5).to(dtype))
        biases.append((torch.randn(n, device=device, generator=gen) * 0.1).to(dtype)
                      if cfg.bias else None)
    biases = biases if cfg.bias else None
    spec = MLPSpec(spec_widths, cfg.activation, cfg.output_activation, cfg.bias, dtype)
    ref, _ = dispatch.REGISTRY["reference"].forward(
        x.double(), [w.double() for w in weights],
        None if biases is None else [b.double() for b in biases],
        dataclasses.replace(spec, dtype=torch.float64), False)
    scale = ref.abs().max().item()

    def error(y) -> float:
        return ((y.double() - ref).abs().max() / scale).item()

    result = dict(schema=SCHEMA, env=environment(device), config=args.config, rows=args.rows,
                  dtype=args.dtype, widths=list(spec_widths), tunings=[])
    nbytes = x.numel() * x.element_size() * (1 + cfg.out_features / cfg.in_features)
    result["copy_ms"] = copy_ms(device, int(nbytes), args.repeats)
    print(f"{args.config} {args.rows} rows {args.dtype}: copy of the same bytes "
          f"{result['copy_ms']:.4f} ms")

    triton = dispatch.REGISTRY["triton"]
    y = torch.full((args.rows, cfg.out_features), float("nan"), device=device, dtype=dtype)
    y_t, _ = triton.forward(x, weights, biases, spec, False)
    rec = dict(backend="triton", error=error(y_t))
    rec["ok"] = rec["error"] <= TOLERANCE[dtype]
    if rec["ok"]:
        rec["ms"] = median_ms(device, lambda i: triton.forward(x, weights, biases, spec, False),
                              args.repeats)
    result["triton"] = rec
    print(f"triton: error {rec['error']:.2e}  {rec.get('ms', float('nan')):.4f} ms")
    writer.write(result)

    base, why = cuda_build.forward_config(spec, cuda_backend.device_info(device)[2])
    if base is None:
        print(f"cuda: not supported: {why}")
        result["cuda_unsupported"] = why
        writer.write(result, final=True)
        return 0
    result["package_tuning"] = f"{base.family} {base.mt}x{base.warps}"
    cap = torch.cuda.get_device_capability(device)
    arch = cuda_build.arch_for(cap)
    for mt, warps, family, stages in args.tunings or [parse_tuning(t) for t in DEFAULT_TUNINGS]:
        c = dataclasses.replace(base, mt=mt, warps=warps, family=family, stages=stages)
        name = (f"wg{warps // 4}" if family == "wgmma" else f"{mt}x{warps}") + f"s{stages}"
        rec = dict(tuning=name, family=family, stages=stages, smem_kb=c.smem_bytes() / 1024)
        try:
            built = cuda_build.compile_forward(c, arch)
            s = cuda_build.ptxas_stats(built.log)
            rec.update(registers=s["registers"], spill=s["spill_stores"] + s["spill_loads"])
            kernel = cuda_backend.forward_kernel(device, c)
        except Exception as e:  # noqa: BLE001 -- recorded: this tuning cannot run
            rec["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
            result["tunings"].append(rec)
            print(f"cuda {rec['tuning']}: FAILED {rec['failed']}")
            writer.write(result)
            continue
        y.fill_(float("nan"))
        params = cuda_backend.pack_params(x, y, weights, biases)
        grid = cuda_backend.grid_size(args.rows, c, kernel.max_ctas)

        def run(i):
            cuda_backend.launch(kernel, grid, params, device)
        run(0)
        torch.cuda.synchronize(device)
        rec["error"] = error(y)
        rec["ok"] = rec["error"] <= TOLERANCE[dtype]
        if rec["ok"]:
            rec["ms"] = median_ms(device, run, args.repeats)
            rec["floor_multiple"] = rec["ms"] / result["copy_ms"]
        result["tunings"].append(rec)
        print(f"cuda {rec['tuning']:>7}: {rec['registers']} regs, spill {rec['spill']} B, "
              f"{rec['smem_kb']:.0f} KB smem, error {rec['error']:.2e}  "
              f"{'%.4f ms' % rec['ms'] if rec['ok'] else 'WRONG'}")
        writer.write(result)  # as it goes: a run cut short keeps its tunings
    writer.write(result, final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
