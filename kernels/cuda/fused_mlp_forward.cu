// The narrow fully-fused MLP forward (inference): y = out_act(W_L act(... act(W_1 x + b_1)
// ...) + b_L), every layer in ONE kernel, for x [n_rows, IN] -> y [n_rows, OUT] in fp16
// or bf16 with fp32 accumulation.
//
// Layout of the work:
// - Every CTA stages all layers' weights (and biases, as fp32) in shared memory once,
//   zero-padded to multiples of 16, rows padded by 16 bytes so that ldmatrix reads
//   them without bank conflicts. The grid is persistent (the host launches SMs x CTAs
//   per SM at most); after that one __syncthreads the warps never wait for each other.
// - A warp owns row blocks of ROWS = 16 MT rows, striding over the row blocks of the
//   whole grid. Its blocks' x tiles are copied global -> shared with cp.async FMLP_STAGES
//   - 1 blocks ahead of the one it computes (a ring of buffers per warp), then read as MMA A
//   fragments with ldmatrix.
// - From there the activations stay in registers: mma.sync m16n8k16, fp32 accumulators
//   started at the bias, the activation applied to them, and two adjacent 8-column
//   accumulator tiles converted to 16 bits are the next layer's A fragment of one
//   16-wide k slice (fmlp_device.cuh). Each layer is computed 16 output columns at a
//   time (all its k slices for those columns, for the warp's MT row tiles), so one B
//   fragment load from shared memory serves MT MMAs and only 8 MT accumulators live
//   at once.
// - The last layer's output goes through the warp's (consumed) x buffer to 16-byte
//   coalesced stores.
//
// Configuration: the NVRTC -D options of fmlp_forward_common.cuh.
#include "fmlp_forward_common.cuh"

namespace fmlp {

// weight row strides in shared memory, in 16-bit elements (+8: as kLdXY, conflict-free
// ldmatrix); element offsets of the regions: W_1, the hidden W's, W_L, then the biases
// (fp32), then kStages x/y buffers per warp
constexpr int kLdW0 = kInP + 8, kLdWH = kHP + 8;
constexpr int kOffWH = kHP * kLdW0;
constexpr int kOffWL = kOffWH + kLHid * kHP * kLdWH;
constexpr int kWeightElems = kOffWL + kOutP * kLdWH;
constexpr unsigned kSmemBytes =
    2u * kWeightElems + 4u * kBiasFloats + 2u * kStages * kWarps * kBufElems;
// the biases' byte offset must stay 16-byte aligned for the buffers after them
static_assert((2 * kWeightElems) % 16 == 0, "weight region not a multiple of 16 bytes");
// the host computes the same size (cuda_build.ForwardConfig.smem_bytes) and passes it
static_assert(kSmemBytes == FMLP_SMEM_BYTES, "host and kernel disagree on shared memory");

// Stage one [rows, k] weight matrix as [ROWS_P, K_P + 8] 16-bit elements (rows padded
// by 16 bytes: conflict-free ldmatrix).
template <int ROWS_P, int K_P>
__device__ __forceinline__ void stage_weight_padded(unsigned short* dst, const unsigned short* src,
                                                    int rows, int k) {
  stage_weight<ROWS_P, K_P>(reinterpret_cast<unsigned char*>(dst), src, rows, k,
                            [](int r, int c) { return 2u * (r * (K_P + 8) + c); });
}

// One layer: out[mt][nb] (A fragments of the next layer) = act(in[mt][:] W^T + bias)
// for N_P output columns, K_P inputs; W in shared memory at ``w`` (row stride LDW).
template <int K_P, int N_P, int LDW, int ACT>
__device__ __forceinline__ void layer(const unsigned (&in)[kMT][K_P / 16][4],
                                      unsigned (&out)[kMT][N_P / 16][4], unsigned w,
                                      const float* bias, int lane) {
  // lane's row address in the four 8x8 B matrices: (n 0-7 | 8-15) x (k 0-7 | 8-15)
  const unsigned b_lane =
      w + 2u * ((((lane >> 4) << 3) + (lane & 7)) * LDW + ((lane >> 3) & 1) * 8);
  const int t2 = (lane & 3) * 2;
#pragma unroll
  for (int nb = 0; nb < N_P / 16; ++nb) {
    float acc[kMT][2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float b0 = 0.f, b1 = 0.f;
      if (kBias) {
        const float2 bb = *reinterpret_cast<const float2*>(bias + nb * 16 + j * 8 + t2);
        b0 = bb.x;
        b1 = bb.y;
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        acc[mt][j][0] = b0; acc[mt][j][1] = b1; acc[mt][j][2] = b0; acc[mt][j][3] = b1;
      }
    }
#pragma unroll
    for (int kb = 0; kb < K_P / 16; ++kb) {
      unsigned b[4];
      ldmatrix_x4(b, b_lane + 2u * (nb * 16 * LDW + kb * 16));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_16816<kBF16>(acc[mt][0], in[mt][kb], b[0], b[1]);
        mma_16816<kBF16>(acc[mt][1], in[mt][kb], b[2], b[3]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      out[mt][nb][0] = act_pack2<ACT, kBF16>(acc[mt][0][0], acc[mt][0][1]);
      out[mt][nb][1] = act_pack2<ACT, kBF16>(acc[mt][0][2], acc[mt][0][3]);
      out[mt][nb][2] = act_pack2<ACT, kBF16>(acc[mt][1][0], acc[mt][1][1]);
      out[mt][nb][3] = act_pack2<ACT, kBF16>(acc[mt][1][2], acc[mt][1][3]);
    }
  }
}

}  // namespace fmlp

extern "C" __global__ void __launch_bounds__(FMLP_WARPS * 32, 1)
fmlp_forward(const FmlpForwardParams p) {
  using namespace fmlp;
  extern __shared__ __align__(16) unsigned short smem[];
  if (dynamic_smem_size() < kSmemBytes) __trap();  // a host/kernel size mismatch

  // --- weights and biases, once per CTA ---
  unsigned short* w0 = smem;
  unsigned short* wh = smem + kOffWH;
  unsigned short* wl = smem + kOffWL;
  float* bias = reinterpret_cast<float*>(smem + kWeightElems);
  stage_weight_padded<kHP, kInP>(w0, p.w[0], kH, kIn);
  for (int l = 0; l < kLHid; ++l)
    stage_weight_padded<kHP, kHP>(wh + l * kHP * kLdWH, p.w[1 + l], kH, kH);
  stage_weight_padded<kOutP, kHP>(wl, p.w[kLHid + 1], kOut, kH);
  stage_biases(bias, p);
  stage_wait();
  __syncthreads();

  // --- row blocks, each warp on its own ---
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const unsigned buf0 = smem_addr(smem + kWeightElems + 2 * kBiasFloats) +
                        2u * (kStages * warp) * kBufElems;
  const unsigned w0_s = smem_addr(w0), wh_s = smem_addr(wh), wl_s = smem_addr(wl);
  const long long n_blocks = (p.n_rows + kRows - 1) / kRows;
  const long long stride = (long long)gridDim.x * kWarps;
  // lane's row address in the four 8x8 A matrices: (rows 0-7 | 8-15) x (k 0-7 | 8-15)
  const unsigned a_lane = 2u * (((lane & 7) + ((lane >> 3) & 1) * 8) * kLdXY + (lane >> 4) * 8);

  auto load = [&](long long b, unsigned buf) { load_x(p, b, buf, lane); };
  long long blk = (long long)blockIdx.x * kWarps + warp;
  ring_start(blk, stride, n_blocks, buf0, load);
  int cur = 0;
  for (; blk < n_blocks; blk += stride) {
    const unsigned buf = ring_next(blk, stride, n_blocks, buf0, cur, load);

    unsigned xa[kMT][kInP / 16][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kb = 0; kb < kInP / 16; ++kb)
        ldmatrix_x4(xa[mt][kb], buf + a_lane + 2u * (mt * 16 * kLdXY + kb * 16));

    unsigned h[kMT][kHP / 16][4];
    layer<kInP, kHP, kLdW0, FMLP_ACT>(xa, h, w0_s, bias, lane);
    constexpr int kUnroll = (kLHid >= 1 && kLHid <= 4) ? kLHid : 1;
#pragma unroll kUnroll
    for (int l = 0; l < kLHid; ++l) {
      unsigned h2[kMT][kHP / 16][4];
      layer<kHP, kHP, kLdWH, FMLP_ACT>(h, h2, wh_s + 2u * l * kHP * kLdWH,
                                       bias + (1 + l) * kHP, lane);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int kb = 0; kb < kHP / 16; ++kb)
#pragma unroll
          for (int i = 0; i < 4; ++i) h[mt][kb][i] = h2[mt][kb][i];
    }
    unsigned o[kMT][kOutP / 16][4];
    layer<kHP, kOutP, kLdWH, FMLP_OUT_ACT>(h, o, wl_s, bias + (kLHid + 1) * kHP, lane);
    __syncwarp();  // every lane has read its x fragments: the buffer takes y now
    store_y(p, blk, o, buf, lane);
  }
  cp_async_wait<0>();
}
