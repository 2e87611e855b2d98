import os

from hypothesis import settings

# A rerun's first failure goes in the log (tests/rerun_reasons.py).
pytest_plugins = ["tests.rerun_reasons"]

# CI runs the same examples every time so a red build can be reproduced; set
# HYPOTHESIS_PROFILE=explore locally to search further.
settings.register_profile("ci", derandomize=True, max_examples=300, deadline=None)
settings.register_profile("explore", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# tests/vm need nvmock.ko loaded in the test VM: `make vm-test` runs them there (tools/vm/run
# sets QPOLICY_IN_VM). Elsewhere they are not collected at all rather than skipped.
collect_ignore = [] if os.environ.get("QPOLICY_IN_VM") == "1" else ["vm"]
