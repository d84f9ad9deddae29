"""audit.py --hf and scorecard.py --hf on the committed tiny random HF fixtures (tests/data/hf):
the routing audit of a tiny DeepSeek-V3 (MLA, sigmoid scores with a selection-only bias,
groups) prints its plan and table with the routing conditions; the scorecard's tokens per
expert (of that DeepSeek-V3) are the counts of the experts its router picks from the
recorded scores (bias and groups applied, not their top-k), its parameter counts the port's; weights_flat replays through the ports' own router with the same experts and
equal weights; open_target tells HF directories apart."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.audit import interventions
from dynjax.errors import AuditError, CheckpointError
from tests.conftest import ROOT

HF = os.path.join(ROOT, "tests", "data", "hf")
SMALL = ["--config.reassignments=2", "--config.batch_size=8", "--config.data.calib_windows=8",
         "--config.data.eval_windows=8", "--config.data.seq_len=32",
         "--config.stats.n_resamples=99"]


def _run(args, timeout=420):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def hf_audit(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hf_audit") / "deepseek_v3")
    stdout = _run(["audit.py", "--config=configs/audit_hf.py", f"--hf={HF}/deepseek_v3",
                   f"--out={out}", *SMALL])
    with open(os.path.join(out, "results.json")) as f:
        return stdout, json.load(f), out


@pytest.mark.subprocess
def test_audit_hf_prints_the_plan_and_the_routing_table(hf_audit):
    stdout, res, out = hf_audit
    assert stdout.startswith("HF deepseek_v3 audit plan: 3 layers, dim 48")
    for label in ("Cross-input", "Token-shuffle", "LayerMean", "GlobalMean", "Token-identity",
                  "Expert-relabel", "Weights-flat"):
        assert f"\n{label}" in stdout, label
    assert res["title"] == "FCA: deepseek_v3 (deepseek_v3), 1 checkpoint"
    assert res["replay"]["exact"] is True
    assert list(res["conditions"]) == list(interventions.REGISTRY)
    assert res["meta"]["facts"] == {"top_k": 2} and res["meta"]["task"] == "next_token"
    assert 0 < res["meta"]["token_identity"]["singleton_fraction"] < 1
    ck = res["meta"]["checkpoints"][0]
    assert ck["family"] == "llm" and ck["variant"] == "deepseek_v3"
    assert np.shape(ck["per_window"]["delta_nll"]["token_identity"]) == (2, 8)
    assert np.shape(ck["per_window"]["delta_nll"]["weights_flat"]) == (8,)
    assert res["meta"]["plan"]["windows"]["seq_len"] == 32
    assert os.path.exists(os.path.join(out, "report.md"))
    assert "Token-identity" in open(os.path.join(out, "report.md")).read()


@pytest.mark.subprocess
def test_scorecard_hf_tokens_per_expert_and_parameters(tmp_path):
    from dynjax.loaders import hf
    from dynjax.models import llm
    from dynjax.audit.targets import open_target

    out = str(tmp_path / "card")
    stdout = _run(["scorecard.py", "--config=configs/scorecard_hf.py", f"--hf={HF}/deepseek_v3",
                   f"--out={out}", *[a.replace("--config.", "--config.audit.") for a in SMALL],
                   "--config.execution_windows=2", "--config.latency_batches=1,",
                   "--config.latency_repeats=1", "--config.thresholds.latency_batch=1"])
    assert "llm/deepseek_v3" in stdout and "execution" in stdout
    card = json.load(open(os.path.join(out, "scorecard.json")))["cards"][0]
    ex = card["execution"]
    assert ex["kind"] == "experts" and ex["top_k"] == 2 and ex["moe_layers"] == [1, 2]
    # the shares count the experts the router picks from the scores recorded on the same
    # windows (the selection bias and groups applied), which are not their top-k
    target = open_target(f"{HF}/deepseek_v3", kind="hf")
    _, ev, _ = target.windows(target.scorecard_audit_config(_config()).data, 0, 2)
    model, params = hf.load(f"{HF}/deepseek_v3")
    _, coeffs = jax.jit(model.apply)(params, jnp.asarray(ev))
    chosen = np.asarray(llm.selected_experts(model.cfg, params, coeffs["router"]))
    counts = np.stack([np.bincount(c.ravel(), minlength=8) for c in chosen])
    np.testing.assert_allclose(ex["tokens_per_expert"], counts / counts.sum(1, keepdims=True))
    top = np.asarray(jax.lax.top_k(coeffs["router"], 2)[1])
    assert (np.sort(top, -1) != np.sort(chosen, -1)).any()
    n = llm.param_count(model.cfg)
    assert (ex["active_params"], ex["total_params"]) == (n["active"], n["total"])
    assert abs(ex["dense_params"] - n["total"]) <= 3 * model.cfg.hidden_size
    assert ex["flops_ratio_analytic"] < 1 and "latency" in ex
    assert set(card["dependence"]["conditions"]) >= {"token_identity", "expert_relabel",
                                                     "weights_flat"}


def _config():
    from configs import scorecard_hf
    c = scorecard_hf.get_config()
    c.audit.data.seq_len = 32
    return c


@pytest.mark.parametrize("name", ["olmoe", "qwen2_moe", "gpt_oss"])
def test_weights_flat_replays_the_same_experts_with_equal_weights(name):
    """Through the port's own router (llm.route): the top-k set is kept and the k weights
    are equal (1/k where norm_topk_prob renormalises: olmoe; else their mean: qwen2_moe)."""
    from dynjax.loaders import hf
    from dynjax.models import llm
    from dynjax.audit.targets import open_target

    target = open_target(f"{HF}/{name}")
    cfg = target.cfg
    tokens = jnp.asarray(np.arange(2 * 16).reshape(2, 16) % cfg.vocab_size, jnp.int32)
    model, params = hf.load(f"{HF}/{name}")
    _, coeffs = jax.jit(model.apply)(params, tokens)
    flat = interventions.apply_condition("weights_flat", coeffs, model.schema,
                                         top_k=target.condition_facts["top_k"])
    e0, _ = llm.route(cfg, coeffs["router"])
    e1, w1 = llm.route(cfg, flat["router"])
    np.testing.assert_array_equal(np.sort(np.asarray(e0), -1), np.sort(np.asarray(e1), -1))
    w1 = np.asarray(w1)
    np.testing.assert_allclose(w1, np.broadcast_to(w1[..., :1], w1.shape), rtol=1e-6)
    if cfg.norm_topk_prob or cfg.router == "topk_softmax":   # gpt-oss: softmax over k
        np.testing.assert_allclose(w1, 1 / cfg.top_k, rtol=1e-6)
    if "shared_gate" in coeffs:
        np.testing.assert_array_equal(np.asarray(flat["shared_gate"]),
                                      np.asarray(coeffs["shared_gate"]))


def test_open_target_tells_hf_directories_apart(tmp_path):
    from dynjax.audit.targets import HfDir, open_target

    moe = open_target(f"{HF}/olmoe")
    assert isinstance(moe, HfDir) and moe.label == "llm/olmoe" and moe.has_coefficients
    assert moe.condition_facts == {"top_k": 4}
    assert set(open_target(f"{HF}/qwen2_moe").schema) == {"router", "shared_gate"}
    dense = open_target(f"{HF}/llama")
    assert isinstance(dense, HfDir) and dense.condition_facts == {}
    with pytest.raises(AuditError, match="dense llama checkpoint: it has no router"):
        dense.require_coefficients()
    from dynjax.configs import scorecard_hf
    from dynjax.scorecard import run as scorecard_run
    with pytest.raises(AuditError, match="dense llama checkpoint: .* nothing to score"):
        scorecard_run.score(f"{HF}/llama", scorecard_hf.get_config(), tmp_path / "sc",
                            log=lambda *a: None)   # refused before any audit or timing
    with pytest.raises(CheckpointError, match="nope does not exist; give a train.py run"):
        open_target(tmp_path / "nope", kind="hf")
    # a safetensors folder of another architecture does not fall through to MUDDPythia
    import shutil
    other = tmp_path / "falcon"
    shutil.copytree(f"{HF}/llama", other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, model_type="falcon")))
    for kind in (None, "hf"):
        with pytest.raises(CheckpointError, match="model_type='falcon' is not supported; "
                                             "supported: deepseek_v2, deepseek_v3, ") as e:
            open_target(other, kind=kind)
        assert "\n" not in str(e.value) and ", llama, mistral, " in str(e.value)
        assert "muddpythia" in str(e.value)
    (other / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has [*].safetensors but no config.json"):
        open_target(other)


def test_real_configs_for_the_plan():
    """configs/hf_llm.py builds each real MoE as the llm family with the parameter count
    results/hf_memory.json records for it (the plan then sizes it, as test_hf checks)."""
    import ml_collections  # noqa: F401  (the config is a ConfigDict)

    from configs import hf_llm
    from dynjax.models import FAMILIES, build

    table = json.load(open(os.path.join(ROOT, "results", "hf_memory.json")))["models"]
    for arg, name in hf_llm.MODELS.items():
        c = hf_llm.get_config(arg)
        model = build(c.model.to_dict())
        assert c.model.family in ("llm", "deepseek_v4") and c.model.dtype == "bfloat16"
        assert c.model.remat
        count = FAMILIES[c.model.family].module.param_count(model.cfg)
        assert count["total"] == table[name]["params"], arg
    with pytest.raises(ValueError, match="unknown model"):
        hf_llm.get_config("deepseek_v3")


@pytest.mark.subprocess
def test_audit_and_scorecard_run_on_gpt_oss(tmp_path):
    """gpt-oss records its router logits: the audit replays them exactly and runs every
    condition; the scorecard's routing entropy is that of softmax(logits) (within ln 8) and
    its tokens per expert are shares of the top-4 routes."""
    out = str(tmp_path / "audit")
    stdout = _run(["audit.py", "--config=configs/audit_hf.py", f"--hf={HF}/gpt_oss",
                   f"--out={out}", *SMALL])
    assert stdout.startswith("HF gpt_oss audit plan: 2 layers, dim 48")
    res = json.load(open(os.path.join(out, "results.json")))
    assert res["replay"]["exact"] is True and res["meta"]["facts"] == {"top_k": 4}
    assert list(res["conditions"]) == list(interventions.REGISTRY)
    card_dir = str(tmp_path / "card")
    _run(["scorecard.py", "--config=configs/scorecard_hf.py", f"--hf={HF}/gpt_oss",
          f"--out={card_dir}", *[a.replace("--config.", "--config.audit.") for a in SMALL],
          "--config.execution_windows=2", "--config.latency_batches=1,",
          "--config.latency_repeats=1", "--config.thresholds.latency_batch=1"])
    card = json.load(open(os.path.join(card_dir, "scorecard.json")))["cards"][0]
    var, ex = card["variation"], card["execution"]
    assert 0 < var["routing_entropy_nats"] < var["routing_entropy_max_nats"] == np.log(8)
    assert ex["kind"] == "experts" and ex["top_k"] == 4 and ex["moe_layers"] == [0, 1]
    np.testing.assert_allclose(np.sum(ex["tokens_per_expert"], -1), 1.0, rtol=1e-6)


# ------------------------------------------- coefficient families (issue 46: --config.sites)

FAMILIES = ("router", "shared_gate", "attn_gate", "deltanet_beta", "deltanet_decay")
FAMILY_CONDITIONS = ("correct,cross_input,token_shuffle,static_profile,structure_removed,"
                     "expert_relabel,weights_flat")


@pytest.fixture(scope="module")
def family_audit(tmp_path_factory):
    """audit.py --hf on the tiny Qwen3.5-MoE (wrapper, 3 DeltaNet + 1 gated attention
    layer, a gated shared expert): one table per coefficient family."""
    out = str(tmp_path_factory.mktemp("hf_families") / "qwen3_5_moe")
    stdout = _run(["audit.py", "--config=configs/audit_hf.py", f"--hf={HF}/qwen3_5_moe",
                   f"--out={out}", *SMALL, f"--config.conditions={FAMILY_CONDITIONS}",
                   "--config.sites=" + ",".join(FAMILIES)])
    with open(os.path.join(out, "results.json")) as f:
        return stdout, json.load(f), out


@pytest.mark.subprocess
def test_audit_hf_one_table_per_coefficient_family(family_audit):
    """Each family's table: Correct's ΔNLL is 0 bit for bit; every applicable condition
    finite; the routing conditions apply to the router alone; intervening on each family
    alone changes the logits (its cross-input ΔNLL is not 0 in every window); a condition
    that touches only the router's leaves gives the same per-window ΔNLL in the table of
    all families and in the router's."""
    stdout, res, out = family_audit
    assert res["replay"]["exact"] is True
    assert "(6 condition tables: all families, then each)" in stdout.splitlines()[2]
    assert sorted(res["families"]) == sorted(FAMILIES)   # in the model's order
    assert res["meta"]["sites"]["families"] == {f: [f] for f in FAMILIES}
    report = open(os.path.join(out, "report.md")).read()
    ck = res["meta"]["checkpoints"][0]
    for fam in FAMILIES:
        assert f"\nfamily {fam} ({fam}; the other coefficients replayed as recorded)" in stdout
        assert f"## Family `{fam}`" in report
        table, per_window = res["families"][fam], ck["families"][fam]["per_window"]["delta_nll"]
        assert table["sites"] == [fam]
        assert table["conditions"]["correct"]["estimate"] == 0.0
        assert not np.any(per_window["correct"]), fam
        assert np.any(np.asarray(per_window["cross_input"]) != 0), fam
        for name, row in table["conditions"].items():
            routing = name in ("expert_relabel", "weights_flat")
            assert bool(row.get("not_applicable")) == (routing and fam != "router"), (fam, name)
            if not row.get("not_applicable"):
                assert np.isfinite(row["estimate"]) and np.isfinite(row["ci_low"]), (fam, name)
                assert np.all(np.isfinite(per_window[name])), (fam, name)
    whole = ck["per_window"]["delta_nll"]
    router = ck["families"]["router"]["per_window"]["delta_nll"]
    for name in ("expert_relabel", "weights_flat"):
        np.testing.assert_array_equal(whole[name], router[name])
    assert np.any(np.asarray(whole["cross_input"]) != np.asarray(router["cross_input"]))


@pytest.mark.subprocess
def test_scorecard_dependence_per_family(family_audit):
    """The scorecard's dependence panel keeps each family's rows (the audit's, verbatim)."""
    from dynjax.scorecard.panels import dependence

    _, res, _ = family_audit
    dep = dependence(res)
    assert sorted(dep["families"]) == sorted(FAMILIES)
    for fam, d in dep["families"].items():
        assert d["sites"] == [fam]
        assert d["conditions"]["cross_input"]["estimate"] == \
            res["families"][fam]["conditions"]["cross_input"]["estimate"]
    assert "expert_relabel" in dep["families"]["router"]["conditions"]
    assert "expert_relabel" not in dep["families"]["attn_gate"]["conditions"]
