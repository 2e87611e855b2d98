"""qpolicy: share one NVIDIA GPU between containers by time slices."""

__version__ = "0.1.0"
