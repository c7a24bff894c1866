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
// the hardware's scheduling, cache hints and property lists, 2-D block messages.
#pragma once

#if defined(__SYCL_DEVICE_ONLY__) || defined(SYCL_LANGUAGE_VERSION)
#define FMLP_EMU_SYCL 1
#include <sycl/ext/oneapi/work_group_static.hpp>
#include <sycl/sycl.hpp>
#else
#define FMLP_EMU_SYCL 0
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sycl/ext/oneapi/bfloat16.hpp>
#include <sycl/half_type.hpp>
#endif

#include <cstdint>
#include <type_traits>

#ifndef FMLP_ESIMD_KERNEL
#define FMLP_ESIMD_KERNEL // real ESIMD: [[intel::sycl_explicit_simd]] (esimd_select.hpp)
#endif
#ifndef ESIMD_INLINE
#define ESIMD_INLINE inline
#endif

namespace fmlp_emu::esimd {

// PVC's shared local memory per work-group; slm_init<Size> must fit in it.
constexpr uint32_t kSlmCapacity = 128 * 1024;

template <class T, int N> class simd;
template <int N> class simd_mask;
template <class T, int N> class simd_view;
template <class T> class elem_ref;

namespace detail {
using half = sycl::half;
using bf16 = sycl::ext::oneapi::bfloat16;

template <class T> constexpr bool is_wrapper_v = std::is_same_v<T, half> || std::is_same_v<T, bf16>;
template <class T> constexpr bool is_fp_v = std::is_floating_point_v<T> || is_wrapper_v<T>;
template <class T>
constexpr bool is_elem_v = (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) || is_wrapper_v<T>;

template <class To, class From> inline To bitcast(const From &f) {
  static_assert(sizeof(To) == sizeof(From), "bitcast: sizes differ");
  To t;
  __builtin_memcpy(static_cast<void *>(&t), static_cast<const void *>(&f), sizeof(To));
  return t;
}

// Stops a host run with a message; on a device the caller makes the result poison.
inline void fail(const char *what) {
#if FMLP_EMU_SYCL
  (void)what;
#else
  std::fprintf(stderr, "esimd_emu: %s\n", what);
  std::abort();
#endif
}

// ---- half / bfloat16 bits <-> float, round to nearest even ---------------------------
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f)
    return bitcast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) { // zero or subnormal: mant * 2^-24, exact in float
    const float m = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -m : m;
  }
  return bitcast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = bitcast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) // NaN: quiet, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) // >= 65520 (65504 + half an ulp, ties to even) -> inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax >= 0x38800000u) { // normal half: add the rounding bias, then rebias the exponent
    const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  // Subnormal or zero: adding 0.5f puts the ulp at 2^-24, the half subnormal step, so
  // the float addition itself rounds to nearest even at the right place.
  const float t = bitcast<float>(ax) + 0.5f;
  return static_cast<uint16_t>(sign | (bitcast<uint32_t>(t) - 0x3f000000u));
}

inline float bf16_to_float(uint16_t b) { return bitcast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = bitcast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u); // quiet NaN, sign kept
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// On a device half <-> float are the compiler's own conversions (exact, and round to
// nearest even); the host's sycl::half conversion truncates, so the host uses the above.
template <class T> inline float to_float(T v) {
  if constexpr (std::is_same_v<T, half>)
#ifdef __SYCL_DEVICE_ONLY__
    return static_cast<float>(v);
#else
    return half_to_float(bitcast<uint16_t>(v));
#endif
  else if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_float(bitcast<uint16_t>(v));
  else
    return static_cast<float>(v);
}

// ESIMD's element conversion: float -> half/bfloat16 round to nearest even, float -> int
// truncates (C++ rules). Integers go to half/bfloat16 through float (exact below 2^24).
template <class To, class From> inline To cvt(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (std::is_same_v<To, half>)
#ifdef __SYCL_DEVICE_ONLY__
    return half(to_float(v));
#else
    return bitcast<half>(float_to_half(to_float(v)));
#endif
  else if constexpr (std::is_same_v<To, bf16>)
    return bitcast<bf16>(float_to_bf16(to_float(v)));
  else if constexpr (is_wrapper_v<From>)
    return static_cast<To>(to_float(v));
  else
    return static_cast<To>(v);
}

template <class T> inline T poison() {
  if constexpr (std::is_same_v<T, half>)
    return bitcast<half>(uint16_t{0x7e00});
  else if constexpr (std::is_same_v<T, bf16>)
    return bitcast<bf16>(uint16_t{0x7fc0});
  else if constexpr (std::is_same_v<T, float>)
    return bitcast<float>(0x7fc00000u);
  else if constexpr (std::is_same_v<T, double>)
    return bitcast<double>(0x7ff8000000000000ull);
  else
    return T(0);
}

// ESIMD's computation_type (detail/types.hpp): C++ promotion for standard types; the
// same wrapper type stays; one floating and one integral type gives the floating one;
// otherwise C++ promotion of the enclosing types (half and bfloat16 enclose in float).
template <class T> using native_t = std::conditional_t<is_wrapper_v<T>, float, T>;
template <class T1, class T2>
using comp_t = std::conditional_t<
    !is_wrapper_v<T1> && !is_wrapper_v<T2>, decltype(T1() + T2()),
    std::conditional_t<
        std::is_same_v<T1, T2>, T1,
        std::conditional_t<is_fp_v<T1> != is_fp_v<T2>, std::conditional_t<is_fp_v<T1>, T1, T2>,
                           decltype(native_t<T1>() + native_t<T2>())>>>;

enum class op { add, sub, mul, div, rem, band, bor, bxor, shl, shr };

template <op O, class R> inline R apply(R a, R b) {
  if constexpr (is_wrapper_v<R>) {
    const float x = to_float(a), y = to_float(b);
    float r;
    if constexpr (O == op::add)
      r = x + y;
    else if constexpr (O == op::sub)
      r = x - y;
    else if constexpr (O == op::mul)
      r = x * y;
    else
      r = x / y;
    return cvt<R>(r);
  } else if constexpr (std::is_integral_v<R> && (O == op::add || O == op::sub || O == op::mul)) {
    using U = std::make_unsigned_t<R>; // wraps, as the hardware does
    if constexpr (O == op::add)
      return static_cast<R>(static_cast<U>(a) + static_cast<U>(b));
    else if constexpr (O == op::sub)
      return static_cast<R>(static_cast<U>(a) - static_cast<U>(b));
    else
      return static_cast<R>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    if constexpr (O == op::add)
      return a + b;
    else if constexpr (O == op::sub)
      return a - b;
    else if constexpr (O == op::mul)
      return a * b;
    else if constexpr (O == op::div)
      return a / b;
    else if constexpr (O == op::rem)
      return a % b;
    else if constexpr (O == op::band)
      return a & b;
    else if constexpr (O == op::bor)
      return a | b;
    else if constexpr (O == op::bxor)
      return a ^ b;
    else if constexpr (O == op::shl)
      return static_cast<R>(a << b);
    else
      return static_cast<R>(a >> b);
  }
}

// ---- float math, through SYCL on a device and <cmath> on the host --------------------
#if FMLP_EMU_SYCL
inline float f_exp2(float x) { return sycl::exp2(x); }
inline float f_log2(float x) { return sycl::log2(x); }
inline float f_sqrt(float x) { return sycl::sqrt(x); }
inline float f_fmax(float a, float b) { return sycl::fmax(a, b); }
inline float f_fmin(float a, float b) { return sycl::fmin(a, b); }
inline float f_fabs(float x) { return sycl::fabs(x); }
#else
inline float f_exp2(float x) { return std::exp2(x); }
inline float f_log2(float x) { return std::log2(x); }
inline float f_sqrt(float x) { return std::sqrt(x); }
inline float f_fmax(float a, float b) { return std::fmax(a, b); }
inline float f_fmin(float a, float b) { return std::fmin(a, b); }
inline float f_fabs(float x) { return std::fabs(x); }
#endif

struct uninit_t {}; // internal: a simd every lane of which is written next
template <class T> struct is_proxy : std::false_type {};
template <class T, int N> struct is_proxy<simd_view<T, N>> : std::true_type {};
template <class T> struct is_proxy<elem_ref<T>> : std::true_type {};
template <class T> inline const T &unproxy(const T &x) { return x; }
template <class T, int N> inline simd<T, N> unproxy(const simd_view<T, N> &v) { return v.read(); }
template <class T> inline T unproxy(const elem_ref<T> &r) { return static_cast<T>(r); }
} // namespace detail

// ---- element reference: what simd[i] and view[i] return ------------------------------
template <class T> class elem_ref {
public:
  explicit elem_ref(unsigned char *p) : p_(p) {}
  operator T() const {
    T v;
    __builtin_memcpy(&v, p_, sizeof(T));
    return v;
  }
  template <class U, class = std::enable_if_t<detail::is_elem_v<U>>> elem_ref &operator=(U v) {
    const T t = detail::cvt<T>(v);
    __builtin_memcpy(p_, &t, sizeof(T));
    return *this;
  }
  elem_ref &operator=(const elem_ref &o) { return *this = static_cast<T>(o); }
  // x[i] op= v is x[i] = x[i] op v in the computation type, rounded to T once
  template <class U> elem_ref &operator+=(U v) { return compound<detail::op::add>(v); }
  template <class U> elem_ref &operator-=(U v) { return compound<detail::op::sub>(v); }
  template <class U> elem_ref &operator*=(U v) { return compound<detail::op::mul>(v); }
  template <class U> elem_ref &operator/=(U v) { return compound<detail::op::div>(v); }

private:
  template <detail::op O, class U> elem_ref &compound(U v) {
    using R = detail::comp_t<T, U>;
    return *this = detail::apply<O, R>(detail::cvt<R>(static_cast<T>(*this)), detail::cvt<R>(v));
  }
  unsigned char *p_;
};

// ---- simd_mask<N>: 16-bit lanes, non-zero = enabled (ESIMD's simd_mask_impl) ----------
template <int N> class simd_mask {
public:
  using element_type = uint16_t;
  static constexpr int length = N;
  simd_mask() = default;
  simd_mask(uint16_t v) { // broadcast, as `simd_mask<N> m = 1;`
    for (int i = 0; i < N; ++i)
      m_[i] = v;
  }
  uint16_t operator[](int i) const { return m_[i]; }
  elem_ref<uint16_t> operator[](int i) {
    return elem_ref<uint16_t>(reinterpret_cast<unsigned char *>(m_ + i));
  }
  // !m: lanes equal to 0. ~m is ESIMD's BITWISE not (0 -> 0xffff, 1 -> 0xfffe): every
  // lane of the result is non-zero, i.e. enabled. Use !m to invert a mask.
  simd_mask operator!() const {
    return map([](uint16_t a) -> uint16_t { return a == 0; });
  }
  simd_mask operator~() const {
    return map([](uint16_t a) -> uint16_t { return static_cast<uint16_t>(~a); });
  }
  friend simd_mask operator&(const simd_mask &a, const simd_mask &b) {
    return zip(a, b, [](uint16_t x, uint16_t y) -> uint16_t { return x & y; });
  }
  friend simd_mask operator|(const simd_mask &a, const simd_mask &b) {
    return zip(a, b, [](uint16_t x, uint16_t y) -> uint16_t { return x | y; });
  }
  friend simd_mask operator^(const simd_mask &a, const simd_mask &b) {
    return zip(a, b, [](uint16_t x, uint16_t y) -> uint16_t { return x ^ y; });
  }
  friend simd_mask operator&&(const simd_mask &a, const simd_mask &b) {
    return zip(a, b, [](uint16_t x, uint16_t y) -> uint16_t { return x && y; });
  }
  friend simd_mask operator||(const simd_mask &a, const simd_mask &b) {
    return zip(a, b, [](uint16_t x, uint16_t y) -> uint16_t { return x || y; });
  }
  friend simd_mask operator==(const simd_mask &a, const simd_mask &b) {
    return zip(a, b, [](uint16_t x, uint16_t y) -> uint16_t { return x == y; });
  }
  friend simd_mask operator!=(const simd_mask &a, const simd_mask &b) {
    return zip(a, b, [](uint16_t x, uint16_t y) -> uint16_t { return x != y; });
  }
  uint16_t any() const {
    for (int i = 0; i < N; ++i)
      if (m_[i])
        return 1;
    return 0;
  }
  uint16_t all() const {
    for (int i = 0; i < N; ++i)
      if (!m_[i])
        return 0;
    return 1;
  }

private:
  template <class F> simd_mask map(F f) const {
    simd_mask r;
    for (int i = 0; i < N; ++i)
      r.m_[i] = f(m_[i]);
    return r;
  }
  template <class F> static simd_mask zip(const simd_mask &a, const simd_mask &b, F f) {
    simd_mask r;
    for (int i = 0; i < N; ++i)
      r.m_[i] = f(a.m_[i], b.m_[i]);
    return r;
  }
  uint16_t m_[N];
};

// ---- simd<T, N> ----------------------------------------------------------------------
template <class T, int N> class simd {
  static_assert(detail::is_elem_v<T>, "simd: unsupported element type");
  static_assert(N >= 1, "simd: N must be positive");

public:
  using element_type = T;
  static constexpr int length = N;

  explicit simd(detail::uninit_t) {}
  simd() { // ESIMD leaves it undefined; here it reads as poison
    for (int i = 0; i < N; ++i)
      v_[i] = detail::poison<T>();
  }
  template <class U, class = std::enable_if_t<detail::is_elem_v<U>>> simd(U s) { *this = s; }
  // iota: base + i * step in ESIMD's enclosing type (make_vector): native half on the
  // device (the product and the sum each rounded to half), float for bfloat16.
  simd(T base, T step) {
    for (int i = 0; i < N; ++i) {
      const float fi = static_cast<float>(i);
      if constexpr (std::is_same_v<T, detail::half>)
        v_[i] = detail::cvt<T>(detail::to_float(base) +
                               detail::to_float(detail::cvt<T>(fi * detail::to_float(step))));
      else if constexpr (detail::is_wrapper_v<T>)
        v_[i] = detail::cvt<T>(detail::to_float(base) + fi * detail::to_float(step));
      else
        v_[i] = detail::apply<detail::op::add>(
            base, detail::apply<detail::op::mul>(static_cast<T>(i), step));
    }
  }
  simd(const simd &) = default;
  template <class U> simd(const simd<U, N> &o) {
    for (int i = 0; i < N; ++i)
      v_[i] = detail::cvt<T>(o[i]);
  }
  template <class U> simd(const simd_view<U, N> &v) : simd(v.read()) {}

  simd &operator=(const simd &) = default;
  template <class U, class = std::enable_if_t<detail::is_elem_v<U>>> simd &operator=(U s) {
    const T t = detail::cvt<T>(s);
    for (int i = 0; i < N; ++i)
      v_[i] = t;
    return *this;
  }

  T operator[](int i) const & { return v_[i]; }
  elem_ref<T> operator[](int i) & { return elem_ref<T>(bytes() + i * sizeof(T)); }

  // A view of Size elements Stride apart, from element `offset` (reads and writes this).
  template <int Size, int Stride = 1> simd_view<T, Size> select(uint16_t offset = 0) & {
    static_assert(Size >= 1 && Stride >= 1 && (Size - 1) * Stride < N,
                  "select: region outside the simd");
    if (offset + (Size - 1) * Stride >= N)
      detail::fail("select: offset + region past the end of the simd");
    return simd_view<T, Size>(bytes() + offset * sizeof(T), Stride);
  }
  template <int Size, int Stride = 1> simd<T, Size> select(uint16_t offset = 0) && {
    return static_cast<simd &>(*this).template select<Size, Stride>(offset).read();
  }
  // This simd's bytes read as elements of U (writable).
  template <class U> simd_view<U, N * sizeof(T) / sizeof(U)> bit_cast_view() & {
    static_assert((N * sizeof(T)) % sizeof(U) == 0, "bit_cast_view: size not a multiple of U");
    return simd_view<U, N * sizeof(T) / sizeof(U)>(bytes(), 1);
  }

  void copy_from(const T *p) {
    for (int i = 0; i < N; ++i)
      v_[i] = p[i];
  }
  void copy_to(T *p) const {
    for (int i = 0; i < N; ++i)
      p[i] = v_[i];
  }
  // Lanes where mask is set take val's element.
  void merge(const simd &val, const simd_mask<N> &mask) {
    for (int i = 0; i < N; ++i)
      if (mask[i])
        v_[i] = val.v_[i];
  }
  void merge(const simd &val1, simd val2, const simd_mask<N> &mask) {
    val2.merge(val1, mask);
    *this = val2;
  }

  simd operator-() const {
    simd r{detail::uninit_t{}};
    for (int i = 0; i < N; ++i) {
      if constexpr (detail::is_wrapper_v<T>) // flip the sign bit: exact, NaN stays NaN
        r.v_[i] =
            detail::bitcast<T>(static_cast<uint16_t>(detail::bitcast<uint16_t>(v_[i]) ^ 0x8000u));
      else
        r.v_[i] = detail::apply<detail::op::sub>(T(0), v_[i]);
    }
    return r;
  }
  template <class U = T, class = std::enable_if_t<std::is_integral_v<U>>> simd operator~() const {
    simd r{detail::uninit_t{}};
    for (int i = 0; i < N; ++i)
      r.v_[i] = static_cast<T>(~v_[i]);
    return r;
  }
  template <class U = T, class = std::enable_if_t<std::is_integral_v<U>>>
  simd_mask<N> operator!() const {
    simd_mask<N> m;
    for (int i = 0; i < N; ++i)
      m[i] = static_cast<uint16_t>(v_[i] == 0);
    return m;
  }

#define FMLP_EMU_OPASSIGN(OPA, OP)                                                                 \
  template <class X> simd &operator OPA(const X &x) {                                              \
    return *this = simd(*this OP detail::unproxy(x));                                              \
  }
  FMLP_EMU_OPASSIGN(+=, +)
  FMLP_EMU_OPASSIGN(-=, -)
  FMLP_EMU_OPASSIGN(*=, *)
  FMLP_EMU_OPASSIGN(/=, /)
  FMLP_EMU_OPASSIGN(%=, %)
  FMLP_EMU_OPASSIGN(&=, &)
  FMLP_EMU_OPASSIGN(|=, |)
  FMLP_EMU_OPASSIGN(^=, ^)
  FMLP_EMU_OPASSIGN(<<=, <<)
  FMLP_EMU_OPASSIGN(>>=, >>)
#undef FMLP_EMU_OPASSIGN

private:
  unsigned char *bytes() { return reinterpret_cast<unsigned char *>(v_); }
  T v_[N];
};

// ---- simd_view<T, N>: N elements of some simd's bytes, `stride` elements apart ---------
template <class T, int N> class simd_view {
public:
  using element_type = T;
  static constexpr int length = N;
  simd_view(unsigned char *base, int stride) : base_(base), stride_(stride) {}
  simd_view(const simd_view &) = default;

  simd<T, N> read() const {
    simd<T, N> r{detail::uninit_t{}};
    for (int i = 0; i < N; ++i)
      r[i] = static_cast<T>((*this)[i]);
    return r;
  }
  // Assignment writes through (never rebinds the view).
  template <class U> simd_view &operator=(const simd<U, N> &v) {
    const simd<T, N> t(v); // convert first: the source may alias this view
    for (int i = 0; i < N; ++i)
      (*this)[i] = t[i];
    return *this;
  }
  template <class U> simd_view &operator=(const simd_view<U, N> &v) { return *this = v.read(); }
  simd_view &operator=(const simd_view &v) { return *this = v.read(); }
  template <class U, class = std::enable_if_t<detail::is_elem_v<U>>> simd_view &operator=(U s) {
    return *this = simd<T, N>(s);
  }
  elem_ref<T> operator[](int i) const { return elem_ref<T>(base_ + i * stride_ * sizeof(T)); }
  template <int Size, int Stride = 1> simd_view<T, Size> select(uint16_t offset = 0) const {
    static_assert(Size >= 1 && Stride >= 1 && (Size - 1) * Stride < N,
                  "select: region outside the view");
    if (offset + (Size - 1) * Stride >= N)
      detail::fail("select: offset + region past the end of the view");
    return simd_view<T, Size>(base_ + offset * stride_ * sizeof(T), stride_ * Stride);
  }
  template <class U> simd_view<U, N * sizeof(T) / sizeof(U)> bit_cast_view() const {
    static_assert((N * sizeof(T)) % sizeof(U) == 0, "bit_cast_view: size not a multiple of U");
    if (stride_ != 1)
      detail::fail("bit_cast_view of a strided view (not emulated)");
    return simd_view<U, N * sizeof(T) / sizeof(U)>(base_, 1);
  }

#define FMLP_EMU_VIEW_OPASSIGN(OPA, OP)                                                            \
  template <class X> simd_view &operator OPA(const X &x) {                                         \
    return *this = simd<T, N>(read() OP detail::unproxy(x));                                       \
  }
  FMLP_EMU_VIEW_OPASSIGN(+=, +)
  FMLP_EMU_VIEW_OPASSIGN(-=, -)
  FMLP_EMU_VIEW_OPASSIGN(*=, *)
  FMLP_EMU_VIEW_OPASSIGN(/=, /)
#undef FMLP_EMU_VIEW_OPASSIGN

private:
  unsigned char *base_;
  int stride_;
};

// ---- binary operators (ESIMD's computation_type promotion) ----------------------------
#define FMLP_EMU_BINOP(OP, ID, COND)                                                               \
  template <class T1, class T2, int N, class R = detail::comp_t<T1, T2>,                           \
            class = std::enable_if_t<COND>>                                                        \
  inline simd<R, N> operator OP(const simd<T1, N> &a, const simd<T2, N> &b) {                      \
    simd<R, N> r{detail::uninit_t{}};                                                              \
    for (int i = 0; i < N; ++i)                                                                    \
      r[i] = detail::apply<detail::op::ID, R>(detail::cvt<R>(a[i]), detail::cvt<R>(b[i]));         \
    return r;                                                                                      \
  }                                                                                                \
  template <class T1, class T2, int N, class = std::enable_if_t<detail::is_elem_v<T2>>>            \
  inline auto operator OP(const simd<T1, N> &a, T2 b) {                                            \
    return a OP simd<T2, N>(b);                                                                    \
  }                                                                                                \
  template <class T1, class T2, int N, class = std::enable_if_t<detail::is_elem_v<T1>>>            \
  inline auto operator OP(T1 a, const simd<T2, N> &b) {                                            \
    return simd<T1, N>(a) OP b;                                                                    \
  }

#define FMLP_EMU_ANY std::is_same_v<T1, T1>
#define FMLP_EMU_INT std::is_integral_v<T1> &&std::is_integral_v<T2>
FMLP_EMU_BINOP(+, add, FMLP_EMU_ANY)
FMLP_EMU_BINOP(-, sub, FMLP_EMU_ANY)
FMLP_EMU_BINOP(*, mul, FMLP_EMU_ANY)
FMLP_EMU_BINOP(/, div, FMLP_EMU_ANY)
FMLP_EMU_BINOP(%, rem, FMLP_EMU_INT)
FMLP_EMU_BINOP(&, band, FMLP_EMU_INT)
FMLP_EMU_BINOP(|, bor, FMLP_EMU_INT)
FMLP_EMU_BINOP(^, bxor, FMLP_EMU_INT)
FMLP_EMU_BINOP(<<, shl, FMLP_EMU_INT)
FMLP_EMU_BINOP(>>, shr, FMLP_EMU_INT)
#undef FMLP_EMU_BINOP

// Comparisons: in the computation type; the mask lanes are 0 or 1 (NaN compares false,
// except !=).
#define FMLP_EMU_CMPOP(OP)                                                                         \
  template <class T1, class T2, int N>                                                             \
  inline simd_mask<N> operator OP(const simd<T1, N> &a, const simd<T2, N> &b) {                    \
    using R = detail::comp_t<T1, T2>;                                                              \
    using C = std::conditional_t<detail::is_wrapper_v<R>, float, R>;                               \
    simd_mask<N> m;                                                                                \
    for (int i = 0; i < N; ++i)                                                                    \
      m[i] = static_cast<uint16_t>(detail::cvt<C>(a[i]) OP detail::cvt<C>(b[i]));                  \
    return m;                                                                                      \
  }                                                                                                \
  template <class T1, class T2, int N, class = std::enable_if_t<detail::is_elem_v<T2>>>            \
  inline simd_mask<N> operator OP(const simd<T1, N> &a, T2 b) {                                    \
    return a OP simd<T2, N>(b);                                                                    \
  }                                                                                                \
  template <class T1, class T2, int N, class = std::enable_if_t<detail::is_elem_v<T1>>>            \
  inline simd_mask<N> operator OP(T1 a, const simd<T2, N> &b) {                                    \
    return simd<T1, N>(a) OP b;                                                                    \
  }
FMLP_EMU_CMPOP(<)
FMLP_EMU_CMPOP(>)
FMLP_EMU_CMPOP(<=)
FMLP_EMU_CMPOP(>=)
FMLP_EMU_CMPOP(==)
FMLP_EMU_CMPOP(!=)
#undef FMLP_EMU_CMPOP

// A view or element reference on either side: read it, then as above. As in ESIMD, an
// element (a one-element view there) does not combine with a longer simd: convert it to
// a scalar first.
namespace detail {
template <class T> struct is_elem_ref : std::false_type {};
template <class T> struct is_elem_ref<elem_ref<T>> : std::true_type {};
template <class T> struct is_simd : std::false_type {};
template <class T, int N> struct is_simd<simd<T, N>> : std::true_type {};
template <class T, int N> struct is_simd<simd_view<T, N>> : std::true_type {};
template <class A, class B>
constexpr bool proxy_op_v =
    (is_proxy<A>::value || is_proxy<B>::value) && !(is_elem_ref<A>::value && is_simd<B>::value) &&
    !(is_simd<A>::value && is_elem_ref<B>::value);
} // namespace detail
#define FMLP_EMU_PROXYOP(OP)                                                                       \
  template <class A, class B, class = std::enable_if_t<detail::proxy_op_v<A, B>>>                  \
  inline auto operator OP(const A &a, const B &b) {                                                \
    return detail::unproxy(a) OP detail::unproxy(b);                                               \
  }
FMLP_EMU_PROXYOP(+)
FMLP_EMU_PROXYOP(-)
FMLP_EMU_PROXYOP(*)
FMLP_EMU_PROXYOP(/)
FMLP_EMU_PROXYOP(<)
FMLP_EMU_PROXYOP(>)
FMLP_EMU_PROXYOP(<=)
FMLP_EMU_PROXYOP(>=)
FMLP_EMU_PROXYOP(==)
FMLP_EMU_PROXYOP(!=)
#undef FMLP_EMU_PROXYOP
#undef FMLP_EMU_ANY
#undef FMLP_EMU_INT

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
