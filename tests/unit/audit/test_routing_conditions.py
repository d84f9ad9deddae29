"""The routing conditions (dynjax.audit.interventions.ROUTING) by value: token-identity gives
each position a score row recorded at another position of the same token id, expert-relabel
is a per-layer derangement of the experts, weights-flat keeps each token's top-k set with
equal weights; and which conditions apply to which schema and task."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import tasks
from dynjax.audit import interventions, settings
from dynjax.coeffs import Axes
from dynjax.models import moe

L, W, T, E, K = 3, 4, 8, 6, 2
SCHEMA = {"router": Axes(("layer", "example", "token", "expert")),
          "shared_gate": Axes(("layer", "example", "token"))}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, (W, T)).astype(np.int32)
    tokens[0, 0] = 99                      # one id that occurs nowhere else
    router = jax.nn.softmax(jnp.asarray(rng.normal(size=(L, W, T, E)) * 3, jnp.float32), -1)
    gate = jnp.asarray(rng.uniform(size=(L, W, T)), jnp.float32)
    return tokens, {"router": router, "shared_gate": gate}


class TokenIdentityTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_each_position_gets_a_row_recorded_for_its_token_id(self):
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, 5, (W, T)).astype(np.int32)
        tokens[0, 0] = 99
        coeffs = {"router": jnp.asarray(rng.normal(size=(L, W, T, E)), jnp.float32),
                  "shared_gate": jnp.asarray(rng.normal(size=(L, W, T)), jnp.float32)}
        fn = self.variant(lambda c, k: interventions.token_identity(c, SCHEMA, k, tokens))
        flat = tokens.reshape(-1)
        seen = set()
        for seed in range(4):
            out = jax.device_get(fn(coeffs, jax.random.key(seed)))
            r_in = np.asarray(coeffs["router"]).reshape(L, W * T, E)
            r_out = out["router"].reshape(L, W * T, E)
            g_out = out["shared_gate"].reshape(L, W * T)
            for p in range(W * T):
                # the donor: the one position whose layer-0 row this is
                donor = [q for q in range(W * T) if np.array_equal(r_in[0, q], r_out[0, p])]
                assert len(donor) == 1
                q = donor[0]
                assert flat[q] == flat[p]
                assert (q != p) == (np.sum(flat == flat[p]) > 1)   # elsewhere, if anywhere
                # one donor for every layer and every leaf
                np.testing.assert_array_equal(r_out[:, p], r_in[:, q])
                np.testing.assert_array_equal(
                    g_out[:, p], np.asarray(coeffs["shared_gate"]).reshape(L, W * T)[:, q])
                seen.add((p, q))
        assert len(seen) > W * T   # different keys draw different donors


def test_singleton_fraction(data):
    tokens, _ = data
    assert interventions.singleton_fraction(tokens) == pytest.approx(1 / (W * T))


def test_expert_relabel_is_a_per_layer_derangement(data):
    _, coeffs = data
    out = jax.jit(lambda c, k: interventions.expert_relabel(c, SCHEMA, k))(
        coeffs, jax.random.key(1))
    r_in, r_out = np.asarray(coeffs["router"]), np.asarray(out["router"])
    perms = []
    for layer in range(L):
        # expert e receives the column of expert perm[e], for every example and token
        perm = [next(j for j in range(E) if np.array_equal(r_out[layer, ..., e],
                                                           r_in[layer, ..., j]))
                for e in range(E)]
        assert sorted(perm) == list(range(E))
        assert all(p != e for e, p in enumerate(perm))        # no expert keeps its scores
        perms.append(tuple(perm))
    assert len(set(perms)) > 1                                  # drawn per layer
    chex.assert_trees_all_equal(out["shared_gate"], coeffs["shared_gate"])


@pytest.mark.parametrize("renormalise", [False, True])
def test_weights_flat_keeps_the_top_k_set_with_equal_weights(data, renormalise):
    _, coeffs = data
    out = jax.jit(lambda c: interventions.weights_flat(c, SCHEMA, top_k=K))(coeffs)
    probs, flat = coeffs["router"], out["router"]
    chosen = lambda p: np.sort(np.asarray(jax.lax.top_k(p, K)[1]), -1)
    np.testing.assert_array_equal(chosen(flat), chosen(probs))
    vals = np.asarray(jax.lax.top_k(flat, K)[0])
    np.testing.assert_array_equal(vals[..., 0], vals[..., 1])       # equal weights
    np.testing.assert_allclose(vals.sum(-1), np.asarray(jax.lax.top_k(probs, K)[0]).sum(-1),
                               rtol=1e-6)                           # their sum kept
    assert np.all(np.sort(np.asarray(flat), -1)[..., :-K] == 0)     # the rest strictly lower
    chex.assert_trees_all_equal(out["shared_gate"], coeffs["shared_gate"])
    # what a top-k router does with them: dynjax's MoE routes the same experts, equal gates
    _, combine, _ = moe.token_choice(flat[0], K, T)
    _, combine_orig, _ = moe.token_choice(probs[0], K, T)
    weights = np.asarray(combine).sum(-1)                           # (W, T, E)
    np.testing.assert_array_equal(weights > 0, np.asarray(combine_orig).sum(-1) > 0)
    if renormalise:
        weights = weights / weights.sum(-1, keepdims=True)
        np.testing.assert_allclose(weights[weights > 0], 1 / K, rtol=1e-6)


def test_weights_flat_needs_a_top_k_and_applicability():
    with pytest.raises(ValueError, match="needs"):
        interventions.apply_condition("weights_flat", {}, {})
    names = ("correct", "cross_input", "token_shuffle", "token_identity", "expert_relabel",
             "weights_flat")
    s = settings.Settings(conditions=names)
    run, skipped = settings.applicable(s, SCHEMA, tasks.LM, {"top_k": 2})
    assert run.conditions == names and skipped == {}
    _, skipped = settings.applicable(s, SCHEMA, tasks.LM, {})
    assert set(skipped) == {"weights_flat"} and "top_k" in skipped["weights_flat"]
    gates = {"gate": Axes(("layer", "example", "token"))}
    _, skipped = settings.applicable(s, gates, tasks.LM, {"top_k": 2})
    assert set(skipped) == {"expert_relabel", "weights_flat"}
    units = {"gate": Axes(("layer", "example", "unit", "expert"))}
    _, skipped = settings.applicable(s, units, tasks.CLASSIFY, {"top_k": 2})
    assert set(skipped) == {"token_shuffle", "token_identity"}


def test_conditions_by_name():
    """ "paper" is the paper's protocol, "all" adds the routing conditions."""
    class C(dict):
        __getattr__ = dict.__getitem__
    base = dict(reassignments=2, seed=0, batch_size=4, max_reassign_bytes=1 << 20,
                replay_atol=0.0, stats=C(level=0.95, n_resamples=99, seed=0),
                criteria=C(small_nll_upper=0.002, high_retention_lower=0.95),
                variance=False, per_window=False)
    paper = settings.Settings.from_config(C(base, conditions="paper"))
    assert paper.conditions == tuple(interventions.CONDITIONS)
    every = settings.Settings.from_config(C(base, conditions="all"))
    assert every.conditions == tuple(interventions.REGISTRY)
    assert set(interventions.ROUTING) <= set(every.conditions)
