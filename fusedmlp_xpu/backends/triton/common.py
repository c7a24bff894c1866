"""Small helpers the Triton backend's two families share (plain Python: importable
without Triton)."""
from __future__ import annotations

from ... import envvars


def interpreting() -> bool:
    """Whether Triton runs its interpreter (TRITON_INTERPRET=1: CPU tensors, for tests)."""
    return envvars.get("TRITON_INTERPRET", "0") not in ("", "0")


def pow2(n: int) -> int:
    """n padded to a power of two, at least 16 (tl.dot's smallest tile)."""
    return max(16, 1 << (n - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
