"""specrl's performance simulator: project sync/async RL with speculative decoding onto clusters.

Modules, one concept each:
  hardware     device catalogue and calibrated efficiencies (GPU literals, CPU from JSON)
  models       model shapes and parameter / KV counts
  drafters     draft proposers as cost-model networks
  costs        the per-forward roofline cost formulas
  iteration    one engine iteration with / without speculation
  acceptance   per-request, per-position acceptance of chain drafts
  workload     prompts x samples with long-tailed lengths
  speculation  K policies: the planner users get, fixed K, the oracle bound
  rollout      discrete-event continuous-batching rollout
  rl_loop      sync and async RL steps
  scenarios    named presets; projection runs / sweeps them
  published    published figures (fit data and validation data)
  fit          the one-off efficiency fits; cpu_measure measures this CPU
  calibration  predicted vs published table; validate_against_bench
  plots        PNGs (the `specrl simulate` command itself is `commands/simulate.py`)
"""
from specrl.sim.calibration import calibration_table, validate_against_bench

__all__ = ["calibration_table", "validate_against_bench"]
