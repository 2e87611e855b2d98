"""Cgroups opened by their ids on a real cgroup v2 mount (the VM's kernel): the daemon finds the
path of a cgroup id it has not seen (a GPU process in a new cgroup) without walking the
hierarchy, and a removed cgroup's id answers None. tests/unit/test_telemetry_cgroups.py holds
the map's choices against a stand-in; only a kernel answers file handles."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpolicy.runtime import fhandle
from qpolicy.telemetry.cgroups import CgroupMap, CgroupsById, cgroup_of_process
from tests.vm.qgpu_env import CGROUP_ROOT, cgroup_tree


@pytest.fixture
def slice_() -> Iterator[Path]:
    with cgroup_tree("qpolicy-ids") as path:
        yield path


def test_a_cgroups_file_handle_is_its_id(slice_: Path) -> None:
    """fs/kernfs/mount.c: kernfs_encode_fh writes the node's id, of type FILEID_KERNFS; the id
    is the directory's inode number, the id the probe and qgpu.ko key cgroups by."""
    kind, handle = fhandle.handle_of(str(slice_))
    assert kind == fhandle.FILEID_KERNFS
    assert handle == fhandle.kernfs_handle(os.stat(slice_).st_ino)


def test_new_cgroups_are_found_by_id_and_removed_ones_are_none_without_a_walk(
    slice_: Path,
) -> None:
    rel = "/" + slice_.name
    jobs = [slice_ / "pod" / f"job-{index}" for index in range(40)]
    for job in jobs:
        job.mkdir(parents=True)
    cgroups = CgroupMap(CGROUP_ROOT)
    try:
        assert cgroups.by_id
        for index, job in enumerate(jobs):
            assert cgroups.path_of(os.stat(job).st_ino) == f"{rel}/pod/job-{index}"
        # A process in a cgroup made after the map was: its id from /proc, its path by id.
        late = slice_ / "pod" / "late"
        late.mkdir()
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            (late / "cgroup.procs").write_text(str(sleeper.pid))
            cgid = cgroup_of_process(sleeper.pid, CGROUP_ROOT)
            assert cgid is not None and cgroups.path_of(cgid) == f"{rel}/pod/late"
        finally:
            sleeper.kill()
            sleeper.wait()
        # Removed before anyone asked: gone at once, as a walk would have found.
        gone = slice_ / "pod" / "gone"
        gone.mkdir()
        gone_id = os.stat(gone).st_ino
        gone.rmdir()
        assert cgroups.path_of(gone_id) is None
        assert cgroups.walks == 0 and cgroups.opened == len(jobs) + 2
        # A file's inode is no cgroup's id.
        assert cgroups.path_of(os.stat(slice_ / "cgroup.procs").st_ino) is None
        assert cgroups.walks == 0
    finally:
        cgroups.close()


def test_opening_by_id_needs_the_capability_and_without_it_the_map_walks(
    slice_: Path, tmp_path: Path
) -> None:
    """open_by_handle_at needs CAP_DAC_READ_SEARCH: a process without it is refused (EPERM), and
    CgroupsById.open says so with None (the map then walks, as on an old kernel)."""
    script = tmp_path / "opener.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from qpolicy.telemetry.cgroups import CgroupsById\n"
        "print(CgroupsById.open(Path(sys.argv[1])) is None)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # Out of the bounding set, root's next program runs without it (util-linux's setpriv).
    drop = ["setpriv", "--bounding-set", "-dac_read_search", "--"]
    run = subprocess.run(
        [*drop, sys.executable, str(script), str(CGROUP_ROOT)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert run.stdout.strip() == "True"
    assert CgroupsById.open(CGROUP_ROOT) is not None  # this test's process has it
