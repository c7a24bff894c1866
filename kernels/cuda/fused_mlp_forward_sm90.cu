// The narrow fully-fused MLP forward (inference) on Hopper (sm_90a) with warpgroup MMAs:
// y = out_act(W_L act(... act(W_1 x + b_1) ...) + b_L), every layer in ONE kernel, for
// x [n_rows, IN] -> y [n_rows, OUT] in fp16 or bf16 with fp32 accumulation. Same
// arithmetic as fused_mlp_forward.cu (mma.sync): the MMAs differ, not the results'
// rounding (fp32 accumulators started at the bias, one rounding per layer output).
//
// Why: the mma.sync kernel reads every B fragment from shared memory once per 16-row
// tile of a warp and issues 8x more MMA instructions; on the H200 it ran narrow-w64
// inference at 0.50-0.52 ms at every tuning against triton's wgmma kernel's 0.37
// (benchmarks/results/h200-cuda-fwd-tunings-narrow-w64-20261203.json). This one ran it
// at 0.43-0.44 ms (fp16/bf16, 4 warpgroups), and narrow-w128 at 0.86 against triton's
// 0.85 (3 warpgroups): h200-cuda-fwd-wgmma-*-20261203.json. With fewer instructions a
// row block (relu in the 16-bit conversion, scale-d 0 without bias, cheaper row I/O:
// 778 -> 331 SASS instructions) it ran narrow-w64 at 0.331 / 0.314 ms against triton's
// 0.367 / 0.351 and narrow-w128 at 0.798 against 0.840 (h200-cuda-fwd-*-20261204*):
// Nsight Compute had shown the first form moving triton's bytes with ~1.8x its
// instructions, and deeper x prefetch changed nothing. Not the in-warpgroup order of MMAs
// and epilogues either: a variant running two row blocks a warpgroup interleaved (one's
// MMAs beside the other's epilogue, 182 registers) was slower, 0.47-0.48 ms at 1-2
// warpgroups (h200-cuda-fwd-pairs-narrow-w64-*-20261203.json).
//
// Layout of the work:
// - Every CTA stages all layers' weights (biases as fp32) in shared memory once, in
//   wgmma's core-matrix layout without swizzling (fmlp_wgmma.cuh), zero-padded to
//   multiples of 16; then a proxy fence (wgmma reads shared memory through the async
//   proxy) and one __syncthreads. The grid is persistent.
// - A warpgroup (4 warps) owns row blocks of 64 rows, striding over the grid's
//   warpgroups; warp w of it holds rows 16 w .. 16 w + 15 of the block: its x tile
//   copied with cp.async kStages - 1 blocks ahead of the one the warpgroup computes
//   (a ring of kStages buffers per warp), read as A fragments with ldmatrix, its y tile
//   written through the same buffer (fmlp_forward_common.cuh: the mma.sync kernel's row
//   I/O at 16 rows a warp).
// - Each layer is one wgmma group: m64nNk16 over its k slices (N = the layer's padded
//   outputs), A from registers, B from shared memory; then bias (already in the
//   accumulators), activation, and packing to the next layer's A fragments, in registers.
//   Several warpgroups per SM overlap one's MMAs with another's epilogue.
//
// Configuration: the -D options of fmlp_forward_common.cuh, with FMLP_MT 1 and
// FMLP_WARPS a multiple of 4 (warpgroups x 4).
#include "fmlp_forward_common.cuh"
#include "fmlp_sm90.cuh"

namespace fmlp {

static_assert(kMT == 1, "the wgmma forward holds 16 rows a warp");
static_assert(kWarps % 4 == 0, "whole warpgroups");
constexpr int kWG = kWarps / 4;
// byte offsets of the weight regions (core-matrix layout: N_P x K_P x 2 bytes each), then
// the biases (fp32), then kStages x/y buffers per warp
constexpr unsigned kOffWH = 2u * kHP * kInP;
constexpr unsigned kOffWL = kOffWH + 2u * kLHid * kHP * kHP;
constexpr unsigned kWeightBytes = kOffWL + 2u * kOutP * kHP;
constexpr unsigned kSmemBytes = kWeightBytes + 4u * kBiasFloats + 2u * kStages * kWarps * kBufElems;
static_assert(kWeightBytes % 16 == 0, "weight region not a multiple of 16 bytes");
static_assert(kSmemBytes == FMLP_SMEM_BYTES, "host and kernel disagree on shared memory");

}  // namespace fmlp

extern "C" __global__ void __launch_bounds__(FMLP_WARPS * 32, 1)
fmlp_forward_sm90(const FmlpForwardParams p) {
  using namespace fmlp;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  if (dynamic_smem_size() < kSmemBytes) __trap();  // a host/kernel size mismatch

  // --- weights and biases, once per CTA ---
  float* bias = reinterpret_cast<float*>(smem_bytes + kWeightBytes);
  stage_weight_cm<kHP, kInP>(smem_bytes, p.w[0], kH, kIn);
  for (int l = 0; l < kLHid; ++l)
    stage_weight_cm<kHP, kHP>(smem_bytes + kOffWH + 2u * l * kHP * kHP, p.w[1 + l], kH, kH);
  stage_weight_cm<kOutP, kHP>(smem_bytes + kOffWL, p.w[kLHid + 1], kOut, kH);
  stage_biases(bias, p);
  stage_wait();
  // the copies and stores above, visible to wgmma's async-proxy reads
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();

  // --- row blocks of 64, one warpgroup each; 16 rows a warp ---
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wg = warp >> 2, wl = warp & 3;
  const unsigned base = smem_addr(smem_bytes);
  const unsigned buf0 = base + kWeightBytes + 4u * kBiasFloats + 2u * (kStages * warp) * kBufElems;
  const unsigned w0_s = base, wh_s = base + kOffWH, wl_s = base + kOffWL;
  const long long n_blocks = (p.n_rows + 63) / 64;
  const long long stride = (long long)gridDim.x * kWG;
  // lane's row address in the four 8x8 A matrices: (rows 0-7 | 8-15) x (k 0-7 | 8-15)
  const unsigned a_lane = 2u * (((lane & 7) + ((lane >> 3) & 1) * 8) * kLdXY + (lane >> 4) * 8);

  // this warp's 16 rows of row block b
  auto load = [&](long long b, unsigned buf) { load_x(p, 4 * b + wl, buf, lane); };
  long long blk = (long long)blockIdx.x * kWG + wg;
  ring_start(blk, stride, n_blocks, buf0, load);
  int cur = 0;
  for (; blk < n_blocks; blk += stride) {  // uniform across the warpgroup
    const unsigned buf = ring_next(blk, stride, n_blocks, buf0, cur, load);

    unsigned xa[kInP / 16][4];
#pragma unroll
    for (int kb = 0; kb < kInP / 16; ++kb) ldmatrix_x4(xa[kb], buf + a_lane + 2u * kb * 16);

    unsigned h[kHP / 16][4];
    layer<kInP, kHP, FMLP_ACT>(xa, h, w0_s, bias, lane);
    constexpr int kUnroll = (kLHid >= 1 && kLHid <= 4) ? kLHid : 1;
#pragma unroll kUnroll
    for (int l = 0; l < kLHid; ++l) {
      unsigned h2[kHP / 16][4];
      layer<kHP, kHP, FMLP_ACT>(h, h2, wh_s + 2u * l * kHP * kHP, bias + (1 + l) * kHP, lane);
#pragma unroll
      for (int kb = 0; kb < kHP / 16; ++kb)
#pragma unroll
        for (int i = 0; i < 4; ++i) h[kb][i] = h2[kb][i];
    }
    unsigned o[1][kOutP / 16][4];
    layer<kHP, kOutP, FMLP_OUT_ACT>(h, o[0], wl_s, bias + (kLHid + 1) * kHP, lane);
    __syncwarp();  // every lane has read its x fragments: the buffer takes y now
    store_y(p, 4 * blk + wl, o, buf, lane);
  }
  cp_async_wait<0>();
}
