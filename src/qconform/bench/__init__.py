"""Benchmarks that print ratios (never timed tests)."""
