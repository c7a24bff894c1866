// What the narrow forward kernels (fused_mlp_forward.cu: mma.sync, any sm_80+;
// fused_mlp_forward_sm90.cu: wgmma, Hopper) share: their configuration from the NVRTC -D
// options, the kernel argument, and each warp's row I/O (its x tile global -> shared
// with cp.async, its y tile registers -> shared -> 16-byte global stores). The weight
// layouts in shared memory and the layer chains are each kernel's own.
//
// Configuration (one specialized kernel per configuration; fusedmlp_xpu/backends/
// cuda_build.py computes the same shared-memory size, which each kernel checks):
//   FMLP_IN, FMLP_OUT      in/out features (<= 128), FMLP_H hidden width (<= 128)
//   FMLP_L_HID             number of hidden -> hidden layers (>= 0; n_layers - 2)
//   FMLP_ACT, FMLP_OUT_ACT activation ids (activations.py), FMLP_BIAS 0/1, FMLP_BF16 0/1
//   FMLP_MT                16-row tiles per warp, FMLP_WARPS warps per CTA
//   FMLP_STAGES            x/y buffers per warp (>= 2): x tiles are copied in this many
//                          minus one row blocks ahead of the one computed
//   FMLP_MAX_LAYERS        size of the pointer arrays in FmlpForwardParams
//   FMLP_SMEM_BYTES        the host's count of the dynamic shared memory
#pragma once

#include "fmlp_device.cuh"

#ifndef FMLP_STAGES
#define FMLP_STAGES 2
#endif
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
constexpr int kMT = FMLP_MT, kWarps = FMLP_WARPS, kRows = 16 * kMT, kStages = FMLP_STAGES;
// the x/y buffers' row stride in 16-bit elements: +8 (16 bytes) shifts consecutive rows
// by 16 bytes mod 128, so the 8 rows of an ldmatrix hit 8 different bank groups
constexpr int kXY = cmax(kInP, kOutP), kLdXY = kXY + 8;
constexpr int kBiasFloats = kBias ? (kLHid + 1) * kHP + kOutP : 0;
constexpr int kBufElems = kRows * kLdXY;  // one x/y buffer of a warp
static_assert(kIn >= 1 && kIn <= 128 && kOut >= 1 && kOut <= 128 && kH >= 1 && kH <= 128,
              "widths must be in [1, 128]");
static_assert(kLHid >= 0 && kLHid + 2 <= FMLP_MAX_LAYERS, "layer count");
static_assert(kStages >= 2 && kStages <= 8, "x/y buffers per warp: 2 to 8");

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

// Stage one [rows, k] weight matrix (global, contiguous) into shared memory at ``dst``,
// zero-padded to [ROWS_P, K_P], element (r, c) at byte offset off(r, c) of the kernel's
// layout, which keeps 8 consecutive c (from a multiple of 8) in 16 contiguous bytes; all
// threads of the CTA take part, and the CTA waits with stage_wait().
// Where k is a multiple of 8: 16-byte cp.async copies (padding zero-filled), all in flight
// at once. A load and a store per chunk, as before, compiled to one dependent global
// round trip per 16 bytes: 21 in a row per thread for narrow-w128's 128 KB of weights.
template <int ROWS_P, int K_P, typename Off>
__device__ __forceinline__ void stage_weight(unsigned char* dst, const unsigned short* src,
                                             int rows, int k, Off off) {
  constexpr int CHUNKS = K_P / 8;
  if (k % 8 == 0) {  // the host passes 16-byte aligned weights
    const unsigned base = smem_addr(dst);
    for (int c = threadIdx.x; c < ROWS_P * CHUNKS; c += blockDim.x) {
      const int r = c / CHUNKS, c8 = (c % CHUNKS) * 8;
      const bool ok = r < rows && c8 < k;
      cp_async_16(base + off(r, c8), ok ? src + (long long)r * k + c8 : src, ok ? 16 : 0);
    }
  } else {
    for (int e = threadIdx.x; e < ROWS_P * K_P; e += blockDim.x) {
      const int r = e / K_P, c = e % K_P;
      *reinterpret_cast<unsigned short*>(dst + off(r, c)) =
          (r < rows && c < k) ? src[(long long)r * k + c] : (unsigned short)0;
    }
  }
}

// The staged weights landed, for every thread's reads (a __syncthreads follows).
__device__ __forceinline__ void stage_wait() {
  cp_async_commit();
  cp_async_wait<0>();
}

template <int N_P>
__device__ __forceinline__ void stage_bias(float* dst, const unsigned short* src, int n) {
  for (int i = threadIdx.x; i < N_P; i += blockDim.x)
    dst[i] = i < n ? to_float<kBF16>(src[i]) : 0.f;
}

// Every layer's bias as fp32 at ``bias``: the hidden layers' kHP each, then the last
// layer's kOutP (zero-padded); nothing without biases. All threads of the CTA take part.
// ``p``: the kernel's argument (its ``b`` pointer array).
template <typename Params>
__device__ __forceinline__ void stage_biases(float* bias, const Params& p) {
  if (kBias) {
    for (int l = 0; l <= kLHid; ++l) stage_bias<kHP>(bias + l * kHP, p.b[l], kH);
    stage_bias<kOutP>(bias + (kLHid + 1) * kHP, p.b[kLHid + 1], kOut);
  }
}

// The warp's lanes over a row block's kRows x CHUNKS 16-byte chunks, unrolled: f(r, c8,
// off) for row r of the block, first column c8 (a multiple of 8) of each chunk a lane
// takes, and off = r * ld (elements).
// - Where CHUNKS divides 32, every lane has a chunk (kRows x CHUNKS a multiple of 32: not
//   so for an 8-wide y of 16-row tiles) and the hidden width is at most 64, a lane's
//   chunks share c8 and lie 32 / CHUNKS rows apart, so off grows by a constant: one
//   64-bit add a chunk instead of a multiply. In the wgmma kernel at narrow-w64 that is
//   369 -> 331 SASS instructions a row block, for 94 -> 108 registers; at hidden 128 the
//   same form spilled (3 warpgroups, 168 registers), so wider nets take the multiply.
template <int CHUNKS, typename F>
__device__ __forceinline__ void for_chunks(int lane, long long ld, F&& f) {
  constexpr int TOTAL = kRows * CHUNKS;
  if constexpr (32 % CHUNKS == 0 && TOTAL % 32 == 0 && kHP <= 64) {
    constexpr int STEP = 32 / CHUNKS;
    const int r0 = lane / CHUNKS, c8 = (lane % CHUNKS) * 8;
    long long off = r0 * ld;
    const long long step = STEP * ld;
#pragma unroll
    for (int i = 0; i < TOTAL / 32; ++i, off += step) f(r0 + i * STEP, c8, off);
  } else {
#pragma unroll
    for (int i = 0; i < (TOTAL + 31) / 32; ++i) {
      const int c = lane + 32 * i;
      if (TOTAL % 32 != 0 && c >= TOTAL) break;
      f(c / CHUNKS, (c % CHUNKS) * 8, (c / CHUNKS) * ld);
    }
  }
}

// The same, element by element over kRows x COLS: f(r, c).
template <int COLS, typename F>
__device__ __forceinline__ void for_elements(int lane, F&& f) {
  for (int e = lane; e < kRows * COLS; e += 32) f(e / COLS, e % COLS);
}

// The warp's tile of row block ``blk`` (kRows rows of COLS columns, rows ``ld`` elements
// apart, ``n_rows`` in all) into its buffer at shared address ``buf`` (rows kLdXY apart),
// zero-padded to pad16(COLS) columns: asynchronous 16-byte copies where COLS is a
// multiple of 8 (rows outside the input and padded columns zero-filled); element by
// element otherwise.
template <int COLS>
__device__ __forceinline__ void load_rows(const unsigned short* const& src, const long long& ld,
                                          const long long& n_rows, long long blk,
                                          unsigned buf, int lane) {
  const long long row0 = blk * kRows;
  if constexpr (COLS % 8 == 0) {
    // the block's first row and its row count once; per chunk a 32-bit compare
    const unsigned short* xb = src + row0 * ld;
    const int rows = (int)(n_rows - row0 < kRows ? n_rows - row0 : kRows);
    for_chunks<pad16(COLS) / 8>(lane, ld, [&](int r, int c8, long long off) {
      const bool ok = r < rows && c8 < COLS;
      cp_async_16(buf + 2u * (r * kLdXY + c8), ok ? xb + off + c8 : src, ok ? 16 : 0);
    });
  } else {
    for_elements<pad16(COLS)>(lane, [&](int r, int c) {
      const long long row = row0 + r;
      const unsigned short v = (row < n_rows && c < COLS) ? src[row * ld + c]
                                                         : (unsigned short)0;
      st_shared_u16(buf + 2u * (r * kLdXY + c), v);
    });
  }
}

// The forward's x tile (IN columns) of row block ``blk``.
__device__ __forceinline__ void load_x(const FmlpForwardParams& p, long long blk,
                                       unsigned buf, int lane) {
  load_rows<kIn>(p.x, p.ld_x, p.n_rows, blk, buf, lane);
}

// The warp's ring of kStages x/y buffers, kBufElems each from shared address ``buf0``:
// the x tiles of its next kStages - 1 row blocks in flight while one is computed (one
// cp.async group per block, empty past the last). ``load(b, buf)`` copies block b's tile.
template <typename Load>
__device__ __forceinline__ void ring_start(long long blk, long long stride, long long n_blocks,
                                           unsigned buf0, Load&& load) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (blk + s * stride < n_blocks) load(blk + s * stride, buf0 + 2u * s * kBufElems);
    cp_async_commit();
  }
}

// The buffer of block ``blk`` (ring slot ``cur``) once its tile has landed, after the copy
// of the block kStages - 1 ahead was issued into the slot the previous block freed (its y
// tile is out: store_y ends with __syncwarp). Advances ``cur``.
template <typename Load>
__device__ __forceinline__ unsigned ring_next(long long blk, long long stride, long long n_blocks,
                                              unsigned buf0, int& cur, Load&& load) {
  const int ahead = cur == 0 ? kStages - 1 : cur - 1;
  if (blk + (kStages - 1) * stride < n_blocks)
    load(blk + (kStages - 1) * stride, buf0 + 2u * ahead * kBufElems);
  cp_async_commit();
  cp_async_wait<kStages - 1>();  // this block's group has landed; later ones may be in flight
  __syncwarp();
  const unsigned buf = buf0 + 2u * cur * kBufElems;
  cur = cur + 1 == kStages ? 0 : cur + 1;
  return buf;
}

// The warp's tile of row block ``blk`` (COLS columns) from registers (packed 16-bit
// values laid out as A fragments: the last layer's output) to its buffer, then to global
// memory at ``dst`` (rows ``ld`` elements apart, ``n_rows`` in all): 16-byte stores where
// COLS is a multiple of 8 (the destination is contiguous, so its rows are 16-byte
// aligned), else element-wise.
template <int COLS>
__device__ __forceinline__ void store_rows(unsigned short* const& dst, const long long& ld,
                                           const long long& n_rows, long long blk,
                                           const unsigned (&o)[kMT][pad16(COLS) / 16][4],
                                           unsigned buf, int lane) {
  const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nb = 0; nb < pad16(COLS) / 16; ++nb) {
      const unsigned at = buf + 2u * ((mt * 16 + g) * kLdXY + nb * 16 + t2);
      st_shared_u32(at, o[mt][nb][0]);
      st_shared_u32(at + 2u * 8 * kLdXY, o[mt][nb][1]);
      st_shared_u32(at + 2u * 8, o[mt][nb][2]);
      st_shared_u32(at + 2u * (8 * kLdXY + 8), o[mt][nb][3]);
    }
  }
  __syncwarp();
  const long long row0 = blk * kRows;
  if constexpr (COLS % 8 == 0) {
    unsigned short* yb = dst + row0 * ld;
    const int rows = (int)(n_rows - row0 < kRows ? n_rows - row0 : kRows);
    for_chunks<COLS / 8>(lane, ld, [&](int r, int c8, long long off) {
      if (r < rows) {
        unsigned v[4];
        ld_shared_v4(v, buf + 2u * (r * kLdXY + c8));
        st_global_cs_v4(yb + off + c8, v);
      }
    });
  } else {
    for_elements<COLS>(lane, [&](int r, int c) {
      const long long row = row0 + r;
      if (row < n_rows) dst[row * ld + c] = ld_shared_u16(buf + 2u * (r * kLdXY + c));
    });
  }
  __syncwarp();  // the buffer is the target of the next prefetch
}

// The forward's y tile (OUT columns) of row block ``blk``.
__device__ __forceinline__ void store_y(const FmlpForwardParams& p, long long blk,
                                        const unsigned (&o)[kMT][kOutP / 16][4],
                                        unsigned buf, int lane) {
  store_rows<kOut>(p.y, p.ld_y, p.n_rows, blk, o, buf, lane);
}

}  // namespace fmlp
