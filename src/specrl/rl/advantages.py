"""Group-normalised advantages (GRPO): each response is scored against its siblings.

For a prompt sampled G times with rewards r_1..r_G:
    A_i = (r_i - mean(r)) / (std(r) + eps)
A group whose rewards are all equal carries no signal and gets A = 0 for every
member (the numerator is zero). `std` is the population standard deviation.
"""
from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """rewards [N] in prompt-major order (N = prompts * G) -> advantages [N].

    Example: rewards [1, 0, 0, 0 | 1, 1, 1, 1], G = 4 -> first group mean 0.25,
    std 0.433: A = [1.73, -0.58, -0.58, -0.58]; second group A = 0.
    `scale=False` gives the mean-centred variant (Dr. GRPO), without the std division.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size).double()
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)
    return centred.flatten().float()
