/* fused_mlp_esimd.h: the ESIMD kernels' arguments and limits, shared by the kernel source
 * (fused_mlp_esimd.cpp) and the host (fusedmlp_xpu/backends/sycl_esimd.py mirrors these
 * structs with ctypes). Plain C. */
#ifndef FUSED_MLP_ESIMD_H
#define FUSED_MLP_ESIMD_H
#include <stdint.h>

#define FMLP_ESIMD_WG 16                 /* threads (work-items) a work-group */
#define FMLP_ESIMD_MAX_WIDTH 128         /* bias stride per layer in the packed biases */

typedef struct FmlpEsimdArgs {
  const void *src;   /* x (forward) or dL/dy (backward): [n, src width], strides below */
  int64_t src_rs, src_cs;
  void *dst;         /* y (forward) or dL/dx (backward, may be NULL): contiguous */
  const void *wpack; /* every layer's weights as dpas B tiles (see fused_mlp_esimd.cpp) */
  const void *bias;  /* [n_layers][FMLP_ESIMD_MAX_WIDTH] biases (zeros: none) */
  void *z;           /* saved pre-activations [n, z_rs], layer l at column l * hid_w; NULL */
  void *dz;          /* backward: dL/dz of every layer, same layout as z; NULL */
  int64_t z_rs, dz_rs, n_rows;
  int32_t wpack_words, n_layers, in_w, hid_w, out_w, act, out_act, pad_;
} FmlpEsimdArgs;

typedef struct FmlpEsimdWgradArgs {
  const void *dz;    /* dL/dz of every layer [n, dz_rs], layer l at column l * hid_w */
  const void *z;     /* saved pre-activations [n, z_rs], layer l at column l * hid_w */
  const void *x;     /* the input [n, in_w], strides x_rs, x_cs */
  void *gw;          /* fp32 partial sums [n_layers][chunks][out_pad][in_pad] */
  void *gb;          /* fp32 partial sums [n_layers][chunks][out_pad][16], or NULL */
  int64_t dz_rs, z_rs, x_rs, x_cs, n_rows, rows_per_chunk;
  int32_t chunks, n_layers, in_w, hid_w, out_w, out_pad, in_pad, pad_;
} FmlpEsimdWgradArgs;

#endif
