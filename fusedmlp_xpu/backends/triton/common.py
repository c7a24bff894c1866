"""Small helpers the Triton backend's two families share (plain Python: importable
without Triton)."""
from __future__ import annotations

import torch

from ... import activations, envvars

#: Added to an activation id (act.py): the NVIDIA hardware form of its transcendental.
APPROX = 64

#: FUSEDMLP_APPROX_TANH=0 keeps the tanh-based activations in their portable form on
#: NVIDIA GPUs too (act.py: the hardware tanh is used for fp16 / bf16 operands otherwise)
APPROX_ENV = "FUSEDMLP_APPROX_TANH"

_ACT = {name: a.id for name, a in activations.ACTIVATIONS.items()}
_APPROX_TANH = ("gelu_tanh", "tanh")


def interpreting() -> bool:
    """Whether Triton runs its interpreter (TRITON_INTERPRET=1: CPU tensors, for tests)."""
    return envvars.get("TRITON_INTERPRET", "0") not in ("", "0")


def pow2(n: int) -> int:
    """n padded to a power of two, at least 16 (tl.dot's smallest tile)."""
    return max(16, 1 << (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def act_id(act: str, where, dtype: torch.dtype | None = None) -> int:
    """The ACT constexpr of ``act`` for a kernel on ``where`` (a device, or a tensor whose
    device and dtype count). On an NVIDIA GPU (compiled, not interpreted) the registry id
    plus APPROX:
    - softplus, any dtype: its logarithm through PTX ``lg2.approx.f32`` of 1 + exp(-|z|)
      in [1, 2] (absolute error about 2e-7, below fp32's rounding of most outputs)
      instead of libdevice's software logf (about 4x the instructions of a whole relu
      forward);
    - gelu_tanh and tanh with fp16 / bf16 operands (their outputs round to 8-11 bits
      anyway; fp32 keeps the exact form): the one-instruction tanh, unless
      FUSEDMLP_APPROX_TANH=0.
    The plain id everywhere else."""
    i = _ACT[act]
    if act != "softplus" and act not in _APPROX_TANH:
        return i
    if isinstance(where, torch.Tensor):
        where, dtype = where.device, where.dtype
    if where.type != "cuda" or torch.version.hip is not None or interpreting():
        return i
    if act == "softplus":
        return i + APPROX
    if dtype in (torch.float16, torch.bfloat16) and envvars.get(APPROX_ENV) != "0":
        return i + APPROX
    return i


def narrow_act_ids(spec, device_type: str) -> tuple[int, int]:
    """(ACT, OUT_ACT) of the narrow kernels: the exact activations (their tests hold them
    to the reference's tolerances), but softplus's logarithm in its PTX form on NVIDIA
    (act_id: any dtype, error far below the outputs' rounding)."""
    dev = torch.device(device_type)
    return tuple(act_id(a, dev) if a == "softplus" else _ACT[a]
                 for a in (spec.activation, spec.output_activation))
