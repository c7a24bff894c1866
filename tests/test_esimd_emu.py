"""The ESIMD emulation (kernels/sycl/esimd_emu.hpp) against Intel's definitions.

Everything expected here is derived from the ESIMD documentation and headers (the
intel-sycl-rt wheel's esimd/*.hpp, xmx/dpas.hpp), never from what the kernels need:
- ``xmx::dpas``: A row-major RepeatCount x 16, B VNNI-packed (element (k, n) at
  (k/2)*32 + n*2 + k%2), C and the result row-major RepeatCount x 16, fp32 accumulation;
- conversions round to nearest even (checked bit for bit against torch);
- masked-off lanes: loads leave them undefined (poison here), stores leave memory alone.

The host tests build tests/esimd/host_driver.cpp with g++ against the wheel's SYCL
headers; the device test compiles tests/esimd/device_kernel.cpp with the runtime's kernel
compiler for opencl:cpu and runs it.
"""
from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import BACKENDS

sycl = importlib.import_module("fusedmlp_xpu.backends.sycl")

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels" / "sycl"
HERE = Path(__file__).resolve().parent / "esimd"
F16 = {"f16": torch.float16, "bf16": torch.bfloat16}

needs_sycl_cpu = pytest.mark.skipif(
    ("sycl", torch.device("cpu")) not in BACKENDS,
    reason="the sycl backend cannot run on opencl:cpu here (see `fusedmlp info`)")


# --- helpers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    """host_driver.cpp built once for this module."""
    try:
        tc = sycl._toolchain()
    except sycl.SyclToolchainError as e:
        pytest.skip(str(e))
    exe = tmp_path_factory.mktemp("esimd_emu") / "host_driver"
    cmd = [tc["cxx"], "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{KERNELS}",
           f"-I{tc['include']}", str(HERE / "host_driver.cpp"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr[-4000:]}"
    return exe


def run(driver: Path, d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(driver), args[0], str(d), *args[1:]], capture_output=True,
                          text=True, timeout=60)


def put(d: Path, name: str, a) -> None:
    (d / name).write_bytes(np.ascontiguousarray(a).tobytes())


def get(d: Path, name: str, dtype) -> np.ndarray:
    return np.frombuffer((d / name).read_bytes(), dtype=dtype)


def bits(t: torch.Tensor) -> np.ndarray:
    """The raw 16-bit patterns of a half/bfloat16 tensor."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def from_bits(b: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.array(b, dtype=np.uint16).view(np.int16)).view(dtype)


def vnni(b: np.ndarray) -> np.ndarray:
    """B (K=16 x N=16) packed as dpas reads it: (k, n) at (k // 2) * 32 + n * 2 + k % 2."""
    packed = np.empty(256, dtype=b.dtype)
    for k in range(16):
        for n in range(16):
            packed[(k // 2) * 32 + n * 2 + k % 2] = b[k, n]
    return packed


def dpas_model(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The documented accumulation model: from C, add the (exact) fp32 products one k at a
    time in order, each sum rounded to fp32."""
    acc = c.astype(np.float32).copy()
    for k in range(a.shape[1]):
        acc = acc + np.outer(a[:, k], b[k]).astype(np.float32)
    return acc


def dpas_bound(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|fp32 result - exact| <= 16 roundings of partial sums bounded by |C| + sum |a b|."""
    return 16 * 2.0 ** -24 * (np.abs(c) + np.abs(a) @ np.abs(b))


def random_16bit(shape, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g).mul_(3.0).to(dtype)


# --- dpas ---------------------------------------------------------------------------------
@pytest.mark.parametrize("with_c", [True, False], ids=["C", "noC"])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("repeat", range(1, 9))
def test_dpas_against_float64(driver, tmp_path, dt, repeat, with_c):
    g = torch.Generator().manual_seed(1000 * repeat + with_c)
    a = random_16bit((repeat, 16), F16[dt], g)
    b = random_16bit((16, 16), F16[dt], g)
    c = torch.randn(repeat, 16, generator=g).numpy() * 10 if with_c else np.zeros((repeat, 16))
    put(tmp_path, "a.bin", bits(a))
    put(tmp_path, "b.bin", vnni(bits(b)))
    put(tmp_path, "c.bin", c.astype(np.float32))
    res = run(driver, tmp_path, "dpas", dt, str(repeat), str(int(with_c)))
    assert res.returncode == 0, res.stderr
    d = get(tmp_path, "d.bin", np.float32).reshape(repeat, 16)

    a64, b64 = a.double().numpy(), b.double().numpy()
    ref = c.astype(np.float32).astype(np.float64) + a64 @ b64
    err = np.abs(d - ref)
    assert np.all(err <= dpas_bound(c, a64, b64)), f"max error {err.max()} at {err.argmax()}"
    np.testing.assert_array_equal(d, dpas_model(c.astype(np.float32), a.float().numpy(),
                                                b.float().numpy()))


def test_dpas_layout_one_hot(driver, tmp_path):
    """A single A[m, k] = 1 and B[k, n] = index: the result row m is row k of B, so any
    mix-up of rows, columns or the VNNI pairing shows as a wrong value at a known place."""
    b = torch.arange(256, dtype=torch.float16).reshape(16, 16)  # exact in fp16
    put(tmp_path, "b.bin", vnni(bits(b)))
    for m, k in [(0, 0), (0, 1), (2, 7), (7, 14), (7, 15)]:
        a = torch.zeros(8, 16, dtype=torch.float16)
        a[m, k] = 1
        put(tmp_path, "a.bin", bits(a))
        assert run(driver, tmp_path, "dpas", "f16", "8", "0").returncode == 0
        d = get(tmp_path, "d.bin", np.float32).reshape(8, 16)
        want = np.zeros((8, 16), np.float32)
        want[m] = b[k].float().numpy()
        np.testing.assert_array_equal(d, want, err_msg=f"A[{m}, {k}] = 1")


# --- conversions and 16-bit arithmetic ------------------------------------------------------
def conversion_inputs(g: torch.Generator) -> np.ndarray:
    """Floats that test rounding: ties (to even, both ways), the half subnormal range and
    its ties, the top of the half range, infinities, NaN, signed zeros, random bits."""
    u = 2.0 ** -24  # the half subnormal step
    special = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -11 + 2 ** -20, -(1 + 2 ** -11),
               0.5 * u, 1.5 * u, 2.5 * u, 0.5 * u * 1.0001, 1023.5 * u, 2 ** -14 - 0.5 * u,
               2 ** -14, 65504, 65519.99, 65520, -65520, 1e10, np.inf, -np.inf, np.nan,
               0.0, -0.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4e38, 1e-40, -1e-42]
    r = torch.randint(0, 2 ** 32, (480,), generator=g, dtype=torch.int64).numpy().astype(np.uint32)
    # exponents 2^-30 .. 2^17 around the half range, a sixth of them exact bf16 ties
    r = (r & np.uint32(0x807FFFFF)) | ((np.uint32(97) + r % np.uint32(48)) << np.uint32(23))
    r[::6] = (r[::6] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    f = np.concatenate([np.array(special, np.float32), r.view(np.float32)])
    return np.concatenate([f, np.zeros(-len(f) % 16, np.float32)])


def same_bits(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    w = bits(want)
    nan = want.isnan().numpy()
    got_nan = from_bits(got, want.dtype).isnan().numpy()
    np.testing.assert_array_equal(got_nan, nan, err_msg=f"{what}: NaN lanes")
    bad = np.nonzero((got != w) & ~nan)[0]
    assert bad.size == 0, (f"{what}: {bad.size} lanes differ, first at {bad[0]}: got "
                           f"{got[bad[0]]:#06x}, want {w[bad[0]]:#06x}")


def test_conversions_and_16bit_arithmetic_round_to_nearest_even(driver, tmp_path):
    g = torch.Generator().manual_seed(7)
    f = conversion_inputs(g)
    h = torch.cat([torch.randn(224, generator=g) * 100, torch.randn(32, generator=g) * 1e-5]).half()
    hg = torch.cat([torch.randn(224, generator=g), torch.randn(32, generator=g) * 1e-3]).half()
    hg[::17] = 0  # division by zero -> inf / NaN
    p = (torch.randn(256, generator=g) * 100).bfloat16()
    q = torch.randn(256, generator=g).bfloat16()
    for name, v in [("h.bin", h), ("g.bin", hg), ("p.bin", p), ("q.bin", q)]:
        put(tmp_path, name, bits(v))
    put(tmp_path, "f.bin", f)
    res = run(driver, tmp_path, "convert")
    assert res.returncode == 0, res.stderr

    ft = torch.from_numpy(f)
    same_bits(get(tmp_path, "to_half.bin", np.uint16), ft.half(), "float -> half")
    same_bits(get(tmp_path, "to_bf16.bin", np.uint16), ft.bfloat16(), "float -> bfloat16")
    np.testing.assert_array_equal(get(tmp_path, "half_to_f32.bin", np.float32), h.float().numpy())
    np.testing.assert_array_equal(get(tmp_path, "bf16_to_f32.bin", np.float32), p.float().numpy())
    # ESIMD: simd<half> op simd<half> is simd<half>, one rounding of the exact result;
    # torch's CPU half/bfloat16 ops compute in fp32 and round once: the same bits
    for (x, y, tag) in [(h, hg, "half"), (p, q, "bf16")]:
        for op, fn in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
                       ("div", torch.div)]:
            want = fn(x.float(), y.float()).to(x.dtype)
            same_bits(get(tmp_path, f"{tag}_{op}.bin", np.uint16), want, f"{tag} {op}")


# --- regions, masks -----------------------------------------------------------------------
def test_select_views_and_masks(driver, tmp_path):
    res = run(driver, tmp_path, "views")
    assert res.returncode == 0, res.stderr
    s = np.arange(32, dtype=np.float32)
    s[2:26:3] += 100          # select<8, 3>(2) += 100
    s[[5, 11]] = -1           # .select<2, 2>(1) of that view = -1
    s[28:32] *= 2             # select<4, 1>(28) *= 2
    s[0] = 7.5
    s[31] += 0.25
    np.testing.assert_array_equal(get(tmp_path, "views_s.bin", np.float32), s)
    np.testing.assert_array_equal(get(tmp_path, "views_firsts.bin", np.float32), s[1:32:8])
    np.testing.assert_array_equal(get(tmp_path, "views_bits.bin", np.uint32), s.view(np.uint32))
    np.testing.assert_array_equal(get(tmp_path, "views_halves.bin", np.uint16), s.view(np.uint16))
    np.testing.assert_array_equal(get(tmp_path, "views_rvalue.bin", np.float32), s[0:32:4])

    a = np.arange(8, dtype=np.float32)
    m = (a > 2.5).astype(np.uint16)
    np.testing.assert_array_equal(get(tmp_path, "mask_m.bin", np.uint16), m)
    np.testing.assert_array_equal(get(tmp_path, "mask_not.bin", np.uint16), 1 - m)
    # ESIMD's ~ on a mask is the bitwise not of its 16-bit lanes: no lane becomes 0
    np.testing.assert_array_equal(get(tmp_path, "mask_tilde.bin", np.uint16), ~m)
    np.testing.assert_array_equal(get(tmp_path, "mask_and.bin", np.uint16), m & (a < 5))
    np.testing.assert_array_equal(get(tmp_path, "merge.bin", np.float32), np.where(m, a, -1))
    np.testing.assert_array_equal(get(tmp_path, "neg.bin", np.float32), -a)
    np.testing.assert_array_equal(get(tmp_path, "compound.bin", np.float32), (3 * (a + 1) - a) / 2)
    ec = np.ones(8, np.float16)
    ec[0] = 1 + 2.0 ** -10
    np.testing.assert_array_equal(get(tmp_path, "elem_compound.bin", np.float16), ec)


# --- global memory at the edges -------------------------------------------------------------
def test_gather_scatter_block_edges(driver, tmp_path):
    g = np.random.default_rng(3)
    n = 37  # not a multiple of 16
    src = g.standard_normal(n).astype(np.float32)
    idx = np.array([36, 0, 5, 35, 1, 2, 3, 4, 10, 11, 20, 30, 31, 32, 33, 34])  # 36: the last
    msk = np.array([1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 7], np.uint16)
    dst = np.full(40, -5.0, np.float32)
    vals = g.standard_normal(16).astype(np.float32)
    hsrc = torch.randn(48).half()
    put(tmp_path, "src.bin", src)
    put(tmp_path, "off.bin", (idx * 4).astype(np.uint32))
    put(tmp_path, "msk.bin", msk)
    put(tmp_path, "dst.bin", dst)
    put(tmp_path, "vals.bin", vals)
    put(tmp_path, "hsrc.bin", bits(hsrc))
    res = run(driver, tmp_path, "memory")
    assert res.returncode == 0, res.stderr

    live = msk != 0
    gathered = get(tmp_path, "gather.bin", np.float32)
    np.testing.assert_array_equal(gathered[live], src[idx[live]])
    assert np.isnan(gathered[~live]).all(), "masked-off gather lanes must read as poison"
    np.testing.assert_array_equal(get(tmp_path, "gather_all.bin", np.float32), src[idx])
    np.testing.assert_array_equal(get(tmp_path, "gather_view.bin", np.float32), gathered)

    want = dst.copy()
    want[idx[live]] = vals[live]
    np.testing.assert_array_equal(get(tmp_path, "scatter.bin", np.float32), want)

    tail = get(tmp_path, "tail.bin", np.float32)
    np.testing.assert_array_equal(tail[:n], src)
    assert np.isnan(tail[n:]).all()
    copy = get(tmp_path, "tail_copy.bin", np.float32)
    np.testing.assert_array_equal(copy[:n], src)
    np.testing.assert_array_equal(copy[n:], -7.0)  # masked lanes wrote nothing

    last = np.full(n, -3.0, np.float32)
    last[n - 16:] = src[n - 16:]
    last[1:9] = src[1:9]
    np.testing.assert_array_equal(get(tmp_path, "last.bin", np.float32), last)

    hg = from_bits(get(tmp_path, "hgather.bin", np.uint16), torch.float16)
    hidx = np.arange(16) * 3
    np.testing.assert_array_equal(hg.numpy()[live], hsrc.numpy()[hidx[live]])
    assert hg[torch.from_numpy(~live)].isnan().all()


def test_scatter_into_distinct_addresses(driver, tmp_path):
    """Scatter where every live lane has its own address, the last element included."""
    g = np.random.default_rng(4)
    idx = g.permutation(40)[:16]
    idx[3] = 39
    msk = (g.random(16) < 0.7).astype(np.uint16)
    msk[3] = 1
    vals = g.standard_normal(16).astype(np.float32)
    put(tmp_path, "src.bin", g.standard_normal(40).astype(np.float32))
    put(tmp_path, "off.bin", (idx * 4).astype(np.uint32))
    put(tmp_path, "msk.bin", msk)
    put(tmp_path, "dst.bin", np.full(40, -5.0, np.float32))
    put(tmp_path, "vals.bin", vals)
    put(tmp_path, "hsrc.bin", bits(torch.randn(48).half()))
    assert run(driver, tmp_path, "memory").returncode == 0
    want = np.full(40, -5.0, np.float32)
    want[idx[msk != 0]] = vals[msk != 0]
    np.testing.assert_array_equal(get(tmp_path, "scatter.bin", np.float32), want)


# --- SLM, math --------------------------------------------------------------------------------
def test_slm_round_trip_and_unwritten_poison(driver, tmp_path):
    res = run(driver, tmp_path, "slm")
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(get(tmp_path, "slm_a.bin", np.float32),
                                  1 + 0.5 * np.arange(32, dtype=np.float32))
    np.testing.assert_array_equal(get(tmp_path, "slm_h.bin", np.uint16),
                                  bits((0.0 + torch.arange(64.0) * -0.25).half()))  # iota: base + i * step
    np.testing.assert_array_equal(get(tmp_path, "slm_unwritten.bin", np.uint32), 0xFFFFFFFF)


def test_math(driver, tmp_path):
    g = np.random.default_rng(5)
    x = (g.standard_normal(64) * 4).astype(np.float32)
    y = (g.standard_normal(64) * 4).astype(np.float32)
    x[[1, 5, 9]] = np.nan
    y[[2, 5, 10]] = np.nan
    x[20:30] = np.abs(x[20:30])
    put(tmp_path, "x.bin", x)
    put(tmp_path, "y.bin", y)
    res = run(driver, tmp_path, "math")
    assert res.returncode == 0, res.stderr
    out = {k: get(tmp_path, f"{k}.bin", np.float32)
           for k in ["max", "min", "exp", "log", "sqrt", "inv", "abs", "hmax"]}
    # max/min are IEEE maxNum/minNum: a NaN operand gives the other; NaN only from two
    np.testing.assert_array_equal(out["max"], np.fmax(x, y))
    np.testing.assert_array_equal(out["min"], np.fmin(x, y))
    hx, hy = (torch.from_numpy(v).half().float().numpy() for v in (x, y))
    np.testing.assert_array_equal(out["hmax"], np.fmax(hx, hy))
    np.testing.assert_array_equal(out["abs"], np.abs(x))
    np.testing.assert_array_equal(out["inv"], np.float32(1) / x)
    with np.errstate(invalid="ignore", divide="ignore"):
        np.testing.assert_array_equal(out["sqrt"], np.sqrt(x))
        x64 = x.astype(np.float64)
        # natural base, through exp2(x * log2e) and log2(x) * ln2 as math.hpp has them: the
        # float constants and the rounded product cost about |x| * 1e-7 relative
        tol = 2.0 ** -22 + np.abs(x64) * 1e-7
        ok = np.isnan(x) | (np.abs(out["exp"] - np.exp(x64)) <= tol * np.exp(x64))
        assert ok.all(), (x[~ok], out["exp"][~ok])
        lg = np.log(x64)
        ok = np.isnan(lg) & np.isnan(out["log"]) | (np.abs(out["log"] - lg) <= 2.0 ** -22 * (1 + np.abs(lg)))
        assert ok.all(), (x[~ok], out["log"][~ok])
    # half: exp rounds x * log2e to half before exp2, log rounds log2(x) to half before
    # the product (math.hpp with T = half): up to ~0.2% from the float formula at |x| ~ 10,
    # more than the half ulp (2^-11 relative) the results are compared with here
    xh = torch.from_numpy(x).half().numpy()
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = (xh.astype(np.float32) * np.float32(1.442695)).astype(np.float16)
        want_exp = np.exp2(t.astype(np.float64))
        l2 = np.log2(xh.astype(np.float64)).astype(np.float16)
        want_log = (l2.astype(np.float32) * np.float32(0.69314718)).astype(np.float64)
    for name, want in [("half_exp", want_exp), ("half_log", want_log)]:
        got = from_bits(get(tmp_path, f"{name}.bin", np.uint16), torch.float16).double().numpy()
        np.testing.assert_allclose(got, want, rtol=2.0 ** -11, atol=2.0 ** -24, equal_nan=True,
                                   err_msg=name)
    i16 = np.arange(32, dtype=np.float16)
    np.testing.assert_array_equal(  # (i * step) rounded to half, then + base rounded
        from_bits(get(tmp_path, "half_iota.bin", np.uint16), torch.float16).numpy(),
        np.float16(1.0) + i16 * np.float16(0.1))
    np.testing.assert_array_equal(get(tmp_path, "int_abs.bin", np.int32), np.abs(np.arange(-4, 4)))
    np.testing.assert_array_equal(get(tmp_path, "int_max.bin", np.int32),
                                  np.maximum(np.arange(-4, 4), 0))


# --- 2-D block messages ------------------------------------------------------------------
def _window(a: np.ndarray, c0: int, r0: int, rows: int, cols: int, w: int, h: int):
    """a's rows x cols block at column c0, row r0, zero outside the w x h surface."""
    out = np.zeros((rows, cols), a.dtype)
    for i in range(rows):
        for j in range(cols):
            if 0 <= c0 + j < w and 0 <= r0 + i < h:
                out[i, j] = a[r0 + i, c0 + j]
    return out


def block_2d_model(surf: np.ndarray, w: int, h: int, x: int, y: int, bw: int, bh: int,
                   nb: int = 1) -> np.ndarray:
    """lsc_load_2d as experimental/esimd/memory.hpp documents it for 16-bit elements: nb
    blocks of bw x bh at (x, y), one after another, each row-major with rows padded to a
    power of two and the row count rounded up to 2 (4 / sizeof(T)); elements outside the
    w x h surface read 0 (so do the padding lanes here)."""
    pw, ph = 1 << (bw - 1).bit_length(), bh + bh % 2
    out = np.zeros((nb, ph, pw), np.uint16)
    for b in range(nb):
        for i in range(bh):
            for j in range(bw):
                c, r = x + b * bw + j, y + i
                if 0 <= c < w and 0 <= r < h:
                    out[b, i, j] = surf[r, c]
    return out.reshape(-1)


@pytest.mark.parametrize("x,y", [(0, 0), (8, 3), (40, 10), (-4, -2), (24, 12)])
def test_block_2d_loads_and_stores_clip_at_the_surface(driver, tmp_path, x, y):
    """Blocks inside, across every edge and partly before the origin: in-surface elements
    as the model places them, the rest 0 on loads and untouched on stores; the pitch
    (48 words) wider than the surface (40)."""
    w, h, p = 40, 14, 48
    g = np.random.default_rng(abs(x * 100 + y) + 7)
    surf = g.integers(1, 2 ** 16, size=(h, p), dtype=np.uint16)
    put(tmp_path, "surf.bin", surf)
    res = run(driver, tmp_path, "block2d", str(w), str(h), str(p), str(x), str(y))
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(get(tmp_path, "ld_16x8x2.bin", np.uint16),
                                  block_2d_model(surf, w, h, x, y, 16, 8, 2))
    np.testing.assert_array_equal(get(tmp_path, "ld_16x1.bin", np.uint16),
                                  block_2d_model(surf, w, h, x, y, 16, 1))
    np.testing.assert_array_equal(get(tmp_path, "ld_8x32.bin", np.uint16),
                                  block_2d_model(surf, w, h, x, y, 8, 32))
    # dwords: the same surface as 20 x 14 of u32 (little-endian word pairs)
    s32 = surf.view(np.uint32)
    want32 = _window(s32, x // 2, y, 4, 16, w // 2, h)
    np.testing.assert_array_equal(get(tmp_path, "ld32_16x4.bin", np.uint32), want32.reshape(-1))
    # transposed (32-bit, 8 x 32): the block's columns as rows; VNNI-transformed (16-bit,
    # 2 blocks of 16 x 32): row pairs interleaved, (i // 2, j, i % 2) in each block, as
    # intel/llvm's test-e2e/ESIMD/lsc/Inputs/lsc_load_prefetch_2d.hpp checks them
    blk32 = _window(s32, x // 2, y, 32, 8, w // 2, h)
    np.testing.assert_array_equal(get(tmp_path, "ld32t_8x32.bin", np.uint32), blk32.T.reshape(-1))
    blocks = block_2d_model(surf, w, h, x, y, 16, 32, 2).reshape(2, 16, 2, 16)  # [b, i/2, i%2, j]
    np.testing.assert_array_equal(get(tmp_path, "ldv_16x32x2.bin", np.uint16),
                                  blocks.transpose(0, 1, 3, 2).reshape(-1))
    want = surf.copy()
    vals = (0x8000 + np.arange(128)).astype(np.uint16).reshape(8, 16)
    for i in range(8):
        for j in range(16):
            c, r = x + j, y + i
            if 0 <= c < w and 0 <= r < h:
                want[r, c] = vals[i, j]
    np.testing.assert_array_equal(get(tmp_path, "st_16x8.bin", np.uint16).reshape(h, p), want)


@pytest.mark.parametrize("what,message", [
    ("surface_2d", "lsc_load_2d: surface breaks the 2-D block message limits"),
    ("block_load", "block_load: address not 4-byte aligned"),
    ("slm_misaligned", "slm_block_store: offset not 16-byte aligned"),
    ("slm_past_init", "past slm_init's size"),
    ("select_offset", "select: offset + region past the end"),
])
def test_misuse_stops_the_host_build(driver, tmp_path, what, message):
    """What ESIMD leaves undefined (a block message off its default alignment, SLM past
    slm_init, a region past the simd) stops the host build, naming the call."""
    res = run(driver, tmp_path, "misuse", what)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


# --- one source, real ESIMD or the emulation ---------------------------------------------------
def include_files() -> dict[str, bytes]:
    return {n: (KERNELS / n).read_bytes() for n in ("esimd_emu.hpp", "esimd_emu_simd.hpp",
                                                   "esimd_select.hpp")}


@needs_sycl_cpu
@pytest.mark.parametrize("emulate", [False, True], ids=["esimd", "emulation"])
def test_api_usage_compiles_against_esimd_and_the_emulation(emulate):
    """tests/esimd/api_usage.cpp (every emulated call) through the runtime's kernel compiler:
    with Intel's ESIMD headers (built, not run: the CPU has no ESIMD) and with the
    emulation. A build error raises, with the compiler's log."""
    sycl.shim().build(sycl.cpu_queue().addressof_ref(), (HERE / "api_usage.cpp").read_bytes(),
                      [], includes=include_files(),
                      options=["-DFMLP_ESIMD_EMULATE"] if emulate else [])


def test_api_usage_compiles_as_host_cpp(driver):
    tc = sycl._toolchain()
    cmd = [tc["cxx"], "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
           "-DFMLP_ESIMD_EMULATE", "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING", f"-I{KERNELS}",
           f"-I{tc['include']}", str(HERE / "api_usage.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]


# --- the same header on a SYCL device -----------------------------------------------------------
@needs_sycl_cpu
@pytest.mark.parametrize("threads", [16, 64])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_device_slm_barrier_and_dpas(dt, threads):
    """tests/esimd/device_kernel.cpp on opencl:cpu: 2 work-groups of ESIMD threads pass
    rows to their neighbour through SLM across a barrier, read SLM nobody wrote, and each
    compute an 8 x 16 dpas tile. The OpenCL CPU device runs 16 work-items in the lanes of
    one vector, in step, so only the 64-thread work-group shows a missing barrier."""
    import dpctl.memory

    q = sycl.cpu_queue()
    bundle = _device_bundle()
    groups = 2
    t = groups * threads
    g = torch.Generator().manual_seed(11)
    x = torch.randn(t, 64, generator=g).numpy()
    a = random_16bit((t, 8, 16), F16[dt], g)
    b = random_16bit((16, 16), F16[dt], g)
    c = torch.randn(t, 8, 16, generator=g).numpy()

    keep = []

    def usm(arr: np.ndarray) -> np.ndarray:
        mem = dpctl.memory.MemoryUSMShared(max(arr.nbytes, 1), queue=q)
        keep.append(mem)
        view = np.frombuffer(mem, dtype=arr.dtype)[: arr.size].reshape(arr.shape)
        view[...] = arr
        return view

    ins = [usm(x), usm(bits(a)), usm(vnni(bits(b))), usm(c.astype(np.float32))]
    outs = [usm(np.full((t, 64), np.nan, np.float32)), usm(np.full((t, 16), 0, np.float32)),
            usm(np.full((t, 8, 16), np.nan, np.float32))]
    bundle.launch(q.addressof_ref(), f"emu_slm_dpas_{dt}", t, threads,
                  *[v.ctypes.data for v in ins + outs])
    q.wait()
    rows, unwritten, d = (np.array(v) for v in outs)

    lid = np.arange(t) % threads
    np.testing.assert_array_equal(rows, x[np.arange(t) - lid + (lid + 1) % threads])
    np.testing.assert_array_equal(unwritten.view(np.uint32), 0xFFFFFFFF)
    a32, b32 = a.float().numpy(), b.float().numpy()
    for i in range(t):
        ref = c[i].astype(np.float64) + a32[i].astype(np.float64) @ b32.astype(np.float64)
        assert np.all(np.abs(d[i] - ref) <= dpas_bound(c[i], a32[i], b32)), f"thread {i}"
        np.testing.assert_array_equal(d[i], dpas_model(c[i], a32[i], b32), err_msg=f"thread {i}")


@needs_sycl_cpu
def test_device_conversions_round_to_nearest_even():
    """On a device the emulation converts half with the compiler's own conversions: the
    same bits as torch, subnormals, ties and overflow included."""
    import dpctl.memory

    q = sycl.cpu_queue()
    g = torch.Generator().manual_seed(12)
    f = conversion_inputs(g)
    n = len(f)
    hx = torch.cat([torch.randn(n - 32, generator=g) * 100,
                    torch.randn(32, generator=g) * 1e-5]).half()
    hy = torch.randn(n, generator=g).half()
    keep = []

    def usm(arr: np.ndarray) -> np.ndarray:
        mem = dpctl.memory.MemoryUSMShared(max(arr.nbytes, 1), queue=q)
        keep.append(mem)
        view = np.frombuffer(mem, dtype=arr.dtype)[: arr.size]
        view[...] = arr
        return view

    ins = [usm(f), usm(np.zeros(n, np.uint16)), usm(np.zeros(n, np.uint16)), usm(bits(hx)),
           usm(bits(hy)), usm(np.zeros(n, np.float32)), usm(np.zeros(n, np.uint16)),
           usm(np.zeros(n, np.uint16))]
    _device_bundle().launch(q.addressof_ref(), "emu_convert", n // 16, 1,
                            *[v.ctypes.data for v in ins])
    q.wait()
    _, h, b, _, _, hf, hsum, hprod = (np.array(v) for v in ins)
    ft = torch.from_numpy(f)
    same_bits(h, ft.half(), "float -> half")
    same_bits(b, ft.bfloat16(), "float -> bfloat16")
    np.testing.assert_array_equal(hf, hx.float().numpy())
    same_bits(hsum, (hx.float() + hy.float()).half(), "half add")
    same_bits(hprod, (hx.float() * hy.float()).half(), "half mul")


_bundle = None


def _device_bundle():
    global _bundle
    if _bundle is None:
        _bundle = sycl.shim().build(
            sycl.cpu_queue().addressof_ref(), (HERE / "device_kernel.cpp").read_bytes(),
            ["emu_slm_dpas_f16", "emu_slm_dpas_bf16", "emu_convert"], includes=include_files(),
            options=["-DFMLP_ESIMD_EMULATE"])
    return _bundle
