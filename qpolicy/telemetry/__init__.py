"""What the node's GPU users do: the eBPF probe, its views, and the metrics exporter."""
