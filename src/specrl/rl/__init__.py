"""RL: tasks and verifiers, advantages, the GRPO loss, the trainer step."""
