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
//   fmlp_esimd_wgrad_<t>_a<act>_io<IO>  every layer's weight/bias gradient partial sums
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

// ---- rows in and out of registers ------------------------------------------------------
// The byte offsets of 16 consecutive columns from a row's start, 64-bit: a column-major x
// of 64 columns passes 2^32 bytes of column stride product at ~34M rows.
template <typename T> inline simd<uint64_t, 16> col_offsets(int col0, int64_t cs) {
  simd<uint64_t, 16> lane(0, 1);
  return (lane + static_cast<uint64_t>(col0)) * static_cast<uint64_t>(cs * sizeof(T));
}

// 16 elements at byte offsets `offs` from `p` where `ok`, zero elsewhere and where the whole
// row is out (`valid` false: no message at all).
template <typename T>
inline simd<T, 16> gather16(const T *p, simd<uint64_t, 16> offs, simd_mask<16> ok, bool valid) {
  simd<T, 16> v(0.0f);
  if (valid) {
    v = esimd::gather<T, 16>(p, offs, ok);
    v = esimd::merge(v, simd<T, 16>(0.0f), ok);
  }
  return v;
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
        a.template select<16, 1>(kt * R * 16 + r * 16) =
            gather16<T>(base + r * rs, offs, col_ok, r < rows);
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
      t.template select<16, 1>(r * 16) = gather16<T>(base + r * ld, offs, col_ok, r < rows);
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
// Every layer in one launch: dW_l[o, i] = sum_r dz_l[r, o] * h_l[r, i], h_0 = x, h_l =
// act(z_{l-1}), db_l[o] = sum_r dz_l[r, o]. A thread owns one 32 x 32 tile of one layer's
// dW (4 output groups of 8 x 2 input tiles of 16) over one chunk of rows, 32 rows (two
// dpas K steps) at a time, and writes its partial sums; one sum on the device adds the
// chunks. Threads are dealt (chunk, layer, tile) so every one has work.
//   A = dz^T (8 outputs x 16 rows): a transposed 2-D load of dz as dwords (output pairs),
//       16 rows x 16 outputs, gives [output pair][row][pair half]; 8 strided moves a
//       tile make its rows.
//   B = h (16 rows x 16 inputs, VNNI): one VNNI-transformed 2-D load, 32 rows x 32 inputs.
//   db: dz^T times a B tile of ones (every column of the result is the row sum), by the
//       threads of input tile 0.
// Rows past n read 0 (the surface's height clips). Columns past a layer's width read
// the next layer's z or dz (the row is one surface): they land in dW's padded rows and
// columns only, which the host drops. ZB/XB: dz and z, and x, by 2-D block messages;
// otherwise gathers with 64-bit offsets (odd widths, strided x).
constexpr int kWgM = 32, kWgN = 32, kWgK = 32;  // thread tile: outputs, inputs, rows a step

// A tiles of 32 outputs from column col0 x 32 rows of dz, base its row (rows `rows` left;
// columns from `end` on zero on the gather path; the block path's surface is the whole row
// of surf_w columns, its base the row: 64-byte aligned): tile (kh, mg) at (kh * 4 + mg) * 128.
template <typename T, bool BLOCK>
inline simd<T, 8 * kTile> load_dzT(const T *base, int64_t rs, int64_t rows, int col0, int end,
                                   int surf_w) {
  simd<T, 8 * kTile> a;
  if constexpr (BLOCK) {
    auto a16 = a.template bit_cast_view<uint16_t>();
    // 16 outputs x 16 rows a message: 8 dwords x 16 rows transposed (IGC 22.43 rejects
    // 32 rows: "block2d cols * data size must be <= 64", though PVC documents 32)
    FMLP_UNROLL
    for (int half = 0; half < 2; ++half)
      FMLP_UNROLL
      for (int kh = 0; kh < 2; ++kh) {
        const uint32_t h = static_cast<uint32_t>(rows - kh * 16 - 1);  // rows - 16 may be <= 0
        simd<uint32_t, 128> t(0);
        if (rows > kh * 16)
          t = xesimd::lsc_load_2d<uint32_t, 8, 16, 1, true, false>(
              reinterpret_cast<const uint32_t *>(base + kh * 16 * rs), surf_w * sizeof(T) - 1,
              h < 15 ? h : 15, rs * sizeof(T) - 1, col0 / 2 + half * 8, 0);
        auto u = t.template bit_cast_view<uint16_t>();  // (pair c, row r, half p): (c*16+r)*2+p
        FMLP_UNROLL
        for (int mg = 0; mg < 2; ++mg)
          FMLP_UNROLL
          for (int m = 0; m < 8; ++m)
            a16.template select<16, 1>(((kh * 4 + half * 2 + mg) * 8 + m) * 16) =
                u.template select<16, 2>((mg * 4 + m / 2) * 32 + m % 2);
      }
  } else {
    simd<uint32_t, 16> lane(0, 1);
    FMLP_UNROLL
    for (int kh = 0; kh < 2; ++kh) {
      simd<uint64_t, 16> offs = (simd<uint64_t, 16>(lane) + kh * 16) *
                                static_cast<uint64_t>(rs * sizeof(T));
      simd_mask<16> ok = (lane + kh * 16) < static_cast<uint32_t>(rows < kWgK ? rows : kWgK);
      FMLP_UNROLL
      for (int o = 0; o < kWgM; ++o) {
        a.template select<16, 1>(((kh * 4 + o / 8) * 8 + o % 8) * 16) =
            gather16<T>(base + col0 + o, offs, ok, col0 + o < end);
      }
    }
  }
  return a;
}

// B tiles of 32 rows x 32 inputs from column col0 (columns from `end` on zero on the gather
// path; the block path as load_dzT's) of rows at base (row stride rs, column stride cs):
// tile (nb, kh) at (nb * 2 + kh) * 256, VNNI.
template <typename T, bool BLOCK>
inline simd<T, 4 * kBTile> load_h(const T *base, int64_t rs, int64_t cs, int64_t rows, int col0,
                                  int end, int surf_w) {
  if constexpr (BLOCK) {
    const uint32_t h = static_cast<uint32_t>((rows < kWgK ? rows : kWgK) - 1);
    return xesimd::lsc_load_2d<T, 16, 32, 2, false, true>(base, surf_w * sizeof(T) - 1, h,
                                                         rs * sizeof(T) - 1, col0, 0);
  } else {
    // one gather a column (32 rows; 32-bit offsets within the row block, the column in the
    // 64-bit base: a column-major x's column stride may pass 2^32 bytes), spread into VNNI
    simd<T, 4 * kBTile> b(0.0f);
    simd<uint32_t, 32> row(0, 1);
    simd<uint32_t, 32> offs = row * static_cast<uint32_t>(rs * sizeof(T));
    simd_mask<32> ok = row < static_cast<uint32_t>(rows < kWgK ? rows : kWgK);
    FMLP_UNROLL
    for (int c = 0; c < 32; ++c) {
      if (col0 + c >= end)
        continue;
      simd<T, 32> v = esimd::gather<T, 32>(base + (col0 + c) * cs, offs, ok);
      v = esimd::merge(v, simd<T, 32>(0.0f), ok);
      FMLP_UNROLL
      for (int kh = 0; kh < 2; ++kh)
        FMLP_UNROLL
        for (int par = 0; par < 2; ++par)  // rows kh*16 + 2j + par at (j, n, par)
          b.template select<8, 32>(((c / 16) * 2 + kh) * kBTile + (c % 16) * 2 + par) =
              v.template select<8, 2>(kh * 16 + par);
    }
    return b;
  }
}

// h = act(z) in place, elementwise (the VNNI order does not matter). relu on the bits:
// 0 where the sign is set, except -0 and NaN (as act<1>: merge(0, z, z < 0)).
template <typename T, int A, int N> inline void act_inplace(simd<T, N> &b) {
  if constexpr (A == 1) {
    constexpr uint16_t neg_inf = std::is_same_v<T, half> ? 0xFC00 : 0xFF80;
    auto u = b.template bit_cast_view<uint16_t>();
    simd<uint16_t, N> v(u);
    simd<uint16_t, N> d(v - uint16_t(0x8001));
    u = esimd::merge(simd<uint16_t, N>(0), v, d < uint16_t(neg_inf - 0x8000));
  } else if constexpr (A != 0) {
    FMLP_UNROLL
    for (int c = 0; c < N / 32; ++c) {
      simd<float, 32> v(b.template select<32, 1>(c * 32));
      b.template select<32, 1>(c * 32) = simd<T, 32>(act<A, 32>(v));
    }
  }
}

template <typename T, int A, int IO>
inline void weight_grads(const FmlpEsimdWgradArgs &p) {
  constexpr bool XB = IO & kX2d, ZB = IO & kZ2d;
  auto it = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int L = p.n_layers;
  const int th = (p.hid_w + kWgM - 1) / kWgM;  // tiles along a hidden width
  const int t_first = th * ((p.in_w + kWgN - 1) / kWgN), t_mid = th * th;
  const int t_last = ((p.out_w + kWgM - 1) / kWgM) * th;
  const int tiles = t_first + (L - 2) * t_mid + t_last;
  const int64_t gid = static_cast<int64_t>(it.get_global_id(0));
  if (gid >= static_cast<int64_t>(tiles) * p.chunks) return;
  const int chunk = static_cast<int>(gid / tiles);
  int t = static_cast<int>(gid % tiles), l, tn;
  if (t < t_first) {
    l = 0, tn = (p.in_w + kWgN - 1) / kWgN;
  } else if (t - t_first < (L - 2) * t_mid) {
    t -= t_first, l = 1 + t / t_mid, t %= t_mid, tn = th;
  } else {
    t -= t_first + (L - 2) * t_mid, l = L - 1, tn = th;
  }
  const int o0 = (t / tn) * kWgM, i0 = (t % tn) * kWgN;
  const int out_w = l == L - 1 ? p.out_w : p.hid_w, in_w = l == 0 ? p.in_w : p.hid_w;
  const T *dz = static_cast<const T *>(p.dz), *z = static_cast<const T *>(p.z);
  const T *x = static_cast<const T *>(p.x);
  const int dz_c = l * p.hid_w, z_c = (l - 1) * p.hid_w;  // this layer's first columns
  const int64_t lo = chunk * p.rows_per_chunk;
  const int64_t hi = p.n_rows < lo + p.rows_per_chunk ? p.n_rows : lo + p.rows_per_chunk;
  const bool with_bias = p.gb && i0 == 0;
  const simd<T, kBTile> ones(1.0f);

  simd<float, 8 * kTile> acc(0.0f);   // tile (mg, nb) at (mg * 2 + nb) * 128
  simd<float, 4 * kTile> bacc(0.0f);  // tile mg: every column the row sum
  for (int64_t r = lo; r < hi; r += kWgK) {
    const int64_t rows = hi - r;
    simd<T, 8 * kTile> a = load_dzT<T, ZB>(dz + r * p.dz_rs, p.dz_rs, rows, dz_c + o0,
                                           dz_c + out_w, static_cast<int>(p.dz_rs));
    simd<T, 4 * kBTile> b;
    if (l == 0) {
      b = load_h<T, XB>(x + r * p.x_rs, p.x_rs, p.x_cs, rows, i0, in_w, p.in_w);
    } else {
      b = load_h<T, ZB>(z + r * p.z_rs, p.z_rs, 1, rows, z_c + i0, z_c + in_w,
                        static_cast<int>(p.z_rs));
      act_inplace<T, A>(b);
    }
    FMLP_UNROLL
    for (int kh = 0; kh < 2; ++kh)
      FMLP_UNROLL
      for (int mg = 0; mg < 4; ++mg) {
        simd<T, kTile> at = a.template select<kTile, 1>((kh * 4 + mg) * kTile);
        FMLP_UNROLL
        for (int nb = 0; nb < 2; ++nb) {
          simd<float, kTile> c = acc.template select<kTile, 1>((mg * 2 + nb) * kTile);
          simd<T, kBTile> bt = b.template select<kBTile, 1>((nb * 2 + kh) * kBTile);
          acc.template select<kTile, 1>((mg * 2 + nb) * kTile) =
              xmx::dpas<8, 8, float, float, T, T>(c, bt, at);
        }
        if (with_bias) {
          simd<float, kTile> c = bacc.template select<kTile, 1>(mg * kTile);
          bacc.template select<kTile, 1>(mg * kTile) =
              xmx::dpas<8, 8, float, float, T, T>(c, ones, at);
        }
      }
  }
  // partials: gw[l][chunk] is [out_pad][in_pad], gb[l][chunk] is [out_pad][16]
  const int64_t part = static_cast<int64_t>(l) * p.chunks + chunk;
  float *gw = static_cast<float *>(p.gw) + part * p.out_pad * p.in_pad;
  const uint32_t gw_w = p.in_pad * 4 - 1, gw_h = p.out_pad - 1;
  FMLP_UNROLL
  for (int mg = 0; mg < 4; ++mg)
    FMLP_UNROLL
    for (int nb = 0; nb < 2; ++nb)
      xesimd::lsc_store_2d<float, 16, 8>(
          gw, gw_w, gw_h, gw_w, i0 + nb * 16, o0 + mg * 8,
          simd<float, kTile>(acc.template select<kTile, 1>((mg * 2 + nb) * kTile)));
  if (with_bias) {
    float *gb = static_cast<float *>(p.gb) + part * p.out_pad * 16;
    FMLP_UNROLL
    for (int mg = 0; mg < 4; ++mg)
      xesimd::lsc_store_2d<float, 16, 8>(gb, 63, gw_h, 63, 0, o0 + mg * 8,
                                         simd<float, kTile>(bacc.template select<kTile, 1>(mg * kTile)));
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
#define FMLP_ESIMD_WGRAD(t, T, A, IO)                                                       \
  FMLP_ESIMD_KERNEL_DECL(fmlp_esimd_wgrad_##t##_a##A##_io##IO, FmlpEsimdWgradArgs) {         \
    fmlp_esimd::weight_grads<T, A, IO>(p);                                                   \
  }
