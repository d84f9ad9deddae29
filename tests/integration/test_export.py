"""``python -m dynjax.export``: an llm-family run as a Hugging Face directory (dynjax/export.py).

Promised and tested: every ported model_type's parameters go out and come back through
``hf.load`` bitwise, with the same architecture; a model whose own model_type has no HF
MoE twin (a Llama upcycled into MoE) goes out as one that computes it (Mixtral); the
exported directory's logits in transformers equal dynjax's (a committed reference made by
scripts/make_export_reference.py, checked without torch; and live where transformers is
installed); the byte tokenizer gives the bytes; a train.py run exports through the command
line; what cannot be exported is one line; a failed export leaves nothing.
"""
import json
import os
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import export
from dynjax.errors import ConfigError
from dynjax.loaders import archs, hf
from dynjax.models import llm
from tests.conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data")
REFERENCE = os.path.join(DATA, "export_reference.npz")
TOL = 1e-4
# the reference's models: a Llama upcycled into MoE (no HF Llama-MoE: it goes out as Mixtral)
# and the routing study's OLMoE-style arm, both tiny
CASES = {
    "llama_moe": dict(model_type="llama", vocab_size=256, hidden_size=32, n_layers=2,
                      n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=48,
                      moe_layers=(0, 1), num_experts=4, top_k=2, moe_intermediate_size=48,
                      norm_topk_prob=True),
    "olmoe": dict(model_type="olmoe", vocab_size=256, hidden_size=32, n_layers=2, n_heads=4,
                  n_kv_heads=4, head_dim=8, intermediate_size=64, qk_norm="full",
                  moe_layers=(0, 1), num_experts=4, top_k=2, moe_intermediate_size=32,
                  norm_topk_prob=False, moe_load_balance_loss_weight=0.01),
}
EXPORTED_AS = {"llama_moe": "mixtral", "olmoe": "olmoe"}
ROUTER_GAIN = 40.0   # routers far from uniform: top-k margins well above float32 noise


def case(name):
    """(cfg, params, tokens) of a reference case: llm.init, the routers scaled by ROUTER_GAIN."""
    cfg = llm.Config(**CASES[name])
    params = llm.init(cfg, jax.random.key(7))
    for layer in params["layers"]:
        layer["moe"]["router"] = layer["moe"]["router"] * ROUTER_GAIN
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 24), 0, 256), np.int32)
    return cfg, jax.device_get(params), tokens


_FORWARD = jax.jit(lambda model, params, tokens: model.apply(params, tokens)[0],
                   static_argnums=0)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each reference case exported once: name -> (cfg, params, tokens, directory)."""
    out = {}
    for name in CASES:
        cfg, params, tokens = case(name)
        d = tmp_path_factory.mktemp("export") / name
        export.export_params(cfg, params, d, max_positions=64)
        out[name] = (cfg, params, tokens, d)
    return out


# ports this export writes; a port added later either goes out and back or is refused in one line
ROUND_TRIP = ("llama", "mistral", "mixtral", "olmoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
FIXTURES = sorted(set(os.listdir(os.path.join(DATA, "hf"))) & set(archs.SUPPORTED))


@pytest.mark.parametrize("arch", FIXTURES)
def test_every_port_goes_out_and_back_bitwise(arch, tmp_path):
    model, params = hf.load(os.path.join(DATA, "hf", arch), dtype="float32")
    try:
        written = export.export_params(model.cfg, jax.device_get(params), tmp_path / "out", 256)
    except ConfigError as e:
        assert arch not in ROUND_TRIP and "\n" not in str(e), e
        assert not (tmp_path / "out").exists()
        return
    assert written["model_type"] == arch
    model2, params2 = hf.load(str(tmp_path / "out"))
    assert model2.cfg == model.cfg
    chex.assert_trees_all_equal(params2, params)


def test_the_ported_fixtures_include_every_type_export_promises():
    assert set(ROUND_TRIP) <= set(FIXTURES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reference_cases_load_back_bitwise_as_their_hf_type(name, exported):
    cfg, params, _, d = exported[name]
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == EXPORTED_AS[name]
    assert config["architectures"] == [{"mixtral": "MixtralForCausalLM",
                                         "olmoe": "OlmoeForCausalLM"}[EXPORTED_AS[name]]]
    model2, params2 = hf.load(str(d))
    chex.assert_trees_all_equal(params2, params)
    assert model2.cfg.moe_layers == cfg.moe_layers and model2.cfg.top_k == cfg.top_k


@pytest.mark.parametrize("name", sorted(CASES))
def test_exported_logits_equal_transformers_committed_reference(name, exported):
    """transformers' logits of the exported directory (scripts/make_export_reference.py)."""
    cfg, params, tokens, d = exported[name]
    ref = np.load(REFERENCE)
    np.testing.assert_array_equal(ref[f"{name}.tokens"], tokens)
    model2, params2 = hf.load(str(d))
    ours = np.asarray(_FORWARD(model2, params2, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, ref[f"{name}.logits"], atol=TOL, rtol=0)
    assert float(ref[f"{name}.max_abs_dlogit"]) <= TOL


@pytest.mark.parametrize("name", sorted(CASES))
def test_exported_logits_equal_transformers_live(name, exported):
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    cfg, params, tokens, d = exported[name]
    ours = np.asarray(_FORWARD(llm.LLM(cfg), params, jnp.asarray(tokens)))
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0)
    from transformers import AutoTokenizer

    text = "Héllo, wörld €\n"
    ids = AutoTokenizer.from_pretrained(str(d))(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))


def test_the_byte_tokenizer_gives_the_bytes(exported):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(exported["olmoe"][3] / "tokenizer.json"))
    text = "Héllo,\n\tworld € \x00 ~"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert sorted(tok.get_vocab().values()) == list(range(256))


def test_mod_layers_and_unported_architectures_are_refused_in_one_line(tmp_path):
    cfg, params, _ = case("olmoe")
    mod = llm.Config(**dict(CASES["olmoe"], moe_layers=(0,), mod_layers=(1,)))
    with pytest.raises(ConfigError, match="Mixture-of-Depths") as e:
        export.export_params(mod, params, tmp_path / "mod")
    assert "\n" not in str(e.value)
    # OLMoE's attention with a dense layer: no ported HF type has both
    mixed = llm.Config(**dict(CASES["olmoe"], moe_layers=(0,)))
    with pytest.raises(ConfigError, match="no ported Hugging Face model_type") as e:
        export.export_params(mixed, llm.init(mixed, jax.random.key(0)), tmp_path / "mixed")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "mod").exists() and not (tmp_path / "mixed").exists()


def test_an_existing_directory_is_refused_and_a_failed_export_leaves_nothing(tmp_path,
                                                                          monkeypatch):
    cfg, params, _ = case("olmoe")
    (tmp_path / "there").mkdir()
    with pytest.raises(ConfigError, match="exists"):
        export.export_params(cfg, params, tmp_path / "there")

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(export, "byte_tokenizer", full_disk)
    with pytest.raises(OSError):
        export.export_params(cfg, params, tmp_path / "half")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["there"]


@pytest.mark.subprocess
def test_a_run_of_another_family_is_refused_by_the_command_in_one_line(tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {"family": "moe"}, "data": {}}))
    r = subprocess.run([sys.executable, "-m", "dynjax.export", str(run), str(tmp_path / "out")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "'moe'-family run" in err, err
    assert err.startswith("python -m dynjax.export: error:")
    assert not (tmp_path / "out").exists()


def test_the_console_command_is_declared():
    text = (pathlib.Path(ROOT) / "pyproject.toml").read_text()
    assert 'dynjax-export = "dynjax.programs.console:export"' in text
    from dynjax.programs import console
    assert callable(console.export)


def test_a_trained_run_exports_through_the_command_and_loads_back_bitwise(tmp_path, capsys):
    """One tiny run of the routing study's arm (2 steps), exported by ``main``."""
    from dynjax.configs import routing_study
    from dynjax.runs import rundir
    from dynjax.train import loop

    c = routing_study.get_config("softmax_topk")
    c.model.update(hidden_size=16, n_heads=2, n_kv_heads=2, head_dim=8, n_layers=2,
                   moe_layers=(0, 1), num_experts=4, moe_intermediate_size=8,
                   intermediate_size=16, moe_dispatch="dense")
    c.data.update(source="embedded", seq_len=16)
    c.train.update(dict(steps=2, batch_size=4, warmup_steps=1, log_every=1, eval_every=2,
                        ckpt_every=2))
    c.eval.update(dict(windows=4, batch_size=4, decode_check_windows=0))
    run = tmp_path / "run"
    loop.train(c, str(run), progress=False)
    assert export.main([str(run), str(tmp_path / "hf")]) == 0
    assert "olmoe (OlmoeForCausalLM)" in capsys.readouterr().out
    _, model, params = rundir.load_params(str(run))
    model2, params2 = hf.load(str(tmp_path / "hf"))
    chex.assert_trees_all_equal(params2, jax.device_get(params))
    from dynjax.audit.targets import open_target   # weights_flat needs the run's top_k
    assert open_target(str(run)).condition_facts == {"top_k": 2}
    recorded = json.loads((tmp_path / "hf" / "dynjax_export.json").read_text())
    assert recorded["step"] == 2 and recorded["run"] == "run"
