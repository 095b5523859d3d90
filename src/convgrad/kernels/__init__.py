"""Kernels: ``reference`` (direct, float64/int64: the oracle) and ``gemm`` (stride-phase GEMM)."""
