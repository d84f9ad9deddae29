"""DynamicGate-MLP: straight-through estimator, budget, closed units, RigL, structured mode,
config errors, bitwise replay, the MAC formula. Tiny synthetic shapes; all on CPU in seconds.
Training runs (the budget's effect, the classifier loop's batches and resume):
tests/integration/train/test_gated_mlp_training.py."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import mlp_common
from dynjax.data import tabular
from dynjax.data.text import DataError
from dynjax.measure import macs
from dynjax.models.gated_mlp import GatedMLP, MLPConfig, structured_forward
from dynjax.train import classify, sparse

X = jax.random.normal(jax.random.key(1), (16, 12))


def small(variant="dgate", **kw):
    cfg = dict(in_dim=12, hidden=(32, 32), n_classes=3, variant=variant, block_size=8,
               gate_bias_init=0.0)
    return GatedMLP(MLPConfig(**{**cfg, **kw}))


def test_ste_forward_is_hard_mask_and_gradient_is_soft_paths():
    model = small(hidden=(32,))
    params = model.init(jax.random.key(0), X)
    y = jnp.arange(16) % 3
    lp, out = params["layer_0"], params["out"]

    def gate_p(gate_params):
        h = jax.nn.relu(X @ gate_params["hidden"]["kernel"] + gate_params["hidden"]["bias"])
        return jax.nn.sigmoid(h @ gate_params["logits"]["kernel"] + gate_params["logits"]["bias"])

    a = jax.nn.relu(X @ lp["dense"]["kernel"] + lp["dense"]["bias"])
    g = (gate_p(lp["gate"]) > 0.5).astype(jnp.float32)
    assert 0 < float(g.mean()) < 1  # the test needs both open and closed units

    def head_loss(h):
        return optax.softmax_cross_entropy_with_integer_labels(h @ out["kernel"] + out["bias"], y).mean()

    # Forward: exactly the hard-masked network.
    logits, _ = jax.jit(model.apply)(params, X)
    np.testing.assert_allclose(logits, (a * g) @ out["kernel"] + out["bias"], rtol=1e-6, atol=1e-6)
    # Backward: the cotangent at the hard forward, sent through the soft path p.
    grads = jax.jit(jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
        model.apply(p, X)[0], y).mean()))(params)
    cot = jax.grad(head_loss)(a * g) * a
    _, vjp = jax.vjp(gate_p, lp["gate"])
    chex.assert_trees_all_close(grads["layer_0"]["gate"], vjp(cot)[0], rtol=1e-5, atol=1e-7)


def test_closed_unit_contributes_nothing():
    model = small()
    params = model.init(jax.random.key(0), X)
    f = jax.jit(lambda p: model.apply(p, X, with_aux=True))
    logits, _, aux = f(params)
    ex, unit = map(int, np.argwhere(np.asarray(aux["open"][0]) == 0)[0])
    bumped = jax.tree.map(lambda t: t, params)
    l0, l1 = dict(bumped["layer_0"]), dict(bumped["layer_1"])
    l0["dense"] = {"kernel": params["layer_0"]["dense"]["kernel"].at[:, unit].add(5.0),
                   "bias": params["layer_0"]["dense"]["bias"].at[unit].add(5.0)}
    l1["dense"] = {**params["layer_1"]["dense"],
                   "kernel": params["layer_1"]["dense"]["kernel"].at[unit].add(5.0)}
    gate = dict(params["layer_1"]["gate"])
    gate["hidden"] = {**gate["hidden"], "kernel": gate["hidden"]["kernel"].at[unit].add(5.0)}
    l1["gate"] = gate
    bumped = {**params, "layer_0": l0, "layer_1": l1}
    logits2, _, _ = f(bumped)
    np.testing.assert_array_equal(logits2[ex], logits[ex])
    assert not np.array_equal(logits2, logits)  # the bump does matter where the unit is open


def test_rigl_keeps_exact_sparsity():
    model = small()
    params = model.init(jax.random.key(0), X)
    y = jnp.arange(16) % 3
    tx = sparse.rigl(optax.adam(1e-2), sparsity=0.8, update_every=2, drop_fraction=0.5,
                     end_step=20)
    state = tx.init(params)
    names = ["layer_0", "layer_1", "out"]
    shapes = [(12, 32), (32, 32), (32, 3)]
    promised = [round(d * a * b) for d, (a, b) in zip(sparse.erk_densities(shapes, 0.8), shapes)]
    assert abs(sum(promised) / sum(a * b for a, b in shapes) - 0.2) < 0.01

    @jax.jit
    def step(params, state):
        g = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
            model.apply(p, X)[0], y).mean())(params)
        u, state = tx.update(g, state, params)
        return optax.apply_updates(params, u), state

    first = sparse.weight_masks(state, params, names)
    for _ in range(7):
        params, state = step(params, state)
        masks = sparse.weight_masks(state, params, names)
        assert [int(m.sum()) for m in masks] == promised
        kernels = [params["layer_0"]["dense"]["kernel"], params["layer_1"]["dense"]["kernel"],
                   params["out"]["kernel"]]
        for w, m in zip(kernels, masks):
            assert not np.any(np.asarray(w)[~np.asarray(m)])  # absent weights exactly 0
    assert not np.array_equal(first[1], masks[1])  # connectivity did move
    # GateNet weights are never sparsified.
    assert bool(state.masks["layer_0"]["gate"]["logits"]["kernel"].all())


def test_magnitude_prune_density():
    model = small(variant="dense")
    params = model.init(jax.random.key(0), X)
    tx = sparse.magnitude_prune(optax.sgd(0.0), density=0.25, prune_step=1)
    state = tx.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    for _ in range(2):
        u, state = tx.update(zero, state, params)
        params = optax.apply_updates(params, u)
    w = np.asarray(params["layer_1"]["dense"]["kernel"])
    assert (w != 0).sum() == round(0.25 * w.size)


@pytest.mark.parametrize("mode", ["example", "batch"])
def test_structured_equals_masked(mode):
    model = small("structured", capacity_mode=mode, keep_fraction=0.5)
    params = model.init(jax.random.key(0), X)
    masked, coeffs, aux = jax.jit(lambda p: model.apply(p, X, with_aux=True))(params)
    fast = jax.jit(lambda p: structured_forward(model.cfg, p, X))(params)
    np.testing.assert_allclose(fast, masked, rtol=1e-5, atol=1e-5)
    for o in aux["open"]:  # exactly the promised fraction of units per example
        np.testing.assert_array_equal(np.asarray(o).sum(-1), 16.0)


@pytest.mark.parametrize("bad, match", [
    (dict(theta=0.0), "theta"), (dict(theta=1.0), "theta"), (dict(theta=-0.2), "theta"),
    (dict(tau=0.0), "tau"), (dict(tau=-1.0), "tau"), (dict(variant="mlp"), "variant"),
    (dict(variant="structured", block_size=5), "block_size")])
def test_bad_model_config(bad, match):
    with pytest.raises(ValueError, match=match):
        small(**bad)


def test_bad_run_config():
    c = mlp_common.base("dgate", "mnist")
    c.data.dataset = "cifar100"
    with pytest.raises(ValueError, match="unknown data.dataset='cifar100'"):
        classify.resolve_config(c)
    c = mlp_common.base("dgate", "mnist")
    c.gate.theta_start = 1.5
    with pytest.raises(ValueError, match="theta_start"):
        classify.resolve_config(c)
    with pytest.raises(ValueError, match="unknown method"):
        mlp_common.base("lottery", "mnist")
    with pytest.raises(DataError, match="unknown dataset"):
        tabular.load("cifar100")


def test_missing_data_names_the_fix(tmp_path):
    with pytest.raises(DataError, match="run `dynjax-fetch pbmc`"):
        tabular.load("pbmc68k", str(tmp_path))


@pytest.mark.parametrize("variant", ["dgate", "structured", "moe"])
def test_bitwise_replay_and_controller_not_run(variant):
    model = small(variant)
    params = model.init(jax.random.key(0), X)
    f = jax.jit(lambda p, c=None: model.apply(p, X, c))
    logits, coeffs = f(params)
    from dynjax.coeffs import check
    check(coeffs, model.schema)
    replay, again = f(params, coeffs)
    np.testing.assert_array_equal(replay, logits)
    chex.assert_trees_all_equal(again, coeffs)
    # Replay never runs the controller: poisoning its weights changes nothing.
    ctrl = "router" if variant == "moe" else "gate"
    poisoned = {k: ({**v, ctrl: jax.tree.map(lambda t: t * jnp.nan, v[ctrl])}
                    if k.startswith("layer_") else v) for k, v in params.items()}
    np.testing.assert_array_equal(f(poisoned, coeffs)[0], logits)


def test_replayed_p_is_rethresholded():
    model = small()
    params = model.init(jax.random.key(0), X)
    f = jax.jit(lambda p, c: model.apply(p, X, c, with_aux=True))
    _, coeffs = model.apply(params, X)
    shut = jax.tree.map(lambda p: jnp.full_like(p, 0.2), coeffs)  # all below theta = 0.5
    logits, _, aux = f(params, shut)
    assert all(float(o.sum()) == 0 for o in aux["open"])
    np.testing.assert_allclose(logits, jnp.broadcast_to(params["out"]["bias"], logits.shape))


def test_mac_formula_by_hand():
    dims = [4, 3, 2]
    a1 = jnp.array([[1, 0, 1], [0, 0, 0]], jnp.float32)   # 2 examples, hidden width 3
    m0 = jnp.ones((4, 3)).at[0, 0].set(0)                  # one absent weight into unit 0
    s = macs.mac_sums(dims, [a1], [m0, None], [(2, 3), None])
    # layer 0: ex0 open units {0, 2}: 4 + 4 - 1 absent = 7; ex1 none: 0.  layer 1: 2*2 + 0.
    np.testing.assert_allclose(s["macs"], [7, 4])
    # GateNet r=2, 3 logits, reads 4 inputs: 4*2 + 2*3 = 14 per example.
    np.testing.assert_allclose(s["ctrl"], [28, 0])
    r = macs.report(dims, s, 2)
    assert math.isclose(r["relmac"], (7 + 4 + 28) / 2 / (12 + 6))
    np.testing.assert_allclose(r["open_rate_per_layer"], [2 / 6])


def test_gate_speed_topk_margin():
    """benchmarks/gate_speed.py's topk_margin: how close a top-k block choice came to a tie
    (why the GPU's per-example fast path at batch 256 differed from masked by 0.055)."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "gate_speed", pathlib.Path(__file__).parents[3] / "benchmarks" / "gate_speed.py")
    gs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gs)
    cfg = small("structured", capacity_mode="example", keep_fraction=0.5).cfg  # 2 of 4 blocks
    p = np.array([[0.9, 0.5, 0.4, 0.1], [0.8, 0.6, 0.6, 0.2]])    # example 1: a tie at k=2
    hidden = len(cfg.hidden)
    assert gs.topk_margin(cfg, [p[:1]] * hidden) == pytest.approx(0.2)   # (0.5 - 0.4) / 0.5
    assert gs.topk_margin(cfg, [p] * hidden) == 0.0
    batch = small("structured", capacity_mode="batch", keep_fraction=0.5).cfg
    assert gs.topk_margin(batch, [p] * hidden) == pytest.approx((0.55 - 0.5) / 0.55)
