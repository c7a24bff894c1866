// fmlp_sycl_shim.cpp: the thin host side of the SYCL kernels, behind a C ABI for ctypes.
//
// Built on first use by fusedmlp_xpu/backends/sycl.py with the system g++ against the
// SYCL headers of the pip-installed intel-sycl-rt wheel, linked with -lsycl. It holds no
// kernels itself: fmlp_sycl_compile hands kernels/sycl/fused_mlp.cpp to the runtime's
// kernel compiler once per (context, device) and keeps the executable bundle for the
// life of the process (the compile costs seconds; a launch must not).
//
// Every entry point takes a sycl::queue* that belongs to the caller (PyTorch's current
// XPU queue, or a dpctl queue) and submits to it; it never creates a queue, never
// allocates, and never waits unless the queue is out of order (then each launch must
// finish before the next one reads its output). Pointers must be USM on that queue.
// Return value: 0 on success, -1 on error with fmlp_sycl_last_error() saying why.
//
// Ahead-of-time build (icpx, see README.md): define FMLP_SYCL_AOT and the kernels are
// compiled into this library instead; that path has not been compiled here.
#ifndef SYCL_DISABLE_FSYCL_SYCLHPP_WARNING
#define SYCL_DISABLE_FSYCL_SYCLHPP_WARNING 1 // g++ builds host code only, by design
#endif
#include <sycl/sycl.hpp>
#include <sycl/ext/oneapi/experimental/raw_kernel_arg.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fused_mlp_params.h"

#ifdef FMLP_SYCL_AOT
#include "fused_mlp.cpp"
#endif

namespace syclexp = sycl::ext::oneapi::experimental;

namespace {

thread_local std::string g_error;

struct Compiled {
  sycl::context ctx;
  sycl::device dev;
  std::map<std::string, sycl::kernel> kernels;
};

std::mutex g_mutex;
// One entry per (context, device). Deliberately never destroyed: at process exit the
// SYCL runtime tears itself down first, and releasing kernels after that crashes.
auto &g_compiled = *new std::vector<std::unique_ptr<Compiled>>();

Compiled *find_compiled(const sycl::queue &q) {
  for (auto &c : g_compiled)
    if (c->ctx == q.get_context() && c->dev == q.get_device())
      return c.get();
  return nullptr;
}

const char *dtype_suffix(int dtype) {
  switch (dtype) {
  case FMLP_F32: return "f32";
  case FMLP_F16: return "f16";
  case FMLP_BF16: return "bf16";
  default: throw std::runtime_error("unknown dtype code " + std::to_string(dtype));
  }
}

sycl::kernel get_kernel(sycl::queue &q, const std::string &base, int dtype) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Compiled *c = find_compiled(q);
  if (!c)
    throw std::runtime_error("kernels not compiled for this queue's device: call fmlp_sycl_compile first");
  std::string name = base + "_" + dtype_suffix(dtype);
  auto it = c->kernels.find(name);
  if (it == c->kernels.end())
    throw std::runtime_error("kernel " + name + " not found in the compiled bundle");
  return it->second;
}

template <class F> int guarded(F &&f) {
  try {
    f();
    return 0;
  } catch (const sycl::exception &e) {
    g_error = std::string("SYCL error: ") + e.what();
  } catch (const std::exception &e) {
    g_error = e.what();
  } catch (...) {
    g_error = "unknown C++ exception";
  }
  return -1;
}

void finish(sycl::queue &q, sycl::event e) {
  if (!q.is_in_order())
    e.wait_and_throw();
}

int64_t row_groups(int64_t n) { return (n + FMLP_TILE_ROWS - 1) / FMLP_TILE_ROWS; }

// src: the rows the kernel reads (x forward, grad_y backward) with strides; dst: what it writes.
FmlpNet make_net(int64_t n, int n_layers, const int32_t *widths, const void *const *w,
                 const void *const *b, int act, int out_act, const void *src, int64_t src_rs,
                 int64_t src_cs, void *dst) {
  if (n_layers < 1 || n_layers > FMLP_MAX_LAYERS)
    throw std::runtime_error("n_layers " + std::to_string(n_layers) + " outside [1, " +
                             std::to_string(FMLP_MAX_LAYERS) + "]");
  FmlpNet net{};
  net.n_rows = n;
  net.n_layers = n_layers;
  net.act = act;
  net.out_act = out_act;
  net.src = src;
  net.src_rs = src_rs;
  net.src_cs = src_cs;
  net.dst = dst;
  for (int l = 0; l < n_layers; ++l) {
    if (widths[l] < 1 || widths[l] > FMLP_MAX_WIDTH || widths[l + 1] < 1 || widths[l + 1] > FMLP_MAX_WIDTH)
      throw std::runtime_error("width outside [1, " + std::to_string(FMLP_MAX_WIDTH) + "]");
    net.layer[l].w = w[l];
    net.layer[l].b = b ? b[l] : nullptr;
    net.layer[l].in = widths[l];
    net.layer[l].out = widths[l + 1];
  }
  return net;
}

// A row kernel (forward, row backward) over net.n_rows rows, one work-group per
// FMLP_TILE_ROWS of them; no launch for no rows.
void launch_rows(sycl::queue &q, const char *name, int dtype, const FmlpNet &net) {
  if (net.n_rows == 0)
    return;
  sycl::kernel k = get_kernel(q, name, dtype);
  finish(q, q.submit([&](sycl::handler &h) {
    h.set_args(net);
    h.parallel_for(sycl::nd_range<1>(sycl::range<1>(row_groups(net.n_rows) * FMLP_WG_SIZE),
                                     sycl::range<1>(FMLP_WG_SIZE)),
                   k);
  }));
}

} // namespace

extern "C" {

const char *fmlp_sycl_last_error(void) { return g_error.c_str(); }

int fmlp_sycl_abi_version(void) { return 3; }

// Compile `source` (with `header` available as "fused_mlp_params.h") for the queue's
// device, once per process; later calls for the same device return at once.
int fmlp_sycl_compile(void *queue, const char *source, const char *header, const char *options) {
  return guarded([&] {
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (find_compiled(q))
      return;
    auto c = std::make_unique<Compiled>(Compiled{q.get_context(), q.get_device(), {}});
#ifdef FMLP_SYCL_AOT
    // Not compiled here (no icpx): kernels built into this library, found by function.
    (void)source, (void)header, (void)options;
    auto exe = sycl::get_kernel_bundle<sycl::bundle_state::executable>(q.get_context(), {q.get_device()});
#define FMLP_AOT_KERNEL(fn) c->kernels.emplace(#fn, exe.get_kernel(syclexp::get_kernel_id<fn>()))
    FMLP_AOT_KERNEL(fmlp_fwd_f32); FMLP_AOT_KERNEL(fmlp_fwd_f16); FMLP_AOT_KERNEL(fmlp_fwd_bf16);
    FMLP_AOT_KERNEL(fmlp_bwd_rows_f32); FMLP_AOT_KERNEL(fmlp_bwd_rows_f16); FMLP_AOT_KERNEL(fmlp_bwd_rows_bf16);
    FMLP_AOT_KERNEL(fmlp_wgrad_f32); FMLP_AOT_KERNEL(fmlp_wgrad_f16); FMLP_AOT_KERNEL(fmlp_wgrad_bf16);
#undef FMLP_AOT_KERNEL
#else
    if (!q.get_device().ext_oneapi_can_compile(syclexp::source_language::sycl))
      throw std::runtime_error("device '" + q.get_device().get_info<sycl::info::device::name>() +
                               "' cannot compile SYCL source at run time (kernel_compiler)");
    syclexp::include_files includes{"fused_mlp_params.h", std::string(header)};
    std::vector<std::string> opts;
    if (options && *options)
      opts.emplace_back(options);
    auto src = syclexp::create_kernel_bundle_from_source(
        q.get_context(), syclexp::source_language::sycl, std::string(source),
        syclexp::properties{includes});
    std::string log;
    auto exe = [&] {
      try {
        return syclexp::build(src, syclexp::properties{syclexp::build_options{opts}, syclexp::save_log{&log}});
      } catch (const sycl::exception &e) {
        throw std::runtime_error(std::string("compiling kernels/sycl/fused_mlp.cpp failed: ") + e.what() +
                                 "\n" + log);
      }
    }();
    for (const char *base : {"fmlp_fwd", "fmlp_bwd_rows", "fmlp_wgrad"})
      for (int dt : {FMLP_F32, FMLP_F16, FMLP_BF16}) {
        std::string name = std::string(base) + "_" + dtype_suffix(dt);
        c->kernels.emplace(name, exe.ext_oneapi_get_kernel(name));
      }
#endif
    g_compiled.push_back(std::move(c));
  });
}

// y = out_act(W_L . act(... act(W_1 . x + b_1) ...) + b_L)
// x: [n, widths[0]] with strides (x_rs, x_cs); w[l]: W_l^T, [widths[l], widths[l+1]] contiguous;
// b: NULL or n_layers pointers to [widths[l+1]]; y: [n, widths[L]] contiguous;
// z: NULL, or n_layers pointers to [n, widths[l+1]] pre-activations to save (each may be NULL).
int fmlp_sycl_forward(void *queue, int dtype, int64_t n, int n_layers, const int32_t *widths,
                      const void *x, int64_t x_rs, int64_t x_cs, const void *const *w,
                      const void *const *b, int act, int out_act, void *y, void *const *z) {
  return guarded([&] {
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    FmlpNet net = make_net(n, n_layers, widths, w, b, act, out_act, x, x_rs, x_cs, y);
    for (int l = 0; z && l < n_layers; ++l)
      net.layer[l].z = z[l];
    launch_rows(q, "fmlp_fwd", dtype, net);
  });
}

// Row backward: dz[l] = dL/dz_l for every layer (where dz && dz[l]), gx = dL/dx (if not NULL).
// gy: [n, widths[L]] with strides (gy_rs, gy_cs); z[l]: the saved pre-activations
// (z[L-1] needed only when out_act != 0).
int fmlp_sycl_backward_rows(void *queue, int dtype, int64_t n, int n_layers, const int32_t *widths,
                            const void *gy, int64_t gy_rs, int64_t gy_cs, const void *const *w,
                            void *const *z, int act, int out_act, void *gx, void *const *dz) {
  return guarded([&] {
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    FmlpNet net = make_net(n, n_layers, widths, w, nullptr, act, out_act, gy, gy_rs, gy_cs, gx);
    for (int l = 0; l < n_layers; ++l) {
      net.layer[l].z = z ? z[l] : nullptr;
      net.layer[l].dz = dz ? dz[l] : nullptr;
    }
    launch_rows(q, "fmlp_bwd_rows", dtype, net);
  });
}

// One layer's weight/bias gradients: gw[o, k] = sum_r dz[r, o] * act(src[r, k]),
// gb[o] = sum_r dz[r, o]. dz: [n, out] contiguous; src: [n, in] with strides; gw: [out, in]
// or NULL; gb: [out] or NULL. With n == 0 it writes zeros (the sum over no rows).
int fmlp_sycl_weight_grads(void *queue, int dtype, int64_t n, int out, int in, const void *dz,
                           const void *src, int64_t src_rs, int64_t src_cs, int src_act, void *gw,
                           void *gb) {
  return guarded([&] {
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    if (!gw && !gb)
      return;
    sycl::kernel k = get_kernel(q, "fmlp_wgrad", dtype);
    const int64_t t = FMLP_WGRAD_TILE;
    const int64_t cols = in + (gb ? 1 : 0);
    sycl::nd_range<2> range(sycl::range<2>((out + t - 1) / t * t, (cols + t - 1) / t * t),
                            sycl::range<2>(t, t));
    const int32_t out32 = out, in32 = in, act32 = src_act;
    finish(q, q.submit([&](sycl::handler &h) {
      h.set_args(dz, n, out32, src, src_rs, src_cs, act32, in32, gw, gb);
      h.parallel_for(range, k);
    }));
  });
}

} // extern "C"

// ---- generic bundles: any kernel source (or SPIR-V), any free-function kernel ----------
// The ESIMD kernels (fused_mlp_esimd.cpp, one bundle per kernel configuration) and the
// tests use these; the portable kernels keep the entry points below.
namespace {
struct Bundle {
  sycl::context ctx;
  sycl::device dev;
  std::map<std::string, sycl::kernel> kernels;
};
auto &g_bundles = *new std::vector<std::unique_ptr<Bundle>>(); // never destroyed, as g_compiled
} // namespace

extern "C" {

// Build `source` for the queue's device and return a handle to its kernels `names`
// (newline-separated). language 0: SYCL source (`n_inc` include files by name and text,
// `options` the compiler's flags, newline-separated); 1: SPIR-V bytes (source_len of
// them; options passed to the device compiler). Every call builds: the caller caches.
int fmlp_sycl_build(void *queue, int language, const char *source, int64_t source_len, int n_inc,
                    const char *const *inc_names, const char *const *inc_srcs, const char *options,
                    const char *names, int64_t *handle) {
  return guarded([&] {
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    auto split = [](const char *s) {
      std::vector<std::string> out;
      std::string cur;
      for (const char *p = s ? s : ""; *p; ++p) {
        if (*p == '\n') {
          if (!cur.empty()) out.push_back(cur);
          cur.clear();
        } else {
          cur += *p;
        }
      }
      if (!cur.empty()) out.push_back(cur);
      return out;
    };
    std::vector<std::string> opts = split(options), kernel_names = split(names);
    std::string log;
    sycl::kernel_bundle<sycl::bundle_state::executable> exe = [&] {
      try {
        if (language == 1) {
          const auto *b = reinterpret_cast<const std::byte *>(source);
          std::vector<std::byte> bytes(b, b + source_len);
          auto src = syclexp::create_kernel_bundle_from_source(q.get_context(), syclexp::source_language::spirv, bytes);
          return syclexp::build(src, syclexp::properties{syclexp::build_options{opts}, syclexp::save_log{&log}});
        }
        if (!q.get_device().ext_oneapi_can_compile(syclexp::source_language::sycl))
          throw std::runtime_error("device '" + q.get_device().get_info<sycl::info::device::name>() +
                                   "' cannot compile SYCL source at run time (kernel_compiler)");
        syclexp::include_files includes;
        for (int i = 0; i < n_inc; ++i)
          includes.add(inc_names[i], inc_srcs[i]);
        auto src = syclexp::create_kernel_bundle_from_source(
            q.get_context(), syclexp::source_language::sycl, std::string(source), syclexp::properties{includes});
        return syclexp::build(src, syclexp::properties{syclexp::build_options{opts}, syclexp::save_log{&log}});
      } catch (const sycl::exception &e) {
        throw std::runtime_error(std::string("build failed: ") + e.what() + "\n" + log);
      }
    }();
    auto bundle = std::make_unique<Bundle>(Bundle{q.get_context(), q.get_device(), {}});
    for (const auto &n : kernel_names) {
      // SPIR-V names a free-function kernel by its entry point, __sycl_kernel_<name>
      std::string found = exe.ext_oneapi_has_kernel(n) ? n : "__sycl_kernel_" + n;
      if (!exe.ext_oneapi_has_kernel(found))
        throw std::runtime_error("kernel " + n + " not in the built bundle");
      bundle->kernels.emplace(n, exe.ext_oneapi_get_kernel(found));
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    g_bundles.push_back(std::move(bundle));
    *handle = static_cast<int64_t>(g_bundles.size() - 1);
  });
}

// Launch kernel `name` of bundle `handle` over nd_range(global, local) with n_args
// arguments in the kernel's order, each given as its bytes (arg_ptrs[i], arg_sizes[i]);
// arg_sizes[i] == -1: arg_ptrs[i] points at a USM pointer.
int fmlp_sycl_launch(void *queue, int64_t handle, const char *name, int64_t global, int64_t local,
                     int n_args, const void *const *arg_ptrs, const int64_t *arg_sizes) {
  return guarded([&] {
    sycl::queue &q = *static_cast<sycl::queue *>(queue);
    sycl::kernel k = [&] {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (handle < 0 || handle >= static_cast<int64_t>(g_bundles.size()))
        throw std::runtime_error("bundle handle " + std::to_string(handle) + " unknown");
      Bundle &b = *g_bundles[handle];
      if (b.ctx != q.get_context() || b.dev != q.get_device())
        throw std::runtime_error("bundle was built for another device or context than the queue's");
      auto it = b.kernels.find(name);
      if (it == b.kernels.end())
        throw std::runtime_error(std::string("kernel ") + name + " not in bundle");
      return it->second;
    }();
    if (global <= 0)
      return;
    finish(q, q.submit([&](sycl::handler &h) {
      for (int i = 0; i < n_args; ++i) {
        if (arg_sizes[i] < 0) // a USM pointer: the backend must know it is one (OpenCL does)
          h.set_arg(i, *static_cast<void *const *>(arg_ptrs[i]));
        else
          h.set_arg(i, syclexp::raw_kernel_arg(arg_ptrs[i], static_cast<size_t>(arg_sizes[i])));
      }
      h.parallel_for(sycl::nd_range<1>(sycl::range<1>(global), sycl::range<1>(local)), k);
    }));
  });
}

} // extern "C"
