"""The package's version, written once: pyproject.toml reads it (setuptools' dynamic
``attr``, parsed without importing the package) and ``torch_metallib.__version__`` is it."""

__version__ = "0.1.0"
