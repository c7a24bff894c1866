// Device helpers shared by the CUDA kernel families of fusedmlp_xpu (kernels/cuda).
//
// Compiled at run time by NVRTC (fusedmlp_xpu/backends/cuda_build.py) with no include
// path at all: nothing here includes a CUDA header. Half and bfloat16 values are plain
// 16-bit integers in memory; conversions, tensor-core MMAs, shared-memory matrix loads
// and asynchronous copies are inline PTX (sm_80 and later: mma.sync, ldmatrix, cp.async).
#pragma once

namespace fmlp {

// --- shared memory addresses ---------------------------------------------------------
// ldmatrix, cp.async and ld/st.shared take 32-bit addresses in the shared window.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

__device__ __forceinline__ unsigned dynamic_smem_size() {
  unsigned s;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(s));
  return s;
}

// --- conversions ---------------------------------------------------------------------
// Two fp32 values to one 32-bit register of two 16-bit values, ``lo`` in the low half
// (the lower column: the order MMA fragments keep). Round to nearest even.
template <bool BF16>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
  if (BF16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

template <bool BF16>
__device__ __forceinline__ float to_float(unsigned short v) {
  if (BF16) return __uint_as_float(static_cast<unsigned>(v) << 16);  // exact
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}

template <bool BF16>
__device__ __forceinline__ unsigned short from_float(float f) {
  unsigned short h;
  if (BF16) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  }
  return h;
}

// --- tensor cores --------------------------------------------------------------------
// d += a * b on one 16x8x16 tile, fp32 accumulators. Fragments (lane = 4 g + t):
//   a[0]: row g,   k 2t..2t+1     a[1]: row g+8, k 2t..2t+1
//   a[2]: row g,   k 2t+8..2t+9   a[3]: row g+8, k 2t+8..2t+9
//   b[0]: k 2t..2t+1, col g       b[1]: k 2t+8..2t+9, col g
//   d[0..1]: row g, cols 2t..2t+1 d[2..3]: row g+8, cols 2t..2t+1
// So the accumulators of two adjacent 8-column tiles, packed to 16 bits, are exactly
// the A fragment of one 16-wide k slice: a layer's output feeds the next layer's MMAs
// from registers.
template <bool BF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4],
                                          unsigned b0, unsigned b1) {
  if (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 matrices of 16-bit values from shared memory; lanes 8j..8j+7 give the row
// addresses (16 contiguous bytes each) of matrix j, which lands in r[j].
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same four matrices transposed on the way: lanes 8j..8j+7 give the addresses of
// matrix j's 8 stored rows, and lane (g, t) receives stored[2t][g], stored[2t + 1][g].
// A tile kept transposed (a column of 8 rows per 16-byte row) comes back as the A
// fragments / accumulator pairs of the untransposed tile.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr) : "memory");
}

// The inverse (sm_90): four 8x8 matrices of fragments r[0..3] stored transposed, lanes
// 8j..8j+7 giving matrix j's 8 row addresses: the value of lane (g, t) r[j] at (g, 2t)
// lands in stored row 2t, position g.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};"
               :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

// --- mbarriers (shared memory, one CTA) ---------------------------------------------
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

// This thread's arrival (release: its earlier shared-memory writes are seen by a waiter).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}"
               :: "r"(bar) : "memory");
}

// The barrier's memory back to plain shared memory: every barrier a kernel initialized is
// invalidated before the CTA exits (PTX requires it before the bytes are reused; without it
// compute-sanitizer's racecheck took the next kernel's stores there for races with this
// kernel's barriers, and synccheck overflowed its table of barriers).
__device__ __forceinline__ void mbar_inval(unsigned bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}

// Wait until the phase of parity ``parity`` has completed. A fresh barrier is in phase 0:
// a wait for parity 1 (the phase "before" it) returns at once.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}" :: "r"(bar), "r"(parity) : "memory");
}

// --- asynchronous copies -------------------------------------------------------------
// 16 bytes global -> shared, bypassing L1; ``bytes`` < 16 zero-fills the rest (0: no
// read at all, the source address is not dereferenced).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

__device__ __forceinline__ void st_shared_u32(unsigned addr, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void st_shared_u16(unsigned addr, unsigned short v) {
  asm volatile("st.shared.u16 [%0], %1;" :: "r"(addr), "h"(v) : "memory");
}

__device__ __forceinline__ unsigned short ld_shared_u16(unsigned addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void ld_shared_v4(unsigned (&v)[4], unsigned addr) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr) : "memory");
}

// 16 bytes to global memory, marked streaming (written once, not read again here).
__device__ __forceinline__ void st_global_cs_v4(void* p, const unsigned (&v)[4]) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};"
               :: "l"(p), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}

// --- activations ---------------------------------------------------------------------
// 1 / x with no call in the kernel: rcp.approx.f32 (subnormals kept: not .ftz; 1/inf = 0,
// NaN stays NaN), as cuda_bf16.hpp's hrcp takes it. Every activation is packed to 16 bits
// right after (act_pack2), far coarser than the approximation. IEEE's 1.f / x (NVRTC's
// default -prec-div=true) compiles to a CALL of ptxas's rcp slow path at each use, and
// with the calls ptxas gave the backward's chains (sigmoid hidden layers: 128 call
// sites) R0-R119 of their 136 registers (R0-R127 of 144): the sigmoid/softplus
// weight-gradient-only backward spilled 24 B (fp16) / 32 B (bf16) with NVRTC 13.x
// (ci/aot_cuda.py), at 136 and at 144 registers alike; without the calls, none.
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// By the registry's ids (fusedmlp_xpu/activations.py), on fp32; NaN stays NaN.
enum Act { NONE = 0, RELU = 1, LEAKY_RELU = 2, GELU = 3, GELU_TANH = 4, SILU = 5,
           SIGMOID = 6, TANH = 7, SOFTPLUS = 8 };

template <int ACT>
__device__ __forceinline__ float act(float z) {
  if (ACT == RELU) {  // max.NaN, not fmaxf: that turns NaN into 0
    float r;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(z));
    return r;
  }
  if (ACT == LEAKY_RELU) return z > 0.f ? z : 0.01f * z;
  if (ACT == GELU) return 0.5f * z * (1.f + erff(z * 0.7071067811865476f));
  if (ACT == GELU_TANH) {
    // 0.5 z (1 + tanh(u)) == z * sigmoid(2u): one exponential
    const float u = z * (0.7978845608028654f + 0.035677408136300125f * z * z);
    return z / (1.f + expf(-2.f * u));
  }
  if (ACT == SILU) return z / (1.f + expf(-z));
  if (ACT == SIGMOID) return rcp_approx(1.f + expf(-z));
  if (ACT == TANH) return tanhf(z);
  if (ACT == SOFTPLUS) return z > 20.f ? z : log1pf(expf(z));  // torch's threshold 20
  return z;
}

// One 32-bit register of two 16-bit values back to fp32 (``lo``: the lower half).
template <bool BF16>
__device__ __forceinline__ void unpack2(unsigned v, float& lo, float& hi) {
  lo = to_float<BF16>((unsigned short)(v & 0xFFFF));
  hi = to_float<BF16>((unsigned short)(v >> 16));
}

// Whether activation ACT's derivative is a function of its output h = act(z) (the
// backward then needs no pre-activation): identity, relu, leaky relu (by h's sign),
// sigmoid h (1 - h), tanh 1 - h^2, softplus sigmoid(z) = 1 - exp(-h).
__host__ __device__ constexpr bool grad_from_output(int a) {
  return a == NONE || a == RELU || a == LEAKY_RELU || a == SIGMOID || a == TANH ||
         a == SOFTPLUS;
}

// g * act'(z), from h = act(z) (grad_from_output activations), as torch's backward
// computes it: relu passes g where h is NaN (its mask is h <= 0).
template <int ACT>
__device__ __forceinline__ float times_grad_from_output(float g, float h) {
  static_assert(grad_from_output(ACT), "this activation's derivative needs z");
  if (ACT == RELU) return h <= 0.f ? 0.f : g;
  if (ACT == LEAKY_RELU) return h > 0.f ? g : 0.01f * g;
  if (ACT == SIGMOID) return g * (h * (1.f - h));
  if (ACT == TANH) return g * (1.f - h * h);
  if (ACT == SOFTPLUS) return g * (1.f - expf(-h));
  return g;
}

// Two outputs of one layer, activated and packed to 16 bits (the next layer's A fragment
// half, as pack2). ReLU in the conversion itself (cvt's .relu: negatives to 0, NaN to
// NaN; rounding commutes with max(., 0)): one instruction for two values, where the fp32
// compare-and-select took two each.
template <int ACT, bool BF16>
__device__ __forceinline__ unsigned act_pack2(float lo, float hi) {
  if (ACT == RELU) {
    unsigned r;
    if (BF16) {
      asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
      asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
  }
  return pack2<BF16>(act<ACT>(lo), act<ACT>(hi));
}

}  // namespace fmlp
