"""The routing study's configs and plan (configs/routing_study.py, experiments/routing_study.py):
the arms have equal active parameters at the FCA sweep's tiny size, an unknown arm is
refused naming the arms, and the plan puts each seed's analyses after its training
and skips what a seed's results file already holds."""
import dataclasses
import json

import pytest

from dynjax.configs import routing_study
from dynjax.models import build, llm
from experiments import fca_sweep
from experiments import routing_study as study


def test_arms_are_the_sweeps_tiny_size_with_the_dense_width_active():
    c = routing_study.get_config("softmax_topk")
    assert (c.model.n_layers, c.model.hidden_size, c.data.seq_len, c.train.batch_size) == \
        (4, 128, fca_sweep.SEQ_LEN, fca_sweep.BATCH)
    assert c.data.source == fca_sweep.DATA_SOURCE
    cfg = build(c.model.to_dict()).cfg
    dense = dataclasses.replace(cfg, moe_layers=(), num_experts=0, top_k=0,
                                moe_intermediate_size=0)
    assert llm.param_count(cfg)["active"] == llm.param_count(dense)["active"] + \
        4 * 128 * 8   # the routers are the only extra active parameters


def test_an_unknown_arm_is_refused_naming_the_arms():
    with pytest.raises(ValueError, match="unknown arm 'moe'; choose one of .*'mhc'"):
        routing_study.get_config("moe")


def test_the_plan_orders_each_seeds_work_and_skips_what_is_done(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    items = [i for i in study.work(runs, out, seeds=(0,)) if i[1] == "softmax_topk"]
    assert items == [("train", "softmax_topk", 0), ("audit", "softmax_topk", 0),
                     ("layers", "softmax_topk", 0), ("experts", "softmax_topk", 0),
                     ("hf", "softmax_topk", 0)]
    assert ("hf", "softmax_topk", 1) not in study.work(runs, out, seeds=(1,))
    f = study.seed_file(out, "softmax_topk", 0)
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"audit": {}, "layers": {}}))
    assert [i for i in study.work(runs, out, seeds=(0,)) if i[1] == "softmax_topk"] == [
        ("experts", "softmax_topk", 0), ("hf", "softmax_topk", 0)]


def test_the_report_combines_seeds_per_layer_with_the_share_token_identity_recovers(tmp_path):
    """Three seeds' per-layer means in, seed-level summaries out: the estimates are the means
    over seeds and the share is 1 - mean(ΔTI) / mean(ΔCI)."""
    ci = [[0.10, 0.02], [0.12, 0.03], [0.08, 0.025]]
    ti = [[0.01, 0.02], [0.02, 0.028], [0.015, 0.02]]
    for seed in range(3):
        f = study.seed_file(tmp_path, "softmax_topk", seed)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"seed": seed, "layers": {"mean_delta": {
            "cross_input": ci[seed], "token_identity": ti[seed]}},
            "experts": {"spearman": [], "pruning": {}}}))
    table = study.report(tmp_path)["softmax_topk"]
    assert [row["seeds"] for row in table] == [3, 3]
    for layer, row in enumerate(table):
        mean_ci = sum(c[layer] for c in ci) / 3
        mean_ti = sum(t[layer] for t in ti) / 3
        assert row["cross_input"]["estimate"] == pytest.approx(mean_ci)
        assert row["difference"]["estimate"] == pytest.approx(mean_ti - mean_ci)
        assert row["share_recovered"]["estimate"] == pytest.approx(1 - mean_ti / mean_ci)
    md = (tmp_path / "table.md").read_text()
    assert md.count("| softmax_topk |") == 2
    assert json.loads((tmp_path / "per_layer.json").read_text())["arms"]["softmax_topk"]


def _audit(estimates: dict, width=0.1) -> dict:
    return {"pooled": {c: {"estimate": e, "ci_low": e - width, "ci_high": e + width}
                       for c, e in {"correct": 0.0, **estimates}.items()}}


def test_the_report_compares_the_arms_whole_model_audits(tmp_path):
    """Each arm's whole-model ΔNLL per condition: the mean over its audited seeds (one
    seed: that seed's CI beside it); conditions an arm lacks are a dash, not a zero."""
    runs = {("softmax_topk", 0): {"cross_input": 2.0, "weights_flat": 0.1},
            ("softmax_topk", 1): {"cross_input": 3.0, "weights_flat": 0.3},
            ("hash", 0): {"cross_input": 0.5}}
    for (arm, seed), est in runs.items():
        f = study.seed_file(tmp_path, arm, seed)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"seed": seed, "test_bpb": 2.0 + seed, "audit": _audit(est)}))
    study.report(tmp_path)
    got = json.loads((tmp_path / "arms.json").read_text())["arms"]
    assert got["softmax_topk"]["conditions"]["cross_input"]["mean"] == pytest.approx(2.5)
    assert got["softmax_topk"]["conditions"]["cross_input"]["ci_one_seed"] is None
    assert got["hash"]["conditions"]["cross_input"]["ci_one_seed"] == [0.4, 0.6]
    assert got["softmax_topk"]["test_bpb"] == [2.0, 3.0]
    md = (tmp_path / "table.md").read_text()
    assert "| hash | 1 | 2.0000 | 0.500 [0.400, 0.600] | — |" in md
    assert "| softmax_topk | 2 | 2.0000 / 3.0000 | 2.500 | 0.200 |" in md


def test_three_seeds_give_whole_model_intervals_over_seeds_and_the_static_share(tmp_path):
    """Three audited seeds: each condition's interval is over the seeds (a checkpoint-level
    bootstrap with the sign-flip p and its floor, 0.25 for three), and the share a static
    profile keeps is 1 - static_profile / structure_removed per seed, with a paired CI."""
    for seed, (s, r) in enumerate(((0.2, 0.4), (0.3, 0.5), (0.1, 0.4))):
        f = study.seed_file(tmp_path, "attn_gate", seed)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"seed": seed, "test_bpb": 2.0, "audit": _audit(
            {"cross_input": 1.0 + seed, "static_profile": s, "structure_removed": r})}))
    study.report(tmp_path)
    got = json.loads((tmp_path / "arms.json").read_text())["arms"]["attn_gate"]
    ci = got["conditions"]["cross_input"]["over_seeds"]
    assert ci["estimate"] == pytest.approx(2.0) and ci["p_floor"] == pytest.approx(0.25)
    assert 1.0 <= ci["ci_low"] < 2.0 < ci["ci_high"] <= 3.0
    keeps = got["static_keeps"]
    assert keeps["per_seed"] == pytest.approx([0.5, 0.4, 0.75])
    assert keeps["over_seeds"]["estimate"] == pytest.approx(1 - 0.2 / (1.3 / 3))
    md = (tmp_path / "table.md").read_text()
    assert f"| attn_gate | 3 | 2.0000 / 2.0000 / 2.0000 | 2.000 [{ci['ci_low']:.3f}, " in md
    assert "- attn_gate: 0.500 / 0.400 / 0.750; 0.538 [" in md


def test_one_seed_reports_its_own_intervals_over_windows(tmp_path):
    """An arm with one seed has no interval over seeds: its rows carry that seed's own
    intervals over windows (never NaN), and the share has no interval."""
    own = {k: {"estimate": e, "ci_low": e - 0.01, "ci_high": e + 0.01}
           for k, e in (("cross_input", 0.2), ("token_identity", 0.05), ("difference", -0.15))}
    f = study.seed_file(tmp_path, "deepseek_sigmoid", 0)
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"seed": 0, "layers": {
        "mean_delta": {"cross_input": [0.2], "token_identity": [0.05]},
        "per_layer": [{"layer": 0, **own}]}}))
    (row,) = study.report(tmp_path)["deepseek_sigmoid"]
    assert row["cross_input"] == own["cross_input"] and row["seeds"] == 1
    assert row["share_recovered"] == {"estimate": pytest.approx(0.75), "ci_low": None,
                                      "ci_high": None}
    md = (tmp_path / "table.md").read_text()
    assert "| deepseek_sigmoid | 0 | 1 | 0.2000 [0.1900, 0.2100] |" in md and "nan" not in md


def test_two_seeds_report_their_range_not_a_bootstrap(tmp_path):
    """Two seeds: the interval is the two seeds' range (a bootstrap over two values is
    no interval: it gave NaN), the share has none."""
    for seed, (c, t) in enumerate(((0.3, 0.1), (0.5, 0.2))):
        f = study.seed_file(tmp_path, "deepseek_sigmoid", seed)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"seed": seed, "layers": {"mean_delta": {
            "cross_input": [c], "token_identity": [t]}}}))
    (row,) = study.report(tmp_path)["deepseek_sigmoid"]
    assert row["seeds"] == 2
    assert (row["cross_input"]["estimate"], row["cross_input"]["ci_low"],
            row["cross_input"]["ci_high"]) == pytest.approx((0.4, 0.3, 0.5))
    assert row["share_recovered"] == {"estimate": pytest.approx(1 - 0.15 / 0.4),
                                      "ci_low": None, "ci_high": None}
    assert "nan" not in (tmp_path / "table.md").read_text()


def test_the_expert_figure_names_every_layer_of_every_arm():
    """A legend read off the first panel alone named the tiny arms' 4 layers, leaving the
    larger size's layers 4-7 unnamed."""
    seed = lambda layers: {"seed": 0, "spearman": [{"rho": 0.5}] * layers,
                           "reap_saliency": [[1.0, 2.0]] * layers,
                           "causal_delta_nll": [[0.1, 0.2]] * layers,
                           "causal_ci_low": [[0.05, 0.1]] * layers,
                           "causal_ci_high": [[0.15, 0.3]] * layers}
    fig = study.plot_experts({"arms": {"softmax_topk": [seed(4)],
                                       "softmax_topk_large": [seed(8)]}})
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        f"layer {i}" for i in range(8)]
