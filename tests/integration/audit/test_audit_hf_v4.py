"""audit.py --hf on the indexer and hyper-connection models (issue 47): the tiny DeepSeek-V4
gives one table per coefficient family (mHC's pre/post/comb around attention, the FFN and
the head together; the learned router; the hash router, whose table says its experts come
from the token-id table, a parameter; the indexer, with Recent-keys, the static control of
"the same number of keys, by position only"), each with Correct's ΔNLL 0 bit for bit; the
tiny DeepSeek-V3.2 gives its indexer's table."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.subprocess   # every test here runs audit.py

HF = os.path.join(ROOT, "tests", "data", "hf")
SMALL = ["--config.reassignments=2", "--config.batch_size=4", "--config.data.calib_windows=4",
         "--config.data.eval_windows=4", "--config.data.seq_len=16",
         "--config.stats.n_resamples=99"]
CONDITIONS = "correct,cross_input,token_shuffle,static_profile,structure_removed,recent_keys"
FAMILIES = {"mhc": ["mhc_attn", "mhc_ffn", "mhc_head"], "router": ["router"],
            "hash_router": ["hash_router"], "indexer": ["indexer"]}


def _audit(arch, out, *extra):
    args = [sys.executable, "audit.py", "--config=configs/audit_hf.py", f"--hf={HF}/{arch}",
            f"--out={out}", *SMALL, *extra]
    run = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr[-3000:]
    with open(os.path.join(out, "results.json")) as f:
        return run.stdout, json.load(f), open(os.path.join(out, "report.md")).read()


@pytest.fixture(scope="module")
def v4_audit(tmp_path_factory):
    return _audit("deepseek_v4", str(tmp_path_factory.mktemp("v4") / "audit"),
                  f"--config.conditions={CONDITIONS}")


def test_v4_one_table_per_coefficient_family(v4_audit):
    stdout, res, report = v4_audit
    assert stdout.startswith("HF deepseek_v4 audit plan: 4 layers, dim 32, 94,629 params")
    assert res["replay"]["exact"] is True
    assert {f: t["sites"] for f, t in res["families"].items()} == FAMILIES
    per_family = res["meta"]["checkpoints"][0]["families"]
    for fam, sites in FAMILIES.items():
        assert f"\nfamily {fam} ({', '.join(sites)}; the other coefficients" in stdout
        assert f"## Family `{fam}`" in report
        table, per_window = res["families"][fam], per_family[fam]["per_window"]["delta_nll"]
        assert table["conditions"]["correct"]["estimate"] == 0.0
        assert not np.any(per_window["correct"]), fam          # replay: ΔNLL 0 bit for bit
        # the family's coefficients are what the model uses: another window's move the loss
        assert np.any(np.asarray(per_window["cross_input"]) != 0), fam
        for name, row in table["conditions"].items():
            assert bool(row.get("not_applicable")) == (name == "recent_keys" and
                                                       fam != "indexer"), (fam, name)
            if not row.get("not_applicable"):
                assert np.isfinite(row["estimate"]) and np.isfinite(row["ci_low"]), (fam, name)
                assert np.all(np.isfinite(per_window[name])), (fam, name)
    note = res["families"]["hash_router"]["note"]
    assert "tid2eid[token], a parameter" in note and "static control" in note
    assert f"note: {note}" in stdout and f"Note: {note}." in report
    assert all("note" not in res["families"][f] for f in ("mhc", "router", "indexer"))


def test_v32_indexer_table():
    """DeepSeek-V3.2's lightning indexer alone (--config.sites=indexer): Cross-input and
    Recent-keys finite, Correct 0 bit for bit, the router replayed as recorded."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        stdout, res, _ = _audit("deepseek_v32", os.path.join(tmp, "audit"),
                                "--config.conditions=correct,cross_input,recent_keys",
                                "--config.sites=indexer")
    assert res["replay"]["exact"] is True and res["meta"]["sites"]["intervened"] == ["indexer"]
    rows = res["conditions"]
    assert rows["correct"]["estimate"] == 0.0
    for name in ("cross_input", "recent_keys"):
        assert np.isfinite(rows[name]["estimate"]) and not rows[name].get("not_applicable")
    delta = res["meta"]["checkpoints"][0]["per_window"]["delta_nll"]
    assert not np.any(delta["correct"]) and np.any(np.asarray(delta["recent_keys"]) != 0)


def test_v4_scorecard_execution_panel(tmp_path):
    """scorecard.py --hf on the tiny DeepSeek-V4: its execution panel counts every layer's
    routes (the hash layers' are their table's experts, tid2eid[token], whatever the
    scores), the port's parameter counts and a timed twin of the same total parameters
    (V4 with one expert that every token takes)."""
    import jax
    import jax.numpy as jnp

    from dynjax.audit.targets import open_target
    from dynjax.loaders import hf
    from dynjax.models import deepseek_v4 as v4
    out = str(tmp_path / "card")
    run = subprocess.run(
        [sys.executable, "scorecard.py", "--config=configs/scorecard_hf.py",
         f"--hf={HF}/deepseek_v4", f"--out={out}", "--config.audit.conditions=correct,cross_input",
         *[a.replace("--config.", "--config.audit.") for a in SMALL],
         "--config.execution_windows=2", "--config.latency_batches=1,",
         "--config.latency_repeats=1", "--config.thresholds.latency_batch=1"],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "deepseek_v4/deepseek_v4" in run.stdout and "execution" in run.stdout
    card = json.load(open(os.path.join(out, "scorecard.json")))["cards"][0]
    ex = card["execution"]
    assert ex["kind"] == "experts" and (ex["num_experts"], ex["top_k"]) == (8, 2)
    assert ex["moe_layers"] == [0, 1, 2, 3] and ex["hash_layers"] == [0, 1]
    target = open_target(f"{HF}/deepseek_v4", kind="hf")
    from configs import scorecard_hf
    data = scorecard_hf.get_config().audit.data
    data.seq_len = 16
    _, ev, _ = target.windows(data, 0, 2)
    model, params = hf.load(f"{HF}/deepseek_v4")
    cfg, E = model.cfg, 8
    share = np.asarray(ex["tokens_per_expert"])
    for i in ex["hash_layers"]:   # the table's experts of the windows' tokens, no forward
        table = np.asarray(params["layers"][i]["moe"]["tid2eid"])
        counts = np.bincount(table[ev].ravel(), minlength=E)
        np.testing.assert_allclose(share[i], counts / counts.sum())
    _, coeffs = jax.jit(model.apply)(params, jnp.asarray(ev))
    chosen = np.asarray(v4.selected_experts(cfg, params, coeffs, jnp.asarray(ev)))
    for i in (2, 3):              # the learned layers: top-k of the scores plus the bias
        counts = np.bincount(chosen[i].ravel(), minlength=E)
        np.testing.assert_allclose(share[i], counts / counts.sum())
    n = v4.param_count(cfg)
    assert (ex["active_params"], ex["total_params"]) == (n["active"], n["total"]) == \
        (66981, 94629)
    # the twin: one expert per layer, as wide as makes the total equal (one width step:
    # 3 x hidden in the expert and the shared expert of every layer)
    assert abs(ex["dense_params"] - n["total"]) <= 6 * cfg.hidden_size * cfg.n_layers
    assert "one expert every token takes" in ex["dense_twin"]
    assert 0 < ex["flops_ratio_analytic"] < 1 and 0 < ex["flops_ratio_compiled"] < 1
    assert "forward_b1" in ex["latency"]
    md = open(os.path.join(out, "scorecard.md")).read()
    assert "Tokens per expert" in md and "layer 0: " in md
