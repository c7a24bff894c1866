// fused_mlp_esimd.cpp: the narrow fused MLP for the Intel Data Center GPU Max 1550 (PVC)
// in ESIMD: every layer's matmul on the XMX engines (xmx::dpas), rows carried through
// all layers in registers, the weights staged once per work-group in SLM.
//
// One ESIMD work-item is one hardware thread. A thread owns R = 8 * RG rows at a time
// (RG row groups of 8, dpas's RepeatCount) and holds them as dpas A tiles: tile (rg, t)
// is 8 rows x 16 columns, row-major, at (rg * TILES + t) * 128. A dpas result tile is
// laid out like an A tile, so a layer's output is the next layer's input with no
// shuffle: h_next(rg, n) = sum_k dpas(h(rg, k), W^T(k, n)).
//
// Widths: the input, hidden and output widths are padded on chip (never in memory) to
// IN, H, OUT in {16, 32, 64, 128}: x columns past in_w load as 0, the host packs zero
// weights there. Every hidden layer has the same width. The host packs the weights
// (fusedmlp_xpu/backends/sycl_esimd.py) as dpas B tiles, 16 x 16 in VNNI order, tile
// (n, k) of layer l at layer_offset(l) + (n * KT + k) * 256 elements.
//
// Kernels (one configuration each; the host appends FMLP_ESIMD_* lines to instantiate):
//   fmlp_esimd_fwd_<t>_<IN>_<H>_<OUT>   forward; saves z when args.z is set (training)
//   fmlp_esimd_bwd_<t>_<IN>_<H>_<OUT>   row backward: dL/dz of every layer, dL/dx
//   fmlp_esimd_wgrad_<t>                one layer's weight/bias gradient partial sums
//
// Rounding follows eager PyTorch in the operand dtype (as fused_mlp.cpp): each layer's
// result and each activation are rounded to T; activations run in fp32.
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
constexpr int kSlmBytes = FMLP_ESIMD_SLM_BYTES;    // the packed weights of every layer
constexpr int kTile = 128;                         // 8 x 16 elements: one A or C tile
constexpr int kBTile = 256;                        // 16 x 16 elements: one B tile (VNNI)

// rows a thread carries at once, by hidden width: the register budget (256 GRF x 64 B)
// holds the input tiles, the output tiles and one column of fp32 accumulators.
template <int H> constexpr int row_groups() { return H >= 128 ? 1 : 2; }

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

template <int N> inline simd<float, N> act_fn(int id, simd<float, N> z) {
  switch (id) {
  case 1: return esimd::merge(simd<float, N>(0.0f), z, z < 0.0f);  // NaN stays NaN
  case 2: return esimd::merge(z, z * kLeakySlope, z > 0.0f);
  case 3: return 0.5f * z * (1.0f + erf_<N>(z * kSqrt1_2));
  case 4: return 0.5f * z * (1.0f + tanh_<N>(kSqrt2OverPi * (z + kGeluTanhC * z * z * z)));
  case 5: return z * sigmoid<N>(z);
  case 6: return sigmoid<N>(z);
  case 7: return tanh_<N>(z);
  case 8: return esimd::merge(z, esimd::log(1.0f + esimd::exp(z)), z > kSoftplusThreshold);
  default: return z;
  }
}

// d act / d z at z (as torch's backward formulas; NaN passes)
template <int N> inline simd<float, N> act_grad(int id, simd<float, N> z) {
  switch (id) {
  case 1: return esimd::merge(simd<float, N>(0.0f), simd<float, N>(1.0f), z <= 0.0f) +
                 0.0f * z;  // 0 * NaN keeps a NaN z visible, as threshold_backward
  case 2: return esimd::merge(simd<float, N>(1.0f), simd<float, N>(kLeakySlope), z > 0.0f) +
                 0.0f * z;
  case 3: return 0.5f * (1.0f + erf_<N>(z * kSqrt1_2)) +
                 z * kInvSqrt2Pi * esimd::exp(-0.5f * z * z);
  case 4: {
    simd<float, N> t = tanh_<N>(kSqrt2OverPi * (z + kGeluTanhC * z * z * z));
    simd<float, N> d = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhC * z * z);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * d;
  }
  case 5: { simd<float, N> s = sigmoid<N>(z); return s * (1.0f + z * (1.0f - s)); }
  case 6: { simd<float, N> s = sigmoid<N>(z); return s * (1.0f - s); }
  case 7: { simd<float, N> t = tanh_<N>(z); return 1.0f - t * t; }
  case 8: return esimd::merge(simd<float, N>(1.0f) + 0.0f * z, sigmoid<N>(z), z > kSoftplusThreshold);
  default: return simd<float, N>(1.0f) + 0.0f * z;
  }
}

// ---- rows in and out of registers ------------------------------------------------------
// The lanes of one 16-column slice of a row, as byte offsets from the row's start.
template <typename T> inline simd<uint32_t, 16> col_offsets(int col0, int64_t cs) {
  simd<uint32_t, 16> lane(0, 1);
  return (lane + col0) * static_cast<uint32_t>(cs * sizeof(T));
}

// A tiles of R = 8 * RG rows x 16 * KT columns from row-major strided memory; rows past
// `rows` and columns past `cols` are 0. Each element is read once.
template <typename T, int RG, int KT>
inline simd<T, RG * KT * kTile> load_tiles(const T *base, int64_t rs, int64_t cs, int64_t rows,
                                          int cols) {
  simd<T, RG * KT * kTile> a;
  simd<uint32_t, 16> lane(0, 1);
  FMLP_UNROLL
  for (int kt = 0; kt < KT; ++kt) {
    simd<uint32_t, 16> offs = col_offsets<T>(kt * 16, cs);
    simd_mask<16> col_ok = (lane + kt * 16) < static_cast<uint32_t>(cols);
    FMLP_UNROLL
    for (int rg = 0; rg < RG; ++rg)
      FMLP_UNROLL
      for (int m = 0; m < 8; ++m) {
        const int r = rg * 8 + m;
        simd<T, 16> v(0.0f);
        if (r < rows) {
          v = esimd::gather<T, 16>(base + r * rs, offs, col_ok);
          v = esimd::merge(v, simd<T, 16>(0.0f), col_ok);
        }
        a.template select<16, 1>((rg * KT + kt) * kTile + m * 16) = v;
      }
  }
  return a;
}

// Store tile (rg, nt) of `tiles` (row-major rows of 16 columns) to row-major memory with
// row stride rs, masking rows past `rows` and columns past `cols`.
template <typename T>
inline void store_tile(T *base, int64_t rs, int64_t rows, int cols, int rg, int nt,
                       simd<T, kTile> tile) {
  simd<uint32_t, 16> lane(0, 1);
  simd<uint32_t, 16> offs = col_offsets<T>(nt * 16, 1);
  simd_mask<16> col_ok = (lane + nt * 16) < static_cast<uint32_t>(cols);
  FMLP_UNROLL
  for (int m = 0; m < 8; ++m) {
    const int r = rg * 8 + m;
    if (r < rows)
      esimd::scatter<T, 16>(base + r * rs, offs, tile.template select<16, 1>(m * 16), col_ok);
  }
}

// One 8 x 16 tile of saved z (row-major [rows, width] at base, row stride rs).
template <typename T>
inline simd<T, kTile> load_tile(const T *base, int64_t rs, int64_t rows, int cols, int rg, int nt) {
  simd<T, kTile> t;
  simd<uint32_t, 16> lane(0, 1);
  simd<uint32_t, 16> offs = col_offsets<T>(nt * 16, 1);
  simd_mask<16> col_ok = (lane + nt * 16) < static_cast<uint32_t>(cols);
  FMLP_UNROLL
  for (int m = 0; m < 8; ++m) {
    const int r = rg * 8 + m;
    simd<T, 16> v(0.0f);
    if (r < rows) {
      v = esimd::gather<T, 16>(base + r * rs, offs, col_ok);
      v = esimd::merge(v, simd<T, 16>(0.0f), col_ok);
    }
    t.template select<16, 1>(m * 16) = v;
  }
  return t;
}

// 16-bit <-> fp32 by bits for bfloat16 (IGC 1.0.12504 fails to build some bf16
// conversions inside run-time loops), by conversion for half.
template <int N> inline simd<float, N> widen(simd<half, N> v) { return simd<float, N>(v); }
template <int N> inline simd<float, N> widen(simd<bf16, N> v) {
  simd<uint16_t, N> b = v.template bit_cast_view<uint16_t>();
  simd<uint32_t, N> u = simd<uint32_t, N>(b) << 16;
  return u.template bit_cast_view<float>();
}
template <typename T, int N> inline simd<T, N> narrow(simd<float, N> v);
template <> inline simd<half, 16> narrow<half, 16>(simd<float, 16> v) { return simd<half, 16>(v); }
template <> inline simd<bf16, 16> narrow<bf16, 16>(simd<float, 16> v) {
  simd<uint32_t, 16> u = v.template bit_cast_view<uint32_t>();
  // round to nearest even; NaN stays a (quiet) NaN
  simd<uint32_t, 16> r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  r = esimd::merge(simd<uint32_t, 16>((u >> 16) | 0x40u), r, v != v);
  simd<uint16_t, 16> h = r;
  return h.template bit_cast_view<bf16>();
}

// In place over every 16-column row slice of `tiles`: v = act(v), in fp32, rounded to
// T. A loop with a run-time index (not unrolled) and the switch inside: one copy of the
// activation code a call site, where unrolled tiles would repeat it for every tile.
template <typename T, int N>
inline void apply_act(simd<T, N> &tiles, int id) {
  if (id == 0) return;
FMLP_NOUNROLL
  for (int c = 0; c < N / 16; ++c) {
    simd<T, 16> t = tiles.template select<16, 1>(c * 16);
    simd<float, 16> v = widen(t);
    tiles.template select<16, 1>(c * 16) = narrow<T>(act_fn<16>(id, v));
  }
}

// In place: g = g * act'(z) for the tiles of R rows x 16 * NT columns, z read from
// row-major memory (row stride rs, `cols` valid columns); the result, rounded to T, is
// also stored to dz where dz is set (same layout as z).
template <typename T, int RG, int NT>
inline void times_act_grad(simd<T, RG * NT * kTile> &g, int id, const T *z, int64_t rs,
                           T *dz, int64_t dz_rs, int64_t rows, int cols) {
  simd<uint32_t, 16> lane(0, 1);
FMLP_NOUNROLL
  for (int c = 0; c < RG * NT * 8; ++c) {
    const int m = c % 8, nt = (c / 8) % NT, rg = c / (8 * NT), r = rg * 8 + m;
    if (r >= rows) continue;
    simd<uint32_t, 16> offs = col_offsets<T>(nt * 16, 1);
    simd_mask<16> col_ok = (lane + nt * 16) < static_cast<uint32_t>(cols);
    simd<T, 16> gt = g.template select<16, 1>(c * 16);
    if (id != 0) {
      simd<T, 16> zv = esimd::gather<T, 16>(z + r * rs, offs, col_ok);
      zv = esimd::merge(zv, simd<T, 16>(0.0f), col_ok);
      gt = narrow<T>(widen(gt) * act_grad<16>(id, widen(zv)));
    }
    g.template select<16, 1>(c * 16) = gt;
    if (dz)
      esimd::scatter<T, 16>(dz + r * dz_rs, offs, gt, col_ok);
  }
}

// ---- the matrix engine -----------------------------------------------------------------
// out(rg, n) = epi(n, sum_k a(rg, k) x B(n, k)), B tiles read from SLM at byte offset
// `slm`; only one column of accumulators (RG tiles of fp32) is live at a time.
template <typename T, int RG, int KT, int NT, class Epi>
inline void layer(simd<T, RG * KT * kTile> &a, uint32_t slm, Epi &&epi) {
  FMLP_UNROLL
  for (int nt = 0; nt < NT; ++nt) {
    simd<float, RG * kTile> acc(0.0f);
    FMLP_UNROLL
    for (int kt = 0; kt < KT; ++kt) {
      simd<T, kBTile> b = esimd::slm_block_load<T, kBTile>(
          slm + static_cast<uint32_t>((nt * KT + kt) * kBTile * sizeof(T)));
      FMLP_UNROLL
      for (int rg = 0; rg < RG; ++rg) {
        simd<float, kTile> c = acc.template select<kTile, 1>(rg * kTile);
        simd<T, kTile> at = a.template select<kTile, 1>((rg * KT + kt) * kTile);
        acc.template select<kTile, 1>(rg * kTile) =
            xmx::dpas<8, 8, float, float, T, T>(c, b, at);
      }
    }
    epi(nt, acc);
  }
}

// Every layer's packed B tiles, global -> SLM, by all threads of the work-group.
inline void stage_weights(const uint32_t *w, int words, int lid) {
  constexpr int kChunk = 64;  // 256 bytes a message
  for (int c = lid; c * kChunk < words; c += kWG) {
    simd<uint32_t, kChunk> v = esimd::block_load<uint32_t, kChunk>(w + c * kChunk);
    esimd::slm_block_store<uint32_t, kChunk>(static_cast<uint32_t>(c * kChunk * 4), v);
  }
  esimd::barrier();
}

template <int IN, int H, int OUT>
inline uint32_t layer_tiles(int l, int n_layers) {
  if (l == 0) return (IN / 16) * (H / 16);
  if (l == n_layers - 1) return (H / 16) * (OUT / 16);
  return (H / 16) * (H / 16);
}

// Bias tile n of a layer, broadcast over 8 rows, in fp32 (0 without biases).
template <typename T>
inline simd<float, 16> bias16(const T *bias, int l, int nt) {
  if (!bias) return simd<float, 16>(0.0f);
  return simd<float, 16>(esimd::block_load<T, 16>(bias + l * FMLP_ESIMD_MAX_WIDTH + nt * 16));
}

// Stage every layer's weights in SLM, then body(r0, rows) for each block of R rows this
// thread owns (blocks dealt round-robin over all threads of the grid; `rows` counts the
// rows from r0 to the end, so a block past it masks what it reads and writes).
template <int R, class Body>
inline void for_each_row_block(const FmlpEsimdArgs &p, Body &&body) {
  esimd::slm_init<kSlmBytes>();
  auto it = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const int lid = static_cast<int>(it.get_local_id(0));
  stage_weights(static_cast<const uint32_t *>(p.wpack), p.wpack_words, lid);
  const int64_t blocks = (p.n_rows + R - 1) / R;
  const int64_t stride = static_cast<int64_t>(it.get_group_range(0)) * kWG;
  for (int64_t blk = static_cast<int64_t>(it.get_group(0)) * kWG + lid; blk < blocks; blk += stride)
    body(blk * R, p.n_rows - blk * R);
}

// ---- forward -----------------------------------------------------------------------------
// The epilogue of a layer's column tile nt: bias added in fp32, rounded to T (z), saved
// where training asks, kept as the next layer's input (the activation follows per layer).
template <typename T, int RG, int NT>
inline void bias_round_save(simd<float, RG * kTile> &acc, simd<T, RG * NT * kTile> &out, int nt,
                            simd<float, 16> b, T *z, int64_t z_rs, int64_t rows, int cols) {
FMLP_UNROLL
  for (int rg = 0; rg < RG; ++rg) {
FMLP_UNROLL
    for (int m = 0; m < 8; ++m)
      acc.template select<16, 1>(rg * kTile + m * 16) += b;
    simd<T, kTile> zt = acc.template select<kTile, 1>(rg * kTile);
    if (z)
      store_tile<T>(z, z_rs, rows, cols, rg, nt, zt);
    out.template select<kTile, 1>((rg * NT + nt) * kTile) = zt;
  }
}

template <typename T, int IN, int H, int OUT>
inline void forward(const FmlpEsimdArgs &p) {
  constexpr int RG = row_groups<H>(), R = 8 * RG;
  constexpr int KI = IN / 16, KH = H / 16, NO = OUT / 16;
  const T *x = static_cast<const T *>(p.src);
  T *y = static_cast<T *>(p.dst);
  const T *bias = static_cast<const T *>(p.bias);
  T *z = static_cast<T *>(p.z);
  const int L = p.n_layers;
  for_each_row_block<R>(p, [&](int64_t r0, int64_t rows) {
    T *zr = z ? z + r0 * p.z_rs : nullptr;  // this block's saved z, layer l at l * hid_w
    simd<T, RG * KH * kTile> h;
    {
      simd<T, RG * KI * kTile> a = load_tiles<T, RG, KI>(x + r0 * p.src_rs, p.src_rs, p.src_cs, rows, p.in_w);
      layer<T, RG, KI, KH>(a, 0u, [&](int nt, simd<float, RG * kTile> &acc) {
        bias_round_save<T, RG, KH>(acc, h, nt, bias16<T>(bias, 0, nt), zr, p.z_rs, rows, p.hid_w);
      });
      apply_act(h, p.act);
    }
    uint32_t slm = layer_tiles<IN, H, OUT>(0, L) * kBTile * sizeof(T);
    for (int l = 1; l < L - 1; ++l) {
      simd<T, RG * KH * kTile> a = h;
      T *zl = zr ? zr + l * p.hid_w : nullptr;
      layer<T, RG, KH, KH>(a, slm, [&](int nt, simd<float, RG * kTile> &acc) {
        bias_round_save<T, RG, KH>(acc, h, nt, bias16<T>(bias, l, nt), zl, p.z_rs, rows, p.hid_w);
      });
      apply_act(h, p.act);
      slm += KH * KH * kBTile * sizeof(T);
    }
    simd<T, RG * NO * kTile> yt;
    T *zo = zr && p.out_act ? zr + (L - 1) * p.hid_w : nullptr;
    layer<T, RG, KH, NO>(h, slm, [&](int nt, simd<float, RG * kTile> &acc) {
      bias_round_save<T, RG, NO>(acc, yt, nt, bias16<T>(bias, L - 1, nt), zo, p.z_rs, rows, p.out_w);
    });
    apply_act(yt, p.out_act);
FMLP_UNROLL
    for (int rg = 0; rg < RG; ++rg)
FMLP_UNROLL
      for (int nt = 0; nt < NO; ++nt)
        store_tile<T>(y + r0 * p.out_w, p.out_w, rows, p.out_w, rg, nt,
                      yt.template select<kTile, 1>((rg * NO + nt) * kTile));
  });
}

// ---- row backward -------------------------------------------------------------------------
// g_L = gy * out_act'(z_L); g_{l-1} = (g_l W_l) * act'(z_{l-1}); gx = g_1 W_1. The weights
// come packed for W (not W^T): tile (n, k) of layer l multiplies g_l's column tile k
// into the layer's input column tile n, layers in reverse order (layer L-1 first).
// Each product is rounded to T before the activation's derivative multiplies it, and
// that product is rounded again, as eager autograd does.
template <typename T, int RG, int NT>
inline void round_into(simd<float, RG * kTile> &acc, simd<T, RG * NT * kTile> &out, int nt) {
FMLP_UNROLL
  for (int rg = 0; rg < RG; ++rg)
    out.template select<kTile, 1>((rg * NT + nt) * kTile) = simd<T, kTile>(acc.template select<kTile, 1>(rg * kTile));
}

template <typename T, int IN, int H, int OUT>
inline void backward_rows(const FmlpEsimdArgs &p) {
  constexpr int RG = row_groups<H>(), R = 8 * RG;
  constexpr int KI = IN / 16, KH = H / 16, KO = OUT / 16;
  const T *gy = static_cast<const T *>(p.src);
  T *gx = static_cast<T *>(p.dst);
  const T *z = static_cast<const T *>(p.z);
  T *dz = static_cast<T *>(p.dz);
  const int L = p.n_layers;
  for_each_row_block<R>(p, [&](int64_t r0, int64_t rows) {
    const T *zr = z + r0 * p.z_rs;
    T *dzr = dz ? dz + r0 * p.dz_rs : nullptr;
    simd<T, RG * KO * kTile> go = load_tiles<T, RG, KO>(gy + r0 * p.src_rs, p.src_rs, p.src_cs, rows, p.out_w);
    times_act_grad<T, RG, KO>(go, p.out_act, zr + (L - 1) * p.hid_w, p.z_rs,
                              dzr ? dzr + (L - 1) * p.hid_w : nullptr, p.dz_rs, rows, p.out_w);
    simd<T, RG * KH * kTile> g;
    layer<T, RG, KO, KH>(go, 0u, [&](int nt, simd<float, RG * kTile> &acc) { round_into<T, RG, KH>(acc, g, nt); });
    times_act_grad<T, RG, KH>(g, p.act, zr + (L - 2) * p.hid_w, p.z_rs,
                              dzr ? dzr + (L - 2) * p.hid_w : nullptr, p.dz_rs, rows, p.hid_w);
    uint32_t slm = layer_tiles<IN, H, OUT>(L - 1, L) * kBTile * sizeof(T);
    for (int l = L - 2; l >= 1; --l) {
      simd<T, RG * KH * kTile> a = g;
      layer<T, RG, KH, KH>(a, slm, [&](int nt, simd<float, RG * kTile> &acc) { round_into<T, RG, KH>(acc, g, nt); });
      times_act_grad<T, RG, KH>(g, p.act, zr + (l - 1) * p.hid_w, p.z_rs,
                                dzr ? dzr + (l - 1) * p.hid_w : nullptr, p.dz_rs, rows, p.hid_w);
      slm += KH * KH * kBTile * sizeof(T);
    }
    if (gx) {
      simd<T, RG * KI * kTile> gi;
      layer<T, RG, KH, KI>(g, slm, [&](int nt, simd<float, RG * kTile> &acc) { round_into<T, RG, KI>(acc, gi, nt); });
FMLP_UNROLL
      for (int rg = 0; rg < RG; ++rg)
FMLP_UNROLL
        for (int nt = 0; nt < KI; ++nt)
          store_tile<T>(gx + r0 * p.in_w, p.in_w, rows, p.in_w, rg, nt,
                        gi.template select<kTile, 1>((rg * KI + nt) * kTile));
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
      apply_act(b, p.src_act);
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
#ifndef FMLP_ESIMD_LARGE_GRF
#define FMLP_ESIMD_PROPS (sycl::ext::oneapi::experimental::nd_range_kernel<1>)
#else
#define FMLP_ESIMD_PROPS                                                                    \
  (sycl::ext::oneapi::experimental::nd_range_kernel<1>,                                     \
   sycl::ext::intel::experimental::grf_size<256>)
#endif
#define FMLP_ESIMD_KERNEL_DECL(name, ArgT)                                                  \
  extern "C" SYCL_EXTERNAL SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(FMLP_ESIMD_PROPS)               \
      FMLP_ESIMD_KERNEL void name(ArgT p)

// One configuration: t in f16/bf16 (type T), padded widths IN, H, OUT.
#define FMLP_ESIMD_FWD(t, T, IN, H, OUT)                                                    \
  FMLP_ESIMD_KERNEL_DECL(fmlp_esimd_fwd_##t##_##IN##_##H##_##OUT, FmlpEsimdArgs) {           \
    fmlp_esimd::forward<T, IN, H, OUT>(p);                                                   \
  }
#define FMLP_ESIMD_BWD(t, T, IN, H, OUT)                                                    \
  FMLP_ESIMD_KERNEL_DECL(fmlp_esimd_bwd_##t##_##IN##_##H##_##OUT, FmlpEsimdArgs) {           \
    fmlp_esimd::backward_rows<T, IN, H, OUT>(p);                                             \
  }
#define FMLP_ESIMD_WGRAD(t, T)                                                              \
  FMLP_ESIMD_KERNEL_DECL(fmlp_esimd_wgrad_##t, FmlpEsimdWgradArgs) {                         \
    fmlp_esimd::weight_grads<T>(p);                                                          \
  }
