// fused_mlp.cpp: the portable fully fused MLP in SYCL (forward, row backward, weight
// gradients) for fp32, fp16 and bf16 operands with fp32 accumulation.
//
// One source, two ways (see README.md): compiled at run time by the SYCL runtime's
// kernel compiler (sycl_ext_oneapi_kernel_compiler, source_language::sycl) on any SYCL
// device, Intel's OpenCL CPU device included; or ahead of time with icpx -fsycl, where
// the host shim includes this file. Kernels are free functions (the only form the kernel
// compiler accepts) and see pointers, sizes, strides and activation ids, nothing else.
//
// Rounding follows eager PyTorch in the operand dtype: every matmul result (z, bias
// included) and every activation output is rounded to T, and activations and their
// derivatives are evaluated in fp32 on the rounded values. That keeps results within
// the dtype's rounding of nn.Sequential, which is what the shared test suite demands.
#include <sycl/sycl.hpp>
#include <sycl/ext/oneapi/work_group_static.hpp>

#include "fused_mlp_params.h"

namespace fmlp {
namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;
using bf16 = sycl::ext::oneapi::bfloat16;

// ---- activations: ids as in fusedmlp_xpu/activations.py (never renumber) ----------
constexpr float kLeakySlope = 0.01f;        // activations.LEAKY_RELU_SLOPE
constexpr float kSoftplusThreshold = 20.0f; // activations.SOFTPLUS_THRESHOLD (beta = 1)
constexpr float kSqrt1_2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluTanhC = 0.044715f;

inline float sigmoid(float z) { return 1.0f / (1.0f + sycl::exp(-z)); }

inline float act_fn(int id, float z) {
  switch (id) {
  case 1: return z < 0.0f ? 0.0f : z;  // not z > 0 ? z : 0, which turns NaN into 0
  case 2: return z > 0.0f ? z : kLeakySlope * z;
  case 3: return 0.5f * z * (1.0f + sycl::erf(z * kSqrt1_2));
  case 4: return 0.5f * z * (1.0f + sycl::tanh(kSqrt2OverPi * (z + kGeluTanhC * z * z * z)));
  case 5: return z * sigmoid(z);
  case 6: return sigmoid(z);
  case 7: return sycl::tanh(z);
  case 8: return z > kSoftplusThreshold ? z : sycl::log1p(sycl::exp(z));
  default: return z; // 0: none
  }
}

// d act / d z at z
inline float act_grad(int id, float z) {
  switch (id) {
  case 1: return z <= 0.0f ? 0.0f : 1.0f;  // as torch's relu backward (NaN passes)
  case 2: return z > 0.0f ? 1.0f : kLeakySlope;
  case 3: return 0.5f * (1.0f + sycl::erf(z * kSqrt1_2)) + z * kInvSqrt2Pi * sycl::exp(-0.5f * z * z);
  case 4: {
    float t = sycl::tanh(kSqrt2OverPi * (z + kGeluTanhC * z * z * z));
    float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhC * z * z);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * dinner;
  }
  case 5: { float s = sigmoid(z); return s * (1.0f + z * (1.0f - s)); }
  case 6: { float s = sigmoid(z); return s * (1.0f - s); }
  case 7: { float t = sycl::tanh(z); return 1.0f - t * t; }
  case 8: return z > kSoftplusThreshold ? 1.0f : sigmoid(z);
  default: return 1.0f; // 0: none
  }
}

// g * act'(z); for relu and leaky relu a select, as torch's backward takes it, so a NaN
// gradient stays where the unit is off (NaN * 0 would spread it)
inline float times_act_grad(int id, float g, float z) {
  if (id == 1) return z <= 0.0f ? 0.0f : g;
  if (id == 2) return z > 0.0f ? g : kLeakySlope * g;
  return g * act_grad(id, z);
}

template <class T> inline float ld(const void *p, int64_t i) {
  return static_cast<float>(static_cast<const T *>(p)[i]);
}
template <class T> inline void st(void *p, int64_t i, float v) { static_cast<T *>(p)[i] = static_cast<T>(v); }
// v rounded to T, kept in fp32 (a no-op for float)
template <class T> inline float rnd(float v) { return static_cast<float>(static_cast<T>(v)); }

// A forward unit's epilogue, shared by the portable and the XMX kernel: z = acc rounded to
// T, stored where training asks for it; its activation rounded to T, stored as y on the
// last layer; rows past the end store nothing. Returns the activation.
template <class T>
inline float forward_epilogue(const FmlpNet &net, const FmlpLayer &ly, int64_t row, int j,
                              float acc, int act, bool last) {
  const float z = rnd<T>(acc);
  const float a = rnd<T>(act_fn(act, z));
  if (row < net.n_rows) {
    if (ly.z)
      st<T>(ly.z, row * ly.out + j, z);
    if (last)
      st<T>(net.dst, row * ly.out + j, a);
  }
  return a;
}

// ---- forward: one work-group carries FMLP_TILE_ROWS rows through every layer --------
// The tile of activations lives in local memory for the whole network (ping-pong
// between two buffers); only x is read and only y (and, for training, z) written.
// Weights are read from global memory: every work-group reads the same few KB, so
// they sit in cache, and staging them would double the local-memory footprint. They
// come transposed (W^T, [in, out]) so that neighbouring work-items (neighbouring j)
// load neighbouring addresses. Measured on the OpenCL CPU device (2 cores, 65536 rows,
// widths 64 x 6 layers, fp32): W as [out, in] with one row per unit 1.8 s; W^T with
// FMLP_ROW_BLOCK = 4 rows per unit 0.7-1.0 s (8: about the same, 2: 1.35 s). Not
// measured on a GPU.
template <class T> void forward(const FmlpNet &net) {
  auto it = syclext::this_work_item::get_nd_item<1>();
  auto grp = it.get_group();
  static syclexp::work_group_static<float[2][FMLP_TILE_ROWS][FMLP_MAX_WIDTH]> tile;
  float(*buf)[FMLP_TILE_ROWS][FMLP_MAX_WIDTH] = tile;
  const int lid = static_cast<int>(it.get_local_id(0));
  const int64_t row0 = static_cast<int64_t>(grp.get_group_id(0)) * FMLP_TILE_ROWS;
  const int L = net.n_layers;

  const int in0 = net.layer[0].in;
  for (int e = lid; e < FMLP_TILE_ROWS * in0; e += FMLP_WG_SIZE) {
    int r = e / in0, k = e % in0;
    int64_t row = row0 + r;
    buf[0][r][k] = row < net.n_rows ? ld<T>(net.src, row * net.src_rs + k * net.src_cs) : 0.0f;
  }
  sycl::group_barrier(grp);

  int cur = 0;
  for (int l = 0; l < L; ++l) {
    const FmlpLayer &ly = net.layer[l];
    const bool last = l == L - 1;
    const int act = last ? net.out_act : net.act;
    const float(*h)[FMLP_MAX_WIDTH] = buf[cur];
    float(*hn)[FMLP_MAX_WIDTH] = buf[cur ^ 1];
    // A work unit is FMLP_ROW_BLOCK rows of one output column j: each weight loaded
    // serves FMLP_ROW_BLOCK rows from registers.
    constexpr int RB = FMLP_ROW_BLOCK;
    for (int e = lid; e < (FMLP_TILE_ROWS / RB) * ly.out; e += FMLP_WG_SIZE) {
      const int r0 = (e / ly.out) * RB, j = e % ly.out;
      const T *wt = static_cast<const T *>(ly.w) + j;
      const float bias = ly.b ? ld<T>(ly.b, j) : 0.0f;
      float acc[RB];
      for (int i = 0; i < RB; ++i)
        acc[i] = bias;
      for (int k = 0; k < ly.in; ++k) {
        const float w = static_cast<float>(wt[static_cast<int64_t>(k) * ly.out]);
        for (int i = 0; i < RB; ++i)
          acc[i] += h[r0 + i][k] * w;
      }
      for (int i = 0; i < RB; ++i)
        hn[r0 + i][j] = forward_epilogue<T>(net, ly, row0 + r0 + i, j, acc[i], act, last);
    }
    sycl::group_barrier(grp);
    cur ^= 1;
  }
}

// ---- row backward: dL/dz of every layer, and dL/dx, one row tile at a time ----------
// Mirrors forward: the row-wise gradient flows back through all layers in local memory.
// It writes dz (the input of the weight-gradient kernel) only where asked.
template <class T> void backward_rows(const FmlpNet &net) {
  auto it = syclext::this_work_item::get_nd_item<1>();
  auto grp = it.get_group();
  static syclexp::work_group_static<float[2][FMLP_TILE_ROWS][FMLP_MAX_WIDTH]> tile;
  float(*buf)[FMLP_TILE_ROWS][FMLP_MAX_WIDTH] = tile;
  const int lid = static_cast<int>(it.get_local_id(0));
  const int64_t row0 = static_cast<int64_t>(grp.get_group_id(0)) * FMLP_TILE_ROWS;
  const int L = net.n_layers;

  {
    const FmlpLayer &ly = net.layer[L - 1];
    for (int e = lid; e < FMLP_TILE_ROWS * ly.out; e += FMLP_WG_SIZE) {
      int r = e / ly.out, j = e % ly.out;
      int64_t row = row0 + r;
      float g = 0.0f;
      if (row < net.n_rows) {
        g = ld<T>(net.src, row * net.src_rs + j * net.src_cs);
        if (net.out_act != 0)
          g = rnd<T>(times_act_grad(net.out_act, g, ld<T>(ly.z, row * ly.out + j)));
        if (ly.dz)
          st<T>(ly.dz, row * ly.out + j, g);
      }
      buf[0][r][j] = g;
    }
  }
  sycl::group_barrier(grp);

  int cur = 0;
  const int l_end = net.dst ? 0 : 1; // layer 0's backward only produces grad_x
  for (int l = L - 1; l >= l_end; --l) {
    const FmlpLayer &ly = net.layer[l];
    const float(*g)[FMLP_MAX_WIDTH] = buf[cur];
    float(*gn)[FMLP_MAX_WIDTH] = buf[cur ^ 1];
    const T *w = static_cast<const T *>(ly.w);
    for (int e = lid; e < FMLP_TILE_ROWS * ly.in; e += FMLP_WG_SIZE) {
      int r = e / ly.in, k = e % ly.in;
      int64_t row = row0 + r;
      float s = 0.0f;
      for (int j = 0; j < ly.out; ++j)
        s += g[r][j] * static_cast<float>(w[static_cast<int64_t>(j) * ly.in + k]);
      if (row >= net.n_rows) {
        if (l > 0)
          gn[r][k] = 0.0f;
        continue;
      }
      if (l == 0) {
        st<T>(net.dst, row * ly.in + k, s);
      } else {
        const FmlpLayer &prev = net.layer[l - 1];
        float gz = rnd<T>(times_act_grad(net.act, rnd<T>(s), ld<T>(prev.z, row * ly.in + k)));
        if (prev.dz)
          st<T>(prev.dz, row * ly.in + k, gz);
        gn[r][k] = gz;
      }
    }
    sycl::group_barrier(grp);
    cur ^= 1;
  }
}

// ---- weight and bias gradients of one layer: a reduction over rows ------------------
// gw[o, k] = sum_n dz[n, o] * h[n, k], gb[o] = sum_n dz[n, o], with h = act(src) rounded
// to T (src is x for layer 0, act 0; else the saved z of the layer before). Column
// k == in of the output grid is the bias: h is 1 there. One work-group owns a 16 x 16
// output tile and streams all rows through local memory, so each partial sum stays in
// a register and nothing is reduced with atomics. Row-split partials (for millions of
// rows on a GPU) are the next step; see README.md.
template <class T>
void weight_grads(const void *dz, int64_t n, int out, const void *src, int64_t src_rs,
                  int64_t src_cs, int src_act, int in, void *gw, void *gb) {
  constexpr int TT = FMLP_WGRAD_TILE;
  auto it = syclext::this_work_item::get_nd_item<2>();
  auto grp = it.get_group();
  // +1 column: the transposed reads below would otherwise hit one local-memory bank
  static syclexp::work_group_static<float[2][TT][TT + 1]> tiles;
  float(*tl)[TT][TT + 1] = tiles;
  const int a = static_cast<int>(it.get_local_id(0)), b = static_cast<int>(it.get_local_id(1));
  const int o0 = static_cast<int>(grp.get_group_id(0)) * TT, k0 = static_cast<int>(grp.get_group_id(1)) * TT;
  const int o = o0 + a, k = k0 + b;
  float acc = 0.0f, comp = 0.0f;
  for (int64_t r0 = 0; r0 < n; r0 += TT) {
    int64_t row = r0 + a;
    // item (a, b) loads dz[row, o0 + b] and h[row, k0 + b]
    tl[0][a][b] = row < n && o0 + b < out ? ld<T>(dz, row * out + o0 + b) : 0.0f;
    float h = 0.0f;
    if (row < n && k0 + b < in)
      h = rnd<T>(act_fn(src_act, ld<T>(src, row * src_rs + (k0 + b) * src_cs)));
    else if (row < n && k0 + b == in)
      h = 1.0f;
    tl[1][a][b] = h;
    sycl::group_barrier(grp);
    float part = 0.0f;
    for (int t = 0; t < TT; ++t)
      part += tl[0][t][a] * tl[1][t][b];
    // Kahan-add each 16-row partial: a plain running sum over ~1000 rows of cancelling
    // terms lost 1.7e-5 relative in fp32 (a bias gradient of the test suite), over the
    // 1e-5 bound; compensated, the error stays at a few fp32 eps for any row count.
    float yk = part - comp;
    float tk = acc + yk;
    // (no compensation past an infinity: inf - inf would turn the sum into NaN)
    comp = sycl::isfinite(tk) ? (tk - acc) - yk : 0.0f;
    acc = tk;
    sycl::group_barrier(grp);
  }
  if (o < out) {
    if (k < in && gw)
      st<T>(gw, static_cast<int64_t>(o) * in + k, acc);
    else if (k == in && gb)
      st<T>(gb, o, acc);
  }
}
} // namespace fmlp

// ---- the kernels: extern "C" names the host shim looks up, one set per dtype ---------
#define FMLP_DEFINE_KERNELS(SUFFIX, T)                                                    \
  extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(                                           \
      (sycl::ext::oneapi::experimental::nd_range_kernel<1>)) void fmlp_fwd_##SUFFIX(      \
      FmlpNet net) {                                                                      \
    fmlp::forward<T>(net);                                                                \
  }                                                                                       \
  extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(                                           \
      (sycl::ext::oneapi::experimental::nd_range_kernel<1>)) void fmlp_bwd_rows_##SUFFIX( \
      FmlpNet net) {                                                                      \
    fmlp::backward_rows<T>(net);                                                          \
  }                                                                                       \
  extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(                                           \
      (sycl::ext::oneapi::experimental::nd_range_kernel<2>)) void fmlp_wgrad_##SUFFIX(    \
      const void *dz, int64_t n, int32_t out, const void *src, int64_t src_rs,            \
      int64_t src_cs, int32_t src_act, int32_t in, void *gw, void *gb) {                  \
    fmlp::weight_grads<T>(dz, n, out, src, src_rs, src_cs, src_act, in, gw, gb);          \
  }

FMLP_DEFINE_KERNELS(f32, float)
FMLP_DEFINE_KERNELS(f16, sycl::half)
FMLP_DEFINE_KERNELS(bf16, fmlp::bf16)

#ifdef FMLP_SYCL_XMX
// Max 1550 only, NEVER compiled or run here: see fused_mlp_xmx.hpp and README.md.
#include "fused_mlp_xmx.hpp"
#endif
