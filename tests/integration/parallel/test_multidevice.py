"""A data-parallel step on 8 simulated CPU devices equals the single-device step, an
MoE model sharded over experts and MLP columns computes the replicated model's loss, the
dropless MoE under expert parallelism (all-to-all in shard_map, on 4 and 8 devices) has the
one-device loss, gradients and HF-port logits, and
every family (gates, mod, moe, mudd, gated_mlp, muddpythia) under FSDP, TP and FSDP+TP on a
(data 2, fsdp 2, tensor 2) mesh has the unsharded model's loss and gradients, with its
parameters split as their logical axes say (activations constrained as in training), and
under fsdp_tp the compiled step's activations are split as the rules say. The audit of the
tiny MUDDPythia under dp and fsdp meshes reports one device's numbers with an exact replay.

Runs in subprocesses, one per device count (the count must be set before JAX starts), each
running every script of that count. Multi-device CPU simulation can deadlock in collectives
on 2 cores when steps are pipelined, so the scripts block on every step and each subprocess
has a hard timeout: a hang fails fast.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import ROOT, cpu_devices_env

pytestmark = pytest.mark.subprocess   # every test here starts processes

SCRIPT = textwrap.dedent("""
    import os, sys, json, numpy as np, jax
    sys.path.insert(0, {root!r})
    from tests.conftest import tiny_config
    from dynjax.models import build
    from dynjax.models.transformer import next_token_nll
    from dynjax.parallel import sharding
    from dynjax.train import lm as lm_task
    import optax
    def sharded_families():
        # FSDP, TP and FSDP+TP on a (data 2, fsdp 2, tensor 2) mesh, for every family: loss
        # and gradients against the unsharded model, and every parameter's shard shape
        from dynjax.loaders import muddpythia_hf
        from dynjax.models import muddpythia
        from dynjax.models.gated_mlp import GatedMLP
        from dynjax.models.activation_sharding import traced_under
        from dynjax.models.transformer import ModelConfig
        import ml_collections
        mesh = sharding.make_mesh(ml_collections.ConfigDict(
            dict(mesh=dict(data=2, fsdp=2, tensor=2))))
        tokens = np.random.default_rng(1).integers(0, 256, (8, 32)).astype(np.int32)
        lm = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, scan_layers=True)
        cases = {{}}
        for fam, var, extra in (("gates", "feature_gate", {{}}), ("mod", "mod", {{}}),
                                ("moe", "moe", dict(moe_num_experts=4)), ("mudd", "mudd", {{}})):
            m = build(ModelConfig.from_dict(dict(family=fam, variant=var, **lm, **extra)))
            def lm_loss(p, t, m=m):
                logits, _, aux = m.apply(p, t, with_aux=True)
                return next_token_nll(logits, t).mean() + sum(aux.values(), 0.0)
            cases[fam] = (lm_loss, jax.jit(m.init)(jax.random.key(0), tokens),
                          m.logical_axes(tokens), tokens)
        x = np.random.default_rng(2).normal(size=(8, 16)).astype(np.float32)
        y = np.arange(8) % 10
        mlp = GatedMLP(dict(in_dim=16, n_classes=10, hidden=(64, 64), variant="dgate",
                            gate_hidden=8))
        cases["gated_mlp"] = (
            lambda p, b: optax.softmax_cross_entropy_with_integer_labels(
                mlp.apply(p, b["x"], gates_open=False)[0], b["y"]).mean(),
            jax.jit(mlp.init)(jax.random.key(0), x), mlp.logical_axes(x), {{"x": x, "y": y}})
        ref = np.load(os.path.join({root!r}, "tests", "data", "muddpythia_tiny.npz"))
        mcfg, mparams = muddpythia_hf.from_state_dict(
            {{k[len("params/"):]: ref[k] for k in ref.files if k.startswith("params/")}})
        cases["muddpythia"] = (
            lambda p, t: next_token_nll(muddpythia.apply(mcfg, p, t)[0], t).mean(),
            mparams, muddpythia.logical_axes(mparams), tokens)
        out = {{}}
        for fam, (loss, params, specs, batch) in cases.items():
            want_l, want_g = jax.jit(jax.value_and_grad(loss))(params, batch)
            for preset in ("fsdp", "tp", "fsdp_tp"):
                shard = sharding.param_shardings(specs, mesh, sharding.PRESETS[preset])
                p = jax.device_put(params, shard)
                b = jax.device_put(batch, sharding.batch_sharding(mesh))
                l, g = jax.jit(traced_under(jax.value_and_grad(loss), mesh,
                                            sharding.PRESETS[preset]), out_shardings=(
                    sharding.replicated(mesh), shard))(p, b)
                jax.block_until_ready(g)
                # a parameter's shard shape: its shape divided by the mesh axes its spec names
                expected = lambda a, sh: [d // int(np.prod([mesh.shape[ax] for ax in (
                    s if isinstance(s, tuple) else (s,)) if ax])) for d, s in zip(
                    a.shape, tuple(sh.spec) + (None,) * (a.ndim - len(sh.spec)))]
                shapes_ok = all(list(a.addressable_shards[0].data.shape) == expected(a, sh)
                                for a, sh in zip(jax.tree.leaves(p), jax.tree.leaves(shard)))
                split = sum(a.addressable_shards[0].data.size < a.size for a in jax.tree.leaves(p))
                out[f"{{fam}}/{{preset}}"] = {{
                    "loss": float(l), "loss_ref": float(want_l), "shapes_ok": shapes_ok,
                    "split": split, "params": len(jax.tree.leaves(p)),
                    "grad_max_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                         for a, b in zip(jax.tree.leaves(g),
                                                         jax.tree.leaves(want_g))),
                    "grad_scale": max(float(np.max(np.abs(np.asarray(b))))
                                      for b in jax.tree.leaves(want_g))}}
        return out


    def expert_parallel():
        # dropless MoE with its experts split over "tensor" (ep rules: shard_map, tokens by
        # all-to-all) on 4 devices (tensor 4) and 8 (data 2 x tensor 4), against one device:
        # loss and every gradient of integrated MoDE (no-op routes go nowhere), and the
        # logits of the OLMoE port
        import ml_collections
        from dynjax.loaders import hf
        from dynjax.models.activation_sharding import traced_under
        from dynjax.models.transformer import ModelConfig
        cfg = ModelConfig(family="moe", variant="mode_integrated", d_model=32, n_heads=2,
                          n_layers=2, d_ff=64, scan_layers=True).replace(
            moe_num_experts=8, moe_num_experts_per_tok=2, moe_dispatch="dropless")
        model = build(cfg)
        tokens = np.random.default_rng(3).integers(0, 256, (8, 32)).astype(np.int32)
        params = jax.jit(model.init)(jax.random.key(0), tokens)
        def loss(p, t):
            logits, _, aux = model.apply(p, t, with_aux=True)
            return next_token_nll(logits, t).mean() + sum(aux.values(), 0.0)
        want_l, want_g = jax.jit(jax.value_and_grad(loss))(params, tokens)
        port, port_params = hf.load(os.path.join({root!r}, "tests", "data", "hf", "olmoe"))
        ids = np.load(os.path.join({root!r}, "tests", "data", "hf", "olmoe",
                                   "reference.npz"))["input_ids"]
        want_logits = jax.jit(port.apply)(port_params, ids)[0]
        rules = sharding.PRESETS["ep"]
        out = {{}}
        for name, sizes, n_dev in (("tensor4", dict(tensor=4), 4),
                                   ("data2_tensor4", dict(data=2, tensor=4), 8)):
            mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(mesh=sizes)),
                                      jax.devices()[:n_dev])
            shard = sharding.param_shardings(model.logical_axes(tokens), mesh, rules)
            p = jax.device_put(params, shard)
            t = jax.device_put(tokens, sharding.batch_sharding(mesh))
            step = jax.jit(traced_under(jax.value_and_grad(loss), mesh, rules),
                           out_shardings=(sharding.replicated(mesh), shard)).lower(p, t)
            l, g = step.compile()(p, t)
            jax.block_until_ready(g)
            wi = [a for path, a in jax.tree_util.tree_flatten_with_path(p)[0]
                  if "wi" in jax.tree_util.keystr(path)][0]
            pshard = sharding.param_shardings(port.logical_axes(ids), mesh, rules)
            fwd = jax.jit(traced_under(lambda pp, tt: port.apply(pp, tt)[0], mesh, rules))
            pp = jax.device_put(port_params, pshard)
            pt = jax.device_put(ids, sharding.batch_sharding(mesh))
            port_text = fwd.lower(pp, pt).as_text()
            logits = fwd(pp, pt)
            jax.block_until_ready(logits)
            out[name] = {{
                "loss": float(l), "loss_ref": float(want_l),
                "grad_max_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                     for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(want_g))),
                "grad_scale": max(float(np.max(np.abs(np.asarray(b))))
                                  for b in jax.tree.leaves(want_g)),
                "all_to_all": step.as_text().count("all_to_all"),
                "wi_shard_shape": list(wi.addressable_shards[0].data.shape),
                "wi_shape": list(wi.shape),
                "port_all_to_all": port_text.count("all_to_all"),
                "port_logit_diff": float(np.max(np.abs(np.asarray(logits) - np.asarray(
                    want_logits))))}}
        return out


    n = jax.device_count()
    c = tiny_config("feature_gate")
    model = build(c.model.to_dict()); tx = lm_task.make_optimizer(c.train)
    state = lm_task.init_state(c, model, jax.random.key(0))
    batch = np.random.default_rng(0).integers(0, 256, (8, 32)).astype(np.int32)
    mesh = sharding.make_mesh()
    rep = sharding.replicated(mesh)
    state = jax.device_put(state, rep)
    step = jax.jit(lm_task.make_train_step(model, tx),
                   in_shardings=(rep, sharding.batch_sharding(mesh)), out_shardings=(rep, rep))
    def loss(p, t):
        logits, _ = model.apply(p, t)
        return next_token_nll(logits, t).mean()
    grad = jax.jit(jax.grad(loss), in_shardings=(rep, sharding.batch_sharding(mesh)), out_shardings=rep)
    g = grad(state["params"], jax.device_put(batch, sharding.batch_sharding(mesh)))
    for _ in range(2):
        state, m = step(state, jax.device_put(batch, sharding.batch_sharding(mesh)))
        jax.block_until_ready(state)
    flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(tree))])
    np.save(sys.argv[1], np.stack([flat(g), flat(state["params"])]))
    info = {{"devices": n, "loss": float(m["loss"]),
            "batch_shards": len(jax.device_put(batch, sharding.batch_sharding(mesh)).addressable_shards)}}
    if n % 2 == 0:
        # Expert and tensor parallelism: an MoE model's experts and MLP columns split over the
        # "tensor" axis (2 ways), the batch over "data"; its loss equals the replicated one.
        from dynjax.models.transformer import ModelConfig
        cfg = ModelConfig(family="moe", variant="moe", d_model=32, n_heads=2, n_layers=2,
                          d_ff=64, scan_layers=True).replace(moe_num_experts=4)
        moe_model = build(cfg)
        params = moe_model.init(jax.random.key(0), batch)
        import ml_collections
        mesh2 = sharding.make_mesh(ml_collections.ConfigDict(dict(mesh=dict(data=-1, tensor=2))))
        rules = [r for r in sharding.DEFAULT_RULES if r[0] not in ("expert", "mlp")]
        rules += [("expert", "tensor"), ("mlp", "tensor")]
        shard = sharding.param_shardings(moe_model.logical_axes(batch), mesh2, rules)
        sharded = jax.device_put(params, shard)
        wi = [a for path, a in jax.tree_util.tree_flatten_with_path(sharded)[0]
              if "wi" in jax.tree_util.keystr(path)][0]
        moe_loss = lambda p, t: next_token_nll(moe_model.apply(p, t)[0], t).mean()
        info["moe_loss_sharded"] = float(jax.jit(moe_loss)(sharded, jax.device_put(
            batch, sharding.batch_sharding(mesh2))))
        info["moe_loss_replicated"] = float(jax.jit(moe_loss)(params, batch))
        info["wi_spec"] = str(wi.sharding.spec)
        info["wi_shard_shape"] = list(wi.addressable_shards[0].data.shape)
        info["wi_shape"] = list(wi.shape)
    if n == 8 and not os.environ.get("DYNJAX_TEST_FAMILIES"):
        info["expert_parallel"] = expert_parallel()
    if n == 8 and os.environ.get("DYNJAX_TEST_FAMILIES"):
        info["families"] = sharded_families()
    print(json.dumps(info))
""")


ACTIVATIONS = textwrap.dedent(r"""
    # a FeatureGate train step under fsdp_tp on a (data 2, fsdp 2, tensor 2) mesh, its
    # activations constrained (traced_under), against the same step on one device
    import re, sys, json, numpy as np, jax, optax, ml_collections
    sys.path.insert(0, {root!r})
    from tests.conftest import tiny_config
    from dynjax.models import build
    from dynjax.models.activation_sharding import traced_under
    from dynjax.parallel import sharding
    from dynjax.train import lm
    c = tiny_config("feature_gate", n_layers=2)
    model = build(c.model.to_dict()); tx = lm.make_optimizer(c.train)
    mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(mesh=dict(data=2, fsdp=2,
                                                                       tensor=2))))
    rules = sharding.PRESETS["fsdp_tp"]
    state = lm.init_state(c, model, jax.random.key(0))
    p_shard = sharding.param_shardings(model.logical_axes(np.zeros((1, 32), np.int32)), mesh,
                                       rules)
    rep = sharding.replicated(mesh)
    shard = {{"step": rep, "params": p_shard, "opt_state": optax.tree_map_params(
        tx, lambda _, s: s, state["opt_state"], p_shard, transform_non_params=lambda _: rep)}}
    batch = np.random.default_rng(0).integers(0, 256, (8, 32)).astype(np.int32)
    step = lm.make_train_step(model, tx)
    sharded = jax.jit(traced_under(step, mesh, rules), in_shardings=(
        shard, sharding.batch_sharding(mesh)), out_shardings=(shard, rep)).lower(state, batch)
    compiled = sharded.compile()
    # the per-device shape of each layer's first query and MLP projection in the compiled step
    shapes = {{}}
    for line in compiled.as_text().splitlines():
        name = re.search(r'op_name="[^"]*/block/(attn/query|mlp/up)/dot_general"', line)
        if name and " dot(" in line and name.group(1) not in shapes:
            shapes[name.group(1)] = [int(d) for d in re.search(
                r"= f32\[([0-9,]+)\]", line).group(1).split(",")]
    new, m = compiled(jax.device_put(state, shard), batch)
    jax.block_until_ready(new)
    ref, m1 = jax.jit(step)(state, batch)
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(jax.tree.leaves(new["params"]), jax.tree.leaves(ref["params"])))
    from dynjax.train import memory_plan as plan  # its per-device state: the compiled step's arguments
    planned = plan.plan(c, dict(data=2, fsdp=2, tensor=2), rules)
    print(json.dumps({{"shapes": shapes, "loss": float(m["loss"]), "loss_ref": float(m1["loss"]),
                      "arguments": compiled.memory_analysis().argument_size_in_bytes,
                      "planned_state": planned["params"] + planned["optimizer"],
                      "param_diff": diff,
                      "constraints": len(re.findall("sharding_constraint", sharded.as_text()))}}))
""")


DRIVER = textwrap.dedent(r"""
    # runs each (name, script, output folder) given as JSON in argv[1] in this one process
    # (JAX started once), and prints {name: the script's last stdout line, parsed}
    import contextlib, io, json, sys
    results = {}
    for name, path, out in json.loads(sys.argv[1]):
        sys.argv = [path, out]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(open(path).read(), path, "exec"), {"__name__": "__main__"})
        results[name] = json.loads(buf.getvalue().strip().splitlines()[-1])
    print(json.dumps(results))
""")


def _run_scripts(tmp_path, n_devices, scripts, timeout, families=False):
    """Run ``scripts`` ({name: script text}) in one subprocess with ``n_devices`` CPU devices
    (JAX starts once per device count, not once per script): {name: (printed JSON, the
    arrays the script saved or None)}."""
    env = cpu_devices_env(n_devices)
    if families:
        env["DYNJAX_TEST_FAMILIES"] = "1"
    jobs = []
    for name, text in scripts.items():
        folder = tmp_path / f"{name}_{n_devices}"
        folder.mkdir()
        (folder / "script.py").write_text(text.format(root=ROOT))
        jobs.append((name, str(folder / "script.py"), str(folder / "params.npy")))
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: (printed[name], np.load(out) if os.path.exists(out) else None)
            for name, _, out in jobs}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every multi-device check of this file, one subprocess per device count: the
    data-parallel step and the audit on 1 and 8 devices, the activation sharding on 8."""
    tmp = tmp_path_factory.mktemp("multidevice")
    one = _run_scripts(tmp, 1, {"dp": SCRIPT, "audit": AUDIT}, timeout=300)
    eight = _run_scripts(tmp, 8, {"dp": SCRIPT, "activations": ACTIVATIONS, "audit": AUDIT},
                         timeout=900)
    return {1: one, 8: eight}


def test_data_parallel_step_matches_single_device(runs):
    (info1, p1), (info8, p8) = runs[1]["dp"], runs[8]["dp"]
    assert info1["devices"] == 1 and info8["devices"] == 8
    assert info8["batch_shards"] == 8                     # the batch really is split
    np.testing.assert_allclose(info8["loss"], info1["loss"], rtol=1e-5)
    np.testing.assert_allclose(p8[0], p1[0], rtol=1e-4, atol=1e-6)   # gradients
    # Parameters after two AdamW steps agree, except where the gradient is near zero: there
    # Adam's g / (sqrt(v) + eps) turns reduction-order noise into a sign (on an AVX2 CPU one
    # coordinate with gradient 1e-9 moved apart by lr / 6). So every coordinate that
    # disagrees must have a gradient below 1e-7 (the median is ~2e-3), and they must be rare.
    apart = ~np.isclose(p8[1], p1[1], rtol=1e-5, atol=1e-6)
    assert apart.mean() < 1e-3, f"{apart.sum()} parameters disagree"
    assert np.all(np.abs(p1[0][apart]) < 1e-7), (
        f"parameters with gradients up to {np.abs(p1[0][apart]).max():.3g} disagree")
    # MoE with experts and MLP columns sharded over a 2-way "tensor" axis (expert parallelism)
    assert "tensor" in info8["wi_spec"]
    layers, experts, d, f = info8["wi_shape"]
    # one mesh axis shards one dimension of a tensor: the experts take "tensor", so the expert
    # kernels keep their MLP columns whole
    assert info8["wi_shard_shape"] == [layers, experts // 2, d, f]
    np.testing.assert_allclose(info8["moe_loss_sharded"], info8["moe_loss_replicated"],
                               rtol=1e-5)
    # dropless MoE with expert parallelism (shard_map, all-to-all) equals one device
    ep = info8["expert_parallel"]
    assert set(ep) == {"tensor4", "data2_tensor4"}
    for name, r in ep.items():
        assert r["all_to_all"] >= 2, name            # the pairs go out and come back
        layers, experts, d, f = r["wi_shape"]
        assert r["wi_shard_shape"] == [layers, experts // 4, d, f], name
        np.testing.assert_allclose(r["loss"], r["loss_ref"], rtol=1e-5, err_msg=name)
        assert r["grad_max_diff"] <= 1e-5 * max(r["grad_scale"], 1.0), (name, r)
        assert r["port_all_to_all"] >= 2 * 2, name   # both MoE layers of the port
        assert r["port_logit_diff"] <= 1e-5, (name, r)


@pytest.mark.skipif(not os.environ.get("DYNJAX_SLOW_TESTS"), reason="about 4 minutes on 2 "
                    "CPU cores, over the CI budget: run with DYNJAX_SLOW_TESTS=1")
def test_every_family_under_fsdp_tp_and_fsdp_tp(tmp_path):
    """FSDP, TP and FSDP+TP for every family: the replicated model's loss and gradients, and
    parameters really split as their logical axes say."""
    info8, _ = _run_scripts(tmp_path, 8, {"dp": SCRIPT}, timeout=900, families=True)["dp"]
    fams = info8["families"]
    assert {k.split("/")[0] for k in fams} == {"gates", "mod", "moe", "mudd", "gated_mlp",
                                               "muddpythia"}
    for name, r in fams.items():
        assert r["shapes_ok"], name
        assert r["split"] > 0, name
        np.testing.assert_allclose(r["loss"], r["loss_ref"], rtol=1e-5, err_msg=name)
        assert r["grad_max_diff"] <= 1e-5 * max(r["grad_scale"], 1.0), (name, r)


def test_activations_are_sharded_under_fsdp_tp(runs):
    """Under fsdp_tp the compiled step keeps activations split as the rules say: a layer's
    MLP and query projections run on 1/4 of the tokens (batch over data x fsdp) and 1/2 of
    the columns (tensor); without the constraints XLA gathers the batch over fsdp instead
    (128 token rows). The step equals the one-device step within float tolerance, and
    dynjax.train.memory_plan predicts its per-device arguments."""
    info, _ = runs[8]["activations"]
    assert info["constraints"] > 0
    tokens = 8 * 32 // 4
    assert info["shapes"] == {"mlp/up": [tokens, 64 // 2], "attn/query": [tokens, 32 // 2]}
    np.testing.assert_allclose(info["loss"], info["loss_ref"], rtol=1e-5)
    assert info["param_diff"] < 1e-5
    # the memory plan's per-device parameters and optimizer state, plus the step counter and
    # a quarter of the int32 batch, are exactly the compiled step's per-device arguments
    assert info["arguments"] == info["planned_state"] + 4 + 8 * 32 * 4 // 4


AUDIT = textwrap.dedent(r"""
    # audit.py's program on the tiny MUDDPythia HF directory under the audit config's mesh:
    # one device, or 8 devices as dp (rows split 8 ways, parameters replicated) and fsdp
    # (rows split 2 x 4, parameters split over fsdp)
    import json, pathlib, sys, jax, numpy as np
    sys.path.insert(0, {root!r})
    from configs import audit_muddpythia
    from dynjax.audit import run
    from dynjax.audit.engine import Engine
    from dynjax.audit.placement import Placement
    from dynjax.errors import AuditError
    from dynjax.parallel import sharding
    from dynjax.audit.targets import open_target
    from tests.integration.audit.test_audit_run import muddpythia_audit_config, small
    from tests.unit.loaders.test_muddpythia import write_tiny_hf_dir
    tmp = pathlib.Path(sys.argv[1]).parent
    hf = write_tiny_hf_dir(tmp / "hf")
    meshes = {{"one": ("dp", dict(data=-1))}} if jax.device_count() == 1 else {{
        "dp": ("dp", dict(data=-1)), "fsdp": ("fsdp", dict(data=2, fsdp=-1))}}
    out = {{}}
    for name, (preset, mesh) in meshes.items():
        cfg = muddpythia_audit_config(small(audit_muddpythia.get_config()), tmp)
        cfg.reassignments = 2
        cfg.conditions = "correct,cross_input,token_shuffle,static_profile"
        cfg.sharding.preset, cfg.sharding.mesh = preset, mesh
        res = run.audit_from_config(cfg, muddpythia_dir=hf, progress=False, log=lambda *a: 0)
        out[name] = {{"replay": res["replay"], "conditions": {{
            k: [c["estimate"], c["ci_low"], c["ci_high"]] for k, c in res["conditions"].items()}}}}
    if jax.device_count() > 1:
        # where the arrays live: the record's cache split over data x fsdp, and fsdp's params
        target = open_target(hf, kind="muddpythia").audit_target()
        mesh = sharding.make_mesh(cfg.sharding)
        eng = Engine(target["apply_fn"], target["schema"], 16, 32,
                     placement=Placement(mesh, sharding.PRESETS["fsdp"]))
        params = eng.place_params(target["params"], target["logical_axes"])
        rec = eng.record(params, np.random.default_rng(0).integers(0, 256, (16, 32)))
        leaf = jax.tree.leaves(rec.coeffs)[0]
        out["cache_shards"] = len({{str(s.index) for s in leaf.addressable_shards}})
        out["params_split"] = sum(a.addressable_shards[0].data.size < a.size
                                  for a in jax.tree.leaves(params))
        out["replay_exact"] = rec.max_abs_dlogit == 0.0 and bool(
            np.array_equal(rec.nll_record, rec.nll_replay))
        try:
            Engine(target["apply_fn"], target["schema"], 12, 32, placement=eng.place)
        except AuditError as e:
            out["error"] = str(e)
    print(json.dumps(out))
""")


def test_sharded_audit_matches_one_device(runs):
    """An audit under an 8-device mesh (dp: windows split 8 ways; fsdp: 2 x 4, the
    MUDDPythia's parameters split) reports the one-device numbers within float tolerance, and
    its replay gate is exact (replay compared with a record made under the same mesh)."""
    (one, _), (eight, _) = runs[1]["audit"], runs[8]["audit"]
    ref = one["one"]
    for name in ("dp", "fsdp"):
        got = eight[name]
        assert got["replay"]["exact"] and got["replay"]["max_abs_dlogit"] == 0.0, name
        np.testing.assert_allclose(got["replay"]["nll"], ref["replay"]["nll"], rtol=1e-5)
        assert got["conditions"].keys() == ref["conditions"].keys()
        for cond, want in ref["conditions"].items():
            np.testing.assert_allclose(got["conditions"][cond], want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name}/{cond}")
    assert eight["cache_shards"] == 8        # each device holds its 2 windows' coefficients
    assert eight["params_split"] > 0 and eight["replay_exact"]
    assert "not a multiple of the 8 data-parallel devices" in eight["error"]
