"""Constants of the simulated GPU, fitted to the H200 measurements in docs/gpu-measurements.md.

Each value says which measurement pins it down; ``tests/unit/test_sim_calibration.py`` re-derives
the measurements from the model so a change here that breaks the fit fails there.
"""

# Hardware default TSG timeslice on Volta+ (kfifoChannelGroupGetDefaultTimeslice_GV100: 128 << 3).
HW_TIMESLICE_US = 1024.0

# libcuda sets every TSG it creates to 2048 µs with NVA06C_CTRL_CMD_SET_TIMESLICE (findings §1), so
# that is what competing CUDA processes actually run with.
CUDA_TIMESLICE_US = 2048.0

# Cost of loading another context on the GPU (save + restore). Three measurements agree on ~150 µs:
# two 1.4 ms-kernel processes keep 93 % of solo (2048 / (2048 + 150) = 93.2 %); an online request
# behind an offline context with a 128 µs timeslice waits 0.21 ms more at p50 (64 + 150 µs); and two
# 30 µs-kernel processes keep 65 % (see HOST_SYNC_GAP_US).
CONTEXT_SWITCH_US = 150.0

# One FIFO_DISABLE_CHANNELS / enable control from userspace: two per switch took p50 1.1-1.3 ms
# (findings §2), so ~0.6 ms each from the call to its effect.
CHANNEL_CONTROL_US = 600.0

# Host time between a synchronising process seeing its last kernel finish and its next batch
# reaching the GPU. With 30 µs kernels and a sync every 8, two processes alternate batches with a
# switch each: (240 + 15) / (240 + 150) = 65 % of solo, as measured.
HOST_SYNC_GAP_US = 15.0

# An online request's host-side overhead before the GPU sees its work (receive, launch, doorbell).
# A 4096 matmul (~0.2 ms kernel) measured 0.29 ms p50 and 0.37 ms p99 alone, from the request to
# its synchronisation: 0.075 ms fixed plus an exponential tail of mean 0.02 ms gives 0.089 /
# 0.167 ms of overhead on top of the kernel.
REQUEST_LAUNCH_US = 75.0
REQUEST_LAUNCH_JITTER_MEAN_US = 20.0
