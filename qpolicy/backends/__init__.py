"""One backend per enforcer, as the daemon runs it: its recovery, start, counters and close.

The daemon is enforcer-agnostic: it reads the desired state, hands the admitted state to its
backend (:class:`~qpolicy.backends.base.Backend`) when it changes, and asks it for counters when it
publishes a view. How an enforcer carries the state out (period loops in userspace, a reconciler
over the kernel module, a simulated node, nothing at all) is the backend's business.
"""
