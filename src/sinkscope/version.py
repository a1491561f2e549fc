"""The package's version, importable without the package root (which exposes the API)."""

__version__ = "0.1.0"
