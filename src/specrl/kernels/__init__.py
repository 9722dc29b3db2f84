"""Native kernels of the embedded engine's fast path: `small_gemm` (small-row fp32 matmuls, AVX2 + FMA)."""
