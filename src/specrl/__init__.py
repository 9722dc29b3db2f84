"""specrl: lossless speculative decoding for RL post-training rollouts."""
import os as _os

# Seeded runs repeat bit for bit at any thread count. Left dynamic, Intel MKL (torch's BLAS on x86) may run a GEMM
# on fewer threads than torch asks for, which sums in another order: at 2 threads about one process in 13
# computed the trainer's backward through the LM head with other last bits (the same other bits each time, and
# never within one process), and a seeded SmolLM2 run sampled other answers from its fourth step (docs/log.md,
# 2026-11-29). MKL reads this when torch loads, so it holds where specrl is imported before torch; a user's own
# setting wins.
_os.environ.setdefault("MKL_DYNAMIC", "FALSE")

__version__ = "0.1.0"
