// The narrow MLP's backward on Hopper (sm_90a), ONE kernel: for x [n_rows, IN] and the
// output gradient gy [n_rows, OUT] (fp16 or bf16), every row block's forward computed
// again from x, the gradient walked back through the layers, and every weight and bias
// gradient summed over the CTA's row blocks into its fp32 partial; the host sums the
// partials (one per CTA) and rounds them to the weights' dtype. Also gx = dL/dx.
// Nothing is read from the forward: a train step's forward saves nothing.
//
// The design of the Triton backend's Gluon kernel (narrow/hopper_backward.py), in CUDA
// C++: warp specialization by warpgroup, every weight in shared memory, the weight-
// gradient sums in registers of one warpgroup that does nothing else.
// - kChains "chain" warpgroups (2; 3 at hidden widths up to 32), each over its share of the CTA's 64-row blocks (16 rows a
//   warp, as in the forward): the forward again (fused_mlp_forward_sm90.cu's layers),
//   each layer's activation h_l also stored transposed (h_l^T: [width][64 rows], the
//   layout the sums read as B); then g_L = gy * out_act'(y), and for l = L .. 1:
//   g_{l-1} = (g_l W_l) * act'(h_{l-1}), act' from the stored h (grad_from_output: relu,
//   leaky relu, identity, sigmoid, tanh, softplus); each g_l handed over transposed
//   (g_l^T: [64][64 rows]) to the summing warpgroup; then gx = g_0 W_0 (W_l^T staged
//   beside W_l: the chain's MMAs take B K-major).
// - One "sums" warpgroup holds dW_l (m64nN fp32 accumulators: 32 registers a thread for
//   a 64 x 64 layer) and db_l and adds g_l^T h_{l-1} (h_{-1} = x) for every hand-over:
//   wgmma with both operands from shared memory (A = g^T, M = 64 outputs: an output
//   width under 64 leaves rows of the sum nobody reads), and g_l^T ones for the biases.
// - Hand-overs: per chain FMLP_G_BUFS g^T tiles (1 or 2: two where shared memory allows),
//   each with two mbarriers, "full" (the chain's 128 threads arrive after storing g^T and
//   a proxy fence) and "empty" (the summing warpgroup's 128 threads arrive once its MMAs
//   have read g^T and h^T). A chain waits for the release of a tile's previous use before
//   storing into it, and at the start of a block for the release of its last hand-over
//   (so h^T and x^T of a block stay until the sums have read them). The summing
//   warpgroup takes the CTA's blocks in order, alternating chains, each block's hand-overs
//   in turn: one chain's backward is summed while the other computes its forward (the
//   Gluon kernel's order). With two tiles a chain one group of its MMAs stays in flight
//   (a tile goes back once the next hand-over's MMAs are issued), drained at each
//   block's end.
// - setmaxnreg gives the summing warpgroup 232 registers and the chains 136 each.
//
// Status: compiled for sm_90a in CI (ci/aot_cuda.py: no spills, no serialized wgmma);
// NOT yet run on a GPU. Hidden width 16, 32 or 64; in and out widths up to 64. Every g^T
// tile is 64 wide (the sums' M): a narrower layer's g fills its first columns, and the
// sums' rows past the layer's outputs are never read.
//
// Configuration: the -D options of fmlp_forward_common.cuh (FMLP_MT 1, FMLP_WARPS 4 x
// (chains + 1)), and
//   FMLP_NEED_X          1: write gx
//   FMLP_NEED_WB         1: sum the weight (and, with FMLP_BIAS, bias) gradients
//   FMLP_PARTIAL_FLOATS  the host's count of one CTA's partial (checked here)
//   FMLP_G_BUFS          g^T tiles a chain (1 or 2)
#include "fmlp_forward_common.cuh"
#include "fmlp_sm90.cuh"

// The kernel's one argument, mirrored by ctypes in fusedmlp_xpu/backends/cuda_build.py.
struct FmlpBackwardParams {
  const unsigned short* x;   // [n_rows, IN], rows ld_x elements apart
  const unsigned short* gy;  // [n_rows, OUT], rows ld_gy apart
  unsigned short* gx;        // [n_rows, IN], rows ld_gx apart; unused without FMLP_NEED_X
  // [gridDim.x, FMLP_PARTIAL_FLOATS]: per CTA the weight-gradient accumulators as the
  // summing warpgroup holds them (partial_offset); unused without FMLP_NEED_WB
  float* partial;
  long long n_rows;
  long long ld_x;
  long long ld_gy;
  long long ld_gx;
  const unsigned short* w[FMLP_MAX_LAYERS];  // layer l: [out_l, in_l], contiguous rows
  const unsigned short* b[FMLP_MAX_LAYERS];  // layer l: [out_l]; unused without bias
};

namespace fmlp {

constexpr bool kNeedX = FMLP_NEED_X != 0;
constexpr bool kNeedWB = FMLP_NEED_WB != 0;
constexpr int kChains = kWarps / 4 - 1;
constexpr int kL = kLHid + 1;  // the last layer's index: layers 0 .. kL
constexpr int kBM = 64;        // rows of a chain's block (a warpgroup's MMA)
constexpr int kGP = 64;        // g^T's rows: the sums' M
constexpr int kGBufs = FMLP_G_BUFS;  // g^T tiles a chain: hand-over u takes tile u % kGBufs
// the last layer is computed again only where its derivative needs y
constexpr bool kOutFwd = FMLP_OUT_ACT != NONE;
static_assert(kMT == 1 && kWarps % 4 == 0 && kChains >= 1 && kChains <= 3,
              "16 rows a warp; 1 to 3 chain warpgroups and the summing one");
static_assert(kChains < 3 || kHP <= 32, "three chains at hidden widths up to 32");
static_assert(kGBufs == 1 || kGBufs == 2, "one or two g^T tiles a chain");
static_assert(kHP == 16 || kHP == 32 || kHP == 64, "hidden width 16, 32 or 64");
static_assert(kInP <= 64 && kOutP <= 64, "in and out widths up to 64");
static_assert(grad_from_output(FMLP_ACT) && grad_from_output(FMLP_OUT_ACT),
              "activations whose derivative is a function of their output");

// shared memory, in bytes from the base: forward weights (layer 0, hidden, last where
// kOutFwd), transposed weights (layer 0 where kNeedX, hidden, last), biases (fp32), the
// ones tile of the bias sums, the mbarriers (each region a multiple of 128 bytes), each chain's tiles, each chain warp's buffers
constexpr unsigned kW0 = 2u * kHP * kInP, kWH = 2u * kHP * kHP, kWL = 2u * kOutP * kHP;
constexpr unsigned kOffFwdH = kW0;
constexpr unsigned kOffFwdL = kOffFwdH + kLHid * kWH;
constexpr unsigned kOffT0 = kOffFwdL + (kOutFwd ? kWL : 0u);
constexpr unsigned kOffTH = kOffT0 + (kNeedX ? kW0 : 0u);
constexpr unsigned kOffTL = kOffTH + kLHid * kWH;
constexpr unsigned kOffBias = kOffTL + kWL;
constexpr bool kBiasSums = kBias && kNeedWB;
constexpr unsigned kOffOnes = kOffBias + (4u * kBiasFloats + 127u) / 128u * 128u;
constexpr unsigned kOffBar = kOffOnes + (kBiasSums ? 2u * 8 * kBM : 0u);
// mbarriers "full" and "empty" (8 bytes each) of each chain's g^T tiles
constexpr unsigned kOffTiles = kOffBar + 128u;
static_assert(16 * kChains * kGBufs <= 128, "mbarrier region");
// a chain's tiles: x^T [IN_P][64], h_l^T [H_P][64] for l < kL, kGBufs g^T [64][64]
constexpr unsigned kXT = 2u * kInP * kBM, kHT = 2u * kHP * kBM, kGT = 2u * kGP * kBM;
constexpr unsigned kChainTiles = kXT + kL * kHT + kGBufs * kGT;
constexpr unsigned kOffBufs = kOffTiles + kChains * kChainTiles;
// two buffers of 16 rows a chain warp: x in; gy in, then gx out
constexpr unsigned kSmemBytes = kOffBufs + 2u * 2 * (4 * kChains) * kBufElems;
static_assert(kOffBar % 16 == 0 && kOffTiles % 128 == 0, "alignment");
static_assert(kSmemBytes == FMLP_SMEM_BYTES, "host and kernel disagree on shared memory");

// One CTA's partial: for each layer l, the summing warpgroup's dW_l accumulators as they
// lie in its registers (thread-major: thread i's N_l / 2 floats, then thread i + 1's),
// then, with biases, its 4 db_l accumulators a thread the same way. Coalesced 16-byte
// stores, no address arithmetic per element; the host sums the CTAs' partials and
// gathers the dense gradients from the fragment layout (cuda_build.partial_index).
__host__ __device__ __forceinline__ constexpr int n_of(int l) { return l == 0 ? kInP : kHP; }
__host__ __device__ __forceinline__ constexpr int partial_offset(int l) {
  // a loop, not recursion: a recursive call stays a call, and ptxas drops setmaxnreg in
  // a kernel that makes one
  int off = 0;
  for (int j = 0; j < l; ++j) off += 128 * (n_of(j) / 2 + (kBias ? 4 : 0));
  return off;
}
constexpr int kPartialFloats = partial_offset(kL + 1);
static_assert(kPartialFloats == FMLP_PARTIAL_FLOATS, "host and kernel disagree on the partial");

// registers a thread: two chains 136 beside the sums' 232 (up to 5 sums of 64 x 64: 160
// accumulators, 20 of the biases'); three (hidden <= 32: sums of 32 columns) 120 beside 152
constexpr unsigned kSumRegs = kChains == 3 ? 152 : 232;
constexpr unsigned kChainRegs = kChains == 3 ? 120 : 136;
static_assert(kSumRegs * 128 + kChainRegs * 128 * kChains <= 65536, "register file");

// Lane's address for ldmatrix/stmatrix .trans of the 16 x 16 fragment block (this warp's
// rows r0 .. r0 + 15, columns c0 .. c0 + 15) of a tile kept transposed (column n at
// stored row n of the core-matrix layout with NP rows; the 64 rows along k). Matrix j =
// lane / 8 covers rows r0 + 8 (j & 1), columns c0 + 8 (j >> 1); lane % 8 its stored row.
template <int NP>
__device__ __forceinline__ unsigned t_addr(unsigned tile, int c0, int r0, int lane) {
  const int j = lane >> 3;
  return tile + cm_offset<NP>(c0 + (j >> 1) * 8 + (lane & 7), r0 + (j & 1) * 8);
}

// Fragments (A layout, 16 rows x NCOL columns of this warp) into a transposed tile.
template <int NP, int NCOL>
__device__ __forceinline__ void store_t(unsigned tile, const unsigned (&f)[NCOL / 16][4], int r0,
                                        int lane) {
#pragma unroll
  for (int nb = 0; nb < NCOL / 16; ++nb) stmatrix_x4_trans(t_addr<NP>(tile, 16 * nb, r0, lane), f[nb]);
}

// Two fp32 gradients times act'(.) of their packed outputs h, packed to 16 bits (one
// rounding: the product is formed in fp32).
template <int ACT>
__device__ __forceinline__ unsigned grad_pack2(float g0, float g1, unsigned h) {
  float h0, h1;
  unpack2<kBF16>(h, h0, h1);
  return pack2<kBF16>(times_grad_from_output<ACT>(g0, h0), times_grad_from_output<ACT>(g1, h1));
}

// The same for two packed gradients.
template <int ACT>
__device__ __forceinline__ unsigned times_grad2(unsigned g, unsigned h) {
  float g0, g1;
  unpack2<kBF16>(g, g0, g1);
  return grad_pack2<ACT>(g0, g1, h);
}

// this chain's count of row blocks (blocks c0, c0 + stride, ...)
__device__ __forceinline__ long long blocks_of(long long c0, long long stride, long long n) {
  return c0 < n ? (n - 1 - c0) / stride + 1 : 0;
}

// One thread's accumulators to its slot of the partial (16-byte stores).
template <int N>
__device__ __forceinline__ void write_sum(float* out, const float (&d)[N], int thread) {
  static_assert(N % 4 == 0, "whole float4s");
#pragma unroll
  for (int i = 0; i < N; i += 4)
    *reinterpret_cast<float4*>(out + thread * N + i) = make_float4(d[i], d[i + 1], d[i + 2], d[i + 3]);
}

// The summing warpgroup: every chain's hand-overs in order, then the CTA's partial.
__device__ __forceinline__ void sums(const FmlpBackwardParams& p, unsigned base,
                                     long long n_blocks, long long stride) {
  float d0[kInP / 2], dh[kLHid > 0 ? kLHid : 1][kHP / 2], dl[kHP / 2], db[kL + 1][4];
#pragma unroll
  for (int i = 0; i < kInP / 2; ++i) d0[i] = 0.f;
#pragma unroll
  for (int l = 0; l < (kLHid > 0 ? kLHid : 1); ++l)
#pragma unroll
    for (int i = 0; i < kHP / 2; ++i) dh[l][i] = 0.f;
#pragma unroll
  for (int i = 0; i < kHP / 2; ++i) dl[i] = 0.f;
#pragma unroll
  for (int l = 0; l <= kL; ++l)
#pragma unroll
    for (int i = 0; i < 4; ++i) db[l][i] = 0.f;

  // the CTA's blocks in order (block j of chain c is its j * kChains + c-th), each block's
  // hand-overs l = kL .. 0 in turn: one chain's backward is summed while the other
  // computes its forward (the Gluon kernel's order)
  long long total = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c)
    total += blocks_of((long long)blockIdx.x * kChains + c, stride, n_blocks);
  const unsigned ones = base + kOffOnes;
  unsigned prev = 0;  // the barriers of the hand-over whose MMAs may still be in flight
  for (long long i = 0; i < total; ++i) {
    const int c = (int)(i % kChains);
    const long long j = i / kChains;
    const unsigned tiles = base + kOffTiles + c * kChainTiles;
#pragma unroll
    for (int l = kL; l >= 0; --l) {
      const long long u = j * (kL + 1) + (kL - l);  // the chain's hand-over count
      const int b = (int)(u % kGBufs);
      const unsigned bar = base + kOffBar + 16u * (c * kGBufs + b);
      mbar_wait(bar, (unsigned)((u / kGBufs) & 1));  // "full": g_l^T is in
      const unsigned gt = tiles + kXT + kL * kHT + b * kGT;
      const unsigned in_t = l == 0 ? tiles : tiles + kXT + (l - 1) * kHT;
      wgmma_fence();
#pragma unroll
      for (int kb = 0; kb < kBM / 16; ++kb) {
        const unsigned long long a = wgmma_desc(gt + kb * kGP * 32u, kGP * 16u, 128u);
        if (l == 0) {
          WgmmaSS<kInP>::mma(d0, a, wgmma_desc(in_t + kb * kInP * 32u, kInP * 16u, 128u), 1);
        } else if (l == kL) {
          WgmmaSS<kHP>::mma(dl, a, wgmma_desc(in_t + kb * kHP * 32u, kHP * 16u, 128u), 1);
        } else {
          WgmmaSS<kHP>::mma(dh[l > 0 && l < kL ? l - 1 : 0], a,
                            wgmma_desc(in_t + kb * kHP * 32u, kHP * 16u, 128u), 1);
        }
        if (kBiasSums) WgmmaSS<8>::mma(db[l], a, wgmma_desc(ones + kb * 256u, 128u, 128u), 1);
      }
      wgmma_commit();
      if (kGBufs == 2) {
        // one group in flight: the previous hand-over's MMAs are done once this one's are
        // issued, and its tile goes back then (the chain already stores into the other);
        // at the block's end every group is waited for, so a chain starting its next
        // block never waits on a release that needs that block's own hand-overs
        if (l < kL) {
          wgmma_wait<1>();
          mbar_arrive(prev + 8);
        }
        if (l == 0) {
          wgmma_wait<0>();
          mbar_arrive(bar + 8);
        }
        prev = bar;
      } else {
        wgmma_wait<0>();
        mbar_arrive(bar + 8);  // "empty": g^T and the layer's input tile are read
      }
    }
  }
  pin(d0);
  pin(dl);
#pragma unroll
  for (int q = 0; q < (kLHid > 0 ? kLHid : 1); ++q) pin(dh[q]);
#pragma unroll
  for (int q = 0; q <= kL; ++q) pin(db[q]);

  float* out = p.partial + (long long)blockIdx.x * kPartialFloats;
  const int thread = threadIdx.x & 127;
#pragma unroll
  for (int l = 0; l <= kL; ++l) {
    float* o = out + partial_offset(l);
    if (l == 0) {
      write_sum(o, d0, thread);
    } else if (l == kL) {
      write_sum(o, dl, thread);
    } else {
      write_sum(o, dh[l > 0 && l < kL ? l - 1 : 0], thread);
    }
    if (kBias) write_sum(o + 128 * (n_of(l) / 2), db[l], thread);
  }
}

// The end of the CTA: invalidate the mbarriers once every warp is done with them. The
// summing warpgroup arrives at named barrier 1 without waiting (it exits at once: a
// __syncthreads there tipped its 232 registers into spills), the chains wait for it there
// and their first threads invalidate the barriers.
constexpr int kRetireBar = 1;  // barrier 0 is __syncthreads'
__device__ __forceinline__ void sums_done() {
  asm volatile("bar.arrive %0, %1;" :: "n"(kRetireBar), "n"(kWarps * 32) : "memory");
}
__device__ __forceinline__ void retire_barriers(unsigned base) {
  asm volatile("bar.sync %0, %1;" :: "n"(kRetireBar), "n"(kWarps * 32) : "memory");
  if (threadIdx.x < kChains * kGBufs) {  // warp 0, a chain's
    mbar_inval(base + kOffBar + 16u * threadIdx.x);
    mbar_inval(base + kOffBar + 16u * threadIdx.x + 8);
  }
}

}  // namespace fmlp

extern "C" __global__ void __launch_bounds__(FMLP_WARPS * 32, 1)
fmlp_backward_sm90(const FmlpBackwardParams p) {
  using namespace fmlp;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  if (dynamic_smem_size() < kSmemBytes) __trap();  // a host/kernel size mismatch

  // --- weights (as the forward's, and transposed), biases, ones, mbarriers: once ---
  stage_weight_cm<kHP, kInP>(smem_bytes, p.w[0], kH, kIn);
  for (int l = 0; l < kLHid; ++l)
    stage_weight_cm<kHP, kHP>(smem_bytes + kOffFwdH + l * kWH, p.w[1 + l], kH, kH);
  if (kOutFwd) stage_weight_cm<kOutP, kHP>(smem_bytes + kOffFwdL, p.w[kL], kOut, kH);
  if (kNeedX) stage_weight_t_cm<kInP, kHP>(smem_bytes + kOffT0, p.w[0], kH, kIn);
  for (int l = 0; l < kLHid; ++l)
    stage_weight_t_cm<kHP, kHP>(smem_bytes + kOffTH + l * kWH, p.w[1 + l], kH, kH);
  stage_weight_t_cm<kHP, kOutP>(smem_bytes + kOffTL, p.w[kL], kOut, kH);
  stage_biases(reinterpret_cast<float*>(smem_bytes + kOffBias), p);
  if (kBiasSums) {
    const unsigned short one = kBF16 ? 0x3F80 : 0x3C00;
    for (int i = threadIdx.x; i < 8 * kBM; i += blockDim.x)
      reinterpret_cast<unsigned short*>(smem_bytes + kOffOnes)[i] = one;
  }
  const unsigned base = smem_addr(smem_bytes);
  stage_wait();
  // every staging store and copy lands before a barrier is initialised: racecheck paired
  // the stores with mbar_init (one configuration, one launch: h100-cuda-bwd-race-one1-case2-20261205e)
  __syncthreads();
  if (threadIdx.x < kChains * kGBufs) {  // per chain and g^T tile
    mbar_init(base + kOffBar + 16u * threadIdx.x, 128);      // full
    mbar_init(base + kOffBar + 16u * threadIdx.x + 8, 128);  // empty
  }
  // the copies and stores above, visible to wgmma's async-proxy reads
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wg = warp >> 2, wl = warp & 3;
  const long long n_blocks = (p.n_rows + kBM - 1) / kBM;
  const long long stride = (long long)gridDim.x * kChains;

  if (wg == kChains) {  // --- the summing warpgroup ---
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(kSumRegs));
    if (kNeedWB) sums(p, base, n_blocks, stride);
    sums_done();
    return;
  }
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(kChainRegs));

  // --- a chain: row blocks of 64, 16 rows a warp ---
  const unsigned tiles = base + kOffTiles + wg * kChainTiles;
  const unsigned xt = tiles, ht = tiles + kXT, gt0 = tiles + kXT + kL * kHT;
  const unsigned xbuf = base + kOffBufs + 2u * (2 * warp) * kBufElems, gbuf = xbuf + 2u * kBufElems;
  const unsigned bars = base + kOffBar + 16u * kGBufs * wg;  // this chain's, 16 bytes a tile
  // fp32, each layer's kHP (the last's kOutP)
  const float* bias = reinterpret_cast<const float*>(smem_bytes + kOffBias);
  const int r0 = 16 * wl;
  // lane's row address in the four 8x8 A matrices of a row-major buffer (as the forward)
  const unsigned a_lane = 2u * (((lane & 7) + ((lane >> 3) & 1) * 8) * kLdXY + (lane >> 4) * 8);
  // hand-over u goes into g^T tile u % kGBufs, its (u / kGBufs)-th use: the phase the
  // tile's "full" and "empty" complete then
  int handed = 0;  // hand-overs so far
  auto wait_release = [&](int u) {  // the sums are done with hand-over u (none: u < 0)
    if (u >= 0) mbar_wait(bars + 16u * (u % kGBufs) + 8, (unsigned)((u / kGBufs) & 1));
  };
  auto hand_over = [&](auto const& g) {  // g^T into its tile, then "full"
    constexpr int NCOL = 16 * (int)(sizeof(g) / sizeof(g[0]));
    wait_release(handed - kGBufs);  // the tile's previous use is read
    store_t<kGP, NCOL>(gt0 + (handed % kGBufs) * kGT, g, r0, lane);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    mbar_arrive(bars + 16u * (handed % kGBufs));
    ++handed;
  };

  long long blk = (long long)blockIdx.x * kChains + wg;
  if (blk < n_blocks) load_rows<kIn>(p.x, p.ld_x, p.n_rows, 4 * blk + wl, xbuf, lane);
  cp_async_commit();
  for (; blk < n_blocks; blk += stride) {  // uniform across the warpgroup
    if (kNeedWB) wait_release(handed - 1);  // the sums are done with the last block's tiles
    cp_async_wait<0>();
    __syncwarp();
    unsigned xa[kInP / 16][4];
#pragma unroll
    for (int kb = 0; kb < kInP / 16; ++kb) ldmatrix_x4(xa[kb], xbuf + a_lane + 2u * kb * 16);
    __syncwarp();  // every lane has read x: the next block's copy may land
    if (blk + stride < n_blocks)
      load_rows<kIn>(p.x, p.ld_x, p.n_rows, 4 * (blk + stride) + wl, xbuf, lane);
    load_rows<kOut>(p.gy, p.ld_gy, p.n_rows, 4 * blk + wl, gbuf, lane);
    cp_async_commit();
    if (kNeedWB) store_t<kInP, kInP>(xt, xa, r0, lane);

    // the forward again: h_l (A fragments) and h_l^T for l < kL
    unsigned h[kHP / 16][4];
    layer<kInP, kHP, FMLP_ACT>(xa, h, base, bias, lane);
    store_t<kHP, kHP>(ht, h, r0, lane);
#pragma unroll
    for (int l = 1; l < kL; ++l) {
      unsigned h2[kHP / 16][4];
      layer<kHP, kHP, FMLP_ACT>(h, h2, base + kOffFwdH + (l - 1) * kWH, bias + l * kHP, lane);
#pragma unroll
      for (int kb = 0; kb < kHP / 16; ++kb)
#pragma unroll
        for (int i = 0; i < 4; ++i) h[kb][i] = h2[kb][i];
      store_t<kHP, kHP>(ht + l * kHT, h, r0, lane);
    }
    unsigned y[kOutP / 16][4];  // y again only where out_act' needs it
    if constexpr (kOutFwd) layer<kHP, kOutP, FMLP_OUT_ACT>(h, y, base + kOffFwdL, bias + kL * kHP, lane);

    // g_L = gy * out_act'(y)
    cp_async_wait<0>();
    __syncwarp();  // gy is in; this warp's h^T stores are seen by its own ldmatrix
    unsigned gl[kOutP / 16][4];
#pragma unroll
    for (int nb = 0; nb < kOutP / 16; ++nb) {
      ldmatrix_x4(gl[nb], gbuf + a_lane + 2u * nb * 16);
      if constexpr (kOutFwd) {
#pragma unroll
        for (int i = 0; i < 4; ++i) gl[nb][i] = times_grad2<FMLP_OUT_ACT>(gl[nb][i], y[nb][i]);
      }
    }
    if (kNeedWB) hand_over(gl);

    // g_{l-1} = (g_l W_l) * act'(h_{l-1}), l = kL .. 1
    unsigned gh[kHP / 16][4];
#pragma unroll
    for (int l = kL; l >= 1; --l) {
      float d[kHP / 2];
      if (l == kL) {
        mma_group<kOutP, kHP>(d, gl, base + kOffTL, false);
      } else {
        mma_group<kHP, kHP>(d, gh, base + kOffTH + (l - 1) * kWH, false);
      }
#pragma unroll
      for (int nb = 0; nb < kHP / 16; ++nb) {
        unsigned hv[4];
        ldmatrix_x4_trans(hv, t_addr<kHP>(ht + (l - 1) * kHT, 16 * nb, r0, lane));
#pragma unroll
        for (int i = 0; i < 4; ++i)
          gh[nb][i] = grad_pack2<FMLP_ACT>(d[8 * nb + 2 * i], d[8 * nb + 2 * i + 1], hv[i]);
      }
      if (kNeedWB) hand_over(gh);
    }

    if (kNeedX) {  // gx = g_0 W_0
      float d[kInP / 2];
      mma_group<kHP, kInP>(d, gh, base + kOffT0, false);
      __syncwarp();  // every lane's ldmatrix of gy is done: gx goes through the same buffer
      unsigned o[1][kInP / 16][4];
#pragma unroll
      for (int nb = 0; nb < kInP / 16; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[0][nb][i] = pack2<kBF16>(d[8 * nb + 2 * i], d[8 * nb + 2 * i + 1]);
      store_rows<kIn>(p.gx, p.ld_gx, p.n_rows, 4 * blk + wl, o, gbuf, lane);
    }
  }
  retire_barriers(base);
}
