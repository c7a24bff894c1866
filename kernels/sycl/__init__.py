"""Makes this directory the package ``fusedmlp_xpu.kernels.sycl`` (see setup.py), whose
data files are the kernel sources: a wheel carries them, and ``importlib.resources``
finds them in a wheel and an editable install alike."""
