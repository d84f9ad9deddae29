"""benchmarks/user_path.py drives train.py's own loop in turns, and benchmarks/cpu_limit.py
sorts a traced step's time into categories (no timed assertions: the figures come from
``python -m benchmarks.vs_pytorch`` on a quiet machine)."""
import argparse
import io
import json

import pytest

from benchmarks import cpu_limit, user_path
from dynjax.models.transformer import ModelConfig
from dynjax.train import guard, loop


def test_loop_worker_times_train_py_loop_and_profiles_it(monkeypatch, capsys):
    args = argparse.Namespace(batch_size=2, seq_len=16, attn_block=8, settle=1, loop_steps=2,
                              loop_log_every=2, profile_steps=1, repeats=1)
    config = user_path.loop_config("dense", args)
    config.model.update(dict(d_model=32, n_heads=2, n_layers=2, d_ff=64))
    monkeypatch.setattr("sys.stdin", io.StringIO("dense forward\ndense train\ndense train\n"
                                                 "dense profile\n"))
    real = guard.guarded_step, loop.task_of
    user_path.loop_worker("dense", args, config)
    assert (guard.guarded_step, loop.task_of) == real          # the hook is removed after
    replies = [json.loads(line) for line in capsys.readouterr().out.splitlines()
               if line.startswith("{")]
    assert [list(r)[0] for r in replies] == ["ready", "seconds", "seconds", "seconds", "profile"]
    assert all(r["seconds"] > 0 for r in replies[1:4])
    assert replies[2]["dispatch_s"] > 0 and replies[2]["host_gap_s"] >= 0   # two timed steps
    prof = replies[4]["profile"]
    assert "unavailable" not in prof, prof
    assert prof["module"] == "jit_step" and prof["events_not_in_hlo"] == 0
    assert sum(prof["op_share"].values()) == pytest.approx(1.0)
    assert prof["op_share"]["matmul"] > 0 and prof["op_share"]["optimizer"] > 0
    assert prof["op_share"]["attention_softmax"] > 0 and prof["batch_s"] > 0


def test_matmul_bound_counts_the_analytic_flops():
    """The bound's executed matmul FLOPs are the analytic count, with block-causal
    attention at (m + 1) / 2m of the square."""
    cfg = ModelConfig(family="mod", variant="mod", d_model=64, n_heads=2, n_layers=4, d_ff=128,
                      attn_block=16).replace(mod_capacity=0.25)
    shapes = cpu_limit.gemm_shapes(cfg, 2, 64)
    gemm = cpu_limit.gemm_summary(shapes, {name: 1e-3 for name in shapes})
    report = cpu_limit.limit_report(cfg, 2, 64, gemm, {"x": {"train": 1.0, "forward": 0.5}})
    F = report["by_class_forward"]
    d, T = 64, 64
    full, block_causal = 2 * 2 * T * T * d, 2 * 2 * T * T * d * 5 / 8   # m = 4 blocks
    mod_attn = 2 * 2 * 16 * 16 * d                                        # k = 16: one block
    assert F["attention"] == pytest.approx(2 * (2 * block_causal + 2 * mod_attn))
    assert sum(F.values()) == pytest.approx(report["model_flops"]["forward"]
                                            - 2 * 2 * (full - block_causal))
    assert report["model_flops"]["train"] == pytest.approx(3 * report["model_flops"]["forward"])
    row = report["rows"]["x"]["train"]                  # 1 ms per shape: its rate is the peak
    assert row["mfu"] == pytest.approx(report["model_flops"]["train"] / gemm["peak_flops_per_s"])
    assert row["matmul_bound_fraction"] == pytest.approx(report["matmul_bound_s"]["train"])
