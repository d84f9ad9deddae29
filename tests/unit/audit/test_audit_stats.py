"""FCA statistics reproduce the paper's derived numbers; variance shares; atomic reports."""
import json

import numpy as np
import pytest

from dynjax.audit import per_checkpoint, report, stats, variance
from dynjax.coeffs import Axes


def test_factorial_effects_paper_featuregate_76m():
    cc, dc, cs, inter = 0.0, 0.000951, 0.001905, -0.000968
    ds = inter + dc + cs - cc
    e = stats.factorial_effects(cc, dc, cs, ds)
    assert abs(e["E_input"] - 0.000466) < 1.5e-6   # paper rounds per-seed means
    assert abs(e["E_token"] - 0.001421) < 1e-9
    assert abs(e["E_interaction"] - inter) < 1e-12
    per_ckpt = stats.factorial_effects(np.zeros(3), [1.0, 2, 3], [2.0, 2, 2], [3.0, 4, 5])
    np.testing.assert_allclose(per_ckpt["E_input"], [1.0, 2.0, 3.0])
    np.testing.assert_allclose(per_ckpt["E_interaction"], [0.0, 0.0, 0.0])
    assert per_ckpt["E_token"].dtype == np.float64


def test_retention_paper_numbers():
    assert round(float(stats.retention(0.001287, 0.098)), 4) == 0.9869
    mudd = stats.retention([1.9798, 1.0190], 7.4237)
    np.testing.assert_array_equal(np.round(mudd, 4), [0.7333, 0.8627])


def test_sign_flip_exact():
    t = stats.sign_flip_test([0.1, 0.2, 0.05, 0.3, 0.01, 0.02, 0.4])
    assert t["p"] == 2 / 128 and "2^7" in t["method"]
    assert stats.sign_flip_test([1.0, -1.0])["p"] == 1.0
    # a mixed-sign case against brute force over all 2^8 sign flips
    x = np.array([0.3, 0.2, -0.05, 0.4, 0.1, 0.25, 0.15, 0.35])
    signs = np.array(np.meshgrid(*[[-1, 1]] * 8)).reshape(8, -1).T
    means = (signs * np.abs(x)).mean(1)
    brute = 2 * min((means >= x.mean() - 1e-12).mean(), (means <= x.mean() + 1e-12).mean())
    assert stats.sign_flip_test(x)["p"] == pytest.approx(min(brute, 1.0))
    big = stats.sign_flip_test(np.linspace(0.1, 1, 40))
    assert "Monte Carlo" in big["method"] and big["p"] < 1e-3


def test_holm_known_values():
    np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(stats.holm([2 / 128, 2 / 128, 0.5]), [3 / 64, 3 / 64, 0.5])
    out = stats.holm([0.01, np.nan, 0.02])
    assert np.isnan(out[1]) and np.allclose(out[[0, 2]], [0.02, 0.02])


def test_bootstrap_ci_and_small_n():
    v = np.array([0.0011, 0.0013, 0.0012, 0.0016, 0.0010, 0.0014, 0.0013])
    s = stats.bootstrap_ci(v, seed=3)
    assert s["ci_low"] < v.mean() < s["ci_high"] and s["estimate"] == pytest.approx(v.mean())
    assert v.min() <= s["ci_low"] and s["ci_high"] <= v.max()
    assert s == stats.bootstrap_ci(v, seed=3) and s["unit"] == stats.UNIT_CHECKPOINT
    for n in (1, 2):
        s = stats.bootstrap_ci(v[:n])
        assert np.isnan(s["ci_low"]) and np.isnan(s["ci_high"]) and f"n={n}" in s["note"]
    s = stats.bootstrap_ci([0.5, 0.5, 0.5])
    assert (s["ci_low"], s["ci_high"]) == (0.5, 0.5)
    full = stats.summarize_checkpoints(v)
    assert full["p"] == 2 / 128 and full["ci_high"] < 0.002
    assert stats.practically_small(full)["met"] is True
    assert stats.practically_small(dict(full, ci_high=0.0025))["met"] is False
    assert stats.practically_small(stats.summarize_checkpoints(v[:2]))["met"] is None


def test_retention_ci_is_ratio_of_means():
    s = np.array([0.0011, 0.0013, 0.0012, 0.0016, 0.0010, 0.0014, 0.0013])
    r = np.array([0.095, 0.1, 0.098, 0.102, 0.094, 0.099, 0.097])
    out = stats.retention_ci(s, r, seed=0)
    assert out["estimate"] == pytest.approx(1 - s.mean() / r.mean())
    assert 0.95 < out["ci_low"] < out["estimate"] < out["ci_high"] < 1
    assert stats.high_retention(out)["met"] is True
    assert np.isnan(stats.retention_ci(s[:2], r[:2])["ci_low"])
    with pytest.raises(ValueError, match="paired"):
        stats.retention_ci(s, r[:3])


def test_single_checkpoint_window_summary():
    rng = np.random.default_rng(0)
    d = 0.001 + 0.0005 * rng.standard_normal((5, 40))  # 5 reassignments x 40 windows
    out = stats.summarize_windows(d, seed=1)
    assert out["unit"] == stats.UNIT_WINDOWS and out["n"] == 40
    assert out["estimate"] == pytest.approx(d.mean())
    assert out["ci_low"] < d.mean() < out["ci_high"] and "crossed" in out["ci_method"]
    one = stats.summarize_windows(d[0], seed=1)
    assert one["ci_low"] < d[0].mean() < one["ci_high"] and "windows" in one["ci_method"]
    assert out["p"] < 0.01


@pytest.mark.parametrize("level", [0.95, 0.8])
def test_crossed_bootstrap_interval_has_its_level(level):
    """Reassignment and window effects that add (x[r, w] = a_r + b_w): resampling both
    crossed, the grand mean's variance is var(a) / R + var(b) / W (plug-in variances), so
    a ``level`` interval's half-width is z * SE. An interval with the wrong tails (e.g. 90%
    for 95%) is 16% narrower."""
    rng = np.random.default_rng(0)
    R, W = 40, 400
    a, b = rng.standard_normal(R), 2.0 * rng.standard_normal(W)
    out = stats.summarize_windows(a[:, None] + b[None, :], level=level, seed=3)
    se = np.sqrt(a.var() / R + b.var() / W)
    z = {0.95: 1.959964, 0.8: 1.281552}[level]
    half = (out["ci_high"] - out["ci_low"]) / 2
    assert half / (z * se) == pytest.approx(1.0, abs=0.05)
    assert (out["ci_low"] + out["ci_high"]) / 2 == pytest.approx(a.mean() + b.mean(),
                                                                 abs=0.1 * se)


def test_variance_decomposition_additive_design():
    L, E, T = 4, 5, 6
    a = np.array([-3.0, -1.0, 1.0, 3.0])               # layer effects, zero mean
    b = np.linspace(-0.2, 0.2, E)
    c = np.linspace(-0.1, 0.1, T)
    x = 0.7 + a[:, None, None] + b[None, :, None] + c[None, None, :]
    sh = variance.decompose(x, ("layer", "example", "token"))
    ss = {"layer": E * T * (a ** 2).sum(), "example": L * T * (b ** 2).sum(),
          "token": L * E * (c ** 2).sum()}
    total = sum(ss.values())
    for k in ss:
        assert sh[k] == pytest.approx(ss[k] / total)
    assert abs(sh["residual"]) < 1e-12 and sh["total_ss"] == pytest.approx(total)
    # a per-layer list of leaves is stacked into a layer factor
    per_layer = variance.decompose_coeffs({"g": [x[i] for i in range(L)]},
                                          {"g": [Axes(("example", "token"))] * L})
    assert per_layer["['g']"]["layer"] == pytest.approx(sh["layer"])
    ragged = variance.decompose_coeffs(
        {"m": [np.ones((2, E, T, 2)), np.arange(2 * E * T * 3.0).reshape(2, E, T, 3)]},
        {"m": [Axes(("stream", "example", "token", "source"))] * 2})
    assert set(ragged) == {"['m'][0]", "['m'][1]"} and np.isnan(ragged["['m'][0]"]["stream"])
    assert sum(v for k, v in ragged["['m'][1]"].items() if k != "total_ss") == pytest.approx(1)


def results_fixture():
    rng = np.random.default_rng(0)
    gate = rng.uniform(size=(3, 4, 8))
    v = np.array([0.0011, 0.0013, 0.0012, 0.0016, 0.0010, 0.0014, 0.0013])
    ref = np.array([0.095, 0.1, 0.098, 0.102, 0.094, 0.099, 0.097])
    lm = stats.summarize_checkpoints(v)
    lm.update(label="LayerMean", retention=stats.retention_ci(v, ref),
              verdicts={"practically_small": stats.practically_small(lm)})
    effects = {k: stats.summarize_checkpoints(np.full(7, 0.001) + 1e-4 * np.arange(7))
               for k in ("E_input", "E_token", "E_interaction")}
    for e, p in zip(effects.values(), stats.holm([e["p"] for e in effects.values()])):
        e["p_holm"] = p
    return {"title": "FCA test", "unit": stats.UNIT_CHECKPOINT,
            "replay": {"exact": True, "max_abs_dlogit": 0.0, "nll": 1.5, "nll_replay": 1.5},
            "conditions": {"correct": stats.summarize_checkpoints(np.zeros(7)),
                           "static_profile": lm,
                           "structure_removed": dict(stats.summarize_checkpoints(ref),
                                                     label="GlobalMean")},
            "effects": effects,
            "variance": variance.decompose_coeffs({"gate": gate},
                                                  {"gate": Axes(("layer", "example", "token"))}),
            "profiles": per_checkpoint.coefficient_profiles(
                {"gate": gate}, {"gate": Axes(("layer", "example", "token"))}),
            "meta": {"seeds": [1, 2, 3], "note": np.float64(np.nan)}}


def test_report_writes_all_files(tmp_path):
    res = results_fixture()
    out = report.write_report(res, tmp_path / "audit")
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["report.md", "results.json", *report.PLOTS,
                            *(p.replace(".png", twin) for p in report.PLOTS
                              for twin in (".svg", ".pdf"))])
    loaded = json.loads((out / "results.json").read_text())
    lm = loaded["conditions"]["static_profile"]
    assert lm["estimate"] == pytest.approx(0.0089 / 7) and lm["p"] == 2 / 128
    assert loaded["meta"]["note"] is None and len(loaded["profiles"]["heatmap"]) == 3
    md = (out / "report.md").read_text()
    assert "| condition | ΔNLL | 95% CI | p | Holm p |" in md
    assert "| LayerMean | 0.001271 |" in md and "practically_small: met" in md
    assert "| E_input |" in md and "GlobalMean" in md
    assert all((out / p).read_bytes()[:4] == b"\x89PNG" for p in report.PLOTS)
    assert [p.name for p in tmp_path.iterdir()] == ["audit"]  # no temp leftovers


def test_report_failure_leaves_nothing_half_written(tmp_path, monkeypatch):
    def boom(_):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(report, "plot_depth_profile", boom)
    with pytest.raises(RuntimeError, match="injected"):
        report.write_report(results_fixture(), tmp_path / "audit")
    assert list(tmp_path.iterdir()) == []
    # an existing report survives a failed rewrite untouched
    monkeypatch.undo()
    out = report.write_report(results_fixture(), tmp_path / "audit")
    before = (out / "results.json").read_bytes()
    monkeypatch.setattr(report, "plot_heatmap", boom)
    with pytest.raises(RuntimeError):
        report.write_report(dict(results_fixture(), title="changed"), out)
    assert (out / "results.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["audit"]


def test_monte_carlo_sign_flip_matches_the_exact_test():
    x = np.random.default_rng(3).normal(0.3, 1.0, 16)
    exact = stats.sign_flip_test(x)["p"]                      # all 2^16 flips
    mc = stats.sign_flip_test(x, max_exact=0, n_resamples=40000)
    assert mc["method"].startswith("Monte Carlo")
    assert abs(mc["p"] - exact) < 4 * np.sqrt(exact * (1 - exact) / 40000) + 1e-4
    # Tiny chunks (7 flips at a time) bound memory and still estimate the same p.
    small = stats._monte_carlo_sign_flip(x, 40000, seed=0, chunk_values=16 * 7)
    assert abs(small - exact) < 4 * np.sqrt(exact * (1 - exact) / 40000) + 1e-4
    assert stats.sign_flip_test(np.zeros(30))["p"] == 1.0    # every flip ties: p = 1


# --------------------------------------- retention's two definitions, small n, resamples, replay

def _table_checkpoints(static, reference, windows=4):
    """One checkpoint per (static, reference) pair: every condition's per-window ΔNLL is
    constant, so a checkpoint's mean is exactly the table's value."""
    from dynjax.audit import interventions

    out = []
    for i, (s, r) in enumerate(zip(static, reference)):
        delta = {}
        for name, cond in interventions.CONDITIONS.items():
            v = {"correct": 0.0, "static_profile": s, "structure_removed": r}.get(name, s + i)
            delta[name] = np.full((2, windows) if cond.randomized else (windows,), float(v))
        out.append({"delta": delta})
    return out


SCHEMA = {"gate": Axes(("layer", "example", "token"))}


def test_retention_ratio_of_means_and_mean_of_ratios_known_answer():
    """S = (1, 2, 3), R = (2, 4, 12): ratio of means 1 - 6/18 = 2/3 (primary, what the
    criterion reads); mean of per-checkpoint ratios 1 - (1/2 + 1/2 + 1/4)/3 = 7/12."""
    from dynjax.audit.settings import Settings
    from dynjax.audit.summary import summarize

    r = stats.retention_ci([1.0, 2.0, 3.0], [2.0, 4.0, 12.0], n_resamples=999)
    assert r["estimate"] == pytest.approx(2 / 3, rel=1e-15)
    assert r["mean_of_ratios"] == pytest.approx(7 / 12, rel=1e-15)
    assert "ratio of means" in r["definition"] and "high-retention criterion" in r["definition"]
    res = summarize(_table_checkpoints([1.0, 2.0, 3.0], [2.0, 4.0, 12.0]),
                    Settings(reassignments=2, n_resamples=999), SCHEMA)
    ret = res["conditions"]["static_profile"]["retention"]
    assert (ret["estimate"], ret["mean_of_ratios"]) == pytest.approx((2 / 3, 7 / 12), rel=1e-15)
    verdict = res["conditions"]["static_profile"]["verdicts"]["high_retention"]
    assert verdict["met"] is (ret["ci_low"] > 0.95)               # the ratio of means' CI
    md = report.render_markdown({"title": "t", "unit": res["unit"], "conditions":
                                 res["conditions"], "replay": {"exact": True}}, [])
    assert "66.67% [" in md and "mean of ratios 58.33%" in md
    assert stats.RETENTION_DEFINITION in md


def test_few_checkpoints_warn_and_report_the_p_floor(capsys):
    from dynjax.audit.settings import Settings
    from dynjax.audit.summary import summarize

    s = Settings(reassignments=2, n_resamples=999)
    res = summarize(_table_checkpoints([1.0, 2.0, 3.0], [2.0, 4.0, 12.0]), s, SCHEMA)
    w = res["small_n_warning"]
    assert "only 3 checkpoints" in w and "at least 5" in w and "2/2^3 = 0.25" in w
    assert res["conditions"]["cross_input"]["p_floor"] == 0.25
    assert res["conditions"]["cross_input"]["p"] == 0.25         # all positive: at the floor
    assert res["effects"]["E_input"]["p_floor"] == 0.25
    md = report.render_markdown({"title": "t", "unit": res["unit"], "replay": {"exact": True},
                                 "conditions": res["conditions"], "small_n_warning": w}, [])
    assert f"**Warning:** {w}." in md
    five = summarize(_table_checkpoints([1.0, 2, 3, 4, 5], [9.0, 9, 9, 9, 9]), s, SCHEMA)
    assert "small_n_warning" not in five
    assert five["conditions"]["cross_input"]["p_floor"] == 2 / 32
    assert stats.sign_flip_floor(1) == 1.0 and stats.sign_flip_floor(10) == 2 / 1024


def test_configured_bootstrap_resamples_are_used(monkeypatch):
    """Every checkpoint-level interval (conditions, effects, retention) resamples
    Settings.n_resamples times, the count results.json records."""
    from dynjax.audit.settings import Settings
    from dynjax.audit.summary import summarize

    seen, real = [], stats.scipy.stats.bootstrap

    def spy(*args, **kw):
        seen.append(kw["n_resamples"])
        return real(*args, **kw)

    monkeypatch.setattr(stats.scipy.stats, "bootstrap", spy)
    summarize(_table_checkpoints([1.0, 2.0, 3.0], [2.0, 4.0, 12.0]),
              Settings(reassignments=2, n_resamples=321), SCHEMA)
    assert len(seen) >= 8 and set(seen) == {321}, seen


def test_replay_accepted_under_a_tolerance_says_so():
    from dynjax.audit.run import verdict_table

    rep = {"exact": False, "max_abs_dlogit": 3.1e-6, "atol": 1e-5, "nll": 1.0,
           "nll_replay": 1.0}
    results = {"title": "t", "unit": "checkpoint", "replay": rep, "conditions": {}}
    for text in (report.render_markdown(results, []), verdict_table(results)):
        assert "FAILED" not in text
        assert "not exact, accepted within the configured tolerance" in text
        assert "replay_atol = 1e-05 (max |Δlogit| = 3.1e-06)" in text
    exact = dict(rep, exact=True, max_abs_dlogit=0.0)
    assert "Replay: **exact** (bitwise" in report.render_markdown(dict(results, replay=exact), [])
