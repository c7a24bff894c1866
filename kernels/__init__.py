"""The kernel sources (cuda/, sycl/) as package data of ``fusedmlp_xpu.kernels``: setup.py
maps this directory into the package, so a wheel carries the sources and an editable
install finds them here. Read them through ``fusedmlp_xpu.backends.kernel_files``."""
