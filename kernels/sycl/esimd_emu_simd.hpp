// esimd_emu_simd.hpp: the ESIMD emulation's types: simd<T, N>, simd_mask<N>, simd_view,
// element references, the half/bfloat16 conversions and the binary operators with
// ESIMD's type promotion. Included by esimd_emu.hpp, whose opening comment says what the
// emulation is and what it makes visible.
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
namespace fmath = sycl;
#else
namespace fmath = std;
#endif
inline float f_exp2(float x) { return fmath::exp2(x); }
inline float f_log2(float x) { return fmath::log2(x); }
inline float f_sqrt(float x) { return fmath::sqrt(x); }
inline float f_fmax(float a, float b) { return fmath::fmax(a, b); }
inline float f_fmin(float a, float b) { return fmath::fmin(a, b); }
inline float f_fabs(float x) { return fmath::fabs(x); }

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

} // namespace fmlp_emu::esimd
