"""Writes sums.jsonl: 200 one-step word problems (a number below 40 and a one-digit number added), answers as numbers.

    python examples/sums/make_dataset.py        # the file is committed; this remakes it, the same each time
"""
import json
import random
from pathlib import Path

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo"]
THINGS = ["apples", "stamps", "marbles", "books", "coins", "shells", "cards", "pencils"]


def problem(rng: random.Random) -> dict:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 39), rng.randint(2, 9)
    return {"question": f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
            "answer": str(a + b)}


if __name__ == "__main__":
    rng = random.Random(0)
    rows = [problem(rng) for _ in range(200)]
    out = Path(__file__).with_name("sums.jsonl")
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} problems to {out}")
