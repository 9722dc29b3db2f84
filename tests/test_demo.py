"""`specrl demo` says what its run's speculation did, the parity check that ran, and times the int8
self-draft at batch 1 (on `tiny` here; the demo's default is SmolLM2-135M); one JSON line ends it."""
import json

from specrl import cli
from specrl.kernels import small_gemm


def test_the_demo_reports_its_speculation_its_parity_and_the_batch_1_payoff(tmp_path, capsys):
    run_dir = tmp_path / "tiny"
    assert cli.main(["demo", "run.steps=4", f"run.run_dir={run_dir}", "run.checkpoint_every=0",
                     "rollout.prompts_per_step=4", "--payoff-model", "tiny", "--payoff-tokens", "24"]) == 0
    out = capsys.readouterr().out
    demo = json.loads(out.strip().splitlines()[-1])["demo"]
    reasons = demo["plan_reasons"]
    assert reasons and demo["decode_steps_speculated"] + demo["decode_steps_plain"] == sum(reasons.values())
    assert demo["parity_steps"] == 4 and 0 <= demo["parity_error_max"] < 1e-4
    payoff = demo["smollm2_batch1"]
    assert payoff["greedy_match"] is True and payoff["speedup"] > 0 and payoff["acceptance_per_pos"]
    assert payoff["int8_kernel"] is not None and payoff["cpu_class"] == small_gemm.cpu_class(small_gemm.cpu_flags())
    assert {"acceptance.png", "drain.png", "reward.png"} <= {p.name for p in (run_dir / "plots").iterdir()}
