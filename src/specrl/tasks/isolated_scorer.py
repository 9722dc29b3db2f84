"""Scoring in a separate worker process, for reasoning-gym datasets whose scorer evaluates the answer.

Some reasoning-gym scorers run the model's answer as code (`eval`, or sympy's `parse_expr`,
which calls `eval`; see `gym.EVALUATING_SCORERS`). specrl refuses those datasets unless
`task.isolated_scoring=true`, and then scores every answer here, never in a process that
holds the trainer's or the engine's state:

    trainer / rollout actor ──JSON line {"index", "answer"}──► worker: python -I -m specrl.tasks.isolated_scorer
                            ◄──JSON line {"score"} or {"error"}──┘

The worker starts with an empty environment (no tokens, keys or paths inherited), in a
fresh temporary folder, in Python's isolated mode, with limits on its address space, CPU
time and open files, and builds the dataset itself from the task's config. An answer that
takes longer than `timeout` seconds kills the worker (a new one starts for the next answer)
and scores 0.

This is isolation of process state, not a security sandbox: code in an answer can still
touch the file system and network as this user. Run untrusted models with such tasks only
inside a container or VM you are prepared to lose.
"""
from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import tempfile
from dataclasses import asdict

from specrl.tasks.task import TaskConfig

MEMORY_BYTES = 4 * 2**30  # address space of the worker
CPU_SECONDS = 600  # CPU time over the worker's life (it is restarted when it runs out)
OPEN_FILES = 64


def _limit_worker() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


class IsolatedScorer:
    """Scores answers of one reasoning-gym task in a worker process (started on first use)."""

    def __init__(self, config: TaskConfig, timeout: float = 10.0):
        self.config, self.timeout = config, timeout
        self.worker: subprocess.Popen | None = None
        self.folder = tempfile.mkdtemp(prefix="specrl-scorer-")

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-I", "-m", "specrl.tasks.isolated_scorer",
                                 json.dumps(asdict(self.config))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={}, cwd=self.folder, preexec_fn=_limit_worker, text=True)

    def score(self, index: int, answer: str) -> float:
        """The dataset's score_answer(answer, task[index]) computed in the worker; 0.0 on timeout or error."""
        if self.worker is None or self.worker.poll() is not None:
            self.worker = self._start()
        try:
            self.worker.stdin.write(json.dumps({"index": index, "answer": answer}) + "\n")
            self.worker.stdin.flush()
            ready, _, _ = select.select([self.worker.stdout], [], [], self.timeout)
            line = self.worker.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            line = ""
        if not line:  # timed out or died: it may be stuck in the answer's code
            self.close()
            return 0.0
        reply = json.loads(line)
        return float(reply.get("score", 0.0))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker.wait()
            self.worker = None

    def __del__(self):
        self.close()


def main() -> None:
    """The worker: build the dataset from argv[1] (a TaskConfig as JSON), then score one JSON line at a time."""
    import reasoning_gym

    config = json.loads(sys.argv[1])
    dataset = reasoning_gym.create_dataset(config["name"], size=config["size"], seed=config["seed"],
                                           **config["difficulty"])
    for line in sys.stdin:
        request = json.loads(line)
        try:
            entry = dataset[request["index"] % len(dataset)]
            reply = {"score": float(dataset.score_answer(request["answer"], entry))}
        except Exception as err:  # noqa: BLE001 - a malformed answer is a wrong answer
            reply = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    os.umask(0o077)
    main()
