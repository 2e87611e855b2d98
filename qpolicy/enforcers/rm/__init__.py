"""The rm enforcer: pods' GPU channels gated from userspace through RM controls.

One concept per module, top to bottom: :mod:`~.enforcer` (the Enforcer the control loop drives),
:mod:`~.control` (the controls), :mod:`~.sensor` (GPU time and activity), :mod:`~.resolver` (pods
to channel groups on one GPU), :mod:`~.files` (borrowed descriptors), :mod:`~.record` (what must be
undone after a crash), :mod:`~.guard` (the process that undoes it as a killed daemon exits),
:mod:`~.handles` (what a restarted daemon adopts).
"""
