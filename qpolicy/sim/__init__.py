"""A discrete-event model of one GPU shared by time slices, calibrated to a real H200.

It powers ``qpolicy sim``, ``qpolicy demo`` and fast tests of the control loop: the same engine and
slice scheduler that drive real hardware drive a simulated GPU here.
"""
