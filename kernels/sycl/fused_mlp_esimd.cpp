// fused_mlp_esimd.cpp: the narrow fused MLP for the Intel Data Center GPU Max 1550 (PVC)
// in ESIMD: every layer's matmul on the XMX engines (xmx::dpas), rows carried through
// all layers in registers, the weights read as dpas B tiles through L1 by 2-D block loads.
//
// One ESIMD work-item is one hardware thread. A thread owns R = 8 * RG rows at a time
// (RG row groups of 8, dpas's RepeatCount) and holds them as dpas A tiles: tile (k, rg)
// is 8 rows x 16 columns, row-major, at (k * RG + rg) * 128, so the R rows of one
// 16-column slice are contiguous: what one 2-D block load of R rows x 16 columns returns,
// and what one column of fp32 accumulators becomes. A layer's output column n is the
// next layer's input slice n with no shuffle: h_next(n, rg) = sum_k dpas(h(k, rg), W^T(k, n)).
//
// Widths: the input, hidden and output widths are padded on chip (never in memory) to
// IN, H, OUT in {16, 32, 64, 128}: x columns past in_w load as 0, the host packs zero
// weights there. Every hidden layer has the same width. The host packs the weights
// (fusedmlp_xpu/backends/sycl_esimd.py) as dpas B tiles, 16 x 16 in VNNI order, tile
// (n, k) of layer l at layer_offset(l) + (n * KT + k) * 256 elements; the kernels read
// them as a 2-D surface of 16 dwords a row (a tile is 8 rows), up to 4 tiles a message.
// No SLM: threads per vector engine are set by the register file alone (4 at 256 GRF).
//
// Kernels (one per configuration, activation pair and I/O mode; the host appends
// FMLP_ESIMD_* lines to instantiate):
//   fmlp_esimd_fwd_<t>_<IN>_<H>_<OUT>_a<act>_<out_act>_io<IO>  forward; saves z when args.z
//   fmlp_esimd_bwd_<t>_<IN>_<H>_<OUT>_a<act>_<out_act>_io<IO>  row backward: dL/dz, dL/dx
//   fmlp_esimd_wgrad_<t>                one layer's weight/bias gradient partial sums
// The activations are template parameters (ids as fusedmlp_xpu/activations.py): the
// epilogue is straight-line code. IO says which surfaces go through 2-D block messages
// (kX2d: x / dL/dx, kY2d: y / dL/dy, kZ2d: z and dL/dz); the host sets a bit only where
// the surface allows it (contiguous rows, width >= 64 B, pitch a multiple of 16 B, base
// 64 B aligned, z columns unpadded); the others are per-lane gathers and scatters.
//
// Rounding follows eager PyTorch in the operand dtype: z = round(x W^T + b) with the bias
// added to the fp32 accumulators, h = round(act(z)) with act in fp32. For none and relu
// round(act(round(z))) == round(act(z)) (rounding is monotone and keeps 0 and the sign),
// so the epilogue converts once, from fp32; every other activation is computed on the
// rounded z, as eager does (leaky_relu's 0.01 z, gelu, silu, ... round differently
// otherwise). The backward: g = round(round(g W) * act'(z)); for relu the mask is exact,
// one rounding; none is the bare round.
//
// FMLP_ESIMD_EMULATE: the same source on any SYCL device (the OpenCL CPU device in CI)
// through esimd_emu.hpp, which implements the ESIMD subset used here in plain SYCL.
#include <sycl/sycl.hpp>

#include "esimd_select.hpp"
#include "fused_mlp_esimd.h"

// Tile loops unroll on the GPU (a register tile's offset must be a constant there); the
// emulation keeps them loops, which the CPU compiler builds in a fraction of the time.
#ifdef FMLP_ESIMD_EMULATE
#define FMLP_UNROLL
#define FMLP_NOUNROLL
#else
#define FMLP_UNROLL _Pragma("unroll")
#define FMLP_NOUNROLL _Pragma("nounroll")
#endif

namespace fmlp_esimd {
namespace syclexp = sycl::ext::oneapi::experimental;
using esimd::simd;
using esimd::simd_mask;
using bf16 = sycl::ext::oneapi::bfloat16;
using half = sycl::half;

constexpr int kWG = FMLP_ESIMD_WG;                 // threads (work-items) a work-group
constexpr int kTile = 128;                         // 8 x 16 elements: one A or C tile
constexpr int kBTile = 256;                        // 16 x 16 elements: one B tile (VNNI)
constexpr int kX2d = 1, kY2d = 2, kZ2d = 4;        // I/O mode bits (see the top)

// rows a thread carries at once, by hidden width: the register budget (256 GRF x 64 B)
// holds the input tiles, the output tiles, one column of fp32 accumulators and 4 B tiles
// (H = 64, RG = 4: 64 + 64 + 32 + 32 GRF).
template <int H> constexpr int row_groups() { return H >= 128 ? 2 : 4; }

// ---- activations (ids as fusedmlp_xpu/activations.py; never renumber) ----------------
constexpr float kLeakySlope = 0.01f;
constexpr float kSoftplusThreshold = 20.0f;
constexpr float kSqrt1_2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluTanhC = 0.044715f;

template <int N> inline simd<float, N> sigmoid(simd<float, N> z) {
  return 1.0f / (1.0f + esimd::exp(-z));
}
// tanh from exp: 1 - 2 / (e^2z + 1) is exact at both infinities and keeps NaN
template <int N> inline simd<float, N> tanh_(simd<float, N> z) {
  return 1.0f - 2.0f / (esimd::exp(2.0f * z) + 1.0f);
}
// erf: Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), odd extension
template <int N> inline simd<float, N> erf_(simd<float, N> z) {
  simd<float, N> a = esimd::abs(z);
  simd<float, N> t = 1.0f / (1.0f + 0.3275911f * a);
  simd<float, N> p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                     t * (-1.453152027f + t * 1.061405429f))));
  simd<float, N> r = 1.0f - p * esimd::exp(-a * a);
  return esimd::merge(-r, r, z < 0.0f);
}

// none and relu: round(act(round(z))) == round(act(z)), one conversion from fp32
template <int A> constexpr bool rounds_once() { return A == 0 || A == 1; }

template <int A, int N> inline simd<float, N> act(simd<float, N> z) {
  if constexpr (A == 1) return esimd::merge(simd<float, N>(0.0f), z, z < 0.0f);  // NaN stays
  else if constexpr (A == 2) return esimd::merge(z, z * kLeakySlope, z > 0.0f);
  else if constexpr (A == 3) return 0.5f * z * (1.0f + erf_<N>(z * kSqrt1_2));
  else if constexpr (A == 4)
    return 0.5f * z * (1.0f + tanh_<N>(kSqrt2OverPi * (z + kGeluTanhC * z * z * z)));
  else if constexpr (A == 5) return z * sigmoid<N>(z);
  else if constexpr (A == 6) return sigmoid<N>(z);
  else if constexpr (A == 7) return tanh_<N>(z);
  else if constexpr (A == 8)
    return esimd::merge(z, esimd::log(1.0f + esimd::exp(z)), z > kSoftplusThreshold);
  else return z;
}

// d act / d z at z (as torch's backward formulas; NaN passes); not used for none, relu
template <int A, int N> inline simd<float, N> act_grad(simd<float, N> z) {
  if constexpr (A == 2)
    return esimd::merge(simd<float, N>(1.0f), simd<float, N>(kLeakySlope), z > 0.0f) + 0.0f * z;
  else if constexpr (A == 3)
    return 0.5f * (1.0f + erf_<N>(z * kSqrt1_2)) + z * kInvSqrt2Pi * esimd::exp(-0.5f * z * z);
  else if constexpr (A == 4) {
    simd<float, N> t = tanh_<N>(kSqrt2OverPi * (z + kGeluTanhC * z * z * z));
    simd<float, N> d = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhC * z * z);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * d;
  } else if constexpr (A == 5) {
    simd<float, N> s = sigmoid<N>(z);
    return s * (1.0f + z * (1.0f - s));
  } else if constexpr (A == 6) {
    simd<float, N> s = sigmoid<N>(z);
    return s * (1.0f - s);
  } else if constexpr (A == 7) {
    simd<float, N> t = tanh_<N>(z);
    return 1.0f - t * t;
  } else if constexpr (A == 8)
    return esimd::merge(simd<float, N>(1.0f) + 0.0f * z, sigmoid<N>(z), z > kSoftplusThreshold);
  else return simd<float, N>(1.0f) + 0.0f * z;
}

// The activation chosen at run time: the weight-gradient kernel's (one per dtype).
template <int N> inline simd<float, N> act_rt(int id, simd<float, N> z) {
  switch (id) {
  case 1: return act<1, N>(z);
  case 2: return act<2, N>(z);
  case 3: return act<3, N>(z);
  case 4: return act<4, N>(z);
  case 5: return act<5, N>(z);
  case 6: return act<6, N>(z);
  case 7: return act<7, N>(z);
  case 8: return act<8, N>(z);
  default: return z;
  }
}

// ---- rows in and out of registers ------------------------------------------------------
// The byte offsets of 16 consecutive columns from a row's start, 64-bit: a column-major x
// of 64 columns passes 2^32 bytes of column stride product at ~34M rows.
template <typename T> inline simd<uint64_t, 16> col_offsets(int col0, int64_t cs) {
  simd<uint64_t, 16> lane(0, 1);
  return (lane + static_cast<uint64_t>(col0)) * static_cast<uint64_t>(cs * sizeof(T));
}

// Rows [0, rows) (at most R) of a row block as a 2-D surface: base is the block's first
// row, so offsets stay 64-bit in the base and the surface height small.
inline uint32_t height_m1(int64_t rows, int R) {
  return static_cast<uint32_t>((rows < R ? rows : R) - 1);
}

// A tiles of R = 8 * RG rows x 16 * KT columns of a [rows, cols] surface at base (row
// stride rs, column stride cs, elements), k-major (see the top); rows past `rows` and
// columns past `cols` are 0. BLOCK: 2-D block loads of R rows x 32 columns (2 KiB at
// R = 32); else one gather a row and 16 columns.
template <typename T, int RG, int KT, bool BLOCK>
inline simd<T, RG * KT * kTile> load_rows(const T *base, int64_t rs, int64_t cs, int64_t rows,
                                          int cols) {
  constexpr int R = 8 * RG;
  simd<T, RG * KT * kTile> a;
  if constexpr (BLOCK) {
    constexpr int NB = KT >= 2 ? 2 : 1;
    const uint32_t h = height_m1(rows, R);
    FMLP_UNROLL
    for (int kt = 0; kt < KT; kt += NB)
      a.template select<R * 16 * NB, 1>(kt * R * 16) = xesimd::lsc_load_2d<T, 16, R, NB>(
          base, cols * sizeof(T) - 1, h, rs * sizeof(T) - 1, kt * 16, 0);
  } else {
    simd<uint32_t, 16> lane(0, 1);
    FMLP_UNROLL
    for (int kt = 0; kt < KT; ++kt) {
      simd<uint64_t, 16> offs = col_offsets<T>(kt * 16, cs);
      simd_mask<16> col_ok = (lane + kt * 16) < static_cast<uint32_t>(cols);
      FMLP_UNROLL
      for (int r = 0; r < R; ++r) {
        simd<T, 16> v(0.0f);
        if (r < rows) {
          v = esimd::gather<T, 16>(base + r * rs, offs, col_ok);
          v = esimd::merge(v, simd<T, 16>(0.0f), col_ok);
        }
        a.template select<16, 1>(kt * R * 16 + r * 16) = v;
      }
    }
  }
  return a;
}

// The R rows x 16 columns at column col0 of a row-major [rows, ld] surface (`cols` valid
// columns from col0 on): a column of tiles, as one 2-D load or R gathers.
template <typename T, int RG, bool BLOCK>
inline simd<T, RG * kTile> load_col(const T *base, int64_t ld, int64_t rows, int col0, int cols) {
  constexpr int R = 8 * RG;
  if constexpr (BLOCK) {
    return xesimd::lsc_load_2d<T, 16, R, 1>(base, ld * sizeof(T) - 1, height_m1(rows, R),
                                            ld * sizeof(T) - 1, col0, 0);
  } else {
    simd<T, RG * kTile> t;
    simd<uint32_t, 16> lane(0, 1);
    simd<uint64_t, 16> offs = col_offsets<T>(col0, 1);
    simd_mask<16> col_ok = lane < static_cast<uint32_t>(cols > 0 ? cols : 0);  // past the end: none
    FMLP_UNROLL
    for (int r = 0; r < R; ++r) {
      simd<T, 16> v(0.0f);
      if (r < rows) {
        v = esimd::gather<T, 16>(base + r * ld, offs, col_ok);
        v = esimd::merge(v, simd<T, 16>(0.0f), col_ok);
      }
      t.template select<16, 1>(r * 16) = v;
    }
    return t;
  }
}

// Store a column of RG tiles (R rows x 16 columns at column col0) to a row-major
// [rows, ld] surface, `cols` valid columns from col0 on (BLOCK: the surface's own width
// clips, so the host sets it only where col0 + 16 stays inside the surface's columns or
// its last columns are the edge).
template <typename T, int RG, bool BLOCK>
inline void store_col(T *base, int64_t ld, int64_t rows, int col0, int cols, int surf_w,
                      simd<T, RG * kTile> col) {
  if constexpr (BLOCK) {
    const uint32_t h = height_m1(rows, 8 * RG);
    // as raw 16-bit words: ESIMD's store_2d_impl (intel-sycl-rt 2026.2) assigns the
    // values to a simd of the raw type, which converts bfloat16 by value (the listing
    // showed bf16 -> f32 -> u32 -> u16), where a load keeps the bits
    FMLP_UNROLL
    for (int rg = 0; rg < RG; ++rg) {
      simd<T, kTile> t = col.template select<kTile, 1>(rg * kTile);
      simd<uint16_t, kTile> bits = t.template bit_cast_view<uint16_t>();
      xesimd::lsc_store_2d<uint16_t, 16, 8>(reinterpret_cast<uint16_t *>(base),
                                            surf_w * sizeof(T) - 1, h, ld * sizeof(T) - 1, col0,
                                            rg * 8, bits);
    }
  } else {
    simd<uint32_t, 16> lane(0, 1);
    simd<uint64_t, 16> offs = col_offsets<T>(col0, 1);
    simd_mask<16> col_ok = lane < static_cast<uint32_t>(cols > 0 ? cols : 0);  // past the end: none
    FMLP_UNROLL
    for (int r = 0; r < 8 * RG; ++r)
      if (r < rows)
        esimd::scatter<T, 16>(base + r * ld, offs, col.template select<16, 1>(r * 16), col_ok);
  }
}

// ---- the matrix engine -----------------------------------------------------------------
// TK B tiles from tile index t0 of the packed weights (a surface of 16 dwords a row, 8 rows
// a tile): one 2-D block load, up to 2 KiB.
template <typename T, int TK>
inline simd<T, TK * kBTile> load_b(const uint32_t *w, uint32_t rows_m1, int t0) {
  simd<uint32_t, TK * 128> v = xesimd::lsc_load_2d<uint32_t, 16, 8 * TK, 1>(w, 63, rows_m1, 63, 0,
                                                                          t0 * 8);
  return v.template bit_cast_view<T>();
}

// out(n) = epi(n, sum_k a(k) x B(n, k)) for the column tiles n of one layer, its B tiles
// from tile t0 on; only one column of accumulators (RG tiles of fp32) is live at a time.
template <typename T, int RG, int KT, int NT, class Epi>
inline void layer(simd<T, RG * KT * kTile> &a, const uint32_t *w, uint32_t w_rows_m1, int t0,
                  Epi &&epi) {
  constexpr int TK = KT < 4 ? KT : 4;
  FMLP_UNROLL
  for (int nt = 0; nt < NT; ++nt) {
    simd<float, RG * kTile> acc;
    FMLP_UNROLL
    for (int k0 = 0; k0 < KT; k0 += TK) {
      simd<T, TK * kBTile> b = load_b<T, TK>(w, w_rows_m1, t0 + nt * KT + k0);
      FMLP_UNROLL
      for (int j = 0; j < TK; ++j)
        FMLP_UNROLL
        for (int rg = 0; rg < RG; ++rg) {
          simd<T, kBTile> bt = b.template select<kBTile, 1>(j * kBTile);
          simd<T, kTile> at = a.template select<kTile, 1>(((k0 + j) * RG + rg) * kTile);
          if (k0 + j == 0)
            acc.template select<kTile, 1>(rg * kTile) = xmx::dpas<8, 8, float, T, T>(bt, at);
          else
            acc.template select<kTile, 1>(rg * kTile) = xmx::dpas<8, 8, float, float, T, T>(
                simd<float, kTile>(acc.template select<kTile, 1>(rg * kTile)), bt, at);
        }
    }
    epi(nt, acc);
  }
}

// Biases of one layer (packed [n_layers][FMLP_ESIMD_MAX_WIDTH], zeros where the net has
// none) for column tiles 2 q and 2 q + 1: one 2-D load of 2 rows (the layer's and the
// next) x 32 columns, the widest a 16-bit block message reads; column c at c % 32.
template <typename T> inline simd<T, 64> load_bias(const T *bias, int n_layers, int l, int q) {
  constexpr uint32_t pitch = FMLP_ESIMD_MAX_WIDTH * sizeof(T) - 1;
  return xesimd::lsc_load_2d<T, 32, 2, 1>(bias, pitch, n_layers - 1, pitch, q * 32, l);
}
constexpr int bias_at(int c) { return c % 32; }

// Every block of R rows this thread owns: body(r0, rows) (blocks dealt round-robin over
// all threads of the grid; `rows` counts the rows from r0 to the end, so a block past it
// masks what it reads and writes).
template <int R, class Body> inline void for_each_row_block(const FmlpEsimdArgs &p, Body &&body) {
  auto it = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int64_t blocks = (p.n_rows + R - 1) / R;
  const int64_t stride = static_cast<int64_t>(it.get_global_range(0));
  for (int64_t blk = static_cast<int64_t>(it.get_global_id(0)); blk < blocks; blk += stride)
    body(blk * R, p.n_rows - blk * R);
}

// ---- forward -----------------------------------------------------------------------------
// A layer's output column: z = acc + b in fp32, saved rounded where training asks (z, the
// block's first row of saved z, != nullptr; the column at col0), h = round(act(z)) (on the
// rounded z unless A rounds once).
template <typename T, int RG, int A, bool ZB>
inline simd<T, RG * kTile> fwd_epilogue(simd<float, RG * kTile> &acc, simd<float, 16> b, T *z,
                                        int64_t z_rs, int64_t rows, int col0, int cols,
                                        int z_w) {
  constexpr int C = RG * kTile;
  simd<float, 32> b2;
  b2.template select<16, 1>(0) = b;
  b2.template select<16, 1>(16) = b;
  FMLP_UNROLL
  for (int i = 0; i < C / 32; ++i)
    acc.template select<32, 1>(i * 32) += b2;
  if constexpr (rounds_once<A>()) {
    if (z)
      store_col<T, RG, ZB>(z, z_rs, rows, col0, cols, z_w, simd<T, C>(acc));
    return simd<T, C>(act<A, C>(acc));
  } else {
    simd<T, C> zt(acc);
    if (z)
      store_col<T, RG, ZB>(z, z_rs, rows, col0, cols, z_w, zt);
    return simd<T, C>(act<A, C>(simd<float, C>(zt)));
  }
}

template <typename T, int IN, int H, int OUT, int A, int OA, int IO>
inline void forward(const FmlpEsimdArgs &p) {
  constexpr int RG = row_groups<H>(), R = 8 * RG, C = RG * kTile;
  constexpr int KI = IN / 16, KH = H / 16, NO = OUT / 16;
  constexpr bool XB = IO & kX2d, YB = IO & kY2d, ZB = IO & kZ2d;
  const T *x = static_cast<const T *>(p.src);
  T *y = static_cast<T *>(p.dst);
  const T *bias = static_cast<const T *>(p.bias);
  T *z = static_cast<T *>(p.z);
  const uint32_t *w = static_cast<const uint32_t *>(p.wpack);
  const uint32_t w_rows_m1 = static_cast<uint32_t>(p.wpack_words / 16 - 1);
  const int L = p.n_layers;
  const int z_w = static_cast<int>(p.z_rs);
  for_each_row_block<R>(p, [&](int64_t r0, int64_t rows) {
    T *zr = z ? z + r0 * p.z_rs : nullptr;  // this block's saved z, layer l at l * hid_w
    simd<T, RG * KH * kTile> h;
    {
      simd<T, RG * KI * kTile> a =
          load_rows<T, RG, KI, XB>(x + r0 * p.src_rs, p.src_rs, p.src_cs, rows, p.in_w);
      simd<T, 64> bl = load_bias<T>(bias, L, 0, 0);
      layer<T, RG, KI, KH>(a, w, w_rows_m1, 0, [&](int nt, simd<float, C> &acc) {
        if (nt % 2 == 0 && nt) bl = load_bias<T>(bias, L, 0, nt / 2);
        h.template select<C, 1>(nt * C) = fwd_epilogue<T, RG, A, ZB>(
            acc, bl.template select<16, 1>(bias_at(nt * 16)), zr, p.z_rs, rows, nt * 16,
            p.hid_w - nt * 16, z_w);
      });
    }
    int t0 = KI * KH;
    for (int l = 1; l < L - 1; ++l) {
      simd<T, RG * KH * kTile> a = h;
      simd<T, 64> bl = load_bias<T>(bias, L, l, 0);
      layer<T, RG, KH, KH>(a, w, w_rows_m1, t0, [&](int nt, simd<float, C> &acc) {
        if (nt % 2 == 0 && nt) bl = load_bias<T>(bias, L, l, nt / 2);
        h.template select<C, 1>(nt * C) = fwd_epilogue<T, RG, A, ZB>(
            acc, bl.template select<16, 1>(bias_at(nt * 16)), zr, p.z_rs, rows,
            l * p.hid_w + nt * 16, p.hid_w - nt * 16, z_w);
      });
      t0 += KH * KH;
    }
    T *zo = OA ? zr : nullptr;  // the output's z only where its activation needs it
    T *yr = y + r0 * p.out_w;
    simd<T, 64> bl = load_bias<T>(bias, L, L - 1, 0);
    layer<T, RG, KH, NO>(h, w, w_rows_m1, t0, [&](int nt, simd<float, C> &acc) {
      if (nt % 2 == 0 && nt) bl = load_bias<T>(bias, L, L - 1, nt / 2);
      simd<T, C> yt = fwd_epilogue<T, RG, OA, ZB>(
          acc, bl.template select<16, 1>(bias_at(nt * 16)), zo, p.z_rs, rows,
          (L - 1) * p.hid_w + nt * 16, p.out_w - nt * 16, z_w);
      store_col<T, RG, YB>(yr, p.out_w, rows, nt * 16, p.out_w - nt * 16, p.out_w, yt);
    });
  });
}

// ---- row backward -------------------------------------------------------------------------
// g_L = gy * out_act'(z_L); g_{l-1} = (g_l W_l) * act'(z_{l-1}); gx = g_1 W_1. The weights
// come packed for W (not W^T): tile (n, k) of layer l multiplies g_l's column tile k
// into the layer's input column tile n, layers in reverse order (layer L-1 first).
// One output column: v (the product, fp32) rounded to T, times act'(z) rounded again
// (relu: masked, exact; none: the bare round), stored to dz where dz is set.
template <typename T, int RG, int A, bool ZB>
inline simd<T, RG * kTile> bwd_epilogue(simd<float, RG * kTile> v, const T *z, int64_t z_rs,
                                        T *dz, int64_t dz_rs, int64_t rows, int col0, int cols,
                                        int z_w, int dz_w) {
  constexpr int C = RG * kTile;
  simd<T, C> g;
  if constexpr (A == 0) {
    g = simd<T, C>(v);
  } else {
    simd<float, C> zf(load_col<T, RG, ZB>(z, z_rs, rows, col0, cols));
    if constexpr (A == 1)
      g = simd<T, C>(esimd::merge(simd<float, C>(0.0f), v, zf <= 0.0f));  // threshold_backward
    else
      g = simd<T, C>(simd<float, C>(simd<T, C>(v)) * act_grad<A, C>(zf));
  }
  if (dz)
    store_col<T, RG, ZB>(dz, dz_rs, rows, col0, cols, dz_w, g);
  return g;
}

template <typename T, int IN, int H, int OUT, int A, int OA, int IO>
inline void backward_rows(const FmlpEsimdArgs &p) {
  constexpr int RG = row_groups<H>(), R = 8 * RG, C = RG * kTile;
  constexpr int KI = IN / 16, KH = H / 16, KO = OUT / 16;
  constexpr bool XB = IO & kX2d, YB = IO & kY2d, ZB = IO & kZ2d;
  const T *gy = static_cast<const T *>(p.src);
  T *gx = static_cast<T *>(p.dst);
  const T *z = static_cast<const T *>(p.z);
  T *dz = static_cast<T *>(p.dz);
  const uint32_t *w = static_cast<const uint32_t *>(p.wpack);
  const uint32_t w_rows_m1 = static_cast<uint32_t>(p.wpack_words / 16 - 1);
  const int L = p.n_layers;
  const int z_w = static_cast<int>(p.z_rs), dz_w = static_cast<int>(p.dz_rs);
  for_each_row_block<R>(p, [&](int64_t r0, int64_t rows) {
    const T *zr = z ? z + r0 * p.z_rs : nullptr;
    T *dzr = dz ? dz + r0 * p.dz_rs : nullptr;
    const int zo = (L - 1) * p.hid_w;
    simd<T, RG * KO * kTile> go =
        load_rows<T, RG, KO, YB>(gy + r0 * p.src_rs, p.src_rs, p.src_cs, rows, p.out_w);
    FMLP_UNROLL
    for (int nt = 0; nt < KO; ++nt)
      go.template select<C, 1>(nt * C) = bwd_epilogue<T, RG, OA, ZB>(
          simd<float, C>(go.template select<C, 1>(nt * C)), zr, p.z_rs, dzr, p.dz_rs, rows,
          zo + nt * 16, p.out_w - nt * 16, z_w, dz_w);
    simd<T, RG * KH * kTile> g;
    const int zl0 = (L - 2) * p.hid_w;
    layer<T, RG, KO, KH>(go, w, w_rows_m1, 0, [&](int nt, simd<float, C> &acc) {
      g.template select<C, 1>(nt * C) = bwd_epilogue<T, RG, A, ZB>(
          acc, zr, p.z_rs, dzr, p.dz_rs, rows, zl0 + nt * 16, p.hid_w - nt * 16, z_w, dz_w);
    });
    int t0 = KO * KH;
    for (int l = L - 2; l >= 1; --l) {
      simd<T, RG * KH * kTile> a = g;
      const int zl = (l - 1) * p.hid_w;
      layer<T, RG, KH, KH>(a, w, w_rows_m1, t0, [&](int nt, simd<float, C> &acc) {
        g.template select<C, 1>(nt * C) = bwd_epilogue<T, RG, A, ZB>(
            acc, zr, p.z_rs, dzr, p.dz_rs, rows, zl + nt * 16, p.hid_w - nt * 16, z_w, dz_w);
      });
      t0 += KH * KH;
    }
    if (gx) {
      T *gxr = gx + r0 * p.in_w;
      layer<T, RG, KH, KI>(g, w, w_rows_m1, t0, [&](int nt, simd<float, C> &acc) {
        store_col<T, RG, XB>(gxr, p.in_w, rows, nt * 16, p.in_w - nt * 16, p.in_w,
                             simd<T, C>(acc));
      });
    }
  });
}

// ---- weight gradients -------------------------------------------------------------------
// One layer: dW[o, i] = sum_r dz[r, o] * h[r, i], h = act(src) (x for the first layer,
// the saved z of the layer before otherwise), db[o] = sum_r dz[r, o]. A thread owns a
// 32 x 32 tile of dW (4 dpas M-repeats x 2 N tiles) and sums its work-group's row slice
// 16 rows (one dpas K) at a time; each work-group writes its partial sums, which the
// host adds (the one cross-group reduction). A = dz^T (8 outputs x 16 rows), B = h
// (16 rows x 16 inputs, VNNI).
template <typename T>
inline void weight_grads(const FmlpEsimdWgradArgs &p) {
  constexpr int MR = 4, NR = 2;
  auto it = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(it.get_local_id(0));
  const int64_t grp = it.get_group(0);
  const int tiles_n = (p.in_w + 16 * NR - 1) / (16 * NR);
  const int tiles_m = (p.out_w + 8 * MR - 1) / (8 * MR);
  if (lid >= tiles_m * tiles_n) return;
  const int o0 = (lid / tiles_n) * 8 * MR, i0 = (lid % tiles_n) * 16 * NR;
  const T *dz = static_cast<const T *>(p.dz);
  const T *src = static_cast<const T *>(p.src);
  const int64_t lo = grp * p.rows_per_group;
  const int64_t hi = p.n_rows < lo + p.rows_per_group ? p.n_rows : lo + p.rows_per_group;

  simd<float, MR * NR * kTile> acc(0.0f);
  simd<float, MR * kTile> bacc(0.0f);
  simd<uint32_t, 16> lane(0, 1);
  simd<uint32_t, 32> lane32(0, 1);
  for (int64_t r = lo; r < hi; r += 16) {
    const int64_t rows = hi - r;
    simd_mask<16> row_ok = lane < static_cast<uint32_t>(rows < 16 ? rows : 16);
    // A tiles: a[m][k] = dz[r + k][o0 + 8 mr + m], one gather down a column per m
    simd<T, MR * kTile> a;
    FMLP_UNROLL
    for (int mr = 0; mr < MR; ++mr)
      FMLP_UNROLL
      for (int m = 0; m < 8; ++m) {
        const int o = o0 + mr * 8 + m;
        simd<T, 16> v(0.0f);
        if (o < p.out_w) {
          simd<uint32_t, 16> offs = lane * static_cast<uint32_t>(p.dz_rs * sizeof(T));
          v = esimd::gather<T, 16>(dz + r * p.dz_rs + o, offs, row_ok);
          v = esimd::merge(v, simd<T, 16>(0.0f), row_ok);
        }
        a.template select<16, 1>(mr * kTile + m * 16) = v;
      }
    // B tiles: b[(k / 2) * 32 + n * 2 + k % 2] = act(src[r + k][i0 + 16 nr + n])
    simd<uint32_t, 32> kk = (lane32 & 1u), nn = (lane32 >> 1);
    FMLP_UNROLL
    for (int nr = 0; nr < NR; ++nr) {
      simd<T, kBTile> b;
      FMLP_UNROLL
      for (int kp = 0; kp < 8; ++kp) {
        simd<uint32_t, 32> row = kk + 2 * kp;
        simd<uint32_t, 32> col = nn + (i0 + 16 * nr);
        simd_mask<32> ok = (row < static_cast<uint32_t>(rows < 16 ? rows : 16)) &
                           (col < static_cast<uint32_t>(p.in_w));
        simd<uint32_t, 32> offs = (row * static_cast<uint32_t>(p.src_rs) +
                                   col * static_cast<uint32_t>(p.src_cs)) * static_cast<uint32_t>(sizeof(T));
        simd<T, 32> v = esimd::gather<T, 32>(src + r * p.src_rs, offs, ok);
        b.template select<32, 1>(kp * 32) = esimd::merge(v, simd<T, 32>(0.0f), ok);
      }
      // act(0) lands where rows or columns are out of range: harmless, as the A tiles
      // are 0 on those rows and the host drops the padded columns
      if (p.src_act != 0) {
FMLP_NOUNROLL
        for (int c = 0; c < kBTile / 16; ++c) {
          simd<float, 16> v(b.template select<16, 1>(c * 16));
          b.template select<16, 1>(c * 16) = simd<T, 16>(act_rt<16>(p.src_act, v));
        }
      }
      FMLP_UNROLL
      for (int mr = 0; mr < MR; ++mr) {
        simd<float, kTile> c = acc.template select<kTile, 1>((mr * NR + nr) * kTile);
        simd<T, kTile> at = a.template select<kTile, 1>(mr * kTile);
        acc.template select<kTile, 1>((mr * NR + nr) * kTile) = xmx::dpas<8, 8, float, float, T, T>(c, b, at);
      }
    }
    if (i0 == 0 && p.gb)
      bacc += simd<float, MR * kTile>(a);
  }
  // partials: gw[grp][o][i] (o, i padded to out_pad, in_pad), gb[grp][o][16 lanes]
  float *gw = static_cast<float *>(p.gw) + grp * p.out_pad * p.in_pad;
  simd<uint32_t, 16> offs = lane * 4u;
  FMLP_UNROLL
  for (int mr = 0; mr < MR; ++mr)
    FMLP_UNROLL
    for (int m = 0; m < 8; ++m) {
      const int o = o0 + mr * 8 + m;
      if (o >= p.out_pad) continue;
      FMLP_UNROLL
      for (int nr = 0; nr < NR; ++nr) {
        const int i = i0 + nr * 16;
        if (i >= p.in_pad) continue;
        esimd::scatter<float, 16>(gw + o * p.in_pad + i, offs,
                                  acc.template select<16, 1>((mr * NR + nr) * kTile + m * 16));
      }
      if (i0 == 0 && p.gb)
        esimd::scatter<float, 16>(static_cast<float *>(p.gb) + (grp * p.out_pad + o) * 16, offs,
                                  bacc.template select<16, 1>(mr * kTile + m * 16));
    }
}

} // namespace fmlp_esimd

// On the GPU the kernels ask for PVC's large register file (256 GRF: the row tiles fit
// without spills there; FMLP_ESIMD_LARGE_GRF, set by the backend). The runtime turns the
// property into the device compiler's option and keeps such images from devices without
// the mode, so ci/aot_sycl.py builds on the CPU device without the property and passes
// ocloc -ze-opt-large-register-file itself.
//
// The float mode: round to nearest, fp16 and fp32 subnormals kept (fp_control): without
// the property the device's default mode decides, and eager PyTorch keeps fp16
// subnormals (down to 2^-24) that a flushing mode would turn to 0. Like grf_size, the
// property keeps an image from the OpenCL CPU device, so it comes with
// FMLP_ESIMD_LARGE_GRF (the GPU build) only; the emulation keeps subnormals throughout.
#ifndef FMLP_ESIMD_LARGE_GRF
#define FMLP_ESIMD_FP
#else
#include <sycl/ext/intel/experimental/fp_control_kernel_properties.hpp>
#define FMLP_ESIMD_FP                                                                       \
  , sycl::ext::intel::experimental::fp_control<                                             \
        sycl::ext::intel::experimental::fp_mode::round_to_nearest |                         \
        sycl::ext::intel::experimental::fp_mode::denorm_hf_allow |                          \
        sycl::ext::intel::experimental::fp_mode::denorm_f_allow>
#endif
#ifndef FMLP_ESIMD_LARGE_GRF
#define FMLP_ESIMD_PROPS (sycl::ext::oneapi::experimental::nd_range_kernel<1> FMLP_ESIMD_FP)
#else
#define FMLP_ESIMD_PROPS                                                                    \
  (sycl::ext::oneapi::experimental::nd_range_kernel<1>,                                     \
   sycl::ext::intel::experimental::grf_size<256> FMLP_ESIMD_FP)
#endif
#define FMLP_ESIMD_KERNEL_DECL(name, ArgT)                                                  \
  extern "C" SYCL_EXTERNAL SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(FMLP_ESIMD_PROPS)               \
      FMLP_ESIMD_KERNEL void name(ArgT p)

// One configuration: t in f16/bf16 (type T), padded widths IN, H, OUT, activation ids A
// (hidden) and OA (output), I/O mode IO (kX2d | kY2d | kZ2d).
#define FMLP_ESIMD_FWD(t, T, IN, H, OUT, A, OA, IO)                                         \
  FMLP_ESIMD_KERNEL_DECL(fmlp_esimd_fwd_##t##_##IN##_##H##_##OUT##_a##A##_##OA##_io##IO,     \
                         FmlpEsimdArgs) {                                                    \
    fmlp_esimd::forward<T, IN, H, OUT, A, OA, IO>(p);                                        \
  }
#define FMLP_ESIMD_BWD(t, T, IN, H, OUT, A, OA, IO)                                         \
  FMLP_ESIMD_KERNEL_DECL(fmlp_esimd_bwd_##t##_##IN##_##H##_##OUT##_a##A##_##OA##_io##IO,     \
                         FmlpEsimdArgs) {                                                    \
    fmlp_esimd::backward_rows<T, IN, H, OUT, A, OA, IO>(p);                                  \
  }
#define FMLP_ESIMD_WGRAD(t, T)                                                              \
  FMLP_ESIMD_KERNEL_DECL(fmlp_esimd_wgrad_##t, FmlpEsimdWgradArgs) {                         \
    fmlp_esimd::weight_grads<T>(p);                                                          \
  }
