"""The example's own reward: a small bonus for answering in the requested format.

specrl calls it as `tagged(response, example)` (`task.reward` names it as `examples/sums/reward.py:tagged`);
the response is the model's text, only ever read, and `example` is the problem's row from sums.jsonl.
"""
import re

_TAGGED = re.compile(r"<answer>\s*[-\d.,/ ]+\s*</answer>")


def tagged(response: str, example: dict) -> float:
    """1.0 when the response holds its answer as a number inside <answer></answer>, else 0.0."""
    return 1.0 if _TAGGED.search(response) else 0.0
