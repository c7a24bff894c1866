// The ESIMD emulation as host C++, driven by tests/test_esimd_emu.py: `host_driver CMD DIR
// [ARGS]` reads its inputs from DIR/*.bin (raw little-endian arrays), writes its outputs
// there, and the Python side checks them against references it computes itself from
// Intel's definitions. The type rules are checked here, at compile time.
#define FMLP_ESIMD_EMULATE
#include "esimd_select.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using half = sycl::half;
using bf16 = sycl::ext::oneapi::bfloat16;
template <class T, int N> using simd = esimd::simd<T, N>;
template <int N> using mask = esimd::simd_mask<N>;

// ESIMD's computation_type (detail/types.hpp, detail/operators.hpp)
static_assert(std::is_same_v<decltype(simd<half, 8>() + simd<half, 8>()), simd<half, 8>>);
static_assert(std::is_same_v<decltype(simd<bf16, 8>() * simd<bf16, 8>()), simd<bf16, 8>>);
static_assert(std::is_same_v<decltype(simd<half, 8>() * 2.0f), simd<float, 8>>);
static_assert(std::is_same_v<decltype(simd<half, 8>() * 2), simd<half, 8>>);
static_assert(std::is_same_v<decltype(simd<half, 8>() + simd<bf16, 8>()), simd<float, 8>>);
static_assert(std::is_same_v<decltype(simd<int16_t, 8>() + simd<int16_t, 8>()), simd<int, 8>>);
static_assert(
    std::is_same_v<decltype(simd<uint32_t, 8>() + simd<int32_t, 8>()), simd<uint32_t, 8>>);
static_assert(std::is_same_v<decltype(simd<float, 8>() < 1.0f), mask<8>>);
static_assert(std::is_same_v<decltype(xmx::dpas<8, 3, float>(simd<half, 256>(), simd<half, 48>())),
                             simd<float, 48>>);

namespace {
std::string g_dir;

template <class T> std::vector<T> read(const char *name) {
  std::string path = g_dir + "/" + name;
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) {
    std::fprintf(stderr, "cannot open %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<T> v;
  T x;
  while (std::fread(&x, sizeof(T), 1, f) == 1)
    v.push_back(x);
  std::fclose(f);
  return v;
}
template <class T> void write(const char *name, const T *p, size_t n) {
  std::string path = g_dir + "/" + name;
  FILE *f = std::fopen(path.c_str(), "wb");
  std::fwrite(p, sizeof(T), n, f);
  std::fclose(f);
}
template <class T> void write(const char *name, const std::vector<T> &v) {
  write(name, v.data(), v.size());
}
template <class T, int N> void write(const char *name, const simd<T, N> &s) {
  T buf[N];
  s.copy_to(buf);
  write(name, buf, N);
}

// ---- dpas: a.bin (R x 16 fp16/bf16 bits), b.bin (16 x 16 VNNI), c.bin (R x 16 f32) -> d.bin
template <class T, int R> void dpas(bool with_c) {
  auto a = read<T>("a.bin"), b = read<T>("b.bin");
  simd<T, R * 16> A;
  simd<T, 256> B;
  A.copy_from(a.data());
  B.copy_from(b.data());
  if (with_c) {
    simd<float, R * 16> C;
    C.copy_from(read<float>("c.bin").data());
    write("d.bin", xmx::dpas<8, R, float>(C, B, A));
  } else {
    write("d.bin", xmx::dpas<8, R, float>(B, A));
  }
}
template <class T> void dpas_r(int r, bool with_c) {
  switch (r) {
  case 1:
    return dpas<T, 1>(with_c);
  case 2:
    return dpas<T, 2>(with_c);
  case 3:
    return dpas<T, 3>(with_c);
  case 4:
    return dpas<T, 4>(with_c);
  case 5:
    return dpas<T, 5>(with_c);
  case 6:
    return dpas<T, 6>(with_c);
  case 7:
    return dpas<T, 7>(with_c);
  case 8:
    return dpas<T, 8>(with_c);
  }
  std::exit(2);
}

// ---- conversions and 16-bit arithmetic, 16 lanes at a time ---------------------------
// f.bin (f32) -> to_half.bin, to_bf16.bin (bits); h.bin, g.bin (half bits), p.bin, q.bin
// (bf16 bits) -> half_to_f32.bin, half_{add,sub,mul,div}.bin, bf16_... .bin
void convert() {
  auto f = read<float>("f.bin");
  auto h = read<half>("h.bin"), g = read<half>("g.bin");
  auto p = read<bf16>("p.bin"), q = read<bf16>("q.bin");
  std::vector<half> th(f.size()), hadd(h.size()), hsub(h.size()), hmul(h.size()), hdiv(h.size());
  std::vector<bf16> tb(f.size()), badd(p.size()), bsub(p.size()), bmul(p.size()), bdiv(p.size());
  std::vector<float> hf(h.size()), bf(p.size());
  for (size_t i = 0; i < f.size(); i += 16) {
    simd<float, 16> x;
    x.copy_from(&f[i]);
    simd<half, 16>(x).copy_to(&th[i]);
    simd<bf16, 16>(x).copy_to(&tb[i]);
  }
  for (size_t i = 0; i < h.size(); i += 16) {
    simd<half, 16> x, y;
    x.copy_from(&h[i]);
    y.copy_from(&g[i]);
    simd<float, 16>(x).copy_to(&hf[i]);
    (x + y).copy_to(&hadd[i]);
    (x - y).copy_to(&hsub[i]);
    (x * y).copy_to(&hmul[i]);
    (x / y).copy_to(&hdiv[i]);
  }
  for (size_t i = 0; i < p.size(); i += 16) {
    simd<bf16, 16> x, y;
    x.copy_from(&p[i]);
    y.copy_from(&q[i]);
    simd<float, 16>(x).copy_to(&bf[i]);
    (x + y).copy_to(&badd[i]);
    (x - y).copy_to(&bsub[i]);
    (x * y).copy_to(&bmul[i]);
    (x / y).copy_to(&bdiv[i]);
  }
  write("to_half.bin", th);
  write("to_bf16.bin", tb);
  write("half_to_f32.bin", hf);
  write("bf16_to_f32.bin", bf);
  write("half_add.bin", hadd), write("half_sub.bin", hsub), write("half_mul.bin", hmul),
      write("half_div.bin", hdiv);
  write("bf16_add.bin", badd), write("bf16_sub.bin", bsub), write("bf16_mul.bin", bmul),
      write("bf16_div.bin", bdiv);
}

// ---- regions: a fixed sequence of selects and writes on iota(0, 1) ---------------------
void views() {
  simd<float, 32> s(0.0f, 1.0f);
  auto v = s.select<8, 3>(2); // elements 2, 5, ..., 23
  v += 100.0f;
  v.select<2, 2>(1) = -1.0f; // elements 5 and 11
  s.select<4, 1>(28) *= simd<float, 4>(2.0f);
  s[0] = 7.5f;
  s[31] += 0.25f;
  simd<float, 4> firsts = s.select<4, 8>(1); // read: elements 1, 9, 17, 25
  simd<uint32_t, 32> bits = s.bit_cast_view<uint32_t>();
  simd<uint16_t, 64> halves = s.bit_cast_view<uint16_t>();
  simd<float, 8> rv = std::move(s).select<8, 4>(0); // select on an rvalue copies
  write("views_s.bin", s);
  write("views_firsts.bin", firsts);
  write("views_bits.bin", bits);
  write("views_halves.bin", halves);
  write("views_rvalue.bin", rv);
  // masks: comparisons give 0/1, ! inverts, ~ is bitwise (every lane stays non-zero)
  simd<float, 8> a(0.0f, 1.0f);
  mask<8> m = a > 2.5f;
  simd<uint16_t, 8> mm, nm, tm, am;
  for (int i = 0; i < 8; ++i)
    mm[i] = m[i], nm[i] = (!m)[i], tm[i] = (~m)[i], am[i] = (m & (a < 5.0f))[i];
  write("mask_m.bin", mm), write("mask_not.bin", nm), write("mask_tilde.bin", tm),
      write("mask_and.bin", am);
  write("merge.bin", esimd::merge(a, simd<float, 8>(-1.0f), m));
  write("neg.bin", -a);
  simd<float, 8> c = a;
  c += 1.0f, c *= 3.0f, c -= a, c /= 2.0f; // (3(a+1) - a) / 2
  write("compound.bin", c);
  // an element's op= rounds once: 1 + (2^-11 + 2^-22) in float, then to half (1 + 2^-10);
  // rounding the addend to half first (2^-11, a tie) would give 1
  simd<half, 8> h = 1.0f;
  h[0] += 0.00048828125f + 2.384185791015625e-07f;
  write("elem_compound.bin", h);
}

// ---- global memory: src.bin (f32, n) ----------------------------------------------------
// gather with off.bin (u32 byte offsets) and msk.bin (u16), scatter vals.bin into dst.bin,
// a masked tail walk over src in blocks of 16, block_load/block_store of the last 16.
void memory() {
  auto src = read<float>("src.bin");
  const int n = static_cast<int>(src.size());
  auto off = read<uint32_t>("off.bin");
  auto msk = read<uint16_t>("msk.bin");
  simd<uint32_t, 16> offs;
  mask<16> m;
  for (int i = 0; i < 16; ++i)
    offs[i] = off[i], m[i] = msk[i];
  write("gather.bin", esimd::gather<float, 16>(src.data(), offs, m));
  write("gather_all.bin", esimd::gather<float, 16>(src.data(), offs));
  simd<uint32_t, 32> spread = 0xFFFFFFF0u; // offsets in the even lanes, junk in the odd
  spread.select<16, 2>(0) = offs;
  write("gather_view.bin", esimd::gather<float, 16>(src.data(), spread.select<16, 2>(0), m));

  auto dst = read<float>("dst.bin");
  simd<float, 16> vals;
  vals.copy_from(read<float>("vals.bin").data());
  esimd::scatter<float, 16>(dst.data(), offs, vals, m);
  write("scatter.bin", dst);

  // rows past the end: lanes i < n - base only, the kernels' tail pattern
  std::vector<float> tail(((n + 15) / 16) * 16), copy(n + 16, -7.0f);
  for (int base = 0; base < n; base += 16) {
    mask<16> live = simd<int, 16>(0, 1) < (n - base);
    simd<uint32_t, 16> bytes = simd<uint32_t, 16>(0u, 4u);
    simd<float, 16> got = esimd::gather<float, 16>(src.data() + base, bytes, live);
    got.copy_to(&tail[base]);
    esimd::scatter<float, 16>(copy.data() + base, bytes, got, live);
  }
  write("tail.bin", tail);
  write("tail_copy.bin", copy);
  std::vector<float> last(n, -3.0f);
  esimd::block_store<float, 16>(last.data() + n - 16,
                                esimd::block_load<float, 16>(src.data() + n - 16));
  esimd::block_store<float, 8>(last.data(), 4,
                               esimd::block_load<float, 8>(src.data(), 4)); // byte offsets
  write("last.bin", last);

  auto hs = read<half>("hsrc.bin"); // 16-bit elements: 2-byte offsets
  simd<uint32_t, 16> hoffs = simd<uint32_t, 16>(0u, 2u) * 3u;
  write("hgather.bin", esimd::gather<half, 16>(hs.data(), hoffs, m));
}

// ---- SLM: declare 1 KiB, store two blocks, read them back and read one never written ----
void slm() {
  esimd::slm_init<1024>();
  simd<float, 32> a(1.0f, 0.5f);
  simd<half, 64> h(0.0f, -0.25f);
  esimd::slm_block_store<float, 32>(0, a);
  esimd::slm_block_store<half, 64>(1024 - 128, h); // the last 128 bytes
  esimd::barrier();
  write("slm_a.bin", esimd::slm_block_load<float, 32>(0));
  write("slm_h.bin", esimd::slm_block_load<half, 64>(1024 - 128));
  write("slm_unwritten.bin", esimd::slm_block_load<float, 16>(512));
}

// ---- math on x.bin, y.bin (f32, multiples of 16) ------------------------------------------
void math() {
  auto x = read<float>("x.bin"), y = read<float>("y.bin");
  const char *names[] = {"max", "min", "exp", "log", "sqrt", "inv", "abs", "hmax"};
  std::vector<std::vector<float>> out(8, std::vector<float>(x.size()));
  for (size_t i = 0; i < x.size(); i += 16) {
    simd<float, 16> a, b;
    a.copy_from(&x[i]);
    b.copy_from(&y[i]);
    esimd::max(a, b).copy_to(&out[0][i]);
    esimd::min(a, b).copy_to(&out[1][i]);
    esimd::exp(a).copy_to(&out[2][i]);
    esimd::log(a).copy_to(&out[3][i]);
    esimd::sqrt(a).copy_to(&out[4][i]);
    esimd::inv(a).copy_to(&out[5][i]);
    esimd::abs(a).copy_to(&out[6][i]);
    simd<float, 16>(esimd::max(simd<half, 16>(a), simd<half, 16>(b))).copy_to(&out[7][i]);
  }
  for (int k = 0; k < 8; ++k)
    write((std::string(names[k]) + ".bin").c_str(), out[k]);
  simd<int, 8> iv(-4, 1);
  write("int_abs.bin", esimd::abs(iv));
  write("int_max.bin", esimd::max(iv, 0));
  // half: exp/log with their half roundings, iota in half arithmetic
  std::vector<half> hexp(x.size()), hlog(x.size());
  for (size_t i = 0; i < x.size(); i += 16) {
    simd<float, 16> a;
    a.copy_from(&x[i]);
    esimd::exp(simd<half, 16>(a)).copy_to(&hexp[i]);
    esimd::log(simd<half, 16>(a)).copy_to(&hlog[i]);
  }
  write("half_exp.bin", hexp);
  write("half_log.bin", hlog);
  write("half_iota.bin", simd<half, 32>(half(1.0f), half(0.1f)));
}

// ---- 2-D block messages: block2d DIR W H P X Y --------------------------------------
// surf.bin: H rows of P 16-bit words (the pitch), of which the first W are the surface's
// columns; loads and a store at element column X, row Y (either may be negative).
void block2d(int w, int h, int p, int x, int y) {
  auto in = read<uint16_t>("surf.bin");
  std::vector<uint16_t> store(in.size() + 32);
  uint16_t *buf = store.data();
  while (reinterpret_cast<uintptr_t>(buf) % 64)
    ++buf;
  std::memcpy(buf, in.data(), in.size() * 2);
  const unsigned sw = w * 2 - 1, sh = h - 1, sp = p * 2 - 1;
  write("ld_16x8x2.bin", xesimd::lsc_load_2d<uint16_t, 16, 8, 2>(buf, sw, sh, sp, x, y));
  write("ld_16x1.bin", xesimd::lsc_load_2d<uint16_t, 16, 1, 1>(buf, sw, sh, sp, x, y));
  write("ld_8x32.bin", xesimd::lsc_load_2d<uint16_t, 8, 32, 1>(buf, sw, sh, sp, x, y));
  write("ld32_16x4.bin", xesimd::lsc_load_2d<uint32_t, 16, 4, 1>(
                             reinterpret_cast<const uint32_t *>(buf), sw, sh, sp, x / 2, y));
  write("ld32t_8x32.bin", xesimd::lsc_load_2d<uint32_t, 8, 32, 1, true, false>(
                              reinterpret_cast<const uint32_t *>(buf), sw, sh, sp, x / 2, y));
  write("ldv_16x32x2.bin", xesimd::lsc_load_2d<uint16_t, 16, 32, 2, false, true>(
                               buf, sw, sh, sp, x, y));
  xesimd::lsc_store_2d<uint16_t, 16, 8>(buf, sw, sh, sp, x, y,
                                        simd<uint16_t, 128>(uint16_t(0x8000), uint16_t(1)));
  write("st_16x8.bin", buf, in.size());
}

// ---- misuse the real API leaves undefined: the host build stops with a message -------
int misuse(const std::string &what) {
  alignas(16) float buf[64] = {};
  if (what == "surface_2d") {  // a pitch of 40 bytes: under 64 and not a multiple of 16
    alignas(64) uint16_t surf[64] = {};
    auto v = xesimd::lsc_load_2d<uint16_t, 16, 2>(surf, 31, 1, 39, 0, 0);
    return static_cast<int>(v[0]);
  }
  if (what == "block_load") {
    auto v = esimd::block_load<float, 8>(
        reinterpret_cast<const float *>(reinterpret_cast<const char *>(buf) + 2));
    return static_cast<int>(v[0]);
  }
  esimd::slm_init<256>();
  if (what == "slm_misaligned") {
    esimd::slm_block_store<float, 4>(8, simd<float, 4>(1.0f));
  } else if (what == "slm_past_init") {
    esimd::slm_block_store<float, 8>(256 - 16, simd<float, 8>(1.0f));
  } else if (what == "select_offset") {
    simd<float, 8> s = 0.0f;
    s.select<4, 2>(1) = 1.0f; // 1 + 3 * 2 = 7 is fine
    s.select<4, 2>(2) = 1.0f; // 2 + 3 * 2 = 8 is past the end
  }
  return 0;
}
} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CMD DIR [ARGS]\n", argv[0]);
    return 2;
  }
  const std::string cmd = argv[1];
  g_dir = argv[2];
  if (cmd == "dpas" && argc == 6) {
    const int r = std::atoi(argv[4]);
    const bool with_c = std::atoi(argv[5]) != 0;
    if (std::string(argv[3]) == "f16")
      dpas_r<half>(r, with_c);
    else
      dpas_r<bf16>(r, with_c);
  } else if (cmd == "convert")
    convert();
  else if (cmd == "views")
    views();
  else if (cmd == "memory")
    memory();
  else if (cmd == "slm")
    slm();
  else if (cmd == "math")
    math();
  else if (cmd == "block2d" && argc == 8)
    block2d(std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]),
            std::atoi(argv[7]));
  else if (cmd == "misuse" && argc == 4)
    return misuse(argv[3]);
  else {
    std::fprintf(stderr, "unknown command %s\n", cmd.c_str());
    return 2;
  }
  return 0;
}
