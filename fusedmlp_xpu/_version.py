"""The package version, written here only: pyproject.toml reads it (``dynamic``), and it
is its own module so that a backend can read it without importing the package face above
it."""
__version__ = "0.1.0"
