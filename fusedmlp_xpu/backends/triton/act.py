"""Activations for the Triton kernels (narrow/, wide/): act(z) and d act / dz by the
registry's integer id (fusedmlp_xpu/activations.py), on fp32 tiles.

An id plus APPROX (chosen on the host, for NVIDIA CUDA devices only: common.act_id)
computes the tanh-based activations (gelu_tanh, tanh) with the GPU's one-instruction
tanh (PTX ``tanh.approx.f32``, absolute error about 5e-4) instead of a sigmoid (an
exponential and a division), and softplus's logarithm with PTX ``lg2.approx.f32``
instead of libdevice's logf (Triton's tl.log is a software routine). The id without it
is the portable form: Triton's interpreter and other vendors' backends have no PTX."""
import triton
import triton.language as tl

from . import common

#: added to an activation id: the PTX form (NVIDIA only)
APPROX = tl.constexpr(common.APPROX)


# Ids and constants as in activations.py (LEAKY_RELU_SLOPE 0.01, SOFTPLUS_THRESHOLD 20).
@triton.jit
def tanh(z):
    # tl has no tanh in every Triton we support. 2*sigmoid(2z)-1 cancels near 0 (absolute
    # error ~1e-7, so 1e-5 relative on a tanh output layer in fp32); instead (1-t)/(1+t),
    # t = exp(-2|z|), which has no cancellation for |z| >= 0.3, and below that the odd
    # Taylor series to z^9 (truncation < 6e-8 relative). NaN stays NaN in both branches.
    a = tl.abs(z)
    t = tl.exp(-2.0 * a)
    big = (1.0 - t) / (1.0 + t)
    big = tl.where(z < 0, -big, big)
    z2 = z * z
    small = z * (1.0 + z2 * (-0.3333333333333333 + z2 * (0.13333333333333333 + z2 * (
        -0.05396825396825397 + z2 * 0.021869488536155203))))
    return tl.where(a < 0.3, small, big)


@triton.jit
def tanh_approx(z):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [z],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def log1p_unit_approx(t):
    """log(1 + t) for t in [0, 1] (NaN passes): log2 by PTX lg2.approx.f32 (absolute
    error about 2^-22 on [1, 2]) times ln 2; below t = 2e-3, where rounding 1 + t would
    cost the small result its relative precision, the series t - t^2 / 2 (relative
    error < 1.4e-6)."""
    big = 0.6931471805599453 * tl.inline_asm_elementwise(
        "lg2.approx.f32 $0, $1;", "=f,f", [1.0 + t], dtype=tl.float32, is_pure=True, pack=1)
    return tl.where(t < 2e-3, t - 0.5 * t * t, big)


@triton.jit
def _gelu_u(z):
    # sqrt(2 / pi) (z + 0.044715 z^3), the tanh argument of gelu_tanh
    return z * (0.7978845608028654 + 0.035677408136300125 * z * z)


@triton.jit
def act(z, ACT: tl.constexpr):
    """act(z), z in fp32; ACT is the registry id (plus APPROX: see the module)."""
    if ACT == 4 + APPROX:
        h = 0.5 * z
        z = h + h * tanh_approx(_gelu_u(z))
    elif ACT == 7 + APPROX:
        z = tanh_approx(z)
    elif ACT == 8 + APPROX:
        # softplus(z) = max(z, 0) + log(1 + exp(-|z|)): no overflow, no threshold; NaN
        # passes through the logarithm, +-inf give inf / 0
        z = tl.where(z > 0, z, 0.0) + log1p_unit_approx(tl.exp(-tl.abs(z)))
    elif ACT == 1:
        # not tl.maximum: it drops NaN (relu(NaN) must be NaN, as in eager)
        z = tl.where(z < 0.0, 0.0, z)
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
        # the clamp keeps exp finite in the unused branch; where() and not tl.minimum, which
        # would turn NaN into 20
        z = tl.where(z > 20.0, z, tl.log(1.0 + tl.exp(tl.where(z > 20.0, 20.0, z))))
    return z


@triton.jit
def act_grad(z, ACT: tl.constexpr):
    """d act / dz at z (fp32)."""
    if ACT == 4 + APPROX:
        t = tanh_approx(_gelu_u(z))
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * (
            0.7978845608028654 + 0.10703222440890037 * z * z)
    elif ACT == 7 + APPROX:
        t = tanh_approx(z)
        d = 1.0 - t * t
    elif ACT == 0:
        d = tl.full(z.shape, 1.0, tl.float32)
    elif ACT == 1:
        # as torch's relu backward: the gradient passes unless z <= 0 (NaN passes it)
        d = tl.where(z <= 0, 0.0, 1.0)
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


@triton.jit
def times_act_grad(g, z, ACT: tl.constexpr):
    """g * act'(z) (fp32). relu and leaky relu select, as torch's backward does: a NaN in g
    stays where the unit is on instead of spreading through NaN * 0."""
    if ACT == 1:
        r = tl.where(z <= 0, 0.0, g)
    elif ACT == 2:
        r = tl.where(z > 0, g, 0.01 * g)
    else:
        r = g * act_grad(z, ACT)
    return r


@triton.jit
def act_grad2(z, ACT: tl.constexpr):
    """d^2 act / dz^2 at z (fp32; the plain ids only: zero for none, relu and leaky relu)."""
    if ACT == 3:
        d = 0.3989422804014327 * tl.exp(-0.5 * z * z) * (2.0 - z * z)
    elif ACT == 4:
        t = tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))
        di = 0.7978845608028654 * (1.0 + 0.134145 * z * z)
        d = (1.0 - t * t) * (di + 0.5 * z * (0.7978845608028654 * 0.26829 * z - 2.0 * t * di * di))
    elif ACT == 5:
        s = tl.sigmoid(z)
        d = s * (1.0 - s) * (2.0 + z * (1.0 - 2.0 * s))
    elif ACT == 6:
        s = tl.sigmoid(z)
        d = s * (1.0 - s) * (1.0 - 2.0 * s)
    elif ACT == 7:
        t = tanh(z)
        d = -2.0 * t * (1.0 - t * t)
    elif ACT == 8 or ACT == 8 + APPROX:
        s = tl.sigmoid(z)
        d = tl.where(z > 20.0, 0.0, s * (1.0 - s))
    else:
        d = tl.zeros(z.shape, tl.float32)
    return d
