"""The RL pipeline: the sync loop, weight sync, checkpoint / resume, run configs."""
