"""The driver version qgpu binds the in-kernel RM entry with, learnt from the driver's answer.

nvidia_get_rm_ops (kernel-open/nvidia/nv-modeset-interface.c, 580.142) answers a version it
does not have with NV_ERR_GENERIC and its own version in version_string; nvmock does the same
(kmod/nvmock/kapi.c). qgpu asks again with that version when it is of the 580 branch, and
refuses a driver of another branch in one log line. nvmock poses as another driver version
through its debugfs kapi_version.
"""

from __future__ import annotations

import pytest

from tests.vm.nvmock import DEBUGFS, kernel_log
from tests.vm.qgpu_env import SYSFS, module_loaded

NVMOCK_VERSION = "580.159.04"  # kmod/uapi/nvmock.h: NVMOCK_VERSION_STRING


@pytest.mark.parametrize("asked", ["", "580.1.1", "570.86.10"])
def test_rm_version_is_learnt_from_the_drivers_answer(asked: str) -> None:
    """nvidia_get_rm_ops answers a mismatch with its own version (nv-modeset-interface.c);
    qgpu asks again with it when it is of the 580 branch, whatever it first named."""
    since = len(kernel_log().splitlines())
    params = {"rm_version": asked} if asked else {}
    with module_loaded(**params):
        assert (SYSFS / "rm_version").read_text() == f"{NVMOCK_VERSION}\n"
        # The entry works: a GPU can be time-sliced.
        (SYSFS / "gpu1" / "policy").write_text("fixed-share\n")
        assert (SYSFS / "gpu1" / "policy").read_text() == "fixed-share\n"
    said = [line for line in kernel_log().splitlines()[since:] if "qgpu" in line]
    learnt = [line for line in said if f"is version {NVMOCK_VERSION}, not {asked}" in line]
    assert len(learnt) == (1 if asked else 0), said
    assert not [line for line in said if "time slicing is off" in line], said


@pytest.mark.parametrize("driver", ["580.65.06", "575.64.05"])
def test_a_driver_of_another_branch_is_refused_in_one_line(driver: str) -> None:
    since = len(kernel_log().splitlines())
    (DEBUGFS / "kapi_version").write_text(driver + "\n")
    try:
        with module_loaded():
            bound = (SYSFS / "rm_version").read_text()
            policy = SYSFS / "gpu0" / "policy"
            try:
                policy.write_text("fixed-share\n")
                sliced = True
            except OSError:
                sliced = False
    finally:
        (DEBUGFS / "kapi_version").write_text("\n")
    said = [line for line in kernel_log().splitlines()[since:] if "qgpu" in line]
    off = [line for line in said if "time slicing is off" in line]
    if driver.startswith("580."):
        assert (bound, sliced, off) == (f"{driver}\n", True, []), said
    else:
        assert (bound, sliced) == ("\n", False), said
        assert len(off) == 1 and driver in off[0] and "580" in off[0], said
