"""The repository's kernels (here one, a CPU stand-in)."""
