/* fused_mlp_params.h: what the host shim hands the SYCL kernels, and their tile sizes.
 *
 * Plain C (no SYCL) so that the host shim (g++) and the kernel source (compiled at run
 * time by the SYCL runtime, or ahead of time by icpx) share one definition of the
 * argument layout. The whole network travels as ONE by-value kernel argument: a
 * struct of pointers and widths, so a single launch can walk every layer.
 */
#ifndef FUSED_MLP_PARAMS_H
#define FUSED_MLP_PARAMS_H

#include <stdint.h>

/* FmlpNet is a by-value kernel argument: OpenCL guarantees only 1024 bytes of kernel
 * arguments (CL_DEVICE_MAX_PARAMETER_SIZE), and 16 layers x 40 bytes + header fits. */
#define FMLP_MAX_LAYERS 16
/* The narrow regime: every width fits one local-memory row of the tile. Wider MLPs
 * belong to GEMM-per-layer kernels (triton), not to this fully fused one. */
#define FMLP_MAX_WIDTH 128

/* Tuning constants, in one place. Chosen by the local-memory budget, not measured on a
 * Max 1550 (none was reachable): forward and row-backward keep two fp32 tiles of
 * FMLP_TILE_ROWS x FMLP_MAX_WIDTH in local memory = 2 * 32 * 128 * 4 B = 32 KiB, half
 * of the 64 KiB a work-group may use on most Intel GPUs, leaving room for a second
 * work-group per Xe-core. */
#define FMLP_TILE_ROWS 32
#define FMLP_WG_SIZE 128
/* Forward register blocking: rows per work unit (divides FMLP_TILE_ROWS); each weight
 * load feeds this many rows. 4 vs 1 halved the forward time on opencl:cpu (see
 * fused_mlp.cpp); 8 was no faster there and leaves fewer units per work-group. */
#define FMLP_ROW_BLOCK 4
/* Weight gradients: a 16 x 16 output tile per work-group, rows streamed 16 at a time. */
#define FMLP_WGRAD_TILE 16

/* dtype codes shared with fusedmlp_xpu/backends/sycl.py */
#define FMLP_F32 0
#define FMLP_F16 1
#define FMLP_BF16 2

/* Named structs: the SYCL compiler forward-declares kernel argument types, which an
 * anonymous typedef'd struct does not allow. */
typedef struct FmlpLayer {
  const void *w; /* forward: W^T [in, out]; backward: W [out, in]; row-major, contiguous.
                    Either way consecutive work-items read consecutive addresses. */
  const void *b; /* [out], or NULL when the MLP has no bias */
  void *z;       /* [n, out] pre-activation: written by forward (NULL: not saved),
                    read by backward (NULL where the activation after it is none) */
  void *dz;      /* [n, out] dL/dz, written by the row backward (NULL: not needed) */
  int32_t in, out;
} FmlpLayer;

typedef struct FmlpNet {
  int64_t n_rows;
  /* forward: x [n, in_0]; backward: grad_y [n, out_{L-1}]; any strides (elements) */
  const void *src;
  int64_t src_rs, src_cs;
  /* forward: y [n, out_{L-1}]; backward: grad_x [n, in_0] or NULL; contiguous */
  void *dst;
  int32_t n_layers, act, out_act, pad_;
  FmlpLayer layer[FMLP_MAX_LAYERS];
} FmlpNet;

#endif
