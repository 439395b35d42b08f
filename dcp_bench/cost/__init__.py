"""Hardware, cluster and model specs; the cost and memory model (analytical and profiled)."""
