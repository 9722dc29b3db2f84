"""Training drafts and models outside RL, all on one optimisation loop (`loop.fit`).

    loop                 the optimisation loop
    pretraining          `tiny` and `tiny-draft` from a fixed seed (`specrl pretrain`)
    draft_distillation   a reduced-vocabulary draft model on the target's samples (`specrl train-draft`)
    head_training        EAGLE-3 / MTP heads on the target's rollouts (`specrl train-draft --kind eagle3|mtp`)

Their losses, and the online adaptation's in `rl`, are `speculation.draft_losses`.
"""
