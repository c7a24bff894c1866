// fused_mlp_xmx.hpp: XMX (joint_matrix) forward for the Intel Data Center GPU Max 1550.
//
// *** NEVER COMPILED OR RUN: no Max 1550 and no icpx were reachable when this was
// *** written. It is included by fused_mlp.cpp only when FMLP_SYCL_XMX is defined, and
// *** the Python backend asks for it only when FUSEDMLP_SYCL_XMX=1 on a Max 1550.
// *** Treat it as a starting point to be compiled, tested and measured on the device.
//
// Same contract as fmlp::forward (the portable kernel): one work-group carries
// FMLP_TILE_ROWS rows through every layer; only the matmul differs. It runs on the
// XMX engines through sycl_ext_oneapi_matrix: 8 x 16 x 16 (M x N x K) tiles of
// fp16/bf16 with an fp32 accumulator, the shape PVC's dpas executes with sub-groups
// of 16. Forward only, fp16/bf16 only, every width a multiple of 16 (the Python side
// checks); backward stays on the portable kernels.
#include <sycl/ext/oneapi/matrix/matrix.hpp>

namespace fmlp {
namespace xmx {
namespace jm = sycl::ext::oneapi::experimental::matrix;
constexpr int M = 8, N = 16, K = 16, SG = 16;
static_assert(FMLP_TILE_ROWS % M == 0 && FMLP_MAX_WIDTH % N == 0, "tile shapes");

template <class P> auto local_ptr(P *p) {
  return sycl::address_space_cast<sycl::access::address_space::local_space,
                                  sycl::access::decorated::no>(p);
}

template <class T> void forward(const FmlpNet &net) {
  auto it = syclext::this_work_item::get_nd_item<1>();
  auto grp = it.get_group();
  auto sg = it.get_sub_group();
  // A operand (activations, rounded to T), B operand (W^T of the current layer) and
  // the fp32 accumulator tile: 8 + 32 + 16 KiB of the 128 KiB of SLM per Xe-core.
  static syclexp::work_group_static<T[FMLP_TILE_ROWS][FMLP_MAX_WIDTH]> a_tile;
  static syclexp::work_group_static<T[FMLP_MAX_WIDTH][FMLP_MAX_WIDTH]> wt_tile;
  static syclexp::work_group_static<float[FMLP_TILE_ROWS][FMLP_MAX_WIDTH]> c_tile;
  T(*a)[FMLP_MAX_WIDTH] = a_tile;
  T(*wt)[FMLP_MAX_WIDTH] = wt_tile;
  float(*c)[FMLP_MAX_WIDTH] = c_tile;
  const int lid = static_cast<int>(it.get_local_id(0));
  const int sg_id = static_cast<int>(sg.get_group_linear_id());
  const int n_sg = static_cast<int>(sg.get_group_linear_range());
  const int64_t row0 = static_cast<int64_t>(grp.get_group_id(0)) * FMLP_TILE_ROWS;

  const int in0 = net.layer[0].in;
  for (int e = lid; e < FMLP_TILE_ROWS * in0; e += FMLP_WG_SIZE) {
    int r = e / in0, k = e % in0;
    int64_t row = row0 + r;
    a[r][k] = static_cast<T>(row < net.n_rows ? ld<T>(net.src, row * net.src_rs + k * net.src_cs) : 0.0f);
  }
  for (int l = 0; l < net.n_layers; ++l) {
    const FmlpLayer &ly = net.layer[l];
    const bool last = l == net.n_layers - 1;
    const int act = last ? net.out_act : net.act;
    // stage W^T (given [in, out], as to the portable forward) as the row-major B tile
    const T *w_t = static_cast<const T *>(ly.w);
    for (int e = lid; e < ly.in * ly.out; e += FMLP_WG_SIZE)
      wt[e / ly.out][e % ly.out] = w_t[e];
    sycl::group_barrier(grp);

    const int nb = ly.out / N, blocks = (FMLP_TILE_ROWS / M) * nb;
    for (int blk = sg_id; blk < blocks; blk += n_sg) {
      const int m0 = (blk / nb) * M, n0 = (blk % nb) * N;
      jm::joint_matrix<sycl::sub_group, float, jm::use::accumulator, M, N> mc;
      jm::joint_matrix_fill(sg, mc, 0.0f);
      for (int k0 = 0; k0 < ly.in; k0 += K) {
        jm::joint_matrix<sycl::sub_group, T, jm::use::a, M, K, jm::layout::row_major> ma;
        jm::joint_matrix<sycl::sub_group, T, jm::use::b, K, N, jm::layout::row_major> mb;
        jm::joint_matrix_load(sg, ma, local_ptr(&a[m0][k0]), FMLP_MAX_WIDTH);
        jm::joint_matrix_load(sg, mb, local_ptr(&wt[k0][n0]), FMLP_MAX_WIDTH);
        jm::joint_matrix_mad(sg, mc, ma, mb, mc);
      }
      jm::joint_matrix_store(sg, mc, local_ptr(&c[m0][n0]), FMLP_MAX_WIDTH, jm::layout::row_major);
    }
    sycl::group_barrier(grp);

    // epilogue, as in the portable kernel: bias, rounding to T, activation, stores
    for (int e = lid; e < FMLP_TILE_ROWS * ly.out; e += FMLP_WG_SIZE) {
      int r = e / ly.out, j = e % ly.out;
      float acc = c[r][j] + (ly.b ? ld<T>(ly.b, j) : 0.0f);
      a[r][j] = static_cast<T>(forward_epilogue<T>(net, ly, row0 + r, j, acc, act, last));
    }
    sycl::group_barrier(grp);
  }
}
} // namespace xmx
} // namespace fmlp

#define FMLP_DEFINE_XMX_KERNEL(SUFFIX, T)                                                 \
  extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(                                           \
      (sycl::ext::oneapi::experimental::nd_range_kernel<1>))                              \
      SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(                                                  \
          (sycl::ext::oneapi::experimental::sub_group_size<fmlp::xmx::SG>)) void          \
      fmlp_fwd_xmx_##SUFFIX(FmlpNet net) {                                                \
    fmlp::xmx::forward<T>(net);                                                           \
  }

FMLP_DEFINE_XMX_KERNEL(f16, sycl::half)
FMLP_DEFINE_XMX_KERNEL(bf16, fmlp::bf16)
