"""The kmod enforcer: qgpu.ko runs the periods in the kernel; this side configures and reads it.

Top to bottom: :mod:`~.enforcer` (the reconciler the daemon drives), :mod:`~.client` (the ``qgpu``
generic netlink family's commands), :mod:`~.transport` (the socket), :mod:`~.sysfs` (what anyone
may read), :mod:`~.uapi` (the mirror of kmod/uapi/qgpu.h), :mod:`~.error`.
"""
