// esimd_select.hpp: what an ESIMD kernel includes. With FMLP_ESIMD_EMULATE defined the
// kernel compiles against the emulation (esimd_emu.hpp: any SYCL device, or host C++);
// without it, against Intel's ESIMD for the GPU. Either way the kernel names
// `esimd::...`, `xesimd::...` (the experimental 2-D block messages) and `xmx::...`, and
// declares itself with FMLP_ESIMD_KERNEL.
#pragma once

#ifdef FMLP_ESIMD_EMULATE
#include "esimd_emu.hpp" // namespaces fmlp_emu::esimd, fmlp_emu::esimd::xmx
namespace esimd = fmlp_emu::esimd;
namespace xesimd = fmlp_emu::esimd;
#else
#include <sycl/ext/intel/esimd.hpp>
#include <sycl/ext/intel/experimental/esimd/memory.hpp>
namespace esimd = sycl::ext::intel::esimd;
namespace xesimd = sycl::ext::intel::experimental::esimd;
#ifndef FMLP_ESIMD_KERNEL
#define FMLP_ESIMD_KERNEL [[intel::sycl_explicit_simd]]
#endif
#endif
namespace xmx = esimd::xmx;
