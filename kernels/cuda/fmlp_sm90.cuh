// What the Hopper (sm_90a) kernels share beyond the warpgroup MMAs of fmlp_wgmma.cuh: the
// weights' core-matrix layout in shared memory and its staging, and one layer of the
// layer chain (A from registers, the weights as B, the bias in the accumulators, the
// activation packed to the next layer's A fragments). Used by fused_mlp_forward_sm90.cu
// and fused_mlp_backward_sm90.cu (whose chains compute the forward again).
#pragma once

#include "fmlp_forward_common.cuh"
#include "fmlp_wgmma.cuh"

namespace fmlp {

// Byte offset of W[n][k] in a layer's core-matrix layout with N_P rows: 8 x 8 core
// matrices of 128 contiguous bytes (8 rows n of 16 bytes), ordered n-group fastest
// within each 8-wide k group. So one 16-wide k slice kb starts at kb * N_P * 32 bytes,
// its second core-matrix column is N_P * 16 bytes on (LBO) and the next 8 rows 128 (SBO).
template <int N_P>
__host__ __device__ constexpr unsigned cm_offset(int n, int k) {
  return ((k >> 3) * (N_P >> 3) + (n >> 3)) * 128u + (n & 7) * 16u + (k & 7) * 2u;
}

// Stage one [rows, k] weight matrix into its core-matrix layout, zero-padded to [N_P, K_P].
template <int N_P, int K_P>
__device__ __forceinline__ void stage_weight_cm(unsigned char* dst, const unsigned short* src,
                                                int rows, int k) {
  stage_weight<N_P, K_P>(dst, src, rows, k, [](int n, int c) { return cm_offset<N_P>(n, c); });
}

// Keep the compiler from moving accesses of the accumulators across the wgmma group's
// fence and wait: an empty volatile statement that reads and writes each of them.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// Stage one [rows, cols] weight matrix transposed: W^T[n][k] = W[k][n] (n < cols, k <
// rows) in the core-matrix layout with N_P rows, zero-padded to [N_P, K_P]. The backward's
// input-gradient chain multiplies by W, so its B operand is W^T, K-major. Element by
// element (reads coalesced along n), once per CTA.
template <int N_P, int K_P>
__device__ __forceinline__ void stage_weight_t_cm(unsigned char* dst, const unsigned short* src,
                                                  int rows, int cols) {
  for (int e = threadIdx.x; e < N_P * K_P; e += blockDim.x) {
    const int n = e % N_P, k = e / N_P;
    *reinterpret_cast<unsigned short*>(dst + cm_offset<N_P>(n, k)) =
        (k < rows && n < cols) ? src[(long long)k * cols + n] : (unsigned short)0;
  }
}

// d = in W^T (+ d where ``accumulate``) for the warpgroup's 64 rows: one wgmma group
// over K_P inputs (A fragments ``in``, this warp's 16 rows) and N_P outputs, W at shared
// byte address w (core-matrix layout, N_P rows); waited for before it returns.
template <int K_P, int N_P>
__device__ __forceinline__ void mma_group(float (&d)[N_P / 2], const unsigned (&in)[K_P / 16][4],
                                          unsigned w, bool accumulate) {
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < K_P / 16; ++kb)
    Wgmma<N_P>::mma(d, in[kb], wgmma_desc(w + kb * N_P * 32u, N_P * 16u, 128u),
                    accumulate || kb > 0);
  wgmma_commit();
  wgmma_wait<0>();
  pin(d);
}

// One layer for the warpgroup's 64 rows: out (A fragments of the next layer, this warp's
// 16 rows) = act(in W^T + bias) over N_P outputs, K_P inputs; W at shared byte address w.
template <int K_P, int N_P, int ACT>
__device__ __forceinline__ void layer(const unsigned (&in)[K_P / 16][4],
                                      unsigned (&out)[N_P / 16][4], unsigned w,
                                      const float* bias, int lane) {
  const int t2 = (lane & 3) * 2;
  float d[N_P / 2];  // without bias: never initialized, the first MMA does not read it
  if (kBias) {
#pragma unroll
    for (int i = 0; i < N_P / 8; ++i) {
      const float2 bb = *reinterpret_cast<const float2*>(bias + i * 8 + t2);
      d[4 * i] = bb.x; d[4 * i + 1] = bb.y; d[4 * i + 2] = bb.x; d[4 * i + 3] = bb.y;
    }
    pin(d);
  }
  mma_group<K_P, N_P>(d, in, w, kBias);
#pragma unroll
  for (int nb = 0; nb < N_P / 16; ++nb) {
    out[nb][0] = act_pack2<ACT, kBF16>(d[8 * nb], d[8 * nb + 1]);
    out[nb][1] = act_pack2<ACT, kBF16>(d[8 * nb + 2], d[8 * nb + 3]);
    out[nb][2] = act_pack2<ACT, kBF16>(d[8 * nb + 4], d[8 * nb + 5]);
    out[nb][3] = act_pack2<ACT, kBF16>(d[8 * nb + 6], d[8 * nb + 7]);
  }
}

}  // namespace fmlp
