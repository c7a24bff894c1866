// Every call of the emulated ESIMD subset, once, in one kernel. tests/test_esimd_emu.py
// compiles it with the runtime's kernel compiler against Intel's ESIMD headers and
// against esimd_emu.hpp (FMLP_ESIMD_EMULATE), and with g++ against the emulation, so a
// call that one accepts and another rejects (a name, a template parameter, an argument
// order) fails the test. It is compiled, not run: what the calls compute is checked by
// the other tests.
#include <sycl/sycl.hpp>

#include "esimd_select.hpp"

using half = sycl::half;
using bf16 = sycl::ext::oneapi::bfloat16;

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((sycl::ext::oneapi::experimental::nd_range_kernel<1>))
    FMLP_ESIMD_KERNEL void emu_api_usage(const float *x, const half *h, const bf16 *g, float *y) {
  esimd::slm_init<4096>();
  // construction, conversion, element access
  esimd::simd<float, 16> a(0.0f, 1.0f), b = 2.0f, c;
  c = 0.5f;
  esimd::simd<half, 16> ah = a;
  esimd::simd<bf16, 16> ab = a;
  esimd::simd<float, 16> back = ah;
  esimd::simd<int32_t, 8> i32(0, 1);
  esimd::simd<uint32_t, 8> u32 = i32;
  esimd::simd<int16_t, 8> i16 = i32;
  esimd::simd<uint16_t, 8> u16 = i16;
  a[3] = 1.0f;
  float a3 = a[3];
  // regions
  auto v = a.select<4, 2>(1);
  v += 1.0f;
  v *= 2.0f;
  v = b.select<4, 1>(0);
  v.select<2, 2>(1) = 0.0f;
  esimd::simd<float, 4> r = a.select<4, 4>(0);
  esimd::simd<uint32_t, 16> bits = a.bit_cast_view<uint32_t>();
  esimd::simd<uint16_t, 16> hbits = ab.bit_cast_view<uint16_t>();
  // arithmetic and comparisons
  c = a + b - a * b / 3.0f;
  c = 2.0f * -a + 1.0f;
  c += b;
  c -= 1.0f;
  c *= a;
  c /= b;
  esimd::simd_mask<16> m = a < b, m2 = (a >= 1.0f) & (a != b),
                       m3 = (!m) | (a == c) | (a <= c) | (a > c);
  esimd::simd_mask<16> m4 = ~m;
  uint16_t lane = m[2];
  c = esimd::merge(a, b, m2);
  c.merge(a, m3);
  // math
  c = esimd::max(a, b) + esimd::min(a, 0.0f) + esimd::abs(c) + esimd::exp(a) + esimd::log(b) +
      esimd::sqrt(b) + esimd::inv(b);
  float s = esimd::exp(a3) + esimd::log(2.0f) + esimd::sqrt(2.0f) + esimd::inv(2.0f);
  // global memory
  esimd::simd<float, 16> l = esimd::block_load<float, 16>(x);
  l += esimd::block_load<float, 16>(x, 64);
  esimd::simd<uint32_t, 16> offs(0, 8);
  l += esimd::gather<float, 16>(x, offs, m) + esimd::gather<float, 16>(x, offs);
  esimd::simd<half, 16> hl = esimd::block_load<half, 16>(h) + esimd::gather<half, 16>(h, offs, m);
  esimd::simd<bf16, 16> gl = esimd::block_load<bf16, 16>(g);
  esimd::scatter<float, 16>(y, offs, l, m);
  esimd::scatter<float, 16>(y + 1, offs, l);
  esimd::simd<uint32_t, 32> offs2(0, 4);
  l += esimd::gather<float, 16>(x, offs2.select<16, 2>(0), m) +
       esimd::gather<float, 16>(x, offs2.select<16, 1>(16));
  esimd::scatter<float, 16>(y, offs2.select<16, 2>(0), l.select<16, 1>(0), m);
  esimd::scatter<float, 16>(y, offs2.select<16, 1>(0), l);
  esimd::block_store<float, 16>(y, l + hl + gl + s + back + lane);
  esimd::block_store<float, 16>(y, 128,
                                c + (float(r[0]) + float(bits[0]) + float(hbits[0]) + float(m4[0]) +
                                     float(u32[0]) + float(u16[0])));
  // 2-D block messages (16-bit elements as the kernels use them, dwords for B tiles);
  // 64-bit gather offsets
  esimd::simd<half, 16 * 16 * 2> blk = xesimd::lsc_load_2d<half, 16, 16, 2>(h, 127, 63, 127, 16, 8);
  esimd::simd<uint32_t, 16 * 8> bw =
      xesimd::lsc_load_2d<uint32_t, 16, 8, 1>(reinterpret_cast<const uint32_t *>(h), 63, 7, 63, 0, 0);
  esimd::simd<half, 128> b0 = blk.select<128, 1>(0);
  esimd::simd<uint16_t, 128> b0bits = b0.bit_cast_view<uint16_t>();
  xesimd::lsc_store_2d<uint16_t, 16, 8>(reinterpret_cast<uint16_t *>(y), 127, 7, 127, 0, 0, b0bits);
  esimd::simd<uint64_t, 16> offs64(0, 8);
  l += esimd::gather<float, 16>(x, offs64, m) + float(bw[3]);
  // shared local memory
  esimd::slm_block_store<float, 16>(0, a);
  esimd::barrier();
  esimd::simd<float, 16> sl = esimd::slm_block_load<float, 16>(64);
  // XMX
  esimd::simd<half, 8 * 16> A = esimd::block_load<half, 8 * 16>(h);
  esimd::simd<half, 16 * 16> B = esimd::block_load<half, 16 * 16>(h);
  esimd::simd<bf16, 4 * 16> Ab = esimd::block_load<bf16, 4 * 16>(g);
  esimd::simd<bf16, 16 * 16> Bb = esimd::block_load<bf16, 16 * 16>(g);
  esimd::simd<float, 8 * 16> C = esimd::block_load<float, 8 * 16>(x);
  esimd::simd<float, 8 * 16> D = xmx::dpas<8, 8, float>(C, B, A);
  esimd::simd<float, 4 * 16> E = xmx::dpas<8, 4, float>(Bb, Ab);
  esimd::block_store<float, 8 * 16>(y + 256, D);
  esimd::block_store<float, 4 * 16>(y + 512, E);
  esimd::block_store<float, 16>(y + 640, sl);
}
