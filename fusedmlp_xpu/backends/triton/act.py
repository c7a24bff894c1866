"""Activations for the Triton kernels (narrow.py, wide.py): act(z) and d act / dz by the
registry's integer id (fusedmlp_xpu/activations.py), on fp32 tiles."""
import triton
import triton.language as tl


# Ids and constants as in activations.py (LEAKY_RELU_SLOPE 0.01, SOFTPLUS_THRESHOLD 20).
@triton.jit
def tanh(z):
    # tl has no tanh in every Triton we support; 2*sigmoid(2z)-1 is exact in fp32 to ~1e-7
    return 2.0 * tl.sigmoid(2.0 * z) - 1.0


@triton.jit
def act(z, ACT: tl.constexpr):
    """act(z), z in fp32; ACT is the registry id."""
    if ACT == 1:
        z = tl.maximum(z, 0.0)
    elif ACT == 2:
        z = tl.where(z > 0, z, 0.01 * z)
    elif ACT == 3:
        z = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    elif ACT == 4:
        # 0.5 z (1 + tanh(u)) == z * sigmoid(2u): one transcendental instead of two
        u = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        z = z * tl.sigmoid(2.0 * u)
    elif ACT == 5:
        z = z * tl.sigmoid(z)
    elif ACT == 6:
        z = tl.sigmoid(z)
    elif ACT == 7:
        z = tanh(z)
    elif ACT == 8:
        z = tl.where(z > 20.0, z, tl.log(1.0 + tl.exp(tl.minimum(z, 20.0))))
    return z


@triton.jit
def act_grad(z, ACT: tl.constexpr):
    """d act / dz at z (fp32)."""
    if ACT == 0:
        d = tl.full(z.shape, 1.0, tl.float32)
    elif ACT == 1:
        d = tl.where(z > 0, 1.0, 0.0)
    elif ACT == 2:
        d = tl.where(z > 0, 1.0, 0.01)
    elif ACT == 3:
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        d = cdf + z * 0.3989422804014327 * tl.exp(-0.5 * z * z)
    elif ACT == 4:
        t = tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * z * z)
    elif ACT == 5:
        s = tl.sigmoid(z)
        d = s * (1.0 + z * (1.0 - s))
    elif ACT == 6:
        s = tl.sigmoid(z)
        d = s * (1.0 - s)
    elif ACT == 7:
        t = tanh(z)
        d = 1.0 - t * t
    else:
        d = tl.where(z > 20.0, 1.0, tl.sigmoid(z))
    return d
