"""Benchmarks of spec_fused: the kernel sweep, the per-step host cost beside upstream's,
the overlap-loop A/B replay and the real-server A/B (see bench/README.md)."""
