"""The FCA engine and audit.py end to end, on one tiny trained model (trained once per session).

Covers: exact replay on a trained feature_gate run (through the CLI), results.json / report.md
contents, ΔNLL = 0 exactly for a constant controller, a large cross_input ΔNLL for a model
whose function depends on its coefficients, a clear error for a perturbed replay and for bad
input, checkpoint-level statistics, and the MUDDPythia path on a tiny HF-style directory.
"""
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import audit_tiny
from dynjax.audit import interventions, run, stats
from dynjax.audit.engine import Engine
from dynjax.audit.settings import Settings
from dynjax.errors import AuditError, CheckpointError, ReplayError
from dynjax.runs.rundir import params_sha256
from dynjax.audit.per_checkpoint import audit_checkpoint
from dynjax.audit.summary import summarize
from dynjax.coeffs import Axes
from dynjax.data import text
from dynjax.models import build
from tests.conftest import tiny_config

W, T, R = 16, 32, 4   # windows (calibration and evaluation each), tokens, reassignments


def small(cfg):
    """An audit config scaled to the tiny test model."""
    cfg.reassignments = R
    cfg.batch_size = W
    cfg.data.calib_windows = W
    cfg.data.eval_windows = W
    cfg.stats.n_resamples = 999
    return cfg


@pytest.fixture(scope="session")
def windows():
    splits = text.load_splits()
    return (text.eval_windows(splits["validation"], T, W),
            text.eval_windows(splits["test"], T, W))


@pytest.fixture(scope="session")
def fg_run(tmp_path_factory):
    """A feature_gate run directory (2 layers, d=32), trained long enough to use context."""
    from dynjax.train.loop import train

    c = tiny_config("feature_gate", n_layers=2)
    c.train.update(steps=60, ckpt_every=60, warmup_steps=5, lr=1e-2)
    workdir = tmp_path_factory.mktemp("fg_run")
    train(c, str(workdir), progress=False)
    return str(workdir)


@pytest.fixture(scope="session")
def fg_audit(fg_run, tmp_path_factory):
    """audit.py's main, run in-process on the trained run: (results, out dir)."""
    import sys

    from absl import flags

    out = str(tmp_path_factory.mktemp("audit") / "fg")
    argv = ["audit.py", "--config=configs/audit_tiny.py", f"--config.reassignments={R}",
            f"--config.batch_size={W}", f"--config.data.calib_windows={W}",
            f"--config.data.eval_windows={W}", "--config.stats.n_resamples=999",
            f"--out={out}", "--checkpoints", fg_run]
    # config_flags reads the overrides from sys.argv at import
    assert "dynjax.programs.audit" not in sys.modules
    saved, sys.argv = sys.argv, argv
    try:
        from dynjax.programs import audit
        audit.main(flags.FLAGS(argv))
    finally:
        sys.argv = saved
        flags.FLAGS.unparse_flags()
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f), out


def test_exact_replay_and_every_condition_on_trained_feature_gate(fg_audit):
    res, _ = fg_audit
    assert res["replay"]["exact"] is True
    assert res["replay"]["max_abs_dlogit"] == 0.0
    assert res["replay"]["nll"] == res["replay"]["nll_replay"]
    assert list(res["conditions"]) == list(interventions.CONDITIONS)
    assert res["conditions"]["correct"]["estimate"] == 0.0
    ck = res["meta"]["checkpoints"][0]
    for name, per in ck["per_window"]["delta_nll"].items():
        shape = (R, W) if interventions.CONDITIONS[name].randomized else (W,)
        assert np.shape(per) == shape, name
        assert np.isclose(np.mean(per), res["conditions"][name]["estimate"])
    # one record + one replay per evaluation batch, one record for calibration,
    # 3 deterministic conditions, 3 randomized x R reassignments
    assert ck["forwards"] == {"record": 2, "replay": 1 + 3 + 3 * R}


def test_results_and_report_files(fg_audit, fg_run):
    res, out = fg_audit
    for name in ("results.json", "report.md", "delta_nll.png", "coeff_heatmap.png",
                 "depth_profile.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    assert res["unit"] == stats.UNIT_WINDOWS                       # one checkpoint
    assert res["meta"]["command"].startswith(                      # the audit.py command, not
        "python audit.py --config=configs/audit_tiny.py")          # the test runner's
    assert set(res["effects"]) == {"E_input", "E_token", "E_interaction"}
    assert all(e["p_holm"] is not None for e in res["effects"].values())
    sp = res["conditions"]["static_profile"]
    assert sp["label"] == "LayerMean" and res["conditions"]["structure_removed"]["label"] == \
        "GlobalMean"
    assert set(sp["verdicts"]) == {"practically_small", "high_retention"}
    assert "retention" in res["conditions"]["layer_position_mean"]
    assert set(res["variance"]["['gate']"]) >= {"layer", "example", "token", "residual"}
    assert np.shape(res["profiles"]["heatmap"]) == (2, T)
    meta = res["meta"]
    assert meta["settings"]["reassignments"] == R and len(meta["seeds"]["key_data"]) == R
    assert meta["config"]["criteria"] == {"small_nll_upper": 0.002, "high_retention_lower": 0.95}
    ck = meta["checkpoints"][0]
    from dynjax import coeffs as coeffs_lib
    from dynjax.runs import rundir
    _, _, params = rundir.load_params(fg_run)
    assert ck["params_sha256"] == params_sha256(params)
    assert meta["windows"]["calibration"] == meta["windows"]["evaluation"] == W
    md = open(os.path.join(out, "report.md")).read()
    assert "Replay: **exact** (bitwise: max |Δlogit| = 0.0)" in md and "single checkpoint" in md
    assert "| LayerMean |" in md and "E_interaction" in md


@pytest.fixture(scope="module")
def constant_model(windows):
    """A uniform model with a fixed gate of 0.75: its controller output never varies."""
    model = build(tiny_config("uniform", n_layers=2, uniform_value=0.75).model.to_dict())
    params = model.init(jax.random.key(0), jnp.asarray(windows[1][:1]))
    return model, params, Engine(model.apply, model.schema, W, T)


def test_constant_controller_gives_zero_for_every_condition(constant_model, windows):
    model, params, engine = constant_model
    calib, ev = windows
    out = audit_checkpoint(engine, params, calib, ev, Settings(reassignments=R))
    assert out["replay"]["exact"]
    for name, d in out["delta"].items():
        assert np.all(d == 0.0), name        # bit for bit, means included (0.75 is exact)
    res = summarize([out], Settings(reassignments=R), model.schema)
    assert all(e["estimate"] == 0.0 for e in res["effects"].values())


def test_perturbed_replay_is_refused(constant_model, windows):
    """Replaying anything but the cached coefficients stops the audit before interventions."""
    model, params, engine = constant_model

    class Perturbed:  # the engine's programs, but replay reads coefficients off by 1 ulp-ish
        def __init__(self, base):
            self.base = base

        def __getattr__(self, name):
            return getattr(self.base, name)

        def take_cached(self, cache, w_idx):
            return jax.tree.map(lambda a: a * (1 + 1e-6), self.base.take_cached(cache, w_idx))

    engine.programs = Perturbed(engine.programs)
    try:
        with pytest.raises(ReplayError, match="exact replay FAILED.*max .Δlogit. = "):
            audit_checkpoint(engine, params, *windows, Settings(reassignments=R))
    finally:
        engine.programs = engine.programs.base


def test_non_finite_parameters_are_named_not_blamed_on_replay(constant_model, windows):
    """A diverged run's NaN parameters make replay inexact (NaN != NaN): the audit says the
    parameters are not finite instead of telling the user to fix the model's apply."""
    model, params, engine = constant_model
    bad = jax.tree.map(lambda p: p * jnp.nan, params)
    with pytest.raises(AuditError, match=r"the parameters are not finite \(.* more arrays\): "
                       r"the run diverged, so replay cannot be judged"):
        audit_checkpoint(engine, bad, *windows, Settings(reassignments=R))


def test_model_that_depends_on_its_coefficients(fg_run, windows):
    """Positive control: a model that reads its input bytes from a coefficient leaf. Giving it
    another window's coefficients must cost a lot; the trained gates alone cost little."""
    from dynjax import coeffs as coeffs_lib
    from dynjax.runs import rundir

    _, model, params = rundir.load_params(fg_run)

    def apply(params, tokens, coeffs=None):   # its own coefficient site, as a family's
        given = coeffs_lib.as_given(coeffs)
        ids = coeffs_lib.site(tokens.astype(jnp.float32),
                              coeffs_lib.part(given, lambda c: c["ids"]))
        logits, c = model.apply(params, jnp.round(ids).astype(jnp.int32),
                                coeffs_lib.part(given, lambda c: {"gate": c["gate"]}))
        return logits, {"gate": c["gate"], "ids": ids}

    schema = {"gate": Axes(("layer", "example", "token")), "ids": Axes(("example", "token"))}
    settings = Settings(conditions=("correct", "cross_input"), reassignments=R)
    out = audit_checkpoint(Engine(apply, schema, W, T), params, *windows, settings)
    assert out["replay"]["exact"]
    dc = out["delta"]["cross_input"]
    assert dc.shape == (R, W) and dc.mean(axis=1).min() > 0.05, dc.mean(axis=1)
    assert (dc.mean(axis=0) > 0).mean() >= 0.75


def test_checkpoint_level_statistics_and_criteria():
    """Several checkpoints: each is one unit (bootstrap CI, exact sign flips, Holm)."""
    rng = np.random.default_rng(0)
    names = tuple(interventions.CONDITIONS)
    level = {"cross_input": 0.001, "token_shuffle": 0.002, "cross_shuffle": 0.0022,
             "layer_position_mean": 0.0005, "static_profile": 0.001, "structure_removed": 0.1}
    ckpts = []
    for _ in range(5):
        delta = {"correct": np.zeros(6)}
        for n in names[1:]:
            shape = (3, 6) if interventions.CONDITIONS[n].randomized else (6,)
            delta[n] = level[n] * (1 + 0.05 * rng.standard_normal(shape))
        ckpts.append({"delta": delta})
    s = Settings(reassignments=3, n_resamples=999)
    res = summarize(ckpts, s, {"gate": Axes(("layer", "example", "token"))})
    assert res["unit"] == stats.UNIT_CHECKPOINT
    ci = res["conditions"]["cross_input"]
    assert ci["n"] == 5 and ci["p"] == pytest.approx(2 / 32)   # 5 positive: exact 2/2^5
    assert ci["ci_low"] < ci["estimate"] < ci["ci_high"]
    sp = res["conditions"]["static_profile"]
    assert sp["verdicts"]["practically_small"]["met"] is True      # CI upper < 0.002
    assert sp["verdicts"]["high_retention"]["met"] is True         # ~99% retained
    assert sp["retention"]["estimate"] == pytest.approx(0.99, abs=0.002)
    e = res["effects"]
    assert e["E_input"]["estimate"] == pytest.approx((0.001 + 0.0022 - 0.002) / 2, rel=0.1)
    holm = stats.holm([e[k]["p"] for k in ("E_input", "E_token", "E_interaction")])
    assert [e[k]["p_holm"] for k in ("E_input", "E_token", "E_interaction")] == list(holm)
    strict = Settings(reassignments=3, n_resamples=999,
                      criteria=stats.Criteria(small_nll_upper=0.0005))
    res = summarize(ckpts, strict, {"gate": Axes(("layer", "example", "token"))})
    assert res["conditions"]["static_profile"]["verdicts"]["practically_small"]["met"] is False


@pytest.fixture(scope="module")
def fg_run_seed1(tmp_path_factory):
    """fg_run's config with seed 1: a second unit."""
    from dynjax.train.loop import train

    c = tiny_config("feature_gate", n_layers=2)
    c.train.update(steps=60, ckpt_every=60, warmup_steps=5, lr=1e-2)
    c.seed = 1
    workdir = tmp_path_factory.mktemp("fg_run_seed1")
    train(c, str(workdir), progress=False)
    return str(workdir)


def test_seeds_audited_apart_combine_to_the_joint_audit(fg_run, fg_run_seed1, fg_audit,
                                                        tmp_path):
    """Each seed audited as it finishes (seed 0: fg_audit, audit.py's run with these
    settings), then --combine: the same checkpoint-level numbers (CIs, p-values, retention,
    verdicts, effects) as auditing both seeds in one run."""
    from dynjax.audit.report import to_jsonable

    cfg, quiet = small(audit_tiny.get_config()), (lambda *_: None)
    joint = to_jsonable(run.audit_from_config(cfg, [fg_run, fg_run_seed1], progress=False,
                                              log=quiet))
    parts = [fg_audit[1], str(tmp_path / "seed1")]
    run.audit_from_config(cfg, [fg_run_seed1], out=parts[1], progress=False, log=quiet)
    run.combine_dirs(parts, out=str(tmp_path / "combined"))
    with open(tmp_path / "combined" / "results.json") as f:
        combined = json.load(f)
    assert combined["unit"] == joint["unit"] == stats.UNIT_CHECKPOINT
    assert combined["conditions"] == joint["conditions"]
    assert combined["effects"] == joint["effects"]
    assert combined["replay"] == joint["replay"]
    assert combined["conditions"]["static_profile"]["label"] == "LayerMean"
    assert [c["params_sha256"] for c in combined["meta"]["checkpoints"]] == \
        [c["params_sha256"] for c in joint["meta"]["checkpoints"]]
    assert [p["checkpoints"] for p in combined["meta"]["combined_from"]] == \
        [[pathlib.Path(fg_run).name], [pathlib.Path(fg_run_seed1).name]]
    np.testing.assert_allclose(combined["profiles"]["heatmap"], joint["profiles"]["heatmap"],
                               rtol=1e-12)
    assert os.path.exists(tmp_path / "combined" / "report.md")

    with pytest.raises(AuditError, match="at least two checkpoints"):
        run.combine_dirs(parts[:1])
    with pytest.raises(AuditError, match="appears twice"):
        run.combine_dirs([parts[0], parts[0]])
    with pytest.raises(AuditError, match="cannot read .*pass directories written by audit.py"):
        run.combine_dirs([parts[0], str(tmp_path / "missing")])
    other = small(audit_tiny.get_config())
    other.reassignments = R + 1
    run.audit_from_config(other, [fg_run_seed1], out=str(tmp_path / "r5"), progress=False,
                          log=quiet)
    with pytest.raises(AuditError, match="audit 2 differs from audit 1 in its settings"):
        run.combine_dirs([parts[0], str(tmp_path / "r5")])


def test_bad_input_names_the_fix(tmp_path, fg_run):
    cfg = small(audit_tiny.get_config())
    with pytest.raises(CheckpointError, match="does not exist; give a train.py run directory"):
        run.audit_from_config(cfg, [str(tmp_path / "missing")], progress=False)
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps(tiny_config("dense").to_dict()))
    with pytest.raises(AuditError, match="records no coefficients"):
        run.audit_from_config(cfg, [str(dense)], progress=False)
    cfg.data.seq_len = 64
    with pytest.raises(AuditError, match="seq_len=32 but the audit asks for data.seq_len=64"):
        run.audit_from_config(cfg, [fg_run], progress=False)
    with pytest.raises(AuditError, match="no checkpoints given"):
        run.audit_from_config(small(audit_tiny.get_config()), [], progress=False)
    with pytest.raises(AuditError, match="unknown condition"):
        Settings(conditions=("correct", "nope"))


def muddpythia_audit_config(cfg, tmp_path):
    """``cfg`` reading T-token windows from 4,000 bytes of the default corpus's validation
    and test splits, written as text files under tmp_path."""
    splits = text.load_splits()
    for name, split in (("valid", "validation"), ("test", "test")):
        (tmp_path / f"{name}.txt").write_bytes(splits[split][:4000].tobytes())
    cfg.data.seq_len = T
    cfg.data.validation_path = str(tmp_path / "valid.txt")
    cfg.data.test_path = str(tmp_path / "test.txt")
    return cfg


@pytest.fixture(scope="module")
def mudd_audit(tmp_path_factory):
    """(HF directory, audit config, results, logs) of the tiny MUDDPythia's audit."""
    from configs import audit_muddpythia
    from tests.unit.loaders.test_muddpythia import write_tiny_hf_dir

    tmp_path = tmp_path_factory.mktemp("mudd")
    hf = write_tiny_hf_dir(tmp_path / "hf")
    cfg = muddpythia_audit_config(small(audit_muddpythia.get_config()), tmp_path)
    cfg.reassignments = 2
    cfg.conditions = "correct,cross_input,layer_position_mean,static_profile,structure_removed"
    logs = []
    res = run.audit_from_config(cfg, muddpythia_dir=hf, out=str(tmp_path / "out"),
                                progress=False, log=logs.append)
    return hf, cfg, res, logs


def test_muddpythia_directory_path(mudd_audit):
    """--muddpythia on a tiny MUDDPythia saved as an HF directory, on local text files."""
    hf, cfg, res, logs = mudd_audit
    assert logs[0].startswith("MUDDPythia audit plan")
    assert res["replay"]["exact"] and res["replay"]["max_abs_dlogit"] == 0.0
    c = res["conditions"]
    assert c["static_profile"]["label"] == "StaticMixMean"
    assert c["structure_removed"]["label"] == "SourceUniformMean"
    assert np.isfinite(c["cross_input"]["estimate"]) and c["cross_input"]["estimate"] != 0
    assert res["meta"]["data"]["tokenizer"] == "bytes"
    assert res["meta"]["plan"]["windows"]["evaluation"] == W
    assert (pathlib.Path(hf).parent / "out" / "report.md").exists()
    cfg = cfg.copy_and_resolve_references()
    cfg.data.seq_len = 128   # beyond the tiny model's block_size of 64
    with pytest.raises(AuditError, match="exceeds the model's block_size"):
        run.audit_from_config(cfg, muddpythia_dir=hf, progress=False, log=logs.append)


def test_muddpythia_scorecard_reuses_the_audit(mudd_audit, tmp_path):
    """scorecard.score on the tiny MUDDPythia HF directory: the audit's ΔNLL rows and
    variance shares, every block executed, and FLOPs against static mixing (the DA MLPs
    replaced by their dense_bs bias) as XLA and memory_time_estimate count them."""
    from configs import scorecard as scorecard_config
    from dynjax import scorecard
    from dynjax.audit.report import to_jsonable
    from dynjax.loaders import muddpythia_hf
    from dynjax.measure.lm_execution import compiled_cost
    from dynjax.models import muddpythia

    hf, cfg, res, _ = mudd_audit
    config = scorecard_config.get_config()
    config.audit = cfg
    config.execution_windows, config.latency_batches, config.latency_repeats = 1, (1,), 1
    config.thresholds.latency_batch = 1
    card = scorecard.score(hf, config, tmp_path, log=lambda *a: None)
    for name, row in card["dependence"]["conditions"].items():
        for key in ("estimate", "ci_low", "ci_high", "p"):
            assert row[key] == res["conditions"][name][key], (name, key)
    assert to_jsonable(card["variation"]["variance"]) == to_jsonable(res["variance"])
    assert card["model"] == "muddpythia/muddpythia"
    ex = card["execution"]
    assert ex["executed_fraction"] == 1.0 and ex["baseline"] == "static mixing"
    mcfg, params, _ = muddpythia_hf.load_hf_dir(hf)
    one = jnp.zeros((1, T), jnp.int32)
    flops = lambda f: compiled_cost(lambda p, t: f(mcfg, p, t)[0], params, one)["flops"]
    assert ex["flops_ratio_compiled"] == (flops(muddpythia.apply)
                                          / flops(muddpythia.apply_static_mixing))
    est = muddpythia.memory_time_estimate(mcfg, 1, T, 1)
    assert ex["flops_ratio_analytic"] == (est["record_flops_per_window"]
                                          / est["static_mixing_flops_per_window"]) > 1
    assert card["verdicts"]["execution"].startswith("no skipping") and \
        "static mixing" in card["verdicts"]["execution"]


def test_static_mixing_is_replay_of_the_biases_without_the_da_mlps(mudd_audit):
    """apply_static_mixing returns each layer's dense_bs bias for every token as its mix, and
    the logits of replaying exactly those coefficients (the program that runs the DA MLPs)."""
    from dynjax.loaders import muddpythia_hf
    from dynjax.models import muddpythia

    mcfg, params, _ = muddpythia_hf.load_hf_dir(mudd_audit[0])
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, mcfg.vocab_size, (2, T)), jnp.int32)
    # each compiled as one program, as the audit and the scorecard run them (not op by op)
    logits, used = jax.jit(muddpythia.apply_static_mixing, static_argnums=0)(mcfg, params,
                                                                             tokens)
    for p, u in zip(params["layers"], used["mix"]):
        np.testing.assert_array_equal(np.asarray(u), np.broadcast_to(
            np.asarray(p["da"]["bias"], np.float32)[:, None, None, :], u.shape))
    replayed, _ = jax.jit(muddpythia.apply, static_argnums=0)(mcfg, params, tokens, used)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(replayed), rtol=1e-5, atol=1e-5)

    def matmuls(f):   # the dot_generals its program traces (two per DA MLP)
        jaxpr = jax.make_jaxpr(lambda p, t: f(mcfg, p, t)[0])(params, tokens)
        return sum(e.primitive.name == "dot_general" for e in jaxpr.eqns)
    assert matmuls(muddpythia.apply) - matmuls(muddpythia.apply_static_mixing) == 2 * mcfg.n_layer
    with pytest.raises(ValueError, match="static_mixing"):
        muddpythia.forward(mcfg, params, tokens, used, static_mixing=True)


def test_scorecard_reuses_the_audit_and_flop_report_numbers(fg_run, fg_audit, tmp_path):
    """The scorecard's dependence and variation panels are the audit's numbers, its FLOP
    ratio is flop_report's, and its verdicts follow the configured thresholds."""
    from configs import scorecard as scorecard_config
    from dynjax import scorecard
    from dynjax.runs import rundir
    from dynjax.measure import execution, lm_execution

    res, _ = fg_audit
    config = scorecard_config.get_config()
    small(config.audit)
    config.execution_windows, config.latency_batches, config.latency_repeats = 1, (1,), 1
    config.thresholds.latency_batch = 1
    card = scorecard.score(fg_run, config, tmp_path / "0", log=lambda *a: None)
    for name, row in card["dependence"]["conditions"].items():
        for key in ("estimate", "ci_low", "ci_high", "p"):
            assert row[key] == res["conditions"][name][key], (name, key)
    from dynjax.audit.report import to_jsonable
    assert to_jsonable(card["dependence"]["retention"]) == \
        res["conditions"]["static_profile"]["retention"]
    assert to_jsonable(card["variation"]["variance"]) == res["variance"]
    cfg = rundir.load_params(fg_run)[1].cfg
    ratio = (lm_execution.flop_report(cfg, 1, T)["compiled_flops"]
             / lm_execution.flop_report(execution.dense_twin(cfg), 1, T)["compiled_flops"])
    assert card["execution"]["flops_ratio_compiled"] == ratio
    assert card["execution"]["executed_fraction"] == 1.0
    assert card["verdicts"]["execution"].startswith("no skipping")
    config.thresholds.depends_min_dnll = -1.0   # any CI lower bound clears it
    assert scorecard.verdicts(card, config.thresholds)["dependence"].startswith("function depends")
    scorecard.write([card], tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "scorecard.json", "scorecard.md", "scorecard_0.png", "scorecard_0.svg",
        "scorecard_0.pdf"}


def test_scorecard_input_share_counts_only_what_varies_with_input():
    """A layer profile, an expert pattern or their interaction is static (share 0); a part
    that changes with the example is what varies, in proportion to its sum of squares."""
    from dynjax import scorecard
    layer = np.arange(3.0)[:, None, None, None]                # (layer, example, token, expert)
    expert = np.array([0.0, 2.0])[None, None, None, :]
    static = np.broadcast_to(layer * expert + layer, (3, 4, 5, 2))
    names = ("layer", "example", "token", "expert")
    assert scorecard.input_share(static, names) == 0.0
    example = np.array([-1.0, 1.0, -1.0, 1.0])[None, :, None, None]
    x = static + example
    ss = lambda a: np.sum((a - a.mean()) ** 2)
    assert scorecard.input_share(x, names) == pytest.approx(
        ss(np.broadcast_to(example, x.shape)) / ss(x), rel=1e-12)
