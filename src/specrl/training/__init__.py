"""Training drafts and models outside RL, all on one optimisation loop (`loop.fit`).

    loop                 the optimisation loop
    losses               soft cross-entropy and agreement metrics between a target p and a draft q
    pretraining          `tiny` and `tiny-draft` from a fixed seed (`specrl pretrain`)
    draft_distillation   a reduced-vocabulary draft model on the target's samples (`specrl train-draft`)
    head_training        EAGLE-3 / MTP heads on the target's rollouts (`specrl train-draft --kind eagle3|mtp`)
"""
