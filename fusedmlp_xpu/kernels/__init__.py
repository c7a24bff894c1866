"""The kernel sources, shipped as package data. Each subpackage is one directory of the
repository's top-level ``kernels/`` (``fusedmlp_xpu.kernels.cuda`` is ``kernels/cuda``;
setup.py maps them), so a wheel carries the sources and an editable install reads the
checkout's files. Find them with ``fusedmlp_xpu.backends.kernel_files.kernel_dir``."""
