"""specrl: lossless speculative decoding for RL post-training rollouts."""
__version__ = "0.1.0"
