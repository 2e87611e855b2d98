"""``qpolicy doctor``: which preemption levers act on this node's GPU and driver, measured.

The doctor runs its own short workloads (a saturating trainer and an online request stream, each
its own process and CUDA context, as tenants are), finds their RM objects through the eBPF probe as
the rm enforcer does, and tries each lever in turn: what it set, what RM answered and how long the
call took, the online latency it gave and the trainer's throughput; last, for comparison, both
workloads as clients of an MPS server of its own (:mod:`~.mps`). It restores whatever it set,
and keeps its result where the daemon reads it (``$QPOLICY_STATE_DIR/doctor-gpuN.json``), so that
the online strategy is chosen from what this GPU did rather than hard-coded.

Top to bottom: :mod:`~.report` (results, statistics, the recommendation), :mod:`~.promise`
(what qpolicy can promise online work on this GPU, from the run), :mod:`~.levers` (what
each lever sets and undoes), :mod:`~.mps` (the comparison's server), :mod:`~.lab` (the workloads
and their objects), :mod:`~.run` (the phases), :mod:`~.workload` (the workload processes
themselves).
"""
