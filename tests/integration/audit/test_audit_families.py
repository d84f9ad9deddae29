"""audit.py on routing and unit-gating families: MoD, MoE (train.py runs) and DynamicGate-MLP
(a classifier train.py run), each trained for a few steps once per module.

Covers: exact replay and every condition through one engine (the per-window loss hook picks
next-token NLL or label cross-entropy from the run's config); conditions that need a token
axis reported as not applicable for unit gates; routing interventions keep MoD's capacity
(k tokens per example and block under every condition) and the multiset of router values;
MoE routing vectors move whole; ties of constant scores are reported.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import audit_tiny, mlp_common
from dynjax import tasks
from dynjax.audit import interventions, run, settings, summary
from dynjax.coeffs import replaying
from dynjax.data import text
from dynjax.errors import AuditError, CheckpointError
from dynjax.runs import rundir
from tests.conftest import tiny_config

W, T, R = 8, 32, 2          # windows (calibration and evaluation each), tokens, reassignments
K = 8                       # MoD capacity: floor(0.25 * 32)
LM_KEYS = {"title", "unit", "loss", "replay", "conditions", "effects", "variance", "profiles",
           "meta"}
TOKEN_CONDS = ("token_shuffle", "cross_shuffle", "layer_position_mean")


def audit_config(windows=W):
    c = audit_tiny.get_config()
    c.reassignments, c.batch_size = R, windows
    c.data.calib_windows = c.data.eval_windows = windows
    c.stats.n_resamples = 99
    return c


def lm_run(tmp, family, variant, **model):
    from dynjax.train.loop import train

    c = tiny_config("dense", n_layers=2, **model)
    c.model.update(family=family, variant=variant)
    c.train.update(steps=4, ckpt_every=4, eval_every=1000)
    c.eval.update(windows=8, batch_size=8)
    train(c, str(tmp), progress=False)
    return str(tmp)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny trained run directories: {"mod", "moe", "dgate"}."""
    from dynjax.data import tabular
    from dynjax.train.loop import train

    root = tmp_path_factory.mktemp("families")
    out = {"mod": lm_run(root / "mod", "mod", "mod", mod_capacity=0.25, mod_every=2),
           "moe": lm_run(root / "moe", "moe", "moe")}
    try:
        tabular.load("mnist5k")
    except tabular.DataError as e:
        pytest.skip(f"tabular data not fetched: {e}")
    c = mlp_common.base("dgate", "mnist5k")
    c.model.hidden = (16, 16)
    c.gate.update(warmup_steps=0, anneal_steps=2, ramp_steps=2)
    c.train.update(steps=4, batch_size=32, warmup_steps=1, eval_every=1000, ckpt_every=4,
                   log_every=2)
    c.eval.batch_size = 500
    train(c, str(root / "dgate"), progress=False)
    out["dgate"] = str(root / "dgate")
    return out


@pytest.fixture(scope="module")
def audits(runs, tmp_path_factory):
    """audit.py's program on each run: {name: (results.json contents, out dir)}."""
    out = {}
    for name, d in runs.items():
        dest = str(tmp_path_factory.mktemp("audit") / name)
        cfg = audit_config(16 if name == "dgate" else W)
        run.audit_from_config(cfg, [d], out=dest, progress=False, log=lambda _: None)
        with open(os.path.join(dest, "results.json")) as f:
            out[name] = json.load(f), dest
    return out


@pytest.mark.parametrize("name", ["mod", "moe"])
def test_routing_lm_exact_replay_and_every_condition(audits, name):
    res, dest = audits[name]
    assert LM_KEYS <= set(res) and os.path.exists(os.path.join(dest, "report.md"))
    assert res["replay"]["exact"] is True and res["replay"]["max_abs_dlogit"] == 0.0
    assert list(res["conditions"]) == list(interventions.CONDITIONS)
    assert all(np.isfinite(r["estimate"]) for r in res["conditions"].values())
    assert set(res["effects"]) == set(summary.EFFECTS)
    meta = res["meta"]
    assert meta["task"] == "next_token" and meta["not_applicable"] == {}
    ck = meta["checkpoints"][0]
    assert ck["family"] == name
    assert np.shape(ck["per_window"]["delta_nll"]["cross_input"]) == (R, W)
    # Averaging over tokens leaves every position tied; the report says so.
    assert ck["constant_along"]["static_profile"] == {"['router']": ["token"]}
    assert "token" in ck["constant_along"]["structure_removed"]["['router']"]
    md = open(os.path.join(dest, "report.md")).read()
    assert f"Loss: {res['loss']}." in md
    assert "under LayerMean, `['router']` is constant along token: top-k ties" in md
    heat = np.asarray(res["profiles"]["heatmap"])
    assert heat.shape == ((1, T) if name == "mod" else (2, T))   # MoD blocks / MoE layers
    if name == "moe":   # top routing probability per token, not the trivial mean 1/E
        assert np.all(heat > 1 / 4) and np.all(heat <= 1)
        assert ck["constant_along"]["structure_removed"]["['router']"] == ["token", "expert"]


def test_dynamic_gate_classifier_audit(audits, runs):
    res, dest = audits["dgate"]
    assert {"title", "unit", "loss", "replay", "conditions", "effects", "variance",
            "meta"} <= set(res)
    assert "label" in res["loss"] and res["meta"]["task"] == "classification"
    assert res["replay"]["exact"] is True and res["replay"]["max_abs_dlogit"] == 0.0
    assert list(res["conditions"]) == list(interventions.CONDITIONS)
    for name, row in res["conditions"].items():
        if name in TOKEN_CONDS:   # no token axis in unit gates: not run, no fake numbers
            assert row["estimate"] is None and "token axis" in row["not_applicable"]
        else:
            assert np.isfinite(row["estimate"]), name
    assert all(e["estimate"] is None and "not applicable" in e["note"]
               for e in res["effects"].values())
    assert set(res["meta"]["not_applicable"]) == set(TOKEN_CONDS)
    ck = res["meta"]["checkpoints"][0]
    assert ck["family"] == "gated_mlp" and ck["variant"] == "dgate"
    assert ck["gate_schedule"] == {"tau": 0.5, "theta": 0.5, "gates_open": False}
    assert set(ck["per_window"]["delta_nll"]) == {"correct", "cross_input", "static_profile",
                                                  "structure_removed"}
    assert np.shape(ck["per_window"]["delta_nll"]["cross_input"]) == (R, 16)
    assert res["meta"]["windows"]["window_shapes"] == {"x": [784], "y": []}
    assert "['p']" in res["variance"]
    md = open(os.path.join(dest, "report.md")).read()
    assert "## Notes" in md and "token_shuffle: not applicable" in md and "Loss: " in md


@pytest.fixture(scope="module")
def recorded(runs):
    """The MoD and MoE runs' models, params, and evaluation / calibration coefficients."""
    splits = text.load_splits()
    ev = jnp.asarray(text.eval_windows(splits["test"], T, W))
    cal = jnp.asarray(text.eval_windows(splits["validation"], T, W))
    out = {}
    for name in ("mod", "moe"):
        _, model, params = rundir.load_params(runs[name])
        record = jax.jit(model.apply)
        out[name] = model, params, ev, record(params, ev)[1], record(params, cal)[1]
    return out


def conditioned(cache, calib, schema):
    """{condition: coefficients of the whole evaluation set} as the engine builds them."""
    key = settings.reassignment_keys(0, R)[0]
    return {n: interventions.apply_condition(n, cache, schema, key=key, calib=calib)
            for n in interventions.CONDITIONS}


def test_routing_interventions_keep_mod_capacity_and_router_values(recorded):
    model, params, ev, cache, calib = recorded["mod"]
    stats = jax.jit(lambda c: model.module.apply({"params": params}, ev, replaying(c),
                                                 mutable=["mod_stats"])[1]["mod_stats"])
    base = np.sort(np.asarray(cache["router"]).reshape(cache["router"].shape[0], -1), axis=-1)
    for name, c in conditioned(cache, calib, model.schema).items():
        entered = np.asarray(stats(c)["stats"][0]["entered"])          # (blocks, W, T)
        np.testing.assert_array_equal(entered.sum(-1), K, err_msg=name)
        if interventions.CONDITIONS[name].randomized or name == "correct":
            r = np.asarray(c["router"])
            assert not name != "correct" or not np.array_equal(r, np.asarray(cache["router"]))
            np.testing.assert_array_equal(np.sort(r.reshape(r.shape[0], -1), axis=-1), base,
                                          err_msg=name)   # same values, new assignment


def test_routing_interventions_move_whole_moe_routing_vectors(recorded):
    """Each token's routing vector over experts moves as a whole (values kept, assignment
    changed); expert capacity is static (moe.expert_capacity), so no condition changes it."""
    model, _, _, cache, calib = recorded["moe"]
    rows = lambda c: np.unique(np.asarray(c["router"]).reshape(-1, 4), axis=0)
    for name, c in conditioned(cache, calib, model.schema).items():
        if interventions.CONDITIONS[name].randomized:
            np.testing.assert_array_equal(rows(c), rows(cache), err_msg=name)
            assert not np.array_equal(np.asarray(c["router"]), np.asarray(cache["router"]))


def test_dynamic_gate_scorecard_reuses_the_audit_and_relmac(audits, runs, tmp_path):
    """A classifier run's scorecard: its dependence and variance rows are the audit's (same
    examples and settings), its open units and RelMAC are macs.report's of the masked
    forward at the checkpoint's gate schedule, its FLOP ratios XLA's and the analytic count
    of that forward against the dense MLP; the masked forward cannot save FLOPs."""
    from configs import scorecard as scorecard_config
    from dynjax import scorecard
    from dynjax.models import gate_schedule
    from dynjax.audit.targets import open_target
    from dynjax.audit.report import to_jsonable
    from dynjax.measure import macs
    from dynjax.measure.lm_execution import compiled_cost
    from dynjax.models import build

    res, _ = audits["dgate"]
    config = scorecard_config.get_config()
    config.audit = audit_config(16)
    config.classifier_examples, config.latency_batches = 16, (1,)
    config.classifier_latency_repeats, config.thresholds.latency_batch = 1, 1
    card = scorecard.score(runs["dgate"], config, tmp_path, log=lambda *a: None)
    assert set(card["dependence"]["conditions"]) == {"cross_input", "static_profile",
                                                     "structure_removed"}
    for name, row in card["dependence"]["conditions"].items():
        for key in ("estimate", "ci_low", "ci_high", "p"):
            assert row[key] == res["conditions"][name][key], (name, key)
    assert to_jsonable(card["variation"]["variance"]) == res["variance"]

    config_run = rundir.read_config(runs["dgate"])
    run = rundir.load(runs["dgate"])
    sched = gate_schedule.apply_settings(config_run, run.step)
    assert card["gate_settings"] == sched
    _, ev, _ = open_target(runs["dgate"]).windows(config.audit.data, 16, 16)
    _, _, aux = run.model.apply(run.params, jnp.asarray(ev["x"]), with_aux=True, **sched)
    rep = macs.report(run.model.dims, macs.model_mac_sums(run.model, aux["open"]), 16)
    ex = card["execution"]
    assert ex["relmac"] == pytest.approx(rep["relmac"], rel=1e-12)
    np.testing.assert_allclose(ex["open_units_per_example"],
                               [float(np.mean(np.sum(o, -1))) for o in aux["open"]], rtol=1e-6)
    x1 = jnp.zeros((1, 784))
    dense = build(dict(run.model.cfg.__dict__, family="gated_mlp", variant="dense"))
    flops = lambda m, p, **kw: compiled_cost(lambda p, x: m.apply(p, x, **kw)[0], p, x1)["flops"]
    assert ex["flops_ratio_compiled"] == flops(run.model, run.params, **sched) / flops(
        dense, jax.eval_shape(dense.init, jax.random.key(0), x1))
    dims = run.model.dims        # 784-16-16-10 and a GateNet of r = 16 per hidden layer
    dense_macs = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    ctrl = sum(n_in * 16 + 16 * n for n_in, n in zip(dims[:-2], dims[1:-1]))
    assert ex["flops_ratio_analytic"] == pytest.approx((dense_macs + ctrl) / dense_macs)
    assert ex["flops_ratio_analytic"] > 1 and "structured" not in ex
    assert card["verdicts"]["execution"].startswith("no skipping")
    assert set(ex["latency"]) == {"forward_b1"}


def test_open_target_opens_every_kind(runs, tmp_path):
    """``open_target`` recognises each kind of checkpoint the tests build (a language-model
    run, a classifier run, a MUDDPythia HF directory) and gives it one interface: the model,
    the parameters the run directory holds, the task, the windows and a label. A classifier
    records its family in config.json; a run directory written before that still opens."""
    import shutil

    import chex

    from dynjax.audit.targets import ClassifierRun, LmRun, MuddPythiaDir, open_target
    from tests.unit.loaders.test_muddpythia import write_tiny_hf_dir

    lm = open_target(runs["moe"])
    assert isinstance(lm, LmRun) and lm.task is tasks.LM and lm.label == "moe/moe"
    assert lm.schema == rundir.load(runs["moe"]).model.schema and lm.has_coefficients
    chex.assert_trees_all_equal(lm.params, rundir.load(runs["moe"]).params)
    calib, ev, info = lm.windows(audit_config().data, 3, 5)
    assert calib.shape == (3, T) and ev.shape == (5, T) and info["evaluation_split"] == "test"
    assert lm.info["step"] == 4 and lm.info["family"] == "moe"
    assert open_target(runs["moe"], step=4).info["step"] == 4     # a saved step, by number
    assert lm.text().encode("é") == [0xC3, 0xA9]                   # a run's text is bytes

    assert json.loads(open(os.path.join(runs["dgate"], "config.json")).read()
                      )["model"]["family"] == rundir.CLASSIFIER_FAMILY
    old = tmp_path / "old_dgate"
    shutil.copytree(runs["dgate"], old)
    cfg = json.loads((old / "config.json").read_text())
    del cfg["model"]["family"]
    (old / "config.json").write_text(json.dumps(cfg))
    for path in (runs["dgate"], old):
        clf = open_target(path)
        assert isinstance(clf, ClassifierRun) and clf.task is tasks.CLASSIFY
        assert clf.label == "gated_mlp/dgate" and clf.family == "gated_mlp"
        _, ev, _ = clf.windows(audit_config().data, 2, 3)
        assert ev["x"].shape == (3, 784) and ev["y"].shape == (3,)
        assert set(clf.gate_settings) == {"tau", "theta", "gates_open"}
    chex.assert_trees_all_equal(open_target(old).params, clf.params)
    # resuming the old directory keeps its config.json's form (no silent rewrite)
    assert "family" not in rundir.with_recorded_family(
        rundir.read_config(old), old).model
    fresh = rundir.read_config(old)
    assert rundir.with_recorded_family(fresh, tmp_path / "new").model.family == "gated_mlp"

    hf = write_tiny_hf_dir(tmp_path / "hf")
    mudd = open_target(hf)
    assert isinstance(mudd, MuddPythiaDir) and mudd.task is tasks.LM
    assert mudd.label == "muddpythia/muddpythia" and mudd.info["family"] == "muddpythia"
    assert set(mudd.schema) == set(mudd.model.schema) and mudd.has_coefficients

    with pytest.raises(CheckpointError, match="does not exist; give a train.py run directory"):
        open_target(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="unknown checkpoint kind"):
        open_target(hf, kind="nope")
    with pytest.raises(CheckpointError, match="holds one set of weights"):
        open_target(hf, step=1)
    with pytest.raises(AuditError, match="different kinds"):
        run.audit_from_config(audit_config(), [runs["moe"], runs["dgate"]], progress=False)
