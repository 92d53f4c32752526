"""Benchmarks of spec_fused: kernel sweep, overlap-loop A/B replay, real-server A/B."""
