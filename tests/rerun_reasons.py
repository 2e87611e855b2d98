"""Why each rerun ran, in the log.

pytest-rerunfailures reports a test that failed and then passed on its rerun as ``R.`` and, with
``-rR``, its name: not what failed. For the VM tier's timed tests (``HOST_TIMED`` in
tests/vm/conftest.py), which are allowed one rerun, the first failure is the evidence of a flake
(which assertion, which numbers), so the summary ends with each rerun's failure message.
"""

from __future__ import annotations

from _pytest.terminal import TerminalReporter


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    reruns = terminalreporter.stats.get("rerun", [])
    if not reruns:
        return
    terminalreporter.section("why each rerun ran")
    for report in reruns:
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            message = crash.message
        else:  # a failure pytest did not take apart (a setup error given as text, say)
            lines = report.longreprtext.strip().splitlines()
            message = lines[-1] if lines else "(no message)"
        terminalreporter.write_line(f"{report.nodeid} ({report.when}): {message}")
