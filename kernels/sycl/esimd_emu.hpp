// esimd_emu.hpp: the subset of Intel's ESIMD API (sycl::ext::intel::esimd) that the
// ESIMD kernels use, written in plain SYCL/C++, so the same kernel source runs where
// ESIMD cannot: on the OpenCL CPU device (through the runtime's kernel compiler) and
// as ordinary host C++ (g++, for unit tests). Kernels include it through
// esimd_select.hpp with FMLP_ESIMD_EMULATE defined.
//
// Written from Intel's documented semantics (the intel-sycl-rt headers:
// esimd/simd.hpp, detail/operators.hpp, math.hpp, memory.hpp, xmx/dpas.hpp), not from
// what the kernels expect. Names, template parameters and argument order are ESIMD's.
//
// The execution model: one ESIMD thread = one SYCL work-item of a 1-D nd_range kernel.
// SLM is one work_group_static buffer of PVC's per-work-group maximum (128 KiB) shared
// by the work-items of a work-group, and barrier() is a work-group barrier.
//
// What ESIMD leaves undefined, the emulation makes visible rather than benign:
//  - a default-constructed simd, a masked-off gather lane and SLM that slm_init handed
//    out but nobody wrote read as poison: NaN for floating types, 0 for integers
//    (SLM bytes are 0xFF: NaN as float, half and bfloat16);
//  - a block load/store whose address breaks the default alignment the real API
//    assumes (4 bytes for global memory, 16 for SLM), an SLM access past what slm_init
//    declared (on a device: past the 128 KiB), a select past the end of its simd: on the
//    host build the program stops with a message; on a device such a load returns
//    poison, a global store writes poison and an SLM store writes nothing.
//
// Arithmetic follows ESIMD's type rules (detail/operators.hpp, computation_type):
// simd<half> + simd<half> is simd<half>, simd<half> * 2.0f is simd<float> (the scalar
// takes part in the promotion), simd<int16_t> + simd<int16_t> is simd<int>. half and
// bfloat16 operations are computed in float and rounded to nearest even once, which
// for + - * / gives the same result as native half arithmetic (float has 24 >= 2*11+2
// bits). Conversions to half/bfloat16 round to nearest even with subnormals kept: on a
// device by the compiler's own half conversions, on the host bit by bit here (the host
// conversion of sycl::half truncates below 2^-13). xmx::dpas: fp16/bf16 operands, float
// C and result, execution size 16 (PVC); see its comment for the rounding model.
//
// Not emulated: timing, the register file (no spills, no GRF limits), bank conflicts,
// the hardware's scheduling, cache hints and property lists, the 2-D block messages'
// transposed and VNNI-transformed forms.
#pragma once

#include "esimd_emu_simd.hpp" // simd, simd_mask, simd_view, operators

namespace fmlp_emu::esimd {

// ---- free functions (math.hpp, alt_ui.hpp) ---------------------------------------------
// a where mask is set, else b.
template <class T, int N> inline simd<T, N> merge(simd<T, N> a, simd<T, N> b, simd_mask<N> mask) {
  b.merge(a, mask);
  return b;
}

namespace detail {
template <class T, int N, class F> inline simd<T, N> map_float(const simd<T, N> &x, F f) {
  simd<T, N> r{detail::uninit_t{}};
  for (int i = 0; i < N; ++i)
    r[i] = cvt<T>(f(to_float(x[i])));
  return r;
}
template <class T, int N, class F>
inline simd<T, N> zip_float(const simd<T, N> &a, const simd<T, N> &b, F f) {
  simd<T, N> r{detail::uninit_t{}};
  for (int i = 0; i < N; ++i)
    r[i] = cvt<T>(f(to_float(a[i]), to_float(b[i])));
  return r;
}
template <class T> using fp_only = std::enable_if_t<is_fp_v<T> && !std::is_same_v<T, double>>;
// ESIMD's exp and log (math.hpp) exist for float and half only (exp2/log2's condition).
template <class T>
using exp_log_only = std::enable_if_t<std::is_same_v<T, float> || std::is_same_v<T, half>>;
// They are natural-base through the hardware's exp2/log2 with these float constants:
// exp(x) = exp2<T>(x * log2e), log(x) = T(log2<T>(x) * ln2). For half, x * log2e is
// rounded to half before exp2 and log2's result before the product, as there. The
// emulation keeps the formulas, with exact-ish exp2/log2 from SYCL or <cmath> (the
// hardware's: exp2 within 4 ulp, log2 within 2^-21).
constexpr float kLn2 = 0.69314718f;
constexpr float kLog2e = 1.442695f;
} // namespace detail

// max/min of floating types are IEEE maxNum/minNum (ESIMD's __esimd_fmax/fmin, the
// hardware's max/min): a NaN operand yields the other operand; NaN only if both are.
template <class T, int N> inline simd<T, N>(max)(simd<T, N> a, simd<T, N> b) {
  if constexpr (detail::is_fp_v<T>)
    return detail::zip_float(a, b, [](float x, float y) { return detail::f_fmax(x, y); });
  else
    return merge(a, b, a >= b);
}
template <class T, int N> inline simd<T, N>(min)(simd<T, N> a, simd<T, N> b) {
  if constexpr (detail::is_fp_v<T>)
    return detail::zip_float(a, b, [](float x, float y) { return detail::f_fmin(x, y); });
  else
    return merge(a, b, a <= b);
}
template <class T, int N, class = std::enable_if_t<detail::is_elem_v<T>>>
inline simd<T, N>(max)(simd<T, N> a, T b) {
  return (max)(a, simd<T, N>(b));
}
template <class T, int N, class = std::enable_if_t<detail::is_elem_v<T>>>
inline simd<T, N>(max)(T a, simd<T, N> b) {
  return (max)(simd<T, N>(a), b);
}
template <class T, int N, class = std::enable_if_t<detail::is_elem_v<T>>>
inline simd<T, N>(min)(simd<T, N> a, T b) {
  return (min)(a, simd<T, N>(b));
}
template <class T, int N, class = std::enable_if_t<detail::is_elem_v<T>>>
inline simd<T, N>(min)(T a, simd<T, N> b) {
  return (min)(simd<T, N>(a), b);
}

template <class T, int N> inline simd<T, N> abs(simd<T, N> x) {
  if constexpr (detail::is_fp_v<T>)
    return detail::map_float(x, [](float v) { return detail::f_fabs(v); });
  else if constexpr (std::is_unsigned_v<T>)
    return x;
  else
    return merge(-x, x, x < T(0)); // the most negative value stays itself (wraps)
}
template <class T, int N, class = detail::exp_log_only<T>> inline simd<T, N> exp(simd<T, N> x) {
  return detail::map_float(x, [](float v) {
    return detail::f_exp2(detail::to_float(detail::cvt<T>(v * detail::kLog2e)));
  });
}
template <class T, int N, class = detail::exp_log_only<T>> inline simd<T, N> log(simd<T, N> x) {
  return detail::map_float(x, [](float v) {
    return detail::to_float(detail::cvt<T>(detail::f_log2(v))) * detail::kLn2;
  });
}
template <class T, int N, class = detail::fp_only<T>> inline simd<T, N> sqrt(simd<T, N> x) {
  return detail::map_float(x, [](float v) { return detail::f_sqrt(v); });
}
template <class T, int N, class = detail::fp_only<T>> inline simd<T, N> inv(simd<T, N> x) {
  return detail::map_float(x, [](float v) { return 1.0f / v; });
}
template <class T, class = std::enable_if_t<detail::is_elem_v<T>>> inline T exp(T x) {
  return exp(simd<T, 1>(x))[0];
}
template <class T, class = std::enable_if_t<detail::is_elem_v<T>>> inline T log(T x) {
  return log(simd<T, 1>(x))[0];
}
template <class T, class = std::enable_if_t<detail::is_elem_v<T>>> inline T sqrt(T x) {
  return sqrt(simd<T, 1>(x))[0];
}
template <class T, class = std::enable_if_t<detail::is_elem_v<T>>> inline T inv(T x) {
  return inv(simd<T, 1>(x))[0];
}

// ---- global memory on USM pointers (memory.hpp) ---------------------------------------
namespace detail {
template <class T> inline bool block_aligned(const void *p) {
  // block_load/block_store assume 4-byte alignment for elements of 4 bytes or fewer,
  // element size above that, unless told otherwise (property lists are not emulated).
  constexpr uintptr_t a = sizeof(T) <= 4 ? 4 : sizeof(T);
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}
template <class T, int N> inline simd<T, N> load_bytes(const unsigned char *p) {
  simd<T, N> r{detail::uninit_t{}};
  for (int i = 0; i < N; ++i) {
    T v;
    __builtin_memcpy(&v, p + i * sizeof(T), sizeof(T));
    r[i] = v;
  }
  return r;
}
template <class T, int N> inline void store_bytes(unsigned char *p, const simd<T, N> &v) {
  for (int i = 0; i < N; ++i) {
    const T t = v[i];
    __builtin_memcpy(p + i * sizeof(T), &t, sizeof(T));
  }
}
} // namespace detail

template <class T, int N> inline simd<T, N> block_load(const T *ptr) {
  if (!detail::block_aligned<T>(ptr)) {
    detail::fail("block_load: address not 4-byte aligned (ESIMD's default alignment)");
    return simd<T, N>();
  }
  return detail::load_bytes<T, N>(reinterpret_cast<const unsigned char *>(ptr));
}
template <class T, int N> inline simd<T, N> block_load(const T *ptr, size_t byte_offset) {
  return block_load<T, N>(
      reinterpret_cast<const T *>(reinterpret_cast<const unsigned char *>(ptr) + byte_offset));
}
template <class T, int N> inline void block_store(T *ptr, simd<T, N> vals) {
  if (!detail::block_aligned<T>(ptr)) {
    detail::fail("block_store: address not 4-byte aligned (ESIMD's default alignment)");
    vals = simd<T, N>();
  }
  detail::store_bytes<T, N>(reinterpret_cast<unsigned char *>(ptr), vals);
}
template <class T, int N> inline void block_store(T *ptr, size_t byte_offset, simd<T, N> vals) {
  block_store<T, N>(reinterpret_cast<T *>(reinterpret_cast<unsigned char *>(ptr) + byte_offset),
                    vals);
}

// gather: lane i reads the T at (char*)p + byte_offsets[i] where mask[i] is set. ESIMD
// leaves masked-off lanes undefined; here they read as poison (NaN / 0), or pass_thru.
template <class T, int N, class OffsetT>
inline simd<T, N> gather(const T *p, simd<OffsetT, N> byte_offsets, simd_mask<N> mask,
                         simd<T, N> pass_thru) {
  static_assert(std::is_integral_v<OffsetT>, "gather: offsets must be integers");
  const unsigned char *base = reinterpret_cast<const unsigned char *>(p);
  simd<T, N> r = pass_thru;
  for (int i = 0; i < N; ++i) {
    if (!mask[i])
      continue;
    if (static_cast<uint64_t>(byte_offsets[i]) % sizeof(T) != 0) {
      detail::fail("gather: byte offset not a multiple of the element size");
      r[i] = detail::poison<T>();
      continue;
    }
    T v;
    __builtin_memcpy(&v, base + byte_offsets[i], sizeof(T));
    r[i] = v;
  }
  return r;
}
template <class T, int N, class OffsetT>
inline simd<T, N> gather(const T *p, simd<OffsetT, N> byte_offsets, simd_mask<N> mask) {
  return gather<T, N, OffsetT>(p, byte_offsets, mask, simd<T, N>());
}
template <class T, int N, class OffsetT>
inline simd<T, N> gather(const T *p, simd<OffsetT, N> byte_offsets) {
  return gather<T, N, OffsetT>(p, byte_offsets, simd_mask<N>(1));
}

// scatter: lane i writes vals[i] to (char*)p + byte_offsets[i] where mask[i] is set;
// masked-off lanes write nothing. Lanes that share an address: the highest lane wins
// here (ESIMD does not define which).
template <class T, int N, class OffsetT>
inline void scatter(T *p, simd<OffsetT, N> byte_offsets, simd<T, N> vals, simd_mask<N> mask) {
  static_assert(std::is_integral_v<OffsetT>, "scatter: offsets must be integers");
  unsigned char *base = reinterpret_cast<unsigned char *>(p);
  for (int i = 0; i < N; ++i) {
    if (!mask[i])
      continue;
    if (static_cast<uint64_t>(byte_offsets[i]) % sizeof(T) != 0) {
      detail::fail("scatter: byte offset not a multiple of the element size");
      continue;
    }
    const T t = vals[i];
    __builtin_memcpy(base + byte_offsets[i], &t, sizeof(T));
  }
}
template <class T, int N, class OffsetT>
inline void scatter(T *p, simd<OffsetT, N> byte_offsets, simd<T, N> vals) {
  scatter<T, N, OffsetT>(p, byte_offsets, vals, simd_mask<N>(1));
}

// The same with the offsets in a view (a region of a larger simd), as ESIMD accepts.
template <class T, int N, class OffsetT>
inline simd<T, N> gather(const T *p, simd_view<OffsetT, N> byte_offsets, simd_mask<N> mask) {
  return gather<T, N, OffsetT>(p, byte_offsets.read(), mask);
}
template <class T, int N, class OffsetT>
inline simd<T, N> gather(const T *p, simd_view<OffsetT, N> byte_offsets) {
  return gather<T, N, OffsetT>(p, byte_offsets.read());
}
template <class T, int N, class OffsetT>
inline void scatter(T *p, simd_view<OffsetT, N> byte_offsets, simd<T, N> vals, simd_mask<N> mask) {
  scatter<T, N, OffsetT>(p, byte_offsets.read(), vals, mask);
}
template <class T, int N, class OffsetT>
inline void scatter(T *p, simd_view<OffsetT, N> byte_offsets, simd<T, N> vals) {
  scatter<T, N, OffsetT>(p, byte_offsets.read(), vals);
}

// ---- 2-D block messages (experimental/esimd/memory.hpp: lsc_load_2d, lsc_store_2d) --
// A surface: `Ptr` its base, rows of (SurfaceWidth + 1) bytes, (SurfacePitch + 1) bytes
// apart, SurfaceHeight + 1 rows (each argument is the size minus 1, as ESIMD's). A block
// is BlockWidth elements x BlockHeight rows at element column X, row Y; a load of NBlocks
// reads that many blocks side by side and returns them one after another, each row-major,
// rows padded to getNextPowerOf2(BlockWidth) elements and the row count rounded up to a
// multiple of 4 / sizeof(T). Elements outside the surface load as 0 and are not stored
// (the hardware's clipping); padding lanes load as 0 here. Transposed (32-bit data, one
// block): element (row i, column j) at j * BlockHeight + i. Transformed (VNNI, 16-bit):
// each block's row pairs interleaved, (i, j) at ((i / 2) * W + j) * 2 + i % 2, as intel/llvm's
// test-e2e/ESIMD/lsc/Inputs/lsc_load_prefetch_2d.hpp checks them. The surface's documented
// limits (base 64-byte aligned, width and pitch at least 64 bytes, pitch a multiple of
// 16 bytes, width a multiple of 4 bytes, width <= pitch) stop the host build when broken.
namespace detail {
constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }
template <class T> constexpr int rows_2d(int h) {
  return (h + (4 / int(sizeof(T))) - 1) / (4 / int(sizeof(T))) * (4 / int(sizeof(T)));
}
inline bool surface_ok(const void *p, unsigned w, unsigned pitch, const char *what) {
  const bool ok = reinterpret_cast<uintptr_t>(p) % 64 == 0 && w + 1 >= 64 && (w + 1) % 4 == 0 &&
                  pitch + 1 >= 64 && (pitch + 1) % 16 == 0 && w <= pitch;
  if (!ok)
    fail(what);
  return ok;
}
} // namespace detail

template <class T, int BlockWidth, int BlockHeight = 1, int NBlocks = 1, bool Transposed = false,
          bool Transformed = false,
          int N = detail::rows_2d<T>(BlockHeight) * detail::pow2_at_least(BlockWidth) * NBlocks>
inline simd<T, N> lsc_load_2d(const T *Ptr, unsigned SurfaceWidth, unsigned SurfaceHeight,
                              unsigned SurfacePitch, int X, int Y) {
  static_assert(!(Transposed && Transformed), "lsc_load_2d: transposed and transformed");
  static_assert(!Transposed || (sizeof(T) == 4 && NBlocks == 1 && BlockWidth <= 8),
                "lsc_load_2d: a transposed load is of 32-bit data, one block, <= 8 wide");
  static_assert(!Transformed || (sizeof(T) == 2 && BlockWidth <= 16 &&
                                 BlockWidth == detail::pow2_at_least(BlockWidth)),
                "lsc_load_2d emulation: VNNI transform of 16-bit data, power-of-2 widths");
  static_assert((BlockWidth * sizeof(T)) % 4 == 0 && BlockWidth * NBlocks * sizeof(T) <= 64 &&
                    BlockHeight <= 32 && N * sizeof(T) <= 2048,
                "lsc_load_2d: block size out of the hardware's limits");
  constexpr int W = detail::pow2_at_least(BlockWidth), RH = detail::rows_2d<T>(BlockHeight);
  simd<T, N> r(T(0));
  if (!detail::surface_ok(Ptr, SurfaceWidth, SurfacePitch, "lsc_load_2d: surface breaks the "
                          "2-D block message limits (base 64 B aligned, width/pitch >= 64 B)"))
    return simd<T, N>();
  const unsigned char *base = reinterpret_cast<const unsigned char *>(Ptr);
  const int64_t cols = (int64_t(SurfaceWidth) + 1) / int64_t(sizeof(T));
  for (int b = 0; b < NBlocks; ++b)
    for (int i = 0; i < BlockHeight; ++i)
      for (int j = 0; j < BlockWidth; ++j) {
        const int64_t x = int64_t(X) + b * BlockWidth + j, y = int64_t(Y) + i;
        if (x < 0 || y < 0 || x >= cols || y > int64_t(SurfaceHeight))
          continue;
        T v;
        __builtin_memcpy(&v, base + y * (int64_t(SurfacePitch) + 1) + x * int64_t(sizeof(T)),
                         sizeof(T));
        if constexpr (Transposed)  // the block's columns become the result's rows
          r[j * BlockHeight + i] = v;
        else if constexpr (Transformed)  // VNNI: row pairs interleaved, (i / 2, j, i % 2)
          r[b * RH * W + ((i / 2) * W + j) * 2 + i % 2] = v;
        else
          r[(b * RH + i) * W + j] = v;
      }
  return r;
}

template <class T, int BlockWidth, int BlockHeight = 1,
          int N = detail::rows_2d<T>(BlockHeight) * detail::pow2_at_least(BlockWidth)>
inline void lsc_store_2d(T *Ptr, unsigned SurfaceWidth, unsigned SurfaceHeight,
                         unsigned SurfacePitch, int X, int Y, simd<T, N> Vals) {
  static_assert((BlockWidth * sizeof(T)) % 4 == 0 && BlockWidth * sizeof(T) <= 64 &&
                    BlockHeight <= 8 && N * sizeof(T) <= 512,
                "lsc_store_2d: block size out of the hardware's limits");
  constexpr int W = detail::pow2_at_least(BlockWidth);
  if (!detail::surface_ok(Ptr, SurfaceWidth, SurfacePitch, "lsc_store_2d: surface breaks the "
                          "2-D block message limits (base 64 B aligned, width/pitch >= 64 B)"))
    return;
  unsigned char *base = reinterpret_cast<unsigned char *>(Ptr);
  const int64_t cols = (int64_t(SurfaceWidth) + 1) / int64_t(sizeof(T));
  for (int i = 0; i < BlockHeight; ++i)
    for (int j = 0; j < BlockWidth; ++j) {
      const int64_t x = int64_t(X) + j, y = int64_t(Y) + i;
      if (x < 0 || y < 0 || x >= cols || y > int64_t(SurfaceHeight))
        continue;
      const T t = Vals[i * W + j];
      __builtin_memcpy(base + y * (int64_t(SurfacePitch) + 1) + x * int64_t(sizeof(T)), &t,
                       sizeof(T));
    }
}

// ---- shared local memory and the barrier ---------------------------------------------
namespace detail {
#if FMLP_EMU_SYCL
inline unsigned char *slm_base() {
  static sycl::ext::oneapi::experimental::work_group_static<uint32_t[kSlmCapacity / 4]> slm;
  uint32_t (&words)[kSlmCapacity / 4] = slm;
  return reinterpret_cast<unsigned char *>(words);
}
inline void group_barrier() {
  sycl::group_barrier(sycl::ext::oneapi::this_work_item::get_nd_item<1>().get_group());
}
#else
inline unsigned char *slm_base() {
  alignas(64) static unsigned char slm[kSlmCapacity];
  return slm;
}
inline uint32_t &slm_declared() {
  static uint32_t size = 0;
  return size;
}
inline void group_barrier() {}
#endif
inline bool slm_ok(uint32_t byte_offset, uint32_t bytes, const char *what) {
#if FMLP_EMU_SYCL
  const uint32_t limit = kSlmCapacity;
#else
  const uint32_t limit = slm_declared();
#endif
  if (byte_offset % 16 != 0) {
    fail(what); // ESIMD's slm_block_load/store assume 16-byte alignment
    return false;
  }
  if (static_cast<uint64_t>(byte_offset) + bytes > limit) {
    fail(what);
    return false;
  }
  return true;
}
} // namespace detail

// Declares SizeBytes of SLM for the work-group; every thread calls it first, before any
// other SLM access, in uniform control flow. Here it fills [0, SizeBytes) with 0xFF
// (NaN for float, half and bfloat16) and waits for the work-group, so SLM read before it
// is written shows.
template <uint32_t SizeBytes> inline void slm_init() {
  static_assert(SizeBytes <= kSlmCapacity,
                "slm_init: more than PVC's 128 KiB of SLM per work-group");
  unsigned char *slm = detail::slm_base();
#if FMLP_EMU_SYCL
  auto it = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const uint32_t lid = static_cast<uint32_t>(it.get_local_linear_id());
  const uint32_t items = static_cast<uint32_t>(it.get_local_range().size());
  uint32_t *words = reinterpret_cast<uint32_t *>(slm); // the buffer is uint32_t[]
  for (uint32_t i = lid; i < (SizeBytes + 3) / 4; i += items)
    words[i] = 0xFFFFFFFFu;
  detail::group_barrier();
#else
  for (uint32_t i = 0; i < SizeBytes; ++i)
    slm[i] = 0xFF;
  detail::slm_declared() = SizeBytes;
#endif
}

template <class T, int N> inline simd<T, N> slm_block_load(uint32_t byte_offset) {
  if (!detail::slm_ok(byte_offset, N * sizeof(T),
                      "slm_block_load: offset not 16-byte aligned or past slm_init's size"))
    return simd<T, N>();
  return detail::load_bytes<T, N>(detail::slm_base() + byte_offset);
}
template <class T, int N> inline void slm_block_store(uint32_t byte_offset, simd<T, N> vals) {
  if (!detail::slm_ok(byte_offset, N * sizeof(T),
                      "slm_block_store: offset not 16-byte aligned or past slm_init's size"))
    return;
  detail::store_bytes<T, N>(detail::slm_base() + byte_offset, vals);
}

// Work-group barrier with the memory fence ESIMD's barrier() implies (global and SLM).
inline void barrier() { detail::group_barrier(); }

// ---- XMX: dpas (xmx/dpas.hpp) -------------------------------------------------------
namespace xmx {
// The values of xmx/common.hpp; only fp16 and bf16 are emulated.
enum class dpas_argument_type {
  Invalid = 0,
  u2 = 3,
  s2 = 4,
  u4 = 5,
  s4 = 6,
  u8 = 7,
  s8 = 8,
  bf16 = 9,
  fp16 = 10,
  tf32 = 12
};

namespace detail {
using esimd::detail::bf16;
using esimd::detail::half;
template <class T> constexpr dpas_argument_type precision_of() {
  if constexpr (std::is_same_v<T, half>)
    return dpas_argument_type::fp16;
  else if constexpr (std::is_same_v<T, bf16>)
    return dpas_argument_type::bf16;
  else
    return dpas_argument_type::Invalid;
}

// Result[m, n] = C[m, n] + sum_k A[m, k] * B[k, n] for m < RepeatCount, n < 16, k < 16.
// A: RepeatCount x 16 row-major; B: 16 x 16 packed VNNI, (k, n) at (k/2)*32 + n*2 + k%2;
// C and the result: RepeatCount x 16 row-major. The model of the arithmetic: each
// product of two fp16/bf16 values is exact in fp32 (11+11 or 8+8 significant bits; a
// bf16 product can still leave fp32's exponent range), and they are added to the fp32
// accumulator one k at a time in order, from C, each sum rounded to nearest even. Intel
// does not publish the systolic array's internal adder precision or order; this model is
// one a kernel author can reason with, and its error bound (16 roundings of partial sums
// no larger than |C| + sum |a b|) is what an order-independent check against float64
// can use. fp32 subnormals are kept (the hardware may flush them).
template <int RepeatCount, class AT, class BT, int N, int BN, int AN> inline void check() {
  static_assert(std::is_same_v<AT, BT> && (std::is_same_v<AT, half> || std::is_same_v<AT, bf16>),
                "dpas emulation: A and B must both be sycl::half or both bfloat16");
  static_assert(RepeatCount >= 1 && RepeatCount <= 8, "Repeat count must be within 1 to 8 range");
  static_assert(
      BN == 16 * 16,
      "dpas emulation: B must hold 16 x 16 VNNI-packed elements (execution size 16, PVC)");
  static_assert(AN == RepeatCount * 16, "The first matrix multiplier has wrong size.");
  static_assert(N == RepeatCount * 16, "dpas: C/result must hold RepeatCount x 16 elements");
}

template <int RepeatCount, class AT, class BT, int BN, int AN>
inline void accumulate(float *acc, const simd<BT, BN> &B, const simd<AT, AN> &A) {
  float a[AN], b[16][16]; // A as is; B unpacked to [k][n] (VNNI: (k/2)*32 + n*2 + k%2)
  for (int i = 0; i < AN; ++i)
    a[i] = esimd::detail::to_float(A[i]);
  for (int i = 0; i < BN; ++i)
    b[(i / 32) * 2 + i % 2][(i % 32) / 2] = esimd::detail::to_float(B[i]);
  for (int m = 0; m < RepeatCount; ++m)
    for (int n = 0; n < 16; ++n) {
      float s = acc[m * 16 + n];
      for (int k = 0; k < 16; ++k) {
        const float prod = a[m * 16 + k] * b[k][n]; // exact
        s = s + prod;
      }
      acc[m * 16 + n] = s;
    }
}
} // namespace detail

template <int SystolicDepth, int RepeatCount, typename T, typename CT, typename BT, typename AT,
          dpas_argument_type BPrecision = detail::precision_of<BT>(),
          dpas_argument_type APrecision = detail::precision_of<AT>(), int N, int BN, int AN>
inline simd<T, N> dpas(simd<CT, N> C, simd<BT, BN> B, simd<AT, AN> A) {
  static_assert(SystolicDepth == 8, "Systolic depth must be equal to 8");
  static_assert(std::is_same_v<T, float> && std::is_same_v<CT, float>,
                "dpas emulation: only float C and result are emulated");
  detail::check<RepeatCount, AT, BT, N, BN, AN>();
  float acc[N];
  for (int i = 0; i < N; ++i)
    acc[i] = C[i];
  detail::accumulate<RepeatCount>(acc, B, A);
  simd<T, N> r{esimd::detail::uninit_t{}};
  for (int i = 0; i < N; ++i)
    r[i] = acc[i];
  return r;
}

template <int SystolicDepth, int RepeatCount, typename T, typename BT, typename AT,
          dpas_argument_type BPrecision = detail::precision_of<BT>(),
          dpas_argument_type APrecision = detail::precision_of<AT>(), int BN, int AN>
inline auto dpas(simd<BT, BN> B, simd<AT, AN> A) {
  static_assert(SystolicDepth == 8, "Systolic depth must be equal to 8");
  static_assert(std::is_same_v<T, float>, "dpas emulation: only a float result is emulated");
  constexpr int N = RepeatCount * 16;
  detail::check<RepeatCount, AT, BT, N, BN, AN>();
  float acc[N];
  for (int i = 0; i < N; ++i)
    acc[i] = 0.0f;
  detail::accumulate<RepeatCount>(acc, B, A);
  simd<T, N> r{esimd::detail::uninit_t{}};
  for (int i = 0; i < N; ++i)
    r[i] = acc[i];
  return r;
}
} // namespace xmx

} // namespace fmlp_emu::esimd
