"""ci/aot_sycl.py, the PVC ahead-of-time check of the ESIMD kernels.

Without a compiler: the listing parser on lines of IGC's own PVC listings (each message
spelling, spills, the argument loads of the thread prologs), the failure rules, and a
missing ocloc failing the script. With the runtime compiler and ocloc (Debian's
intel-opencl-icd): test kernels written here compiled for PVC in one batch, and their
listings read back as their source says they must be: k dpas calls show k, 2-D block
messages show as such, and a bf16 8-row x 64 two-layer kernel with its weights in SLM
spills at the default 128 GRF and not at 256. Skipped where ocloc or the sycl backend's
toolchain is missing, unless FUSEDMLP_REQUIRE_OCLOC=1 (CI) makes that a failure."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("aot_sycl", ROOT / "ci" / "aot_sycl.py")
aot = sys.modules.setdefault("aot_sycl", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(aot)


# --- the listing parser ----------------------------------------------------------------
# Lines as IGC 1.0.12504 writes them for pvc (ocloc -vc-codegen), header and body, runs
# of spaces collapsed.
LISTING = """\
//.kernel __sycl_kernel_probe
//.platform PVCXT
//.thread_config numGRF=128, numAcc=4, numSWSB=16
//.instCount 120
//.RA type\tGRAPH_COLORING_SPILL_FF_RA
//.spill size 1024
// B000: Preds:{}, Succs:{B001}
per_thread_prolog:
(W) mov (16|M0) r127.0<1>:ud 0x0:ud {A@1} //
        load.ugm.d32x16t.a32.ca.ca (1|M0) r1:1 bti[255][r127:1] {A@1,$0} // ex_desc:0xFF000000; desc:0x6218D500 // $62
// B001: Preds:{B000}, Succs:{B002}
// cross_thread_prolog:
        load.ugm.d32x16t.a32.ca.ca (1|M0) r2:1 bti[255][r127:1] {A@1,$1} // ex_desc:0xFF000000; desc:0x6218D500 // $62
// B002: Preds:{B001}, Succs:{}
// __sycl_kernel_probe_BB_0:
        send.dc1 (16|M0) r32 r24 null:0 0x0 0x041411FF {I@7,$2} // wr:2+0, rd:1; a64 dword gathering read // $33
(W) send.dc1 (16|M0) r12 r3 null:0 0x0 0x022D04FF {I@2,$8} // wr:1h+0, rd:2; a64 unaligned oword block read x8 // $41
        send.dc0 (16|M0) r40 r9 null:0 0x0 0x042405FE {$3} // wr:2+0, rd:1; byte gathering read 32b // $113
        send.dc0 (16|M0) null r10 r6:1 0x0 0x020305FE {A@2,$2} // wr:1+1, rd:0; byte scattering write 16b // $24
(W) send.dc0 (8|M0) null r0 r4:1 0x0 0x020F1016 {F@1,$4} // wr:1h+1, rd:0; hword scratch block write x2 // scratch space spill: SP_GRF_V449_1 from offset[22x32]; $219
(W) send.dc0 (16|M0) r5 r0 null:0 0x0 0x022C2012 {F@1,$10} // wr:1h+0, rd:2; hword scratch block read x4 // scratch space fill: from offset[18x32]; $353
(W) store.ugm.d32x16t.a32 (1|M0) ss[a0.2][r126:1] r15:1 {ExBSO,I@3,$12} // ex_desc:a0.2; desc:0x4200D504 // spill to FP[0*64] of ?; $486
(W) send.slm (1|M0) r3 r0 null:0 0x0 0x0210011F {$12} // wr:1+0, rd:1; fence.slm.none.group // $58
(W) send.gtwy (1|M0) null r3 null:0 0x0 0x02000004 {I@1,$13} // wr:1+0, rd:0; signal barrier // $59
        load_block2d.ugm.d16v.a64 (1|M0) r8:8 [r33:1] {A@3,$2} // ex_desc:0x0; desc:0x2800283 // $9
        load.slm.d32x8t.a32 (1|M0) r9:1 [r4:1] {$5} // ex_desc:0x0; desc:0x0 // $10
        load.ugm.d32.a64 (16|M0) r10:2 [r12:4] {$6} // ex_desc:0x0; desc:0x0 // $11
        dpas.8x8 (16|M0) r52:f r36:f r32:hf r20.0:hf {Compacted,$2} // $39
        dpas.8x8 (16|M0) r52:f r52:f r48:hf r20.0:hf {Compacted,$10} // $49
        dpas.8x4 (16|M0) r60:f r60:f r48:hf r22.0:hf {$11} // $50
        store_block2d.ugm.d32.a64 (1|M0) [r34:1] r24:8 {A@1,$2} // ex_desc:0x0; desc:0x2000407 // $15
        store.ugm.d32x16t.a64 (1|M0) [r35:1] r26:1 {$7} // ex_desc:0x0; desc:0x0 // $16
(W) send.gtwy (8|M0) null r127 null:0 0x0 0x02000010 {EOT} // wr:1+0, rd:0; end of thread // $62
"""


def test_parse_reads_the_header_and_every_message_spelling():
    st = aot.parse_asm(LISTING)
    assert (st.kernel, st.grf, st.inst_count, st.spill_bytes) == ("probe", 128, 120, 1024)
    assert (st.dpas, st.dpas_shapes) == (3, {"8x4": 1, "8x8": 2})
    # the two prolog loads (kernel arguments) and the end of thread are not traffic
    assert st.sends == {"global_load": 4, "global_store": 2, "slm_load": 2, "slm_store": 1,
                        "atomic": 0, "spill_fill": 3, "sync": 2, "other": 0}, st.sends
    assert st.spill_messages == 3
    # a64 dword gather, SLM byte gather and scatter, LSC load.ugm.d32 (16 lanes)
    assert st.gathers == 4 and st.block2d == 2


def test_parse_without_spills_reports_zero():
    text = "\n".join(ln for ln in LISTING.splitlines()
                     if "spill" not in ln and "fill" not in ln).replace("numGRF=128", "numGRF=256")
    st = aot.parse_asm(text)
    assert (st.grf, st.spill_bytes, st.spill_messages, st.sends["spill_fill"]) == (256, 0, 0, 0)


def _row(**kw):
    row = {"kernel": "k", "grf": 128, "spill_bytes": 0, "spill_messages": 0, "dpas": 4,
           "dpas_expected": 4, "options": "-vc-codegen"}
    row.update(kw)
    return row


@pytest.mark.parametrize("row, why", [
    (_row(), None),
    (_row(spill_bytes=768, spill_messages=30), "spills 768 B"),
    (_row(spill_messages=1), "spills 0 B (1 spill/fill"),
    (_row(dpas=0), "no dpas"),
    (_row(dpas=5), "5 dpas in its PVC listing, expected 4"),
    (_row(options="-vc-codegen -ze-opt-large-register-file"), "at 128 GRF, asked for 256"),
    (_row(dpas=0, spill_bytes=64, dpas_expected=None), None),  # informational rows
])
def test_failures_name_the_kernel_and_the_reason(row, why):
    bad = aot.failures([row])
    if why is None:
        assert bad == []
    else:
        assert len(bad) == 1 and bad[0].startswith("k: ") and why in bad[0], bad


def test_gather_share_and_instructions_a_dpas_fail_where_set():
    sends = {"global_load": 8, "global_store": 2, "slm_load": 0, "slm_store": 0, "atomic": 0}
    ok = _row(sends=sends, gathers=1, gather_share_max=0.10, inst_count=40,
              inst_per_dpas_max=10)
    assert aot.failures([ok]) == []
    bad = aot.failures([dict(ok, gathers=2)])
    assert len(bad) == 1 and "2 of its 10 memory messages are gathers" in bad[0], bad
    bad = aot.failures([dict(ok, inst_count=44)])
    assert len(bad) == 1 and "11.0 instructions a dpas, target 10" in bad[0], bad
    assert aot.failures([dict(ok, gathers=9, gather_share_max=None, inst_per_dpas_max=None)]) == []


@pytest.mark.parametrize("grf,slm,wg,want", [
    (256, 0, 16, 4), (128, 0, 16, 8),
    (256, 128 * 1024, 16, 2),   # one 16-thread group an Xe-core: 2 threads a vector engine
    (256, 32 * 1024, 16, 4), (128, 32 * 1024, 16, 8), (128, 64 * 1024, 16, 4),
])
def test_threads_per_vector_engine(grf, slm, wg, want):
    assert aot.threads_per_eu(grf, slm, wg) == want


def test_config_from_a_backend_object_and_its_errors():
    class Cfg:  # the attributes a backend configuration gives
        kernel_name, dpas_per_block, instantiation, source_defines, grf = "f", 12, "x", ["A=1"], 256

    c = aot.KernelConfig.of(Cfg())
    assert (c.name, c.dpas_expected, c.instantiation, c.defines, c.grf) == (
        "f", 12, "x", ("A=1",), 256)
    with pytest.raises(ValueError, match="grf=96"):
        aot.KernelConfig("f", 1, grf=96)
    with pytest.raises(ValueError, match=r"repeated.*\['f'\]"):
        aot.isa_table([aot.KernelConfig("f", 1), aot.KernelConfig("f", 2)], "", {}, Path("."))


def test_visa_verifier_errors_name_the_kernel_and_the_instruction(tmp_path):
    """ocloc says only "VISA builder API call failed"; IGC's *.errors.txt says why."""
    block = ("/----!!!INSTRUCTION ERROR FOUND!!!----\\\n"
             "Error in CISA routine with name: __sycl_kernel_k\n"
             "        Error Message: Src opnd in BF mixed mode should be either BF or F\n"
             "                    Diagnostics:\n"
             "    Violating Instruction:     mov (M1, 16) V15(0,0)<2> V5(0,0)<1;1,0> /// $13\n")
    (tmp_path / "VC_asm1___sycl_kernel_k.errors.txt").write_text(block * 3)
    assert aot.visa_errors(tmp_path) == (
        "\n  k: Src opnd in BF mixed mode should be either BF or F "
        "(e.g. mov (M1, 16) V15(0,0)<2> V5(0,0)<1;1,0> /// $13)")
    assert aot.visa_errors(tmp_path / "none") == ""


def test_a_missing_ocloc_fails_the_script(monkeypatch, capsys):
    monkeypatch.setenv("OCLOC", "/nonexistent/ocloc")
    assert aot.main([]) == 1
    assert "intel-opencl-icd" in capsys.readouterr().out


# --- compiled for PVC ------------------------------------------------------------------
SOURCE = r"""
#include <sycl/sycl.hpp>
#include <sycl/ext/intel/esimd.hpp>
#include <sycl/ext/intel/experimental/esimd/memory.hpp>
namespace syclexp = sycl::ext::oneapi::experimental;
namespace esimd = sycl::ext::intel::esimd;
namespace xesimd = sycl::ext::intel::experimental::esimd;
namespace xmx = sycl::ext::intel::esimd::xmx;
using half = sycl::half;
using bf16 = sycl::ext::oneapi::bfloat16;
#define KERNEL(dims) extern "C" SYCL_EXTERNAL \
  SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<dims>)) [[intel::sycl_explicit_simd]]

inline int gid() {
  return sycl::ext::oneapi::this_work_item::get_nd_item<1>().get_global_id(0);
}
constexpr esimd::overaligned_tag<16> A16{};

// K dpas in a row (unrolled): A 8x16 fp16, B 16x16 fp16 (VNNI), C 8x16 fp32
template <int K> void chain(const half *a, const half *b, float *c) {
  esimd::simd<half, 128> A = esimd::block_load<half, 128>(a + gid() * 128, A16);
  esimd::simd<float, 128> acc = 0;
#pragma unroll
  for (int k = 0; k < K; ++k)
    acc = xmx::dpas<8, 8, float>(acc, esimd::block_load<half, 256>(b + k * 256, A16), A);
  esimd::block_store<float, 128>(c + gid() * 128, acc);
}
KERNEL(1) void dpas_1(const half *a, const half *b, float *c) { chain<1>(a, b, c); }
KERNEL(1) void dpas_3(const half *a, const half *b, float *c) { chain<3>(a, b, c); }

// no matrix work
KERNEL(1) void no_dpas(const float *a, float *c) {
  esimd::simd<float, 16> v = esimd::block_load<float, 16>(a + gid() * 16);
  esimd::block_store<float, 16>(c + gid() * 16, v * 2.0f);
}

// 2-D block messages: A by rows, B with the VNNI transform, C stored as a 2-D block
KERNEL(1) void block_2d(const half *a, const half *b, float *c, int n) {
  // (surface width - 1 in bytes, height - 1, pitch - 1 in bytes, x, y)
  esimd::simd<half, 128> A =
      xesimd::lsc_load_2d<half, 16, 8, 1, false, false>(a, 31, n - 1, 31, 0, gid() * 8);
  esimd::simd<half, 256> B =
      xesimd::lsc_load_2d<half, 16, 16, 1, false, true>(b, 31, 15, 31, 0, 0);
  esimd::simd<float, 128> acc = 0;
  acc = xmx::dpas<8, 8, float>(acc, B, A);
  xesimd::lsc_store_2d<float, 16, 8>(c, 63, n - 1, 63, 0, gid() * 8, acc);
}

// a 16x16 16-bit B tile (512 B) from SLM and back out: 16 lanes x 8 dwords a message
KERNEL(1) void tile_d32x8(uint32_t *c) {
  esimd::slm_init<8192>();
  esimd::simd<uint32_t, 16> lanes(0, 32);
  esimd::simd<uint32_t, 128> tile = esimd::slm_gather<uint32_t, 128, 8>(lanes);
  esimd::scatter<uint32_t, 128, 8>(c + gid() * 128, lanes, tile);
}

// bf16, 8 rows x 64 carried through a runtime loop over layers of 64x64 weights held in
// SLM (VNNI tiles of 16x16), relu in registers: 4 k-steps x 4 n-tiles = 16 dpas a layer
KERNEL(1) void mlp_8x64(const bf16 *x, const bf16 *w, bf16 *y, int n_layers) {
  constexpr int W = 64, R = 8;
  esimd::slm_init<2 * W * W * 2>();
  auto it = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  if (it.get_local_id(0) == 0)
    for (int c = 0; c < 2 * W * W; c += 64)
      esimd::slm_block_store<bf16, 64>(c * 2, esimd::block_load<bf16, 64>(w + c, A16));
  esimd::barrier();
  esimd::simd<bf16, R * W> h = esimd::block_load<bf16, R * W>(x + gid() * R * W, A16);
  for (int l = 0; l < n_layers; ++l) {
    esimd::simd<float, R * W> acc = 0;
#pragma unroll
    for (int k = 0; k < W / 16; ++k) {
      esimd::simd<bf16, R * 16> a;
#pragma unroll
      for (int r = 0; r < R; ++r)
        a.select<16, 1>(r * 16) = h.select<16, 1>(r * W + k * 16);
#pragma unroll
      for (int n = 0; n < W / 16; ++n) {
        int tile = (l & 1) * W * W + (k * 4 + n) * 256;
        esimd::simd<bf16, 256> b = esimd::slm_block_load<bf16, 256>(tile * 2);
        esimd::simd<float, R * 16> c = acc.select<R * 16, 1>(n * R * 16);
        acc.select<R * 16, 1>(n * R * 16) = xmx::dpas<8, 8, float>(c, b, a);
      }
    }
    h = esimd::max(acc, 0.0f);
  }
  esimd::block_store<bf16, R * W>(y + gid() * R * W, h);
}
"""

CONFIGS = [aot.KernelConfig("dpas_1", 1), aot.KernelConfig("dpas_3", 3),
           aot.KernelConfig("no_dpas", 1), aot.KernelConfig("block_2d", 1),
           aot.KernelConfig("tile_d32x8", None),
           aot.KernelConfig("mlp_8x64", 16), aot.KernelConfig("mlp_8x64", 16, grf=256)]


def _toolchain_or_skip():
    try:
        aot.find_ocloc()
        from fusedmlp_xpu.backends import sycl

        sycl._toolchain()
        sycl.cpu_queue()
    except Exception as e:  # noqa: BLE001 (any missing piece: ocloc, runtime, compiler)
        if os.environ.get("FUSEDMLP_REQUIRE_OCLOC") == "1":
            pytest.fail(f"FUSEDMLP_REQUIRE_OCLOC=1 but {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """The test kernels compiled for PVC: two builds (128 and 256 GRF), one row each."""
    _toolchain_or_skip()
    rows = aot.isa_table(CONFIGS, SOURCE, {}, tmp_path_factory.mktemp("aot_sycl"))
    return {(r["kernel"], r["grf"]): r for r in rows}


def test_k_dpas_calls_show_k(table):
    for k in (1, 3):
        r = table[(f"dpas_{k}", 128)]
        assert (r["dpas"], r["dpas_shapes"], r["spill_bytes"]) == (k, {"8x8": k}, 0), r
    assert table[("no_dpas", 128)]["dpas"] == 0
    assert aot.failures([table[("no_dpas", 128)]]) == ["no_dpas: no dpas instruction in its "
                                                       "PVC listing"]


def test_aligned_block_loads_and_2d_messages(table):
    r = table[("dpas_3", 128)]
    # block_load of 512 B (A, and B per dpas) and block_store: with this IGC's vc-codegen,
    # 16-lane dword gathers and scatters (a 128-B legacy block read is the largest)
    s = r["sends"]
    assert s["global_load"] > 4 and s["global_store"] > 1 and s["spill_fill"] == 0, r
    assert r["gathers"] == s["global_load"] + s["global_store"] and r["block2d"] == 0, r
    r = table[("block_2d", 128)]
    assert (r["sends"]["global_load"], r["sends"]["global_store"], r["block2d"],
            r["gathers"]) == (2, 1, 3, 0), r
    # one LSC message each way for 512 B: gathers with 8 dwords a lane
    r = table[("tile_d32x8", 128)]
    assert (r["sends"]["slm_load"], r["sends"]["global_store"], r["gathers"]) == (1, 1, 2), r


def test_a_runtime_layer_loop_holds_its_dpas_once_and_spills_at_128_grf(table):
    """The static count: the loop body's 16 dpas, whatever n_layers is at run time."""
    small, large = table[("mlp_8x64", 128)], table[("mlp_8x64", 256)]
    assert small["dpas"] == large["dpas"] == 16
    assert small["grf"] == 128 and small["spill_bytes"] > 0 and small["sends"]["spill_fill"] > 0
    assert large["grf"] == 256 and large["spill_bytes"] == 0 and large["sends"]["spill_fill"] == 0
    assert large["options"] == "-vc-codegen -ze-opt-large-register-file"
    bad = aot.failures([small, large])
    assert len(bad) == 1 and bad[0].startswith("mlp_8x64: spills") and "128 GRF" in bad[0], bad
    assert small["sends"]["slm_load"] > 0 and small["sends"]["sync"] >= 1


def test_the_portable_kernels_compile_for_pvc_as_information(tmp_path):
    """The SIMT kernels of kernels/sycl/fused_mlp.cpp (no -vc-codegen): every one has a
    listing; rows without an expectation never fail the check."""
    _toolchain_or_skip()
    configs, source, includes = aot.portable_configs()
    rows = aot.isa_table(configs, source, includes, tmp_path)
    assert sorted(r["kernel"] for r in rows) == sorted(c.name for c in configs)
    assert all(r["inst_count"] > 0 and r["dpas"] == 0 and not r["esimd"] for r in rows), rows
    assert aot.failures(rows) == []


def test_the_script_checks_every_esimd_configuration(tmp_path):
    """ci/aot_sycl.py --alone over the sycl backend's ESIMD configurations: every kernel in
    a SPIR-V module of its own, as the runtime builds it (one kernel a module), compiled for
    pvc with its GRF mode, no spill, its dpas count as stated; the JSON table written. The
    bf16 64/64/64 backward once failed in IGC built alone ("Src opnd in BF mixed mode")
    while it compiled beside the forward. One run: grouped into a few modules, every
    kernel's ISA counts came out the same (the 64 bf16 forwards compared), so a second,
    grouped run checked nothing more and took as long again."""
    if importlib.util.find_spec("fusedmlp_xpu.backends.sycl_esimd") is None:
        pytest.skip("no ESIMD backend (fusedmlp_xpu.backends.sycl_esimd) in this tree yet")
    _toolchain_or_skip()
    out = tmp_path / "pvc.json"
    r = subprocess.run([sys.executable, str(ROOT / "ci" / "aot_sycl.py"), "--alone", "--out",
                        str(out)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = json.loads(out.read_text())["kernels"]
    assert rows and all(r["alone"] for r in rows)
    assert all(r["dpas"] == r["dpas_expected"] > 0 and r["spill_bytes"] == 0
               for r in rows), rows
    assert all(r["threads_per_eu"] == 4 for r in rows), rows
    # where every surface allows them, the rows move by 2-D block messages only
    full = [r for r in rows if r["kernel"].endswith("_io7")]
    assert full and all(r["gathers"] == 0 and r["block2d"] > 0 for r in full), full
