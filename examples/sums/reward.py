"""The example's own reward: a bonus for ending with the answer sentence the instruction asks for.

specrl calls it as `answer_sentence(response, example)` (`task.reward` names it as
`examples/sums/reward.py:answer_sentence`); the response is the model's text, only ever read, and
`example` is the problem's row from sums.jsonl.
"""
import re

_ANSWER_SENTENCE = re.compile(r"the answer is:? \$?-?\d+(?:\.\d+)?\.?\s*$", re.IGNORECASE)


def answer_sentence(response: str, example: dict) -> float:
    """1.0 when the response ends with "The answer is N." (any case, an optional colon) for a number N, right or
    wrong, else 0.0."""
    return 1.0 if _ANSWER_SENTENCE.search(response) else 0.0
