"""tools/gpu/online-rows.sh (issue 14's online rows on a lent GPU machine), run here with
stand-ins for tools/bench/gpu.py, the doctor and nvidia-smi: which rows it asks gpu.py for, what
it leaves under $OUT, that a failing row does not stop the next, and the values it refuses."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from tools.bench import gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu" / "online-rows.sh"
SCENARIO_NAMES = {s.name for s in gpu.SCENARIOS}

# Stands in for python3: `import bcc` succeeds (bcc-env.sh then unpacks nothing); gpu.py writes
# its arguments as its JSON and a daemon log beside it, and fails where its --only names the 2048
# row and FAIL_2048 is set; the doctor prints what it was asked.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = -c ]; then exit 0; fi
if [ "$1" = tools/bench/gpu.py ]; then
    shift
    exec "$REAL_PYTHON" - "$@" <<'EOF'
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--out") + 1])
only = args[args.index("--only") + 1]
if "2048" in only and os.environ.get("FAIL_2048"):
    sys.exit(1)
out.write_text(json.dumps({"argv": args}))
(out.parent / "daemon-0.log").write_text("daemon log\\n")
EOF
fi
if [ "$1 $2 $3" = "-m qpolicy doctor" ]; then
    shift 3
    echo "doctor stderr" >&2
    exec "$REAL_PYTHON" -c 'import json, sys; print(json.dumps({"argv": sys.argv[1:]}))' "$@"
fi
echo "unexpected python3 $*" >&2
exit 3
"""


# Stand in for pgrep and py-spy: the daemon is pid 4242 and pod p0 starts now for 6 s (or, with
# NO_PODS set, nothing runs); py-spy writes its arguments where -o says.
FAKE_PGREP = """#!/bin/sh
if [ -n "$NO_PODS" ]; then exit 1; fi
case "$*" in
*qpolicy*) echo 4242 ;;
*matmul*) echo "4243 sh -c echo python3 tools/gpu/matmul.py --n 4096 --label p0 \\
--start-at $(date +%s) --seconds 6.0 --timeline" ;;
*) exit 1 ;;
esac
"""
FAKE_PYSPY = """#!/bin/sh
while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then out=$2; fi
    args="$args $1"
    shift
done
echo "thread (1): MainThread;main (qpolicy/daemon.py:1) 1 #$args" > "$out"
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in {
        "pgrep": FAKE_PGREP,
        "py-spy": FAKE_PYSPY,
        "python3": FAKE_PYTHON,
        # A sampler that says which query it was given, then samples until killed.
        "nvidia-smi": '#!/bin/sh\necho "query: $*"\ncase "$*" in *-lms*) exec sleep 600;; esac\n',
        "mountpoint": "#!/bin/sh\nexit 0\n",
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    real_python = shutil.which("python3")
    assert real_python
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "REAL_PYTHON": real_python,
            "OUT": str(tmp_path / "out"),
            "DEBS": str(tmp_path / "no-debs"),
            "PYSPY": str(bin_dir / "py-spy"),
            **env,
        },
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _bench(out: Path, row: str) -> list[str]:
    argv: list[str] = json.loads(lzma.decompress((out / f"{row}-bench.json.xz").read_bytes()))[
        "argv"
    ]
    return argv


def test_it_runs_the_rows_and_the_doctor_and_leaves_what_benchmarks_md_cites(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, ROWS="8192 2048 10pods 8192-annotated", DOCTOR="8192", REV="c18f9ae")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "10pods-bench.json.xz", "2048-bench.json.xz", "8192-annotated-bench.json.xz",
        "8192-bench.json.xz", "doctor-8192.json", "logs.tar.xz", "smi.csv.xz",
    ]  # fmt: skip
    # Each row is gpu.py's scenario of that name, with native and MPS beside qpolicy's rows.
    for row, only, modes in [
        ("8192", "online 4096 @ 150 Hz next to an offline 8192 trainer", "native,mps,qpolicy"),
        ("2048", "online 4096 @ 150 Hz next to an offline 2048 trainer (short kernels)",
         "native,mps,qpolicy"),
        ("10pods", "daemon CPU, 10 pods", "qpolicy,probe"),
        # The pods told by the state file and by annotations, side by side, with native.
        ("8192-annotated", "online 4096 @ 150 Hz next to an offline 8192 trainer",
         "native,qpolicy,qpolicy-annotated"),
    ]:  # fmt: skip
        argv = _bench(out, row)
        assert argv[argv.index("--only") + 1] == only
        # gpu.py runs what --only starts: the name must be one of its scenarios, or none runs.
        assert only in SCENARIO_NAMES
        assert argv[argv.index("--modes") + 1] == modes
        assert "--daemon-logs" in argv
    doctor = json.loads((out / "doctor-8192.json").read_text())["argv"]
    assert doctor[doctor.index("--trainer-n") + 1] == "8192"
    assert doctor[doctor.index("--levers") + 1] == "timeslice-1us-8ms"
    assert "--json" in doctor and "--no-cache" in doctor
    smi = lzma.decompress((out / "smi.csv.xz").read_bytes()).decode()
    assert smi.startswith("query: -lms 250 --format=csv --query-gpu=timestamp,clocks.sm,")
    with tarfile.open(out / "logs.tar.xz") as tar:
        names = sorted(n.removeprefix("./") for n in tar.getnames() if n not in (".", "./"))
        assert names == [
            "10pods", "10pods/daemon-0.log", "2048", "2048/daemon-0.log", "8192",
            "8192-annotated", "8192-annotated/daemon-0.log", "8192/daemon-0.log",
            "doctor-8192.err", "host.txt",
        ]  # fmt: skip
        host = tar.extractfile("./host.txt")
        assert host is not None
        assert "rev c18f9ae" in host.read().decode().splitlines()


def test_a_failing_row_is_reported_and_the_next_still_runs(tmp_path: Path) -> None:
    done = _run(tmp_path, ROWS="2048 8192", FAIL_2048="1")
    assert done.returncode == 1
    assert "online-rows: row 2048 failed" in done.stderr
    out = tmp_path / "out"
    assert not (out / "2048-bench.json.xz").exists()
    argv = _bench(out, "8192")
    assert argv[argv.index("--sizes") + 1] == "4096"
    assert not list(out.glob("doctor-*"))


def test_the_profiled_row_samples_its_daemon_in_the_pods_steady_state(tmp_path: Path) -> None:
    done = _run(tmp_path, ROWS="10pods-profiled")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "10pods-profiled-bench.json.xz", "10pods-profiled-daemon.raw.xz", "logs.tar.xz",
        "smi.csv.xz",
    ]  # fmt: skip
    argv = _bench(out, "10pods-profiled")
    assert argv[argv.index("--only") + 1] == "daemon CPU, 10 pods"
    # The enforcing daemon alone: the watching one would be sampled too, under the same name.
    assert argv[argv.index("--modes") + 1] == "qpolicy"
    raw = lzma.decompress((out / "10pods-profiled-daemon.raw.xz").read_bytes()).decode()
    spy = raw.split("#", 1)[1].split()
    # The daemon's pid; from 2 s after the pods start to 2 s before their 6 s end; not stopped
    # (no --native), thread names, as tools/gpu/profile_summary.py reads them.
    assert spy[:5] == ["record", "-p", "4242", "-r", "1000"]
    assert spy[spy.index("-d") + 1] == "2"
    assert {"--nonblocking", "--threads", "--function"} <= set(spy)
    assert "--native" not in spy
    assert spy[spy.index("-f") + 1] == "raw"


def test_a_profiled_row_with_no_daemon_to_sample_is_reported(tmp_path: Path) -> None:
    done = _run(tmp_path, ROWS="10pods-profiled", NO_PODS="1")
    assert done.returncode == 1
    assert "online-rows: the profile of row 10pods-profiled failed" in done.stderr
    out = tmp_path / "out"
    assert (out / "10pods-profiled-bench.json.xz").exists()
    assert not (out / "10pods-profiled-daemon.raw.xz").exists()
    with tarfile.open(out / "logs.tar.xz") as tar:
        log = tar.extractfile("./10pods-profiled/py-spy.log")
        assert log is not None
        assert log.read().decode().strip() == "online-rows: no daemon and pods to profile"


def test_it_refuses_an_unknown_row_or_doctor_size_before_starting(tmp_path: Path) -> None:
    for env, says in [
        (
            {"ROWS": "8192 4096"},
            "online-rows: unknown row '4096' (8192, 2048, 10pods, 10pods-profiled or"
            " 8192-annotated)",
        ),
        ({"DOCTOR": "big"}, "online-rows: DOCTOR must be a matrix size, not 'big'"),
        (
            {"ROWS": "10pods-profiled", "PYSPY": str(tmp_path / "none")},
            f"online-rows: row 10pods-profiled needs py-spy, and '{tmp_path / 'none'}' is not"
            " executable",
        ),
    ]:
        done = _run(tmp_path, **env)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [says]
        assert not (tmp_path / "out").exists()
