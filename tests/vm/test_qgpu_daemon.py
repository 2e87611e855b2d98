"""The daemon with the kmod enforcer, end to end: desired state from the CLI, pods as cgroups,
qgpu.ko running the periods, nvmock's engine as ground truth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.vm.conftest import reset
from tests.vm.qgpu_env import cgroups, gpu_seconds, in_cgroup, qgpu_loaded

SATURATE = ["--shape", "saturate", "--kernel-us", "500", "--sync-every", "4", "--queue", "4"]


def qpolicy(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QPOLICY_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "qpolicy", *args], env=env, capture_output=True, text=True
    )


def test_the_daemon_drives_qgpu_and_releases_it_on_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with qgpu_loaded() as client, cgroups(2) as (a, b):
        rel = [f"/{cg.path.name}" for cg in (a, b)]
        assert qpolicy(state, "set", "--gpu", "0", "--policy", "fixed-share").returncode == 0
        for path, share in zip(rel, ("60", "20"), strict=True):
            done = qpolicy(
                state, "pod", "set", path, "--gpu", "0", "--class", "offline", "--share", share
            )
            assert done.returncode == 0, done.stderr
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "qpolicy",
                "daemon",
                "--enforcer",
                "kmod",
                "--no-metrics",
                "--probe",
                "off",
            ],
            env={**os.environ, "QPOLICY_STATE_DIR": str(state)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 180  # Python starts slowly without KVM
            while time.monotonic() < deadline and len(client.cgroups()) < 2:
                time.sleep(0.2)
            configured = {s.cgroup_id: s for s in client.cgroups()}
            if not {a.id, b.id} <= set(configured):
                daemon.kill()
                pytest.fail(f"the daemon configured {configured}: {daemon.communicate()[1]}")
            assert configured[a.id].share == 60 and configured[b.id].share == 20
            assert client.gpus()[0].policy.name == "FIXED_SHARE"

            status = qpolicy(state, "status", "--json")
            assert status.returncode == 0, status.stderr
            assert "kmod" in json.loads(status.stdout)

            reset()
            loads = [in_cgroup(cg, [*SATURATE, "--seconds", "5"]).ready() for cg in (a, b)]
            walls = [load.result()["elapsed_s"] for load in loads]
            got = [
                gpu_seconds(load.pid) / wall * 100 for load, wall in zip(loads, walls, strict=True)
            ]
            print(f"daemon + qgpu, fixed-share 60/20 -> {got[0]:.1f}/{got[1]:.1f}")
            assert got[0] == pytest.approx(60, abs=3)
            assert got[1] == pytest.approx(20, abs=3)
        finally:
            daemon.send_signal(signal.SIGTERM)
            _, err = daemon.communicate(timeout=30)
        assert daemon.returncode == 0, err
        # SIGTERM gave the GPU back: nothing configured, best-effort.
        assert client.cgroups() == []
        assert client.gpus()[0].policy.name == "BEST_EFFORT"
