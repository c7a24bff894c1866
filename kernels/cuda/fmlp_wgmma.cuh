// Hopper warpgroup MMA (wgmma, sm_90a) for the narrow forward (fused_mlp_forward_sm90.cu):
// D[64 x N] += A[64 x 16] B[16 x N] for one warpgroup (4 warps, 128 threads), A from
// registers, B from shared memory through a matrix descriptor, fp32 accumulators.
//
// Register layouts (warp w of the warpgroup holds rows 16 w .. 16 w + 15; lane = 4 g + t):
// - A: the mma.sync m16n8k16 A fragment of the warp's 16 rows (fmlp_device.cuh, mma_16816);
// - D: for each 8-column tile i of the N columns, d[4i .. 4i+3] are the mma.sync m16n8
//   accumulators of that tile: (row g, cols 8i + 2t, +1), (row g + 8, the same cols).
// So, as with mma.sync, two adjacent 8-column tiles packed to 16 bits are the next
// layer's A fragment of one 16-wide k slice, and a layer's output never leaves registers.
//
// B in shared memory, "K-major" (W[n][k] rows: the k values of one output contiguous),
// without swizzling: 8 x 8 core matrices (8 n rows of 16 bytes = 8 k values each, 128
// contiguous bytes); the descriptor gives the byte stride between the two core matrices
// of a 16-wide k slice (leading dimension, LBO) and between consecutive 8-row groups
// along n (stride dimension, SBO).
//
// Usage: wgmma_fence() (orders the registers' earlier writes: the bias-initialized D,
// the A fragments) -> Wgmma<N>::mma(d, a, desc) per k slice -> wgmma_commit() ->
// wgmma_wait<0>() before D is read. The accumulator statements below take D as
// read-write operands ("+f"), so the compiler keeps them in place across the group.
// The operand type is the configuration's (FMLP_BF16: fmlp_forward_common.cuh).
#pragma once

namespace fmlp {

// The 64-bit shared-memory matrix descriptor: start address, LBO and SBO in 16-byte
// units (bits 0-13, 16-29, 32-45), base offset 0, no swizzle (bits 62-63 = 0).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned smem_byte_addr, unsigned lbo,
                                                         unsigned sbo) {
  return (unsigned long long)((smem_byte_addr & 0x3FFFF) >> 4) |
         ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

// Wgmma<N>::mma(d, a, desc, accumulate): one m64nNk16 MMA, D = A B + (accumulate ? D : 0)
// (the scale-d predicate; 0 starts a layer without bias, whose D is never initialized).
// N in 16, 32, ..., 128.
template <int N>
struct Wgmma;

#if FMLP_BF16
#define FMLP_WGMMA_AB "bf16.bf16"
#else
#define FMLP_WGMMA_AB "f16.f16"
#endif

// The accumulators d[0 .. n-1] as "+f" operands (FMLP_WGMMA_D<n>) and as the statement's
// register list (FMLP_WGMMA_R<n>: "%0, ..., %<n-1>"), 8 at a time.
#define FMLP_WGMMA_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FMLP_WGMMA_D4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define FMLP_WGMMA_D8 FMLP_WGMMA_ACC8(0)
#define FMLP_WGMMA_D16 FMLP_WGMMA_D8, FMLP_WGMMA_ACC8(8)
#define FMLP_WGMMA_D24 FMLP_WGMMA_D16, FMLP_WGMMA_ACC8(16)
#define FMLP_WGMMA_D32 FMLP_WGMMA_D24, FMLP_WGMMA_ACC8(24)
#define FMLP_WGMMA_D40 FMLP_WGMMA_D32, FMLP_WGMMA_ACC8(32)
#define FMLP_WGMMA_D48 FMLP_WGMMA_D40, FMLP_WGMMA_ACC8(40)
#define FMLP_WGMMA_D56 FMLP_WGMMA_D48, FMLP_WGMMA_ACC8(48)
#define FMLP_WGMMA_D64 FMLP_WGMMA_D56, FMLP_WGMMA_ACC8(56)
#define FMLP_WGMMA_R4 "%0, %1, %2, %3"
#define FMLP_WGMMA_R8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FMLP_WGMMA_R16 FMLP_WGMMA_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define FMLP_WGMMA_R24 FMLP_WGMMA_R16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define FMLP_WGMMA_R32 FMLP_WGMMA_R24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define FMLP_WGMMA_R40 FMLP_WGMMA_R32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FMLP_WGMMA_R48 FMLP_WGMMA_R40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FMLP_WGMMA_R56 FMLP_WGMMA_R48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define FMLP_WGMMA_R64 FMLP_WGMMA_R56 ", %56, %57, %58, %59, %60, %61, %62, %63"

// One m64nNk16 statement over N / 2 accumulators; A0..A3, DESC and ONE are the numbers
// (as strings) of the operands after them: a[0..3], the descriptor, ``accumulate`` (the
// scale-d predicate).
#define FMLP_WGMMA_RS(N, ND, A0, A1, A2, A3, DESC, ONE)                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ONE ", 0;\n"                         \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." FMLP_WGMMA_AB " "        \
               "{" FMLP_WGMMA_R##ND "}, {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" DESC     \
               ", p, 1, 1, 0;\n}\n"                                                       \
               : FMLP_WGMMA_D##ND                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate))

// Wgmma<N> for N = 16, 32, ..., 128 (ND = N / 2 accumulators; the numbers of the
// operands after them: a[0..3], the descriptor, accumulate).
#define FMLP_WGMMA_N(N, ND, A0, A1, A2, A3, DESC, ONE)                                    \
  template <>                                                                             \
  struct Wgmma<N> {                                                                       \
    static __device__ __forceinline__ void mma(float (&d)[ND], const unsigned (&a)[4],    \
                                               unsigned long long desc, int accumulate) { \
      FMLP_WGMMA_RS(N, ND, A0, A1, A2, A3, DESC, ONE);                                    \
    }                                                                                     \
  };
FMLP_WGMMA_N(16, 8, "8", "9", "10", "11", "12", "13")
FMLP_WGMMA_N(32, 16, "16", "17", "18", "19", "20", "21")
FMLP_WGMMA_N(48, 24, "24", "25", "26", "27", "28", "29")
FMLP_WGMMA_N(64, 32, "32", "33", "34", "35", "36", "37")
FMLP_WGMMA_N(80, 40, "40", "41", "42", "43", "44", "45")
FMLP_WGMMA_N(96, 48, "48", "49", "50", "51", "52", "53")
FMLP_WGMMA_N(112, 56, "56", "57", "58", "59", "60", "61")
FMLP_WGMMA_N(128, 64, "64", "65", "66", "67", "68", "69")

// WgmmaSS<N>::mma(d, a_desc, b_desc, accumulate): one m64nNk16 MMA with A from shared
// memory too (a descriptor, K-major as B: A[m][k] with the k values of one m contiguous,
// in the same core-matrix layout), D = A B + (accumulate ? D : 0). N in 8, 16, ..., 128.
// The backward's weight-gradient sums take it: A = g^T, B = the layer's input, both
// kept transposed in shared memory.
template <int N>
struct WgmmaSS;

#define FMLP_WGMMA_SS(N, ND, ADESC, BDESC, ONE)                                           \
  template <>                                                                             \
  struct WgmmaSS<N> {                                                                     \
    static __device__ __forceinline__ void mma(float (&d)[ND], unsigned long long a_desc, \
                                               unsigned long long b_desc, int accumulate) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ONE ", 0;\n"                     \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." FMLP_WGMMA_AB " "    \
                   "{" FMLP_WGMMA_R##ND "}, %" ADESC ", %" BDESC ", p, 1, 1, 0, 0;\n}\n"   \
                   : FMLP_WGMMA_D##ND                                                     \
                   : "l"(a_desc), "l"(b_desc), "r"(accumulate));                          \
    }                                                                                     \
  };
FMLP_WGMMA_SS(8, 4, "4", "5", "6")
FMLP_WGMMA_SS(16, 8, "8", "9", "10")
FMLP_WGMMA_SS(32, 16, "16", "17", "18")
FMLP_WGMMA_SS(48, 24, "24", "25", "26")
FMLP_WGMMA_SS(64, 32, "32", "33", "34")

}  // namespace fmlp
