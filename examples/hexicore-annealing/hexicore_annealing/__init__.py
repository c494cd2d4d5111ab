"""hexicore-annealing: an example third-party solver plugin for hexicore (docs/plugins.md)."""

__version__ = "0.1.0"
