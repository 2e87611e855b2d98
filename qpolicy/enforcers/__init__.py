"""Enforcers apply a :class:`~qpolicy.engine.Plan` to a GPU and report what each pod used.

``sim`` drives the simulated GPU; ``rm`` (userspace driver controls) and ``kmod`` (the qgpu kernel
module) drive real ones. The daemon loop does not know which one it talks to.
"""
