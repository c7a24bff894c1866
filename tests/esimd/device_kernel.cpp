// A test kernel for the ESIMD emulation on a SYCL device (tests/test_esimd_emu.py):
// one ESIMD thread per work-item, up to 64 to a work-group (the local size L is the
// launch's). Each thread
//  - passes a row of 64 floats to its neighbour through SLM (slm_init, slm_block_store,
//    barrier, slm_block_load): rows[t] = x[group * L + (lid + 1) % L];
//  - reads 16 floats of SLM nobody wrote (poison: NaN): unwritten[t];
//  - computes one 8 x 16 dpas tile: d[t] = c[t] + a[t] . B (B shared, VNNI-packed).
// emu_convert: each work-item converts 16 floats to half and bfloat16 (the device's own
// conversions, which the emulation uses there) and 16 halves back to float, and adds and
// multiplies 16 pairs of halves.
#include <sycl/sycl.hpp>

#include "esimd_select.hpp"

namespace {
constexpr uint32_t kRow = 64;                      // floats a thread passes on
constexpr uint32_t kThreads = 64;                  // the most threads of a work-group
constexpr uint32_t kSlmRows = kThreads * kRow * 4; // bytes of the passed rows
constexpr uint32_t kSlmBytes = kSlmRows + 16 * 4;  // and 16 floats left unwritten

template <class T>
void slm_and_dpas(const float *x, const T *a, const T *b, const float *c, float *rows,
                  float *unwritten, float *d) {
  esimd::slm_init<kSlmBytes>();
  auto it = sycl::ext::oneapi::this_work_item::get_nd_item<1>();
  const uint32_t lid = static_cast<uint32_t>(it.get_local_id(0));
  const uint32_t t = static_cast<uint32_t>(it.get_global_id(0));
  const uint32_t threads = static_cast<uint32_t>(it.get_local_range(0));

  esimd::simd<float, kRow> row = esimd::block_load<float, kRow>(x + t * kRow);
  esimd::slm_block_store<float, kRow>(lid * kRow * 4, row);
  esimd::barrier();
  esimd::simd<float, kRow> next =
      esimd::slm_block_load<float, kRow>((lid + 1) % threads * kRow * 4);
  esimd::block_store<float, kRow>(rows + t * kRow, next);
  esimd::block_store<float, 16>(unwritten + t * 16, esimd::slm_block_load<float, 16>(kSlmRows));

  esimd::simd<T, 8 * 16> A = esimd::block_load<T, 8 * 16>(a + t * 8 * 16);
  esimd::simd<T, 16 * 16> B = esimd::block_load<T, 16 * 16>(b);
  esimd::simd<float, 8 * 16> C = esimd::block_load<float, 8 * 16>(c + t * 8 * 16);
  esimd::simd<float, 8 * 16> D = xmx::dpas<8, 8, float>(C, B, A);
  esimd::block_store<float, 8 * 16>(d + t * 8 * 16, D);
}
} // namespace

#define EMU_TEST_KERNEL(NAME, T)                                                                   \
  extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY(                                                    \
      (sycl::ext::oneapi::experimental::nd_range_kernel<1>)) FMLP_ESIMD_KERNEL void                \
  NAME(const float *x, const T *a, const T *b, const float *c, float *rows, float *unwritten,      \
       float *d) {                                                                                 \
    slm_and_dpas<T>(x, a, b, c, rows, unwritten, d);                                               \
  }
EMU_TEST_KERNEL(emu_slm_dpas_f16, sycl::half)
EMU_TEST_KERNEL(emu_slm_dpas_bf16, sycl::ext::oneapi::bfloat16)

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((sycl::ext::oneapi::experimental::nd_range_kernel<1>))
    FMLP_ESIMD_KERNEL
    void emu_convert(const float *f, sycl::half *h, sycl::ext::oneapi::bfloat16 *b,
                     const sycl::half *hx, const sycl::half *hy, float *hf, sycl::half *hsum,
                     sycl::half *hprod) {
  const uint32_t o =
      static_cast<uint32_t>(sycl::ext::oneapi::this_work_item::get_nd_item<1>().get_global_id(0)) *
      16;
  esimd::simd<float, 16> x = esimd::block_load<float, 16>(f + o);
  esimd::block_store<sycl::half, 16>(h + o, x);
  esimd::block_store<sycl::ext::oneapi::bfloat16, 16>(b + o, x);
  esimd::simd<sycl::half, 16> u = esimd::block_load<sycl::half, 16>(hx + o);
  esimd::simd<sycl::half, 16> v = esimd::block_load<sycl::half, 16>(hy + o);
  esimd::block_store<float, 16>(hf + o, u);
  esimd::block_store<sycl::half, 16>(hsum + o, u + v);
  esimd::block_store<sycl::half, 16>(hprod + o, u * v);
}
