"""Bit-exact CPU references, one subpackage per upstream family. Plain numpy/numba only."""
