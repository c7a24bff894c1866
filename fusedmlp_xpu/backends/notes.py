"""The one line a first call prints when it compiles kernels, for every backend that
compiles at run time (Triton's launches, the cuda backend's NVRTC builds)."""
from __future__ import annotations

import logging
import sys

from .. import envvars

#: FUSEDMLP_QUIET=1: no line on stderr when a first call compiles kernels (the logger
#: "fusedmlp_xpu" still gets it at INFO)
QUIET_ENV = "FUSEDMLP_QUIET"
LOG = logging.getLogger("fusedmlp_xpu")
_told = []  # whether stderr has had its one line this process


def note_compile(name: str, seconds: float) -> None:
    """Say that a first call compiled ``name``: once a process on stderr (unless
    FUSEDMLP_QUIET=1 or logging is configured, then only to the logger), every time to the
    "fusedmlp_xpu" logger at INFO."""
    msg = (f"fusedmlp_xpu: compiled {name} in {seconds:.1f} s: the first call of a new shape "
           f"compiles its kernels, later calls reuse them (fusedmlp_xpu.warmup compiles "
           f"ahead; {QUIET_ENV}=1 silences this line)")
    LOG.info(msg)
    if _told or envvars.get(QUIET_ENV) == "1" or LOG.hasHandlers():
        return
    _told.append(True)
    print(msg, file=sys.stderr, flush=True)
