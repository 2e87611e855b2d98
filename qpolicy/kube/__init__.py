"""Kubernetes: the pods of this node as qpolicy sees them.

* :mod:`qpolicy.kube.pods`: what qpolicy derives from a Pod object (class, share, memory, the
  key each came from, disagreements, bad values, cgroup paths, GPUs named in its environment): a
  pure function, shared by ``qpolicy kube explain`` and the daemon;
* :mod:`qpolicy.kube.podcgroup`: the pod's cgroup, found on disk for the systemd and cgroupfs
  drivers;
* :mod:`qpolicy.kube.podresources`: which GPUs the kubelet gave each container (its
  pod-resources gRPC API);
* :mod:`qpolicy.kube.policy`: per-GPU policies from a ConfigMap value;
* :mod:`qpolicy.kube.source`: ``qpolicy daemon --kubernetes``, the pod source that watches the API
  server in the background and hands candidates to admission.
"""
