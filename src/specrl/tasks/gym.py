"""Verifiable reasoning tasks from reasoning-gym, rendered as prompts and scored exactly.

A task yields `Problem`s; `render` turns one into prompt text (through the model's
chat template when the tokenizer has one); `verify` scores a response with the
dataset's own scorer, or specrl's rewrite of it: 1.0 when the extracted answer scores
>= 1, else 0.0. The answer is taken from the last `<answer>...</answer>` in the response,
or, when there is none, the last number in it. A scorer that raises on a malformed answer
scores 0.

Which scorers run in the trainer's process. A reasoning-gym scorer receives text the model
wrote. `SAFE_SCORERS` lists the datasets of reasoning-gym 0.1.25 whose `score_answer` was
read, with every function it calls, and fed code-executing answers: they only compare,
split, regex-match or parse numbers, JSON and grids (the audit is in docs/tasks.md).
Datasets whose scorer runs the answer as code but can be scored by reading it are scored by
specrl's own scorer instead (`safe_scorers.REWRITTEN_SCORERS`: countdown, puzzle24 and the
exact-match ones). Every other dataset is refused with the reason (`EVALUATING_SCORERS`:
sympy's `parse_expr`, which calls `eval`, where checking the answer needs symbolic algebra;
`FLAWED_SCORERS`: a verifier that does not verify).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import reasoning_gym

from specrl.tasks.safe_scorers import REWRITTEN_SCORERS
from specrl.tasks.task import HeldOutTail, TaskConfig, chat_prompt

INSTRUCTION = "Solve the problem. Give only the final answer inside <answer></answer>."

SAFE_SCORERS = frozenset((
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion", "basic_arithmetic", "bf",
    "binary_alternation", "bitwise_arithmetic", "boxnet", "caesar_cipher", "calendar_arithmetic", "chain_sum",
    "circuit_logic", "codeio", "coin_flip", "color_cube_rotation", "complex_arithmetic", "count_bits",
    "count_primes", "course_schedule", "cryptarithm", "decimal_arithmetic", "decimal_chain_sum", "dice",
    "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification", "futoshiki",
    "game_of_life", "gcd", "graph_color", "group_anagrams", "gsm_symbolic", "isomorphic_strings", "jugs",
    "kakurasu", "knight_swap", "knights_knaves", "largest_island", "lcm", "leg_counting", "letter_counting",
    "letter_jumble", "list_functions", "mahjong_puzzle", "manipulate_matrix", "maze", "mini_sudoku",
    "modulo_grid", "needle_haystack", "number_filtering", "number_format", "number_sequence", "number_sorting",
    "palindrome_generation", "palindrome_partitioning", "path_star", "polynomial_equations", "pool_matrix",
    "power_function", "prime_factorization", "products", "propositional_logic", "quantum_lock", "ransom_note",
    "rearc", "rectangle_count", "rotate_matrix", "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference",
    "sentence_reordering", "shortest_path", "simple_equations", "simple_geometry", "sokoban", "spell_backward",
    "string_manipulation", "string_splitting", "string_synthesis", "sudoku", "survo", "syllogism",
    "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder", "word_sequence_reversal", "word_sorting",
    "zebra_puzzles",
))
_SYMPY = "its scorer parses the answer with sympy's parse_expr, which calls eval(); a safe check needs symbolic algebra"
EVALUATING_SCORERS = {  # no rewrite in safe_scorers: these need more than arithmetic to check
    "intermediate_integration": _SYMPY + " (an antiderivative in a variable), not arithmetic",
    "simple_integration": _SYMPY + " (an antiderivative in a variable), not arithmetic",
    "polynomial_multiplication": _SYMPY + " (polynomials in variables, with **), not arithmetic",
    "composite": "it scores with the scorers of the datasets it wraps, eval-based ones included",
}
FLAWED_SCORERS = {
    "game_of_life_halting": "its scorer gives 1.0 to any non-empty answer (bool(answer) == bool(entry['answer']))",
}


def scorer_refusal(name: str) -> str | None:
    """Why a dataset's scorer may not run in the trainer's process, or None when it may."""
    if name in SAFE_SCORERS or name in REWRITTEN_SCORERS:
        return None
    return EVALUATING_SCORERS.get(name) or FLAWED_SCORERS.get(name) or \
        "its scorer has not been vetted (specrl's list is for reasoning-gym 0.1.25)"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Problem:
    index: int  # position in the dataset
    question: str
    answer: str
    entry: dict  # the dataset's own record, passed back to its scorer


def extract_answer(response: str) -> str | None:
    tagged = _ANSWER_TAG.findall(response)
    if tagged:
        return tagged[-1].strip()
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


class ReasoningGymTask(HeldOutTail):
    def __init__(self, config: TaskConfig):
        refusal = scorer_refusal(config.name)
        if refusal is not None:
            raise ValueError(f"task {config.name!r} is refused: {refusal}. Pick another dataset (docs/tasks.md)")
        try:
            self.dataset = reasoning_gym.create_dataset(config.name, size=config.size, seed=config.seed,
                                                        **config.difficulty)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"task {config.name!r} with difficulty {config.difficulty}: {err}") from err
        self.config = config if config.instruction is not None else replace(config, instruction=INSTRUCTION)
        self.score = REWRITTEN_SCORERS.get(config.name, self.dataset.score_answer)  # (answer, entry) -> score

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Problem:
        index %= len(self.dataset)
        entry = self.dataset[index]
        return Problem(index, entry["question"], str(entry["answer"]), entry)

    def messages(self, problem: Problem) -> list[dict]:
        return [{"role": "user", "content": problem.question}]

    def render(self, problem: Problem, tokenizer) -> str:
        """The question and `task.instruction` (default `INSTRUCTION`), through the chat template where there is one."""
        return chat_prompt(self.messages(problem), tokenizer, self.config)

    def example(self, problem: Problem) -> dict:
        return problem.entry

    def verify(self, response: str, entry: dict) -> float:
        """1.0 when the dataset's scorer (or specrl's rewrite) gives the extracted answer >= 1, else 0.0."""
        answer = extract_answer(response)
        if answer is None:
            return 0.0
        try:
            score = self.score(answer, entry)
        except Exception:  # noqa: BLE001 - some scorers raise on malformed answers (prime_factorization: int())
            return 0.0
        return 1.0 if score >= 1.0 else 0.0
