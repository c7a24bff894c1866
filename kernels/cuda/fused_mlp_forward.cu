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
//   whole grid. Its block's x tile is copied global -> shared with cp.async while the
//   warp computes the previous block (two buffers per warp), then read as MMA A
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
// Configuration (NVRTC -D options, one specialized kernel per configuration; see
// fusedmlp_xpu/backends/cuda_build.py, which also computes the same shared-memory size):
//   FMLP_IN, FMLP_OUT      in/out features (<= 128), FMLP_H hidden width (<= 128)
//   FMLP_L_HID             number of hidden -> hidden layers (>= 0; n_layers - 2)
//   FMLP_ACT, FMLP_OUT_ACT activation ids (activations.py), FMLP_BIAS 0/1, FMLP_BF16 0/1
//   FMLP_MT                16-row tiles per warp, FMLP_WARPS warps per CTA
//   FMLP_MAX_LAYERS        size of the pointer arrays in FmlpForwardParams
//   FMLP_SMEM_BYTES        the host's count of the dynamic shared memory (checked here)
#include "fmlp_device.cuh"

#ifndef FMLP_MAX_LAYERS
#define FMLP_MAX_LAYERS 32
#endif

namespace fmlp {

__host__ __device__ constexpr int pad16(int v) { return (v + 15) / 16 * 16; }
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }

constexpr bool kBF16 = FMLP_BF16 != 0;
constexpr bool kBias = FMLP_BIAS != 0;
constexpr int kIn = FMLP_IN, kOut = FMLP_OUT, kH = FMLP_H, kLHid = FMLP_L_HID;
constexpr int kInP = pad16(kIn), kOutP = pad16(kOut), kHP = pad16(kH);
constexpr int kMT = FMLP_MT, kWarps = FMLP_WARPS, kRows = 16 * kMT;
// row strides in shared memory, in 16-bit elements: +8 (16 bytes) shifts consecutive rows
// by 16 bytes mod 128, so the 8 rows of an ldmatrix hit 8 different bank groups
constexpr int kLdW0 = kInP + 8, kLdWH = kHP + 8;
constexpr int kXY = cmax(kInP, kOutP), kLdXY = kXY + 8;
// element offsets of the shared-memory regions: W_1, the hidden W's, W_L, then the
// biases (fp32), then two x/y buffers per warp
constexpr int kOffWH = kHP * kLdW0;
constexpr int kOffWL = kOffWH + kLHid * kHP * kLdWH;
constexpr int kWeightElems = kOffWL + kOutP * kLdWH;
constexpr int kBiasFloats = kBias ? (kLHid + 1) * kHP + kOutP : 0;
constexpr int kBufElems = kRows * kLdXY;
constexpr unsigned kSmemBytes =
    2u * kWeightElems + 4u * kBiasFloats + 2u * 2u * kWarps * kBufElems;
// the biases' byte offset must stay 16-byte aligned for the buffers after them
static_assert((2 * kWeightElems) % 16 == 0, "weight region not a multiple of 16 bytes");
// the host computes the same size (cuda_build.ForwardConfig.smem_bytes) and passes it
static_assert(kSmemBytes == FMLP_SMEM_BYTES, "host and kernel disagree on shared memory");
static_assert(kIn >= 1 && kIn <= 128 && kOut >= 1 && kOut <= 128 && kH >= 1 && kH <= 128,
              "widths must be in [1, 128]");
static_assert(kLHid >= 0 && kLHid + 2 <= FMLP_MAX_LAYERS, "layer count");

}  // namespace fmlp

// The kernel's one argument, mirrored by ctypes in fusedmlp_xpu/backends/cuda_build.py.
struct FmlpForwardParams {
  const unsigned short* x;  // [n_rows, IN], rows ld_x elements apart, columns contiguous
  unsigned short* y;        // [n_rows, OUT], rows ld_y elements apart
  long long n_rows;
  long long ld_x;
  long long ld_y;
  const unsigned short* w[FMLP_MAX_LAYERS];  // layer l: [out_l, in_l], contiguous rows
  const unsigned short* b[FMLP_MAX_LAYERS];  // layer l: [out_l]; unused without bias
};

namespace fmlp {

// Stage one [rows, k] weight matrix (global, contiguous) into shared memory as
// [ROWS_P, K_P + 8], zero-padded; all threads of the CTA take part.
template <int ROWS_P, int K_P>
__device__ __forceinline__ void stage_weight(unsigned short* dst, const unsigned short* src,
                                             int rows, int k) {
  constexpr int LD = K_P + 8, CHUNKS = K_P / 8;
  if (k % 8 == 0) {  // 16-byte chunks (the host passes 16-byte aligned weights)
    for (int c = threadIdx.x; c < ROWS_P * CHUNKS; c += blockDim.x) {
      const int r = c / CHUNKS, c8 = (c % CHUNKS) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows && c8 < k) v = *reinterpret_cast<const uint4*>(src + (long long)r * k + c8);
      *reinterpret_cast<uint4*>(dst + r * LD + c8) = v;
    }
  } else {
    for (int e = threadIdx.x; e < ROWS_P * K_P; e += blockDim.x) {
      const int r = e / K_P, c = e % K_P;
      dst[r * LD + c] = (r < rows && c < k) ? src[(long long)r * k + c] : (unsigned short)0;
    }
  }
}

template <int N_P>
__device__ __forceinline__ void stage_bias(float* dst, const unsigned short* src, int n) {
  for (int i = threadIdx.x; i < N_P; i += blockDim.x)
    dst[i] = i < n ? to_float<kBF16>(src[i]) : 0.f;
}

// The warp's lanes over a row block's kRows x CHUNKS 16-byte chunks, unrolled: f(r, c8)
// for row r of the block and first column c8 (a multiple of 8) of each chunk a lane takes.
template <int CHUNKS, typename F>
__device__ __forceinline__ void for_chunks(int lane, F&& f) {
  constexpr int TOTAL = kRows * CHUNKS;
#pragma unroll
  for (int i = 0; i < (TOTAL + 31) / 32; ++i) {
    const int c = lane + 32 * i;
    if (TOTAL % 32 != 0 && c >= TOTAL) break;
    f(c / CHUNKS, (c % CHUNKS) * 8);
  }
}

// The same, element by element over kRows x COLS: f(r, c).
template <int COLS, typename F>
__device__ __forceinline__ void for_elements(int lane, F&& f) {
  for (int e = lane; e < kRows * COLS; e += 32) f(e / COLS, e % COLS);
}

// The warp's x tile of row block ``blk`` into its buffer at shared address ``buf``:
// asynchronous 16-byte copies where IN is a multiple of 8 (rows outside the input and
// padded columns zero-filled); element by element otherwise.
__device__ __forceinline__ void load_x(const FmlpForwardParams& p, long long blk,
                                       unsigned buf, int lane) {
  const long long row0 = blk * kRows;
  if (kIn % 8 == 0) {
    for_chunks<kInP / 8>(lane, [&](int r, int c8) {
      const long long row = row0 + r;
      const bool ok = row < p.n_rows && c8 < kIn;
      const unsigned short* src = ok ? p.x + row * p.ld_x + c8 : p.x;
      cp_async_16(buf + 2u * (r * kLdXY + c8), src, ok ? 16 : 0);
    });
  } else {
    for_elements<kInP>(lane, [&](int r, int c) {
      const long long row = row0 + r;
      const unsigned short v = (row < p.n_rows && c < kIn) ? p.x[row * p.ld_x + c]
                                                         : (unsigned short)0;
      st_shared_u16(buf + 2u * (r * kLdXY + c), v);
    });
  }
}

// One layer: out[mt][nb] (A fragments of the next layer) = act(in[mt][:] W^T + bias)
// for N_P output columns, K_P inputs; W in shared memory at ``w`` (row stride LDW).
template <int K_P, int N_P, int LDW, int ACT>
__device__ __forceinline__ void layer(const unsigned (&in)[kMT][K_P / 16][4],
                                      unsigned (&out)[kMT][N_P / 16][4], unsigned w,
                                      const float* bias, int lane) {
  // lane's row address in the four 8x8 B matrices: (n 0-7 | 8-15) x (k 0-7 | 8-15)
  const unsigned b_lane = w + 2u * ((((lane >> 4) << 3) + (lane & 7)) * LDW + ((lane >> 3) & 1) * 8);
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
      out[mt][nb][0] = pack2<kBF16>(act<ACT>(acc[mt][0][0]), act<ACT>(acc[mt][0][1]));
      out[mt][nb][1] = pack2<kBF16>(act<ACT>(acc[mt][0][2]), act<ACT>(acc[mt][0][3]));
      out[mt][nb][2] = pack2<kBF16>(act<ACT>(acc[mt][1][0]), act<ACT>(acc[mt][1][1]));
      out[mt][nb][3] = pack2<kBF16>(act<ACT>(acc[mt][1][2]), act<ACT>(acc[mt][1][3]));
    }
  }
}

// The warp's y tile from registers (the last layer's packed output, laid out as A
// fragments) to its buffer, then to global memory: 16-byte stores where OUT is a
// multiple of 8 (y is contiguous, so its rows are 16-byte aligned), else element-wise.
__device__ __forceinline__ void store_y(const FmlpForwardParams& p, long long blk,
                                        const unsigned (&o)[kMT][kOutP / 16][4],
                                        unsigned buf, int lane) {
  const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nb = 0; nb < kOutP / 16; ++nb) {
      const unsigned at = buf + 2u * ((mt * 16 + g) * kLdXY + nb * 16 + t2);
      st_shared_u32(at, o[mt][nb][0]);
      st_shared_u32(at + 2u * 8 * kLdXY, o[mt][nb][1]);
      st_shared_u32(at + 2u * 8, o[mt][nb][2]);
      st_shared_u32(at + 2u * (8 * kLdXY + 8), o[mt][nb][3]);
    }
  }
  __syncwarp();
  const long long row0 = blk * kRows;
  if (kOut % 8 == 0) {
    for_chunks<kOut / 8>(lane, [&](int r, int c8) {
      const long long row = row0 + r;
      if (row < p.n_rows) {
        unsigned v[4];
        ld_shared_v4(v, buf + 2u * (r * kLdXY + c8));
        st_global_cs_v4(p.y + row * p.ld_y + c8, v);
      }
    });
  } else {
    for_elements<kOut>(lane, [&](int r, int c) {
      const long long row = row0 + r;
      if (row < p.n_rows) p.y[row * p.ld_y + c] = ld_shared_u16(buf + 2u * (r * kLdXY + c));
    });
  }
  __syncwarp();  // the buffer is the target of the next prefetch
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
  stage_weight<kHP, kInP>(w0, p.w[0], kH, kIn);
  for (int l = 0; l < kLHid; ++l)
    stage_weight<kHP, kHP>(wh + l * kHP * kLdWH, p.w[1 + l], kH, kH);
  stage_weight<kOutP, kHP>(wl, p.w[kLHid + 1], kOut, kH);
  if (kBias) {
    for (int l = 0; l <= kLHid; ++l) stage_bias<kHP>(bias + l * kHP, p.b[l], kH);
    stage_bias<kOutP>(bias + (kLHid + 1) * kHP, p.b[kLHid + 1], kOut);
  }
  __syncthreads();

  // --- row blocks, each warp on its own ---
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const unsigned buf0 = smem_addr(smem + kWeightElems + 2 * kBiasFloats) +
                        2u * (2 * warp) * kBufElems;
  const unsigned w0_s = smem_addr(w0), wh_s = smem_addr(wh), wl_s = smem_addr(wl);
  const long long n_blocks = (p.n_rows + kRows - 1) / kRows;
  const long long stride = (long long)gridDim.x * kWarps;
  // lane's row address in the four 8x8 A matrices: (rows 0-7 | 8-15) x (k 0-7 | 8-15)
  const unsigned a_lane = 2u * (((lane & 7) + ((lane >> 3) & 1) * 8) * kLdXY + (lane >> 4) * 8);

  long long blk = (long long)blockIdx.x * kWarps + warp;
  if (blk < n_blocks) load_x(p, blk, buf0, lane);
  cp_async_commit();
  int cur = 0;
  for (; blk < n_blocks; blk += stride) {
    const unsigned buf = buf0 + 2u * cur * kBufElems;
    if (blk + stride < n_blocks) load_x(p, blk + stride, buf0 + 2u * (cur ^ 1) * kBufElems, lane);
    cp_async_commit();
    cp_async_wait<1>();  // this block's tile has landed (the next one may be in flight)
    __syncwarp();

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
    cur ^= 1;
  }
  cp_async_wait<0>();
}
