"""Each FCA condition preserves exactly what it claims, generically over schema axes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.audit import interventions as iv
from dynjax.coeffs import Axes

L, B, T, BC = 3, 5, 6, 7  # layers, eval examples, tokens, calibration examples
GATE = Axes(("layer", "example", "token"))
MIX = Axes(("stream", "example", "token", "source"))
SCHEMA = {"gate": GATE, "mix": [MIX, MIX], "static": Axes(("layer",))}


def make(n_examples, seed):
    """Distinct values everywhere, so equal slices mean equal origin."""
    rng = np.random.default_rng(seed)
    return {"gate": jnp.asarray(rng.uniform(size=(L, n_examples, T)), jnp.float32),
            "mix": [jnp.asarray(rng.normal(size=(2, n_examples, T, s)), jnp.float32)
                    for s in (2, 3)],
            "static": jnp.asarray(rng.uniform(size=(L,)), jnp.float32)}


C, CAL = make(B, 0), make(BC, 1)
KEY = jax.random.key(42)


def leaves(c):
    return [np.asarray(x) for x in jax.tree.leaves(c)]


def test_derangement_no_fixed_point_and_permutation():
    draws = jax.jit(lambda keys, n: jax.vmap(lambda k: iv.derangement(k, n))(keys),
                    static_argnums=1)           # one program per n, not the draws op by op
    for n in (2, 3, 5, 17):
        d = np.asarray(draws(jax.random.split(KEY, 64), n))
        assert not np.any(d == np.arange(n)), n
        np.testing.assert_array_equal(np.sort(d, axis=1), np.broadcast_to(np.arange(n), d.shape))
    # n=3 has exactly two derangements (the two 3-cycles); uniform sampling hits both.
    d3 = np.asarray(draws(jax.random.split(KEY, 64), 3))
    assert {tuple(r) for r in d3} == {(1, 2, 0), (2, 0, 1)}
    with pytest.raises(ValueError, match="at least 2"):
        iv.derangement(KEY, 1)


def test_token_permutations_are_independent_permutations():
    p = np.asarray(iv.token_permutations(KEY, 8, (3, 4)))
    assert p.shape == (3, 4, 8)
    np.testing.assert_array_equal(np.sort(p, -1), np.broadcast_to(np.arange(8), p.shape))
    assert len({tuple(r) for r in p.reshape(-1, 8)}) > 1


def test_permute_explicit():
    out = iv.permute(C, SCHEMA, "example", jnp.array([1, 0, 2, 4, 3]))
    np.testing.assert_array_equal(out["gate"], np.asarray(C["gate"])[:, [1, 0, 2, 4, 3]])
    np.testing.assert_array_equal(out["mix"][1], np.asarray(C["mix"][1])[:, [1, 0, 2, 4, 3]])
    np.testing.assert_array_equal(out["static"], C["static"])  # no example axis: unchanged
    perm = jnp.array([5, 4, 3, 2, 1, 0])
    out = iv.permute(C, SCHEMA, "token", perm)
    np.testing.assert_array_equal(out["mix"][0], np.asarray(C["mix"][0])[:, :, ::-1])
    with pytest.raises(ValueError, match="length"):
        iv.permute(C, SCHEMA, "example", jnp.array([1, 0]))


def donor_map(out, orig):
    """For every example slot of the gate leaf, the example whose tensor it now holds."""
    g, g0 = np.asarray(out["gate"]), np.asarray(orig["gate"])
    return np.array([next(j for j in range(B) if np.array_equal(g[:, e], g0[:, j]))
                     for e in range(B)])


def test_cross_input_global_derangement_keeps_multiset():
    out = iv.cross_input(C, SCHEMA, KEY)
    donor = donor_map(out, C)
    assert not np.any(donor == np.arange(B))
    for a, a0, ax in [(out["gate"], C["gate"], 1), (out["mix"][0], C["mix"][0], 1),
                      (out["mix"][1], C["mix"][1], 1)]:
        np.testing.assert_array_equal(a, np.take(np.asarray(a0), donor, axis=ax))  # same map
        np.testing.assert_array_equal(np.sort(np.ravel(a)), np.sort(np.ravel(a0)))
    np.testing.assert_array_equal(out["static"], C["static"])


def test_token_shuffle_keeps_values_per_layer_stream_example():
    out = iv.token_shuffle(C, SCHEMA, KEY)
    g, g0 = np.asarray(out["gate"]), np.asarray(C["gate"])
    np.testing.assert_array_equal(np.sort(g, -1), np.sort(g0, -1))
    assert not np.array_equal(g, g0)
    # per-(layer, example) permutations recovered from the distinct values are independent
    perms = {tuple(np.argsort(g0[l, e])[np.argsort(np.argsort(g[l, e]))])
             for l in range(L) for e in range(B)}
    assert len(perms) > L * B // 2
    for m, m0 in zip(out["mix"], C["mix"]):
        m, m0 = np.asarray(m), np.asarray(m0)
        for s in range(m.shape[0]):
            for e in range(B):  # whole source vectors move with their token
                rows = sorted(map(tuple, m[s, e]))
                assert rows == sorted(map(tuple, m0[s, e]))
    # the two mix leaves and the two streams do not share one permutation
    order = lambda a, a0: tuple(int(np.where(a0[:, 0] == v)[0][0]) for v in a[:, 0])
    m0, m1 = np.asarray(out["mix"][0]), np.asarray(out["mix"][1])
    o00 = order(m0[0, 0], np.asarray(C["mix"][0])[0, 0])
    o01 = order(m0[1, 0], np.asarray(C["mix"][0])[1, 0])
    o10 = order(m1[0, 0], np.asarray(C["mix"][1])[0, 0])
    assert len({o00, o01, o10}) > 1
    np.testing.assert_array_equal(out["static"], C["static"])


def test_cross_shuffle_is_paired():
    for k in jax.random.split(KEY, 3):
        both = iv.cross_shuffle(C, SCHEMA, k)
        composed = iv.token_shuffle(iv.cross_input(C, SCHEMA, k), SCHEMA, k)
        for a, b in zip(leaves(both), leaves(composed)):
            np.testing.assert_array_equal(a, b)
        # same donor map as cross_input alone and same perms as token_shuffle alone:
        # both[l, e, t] = C[l, donor[e], perm[l, e, t]]
        donor = donor_map(iv.cross_input(C, SCHEMA, k), C)
        cs, g0 = np.asarray(iv.token_shuffle(C, SCHEMA, k)["gate"]), np.asarray(C["gate"])
        perm = np.array([[[int(np.where(g0[l, e] == v)[0][0]) for v in cs[l, e]]
                          for e in range(B)] for l in range(L)])
        expect = np.take_along_axis(g0[:, donor], perm, axis=-1)
        np.testing.assert_array_equal(np.asarray(both["gate"]), expect)


def test_means_have_the_right_axes():
    lp = iv.layer_position_mean(C, SCHEMA, CAL)
    np.testing.assert_allclose(lp["gate"], np.broadcast_to(
        np.asarray(CAL["gate"]).mean(1, keepdims=True), (L, B, T)), rtol=1e-6)
    np.testing.assert_allclose(lp["mix"][1], np.broadcast_to(
        np.asarray(CAL["mix"][1]).mean(1, keepdims=True), C["mix"][1].shape), rtol=1e-5,
        atol=1e-7)
    sp = iv.static_profile(C, SCHEMA, CAL)
    expect = np.asarray(CAL["gate"]).mean((1, 2))
    np.testing.assert_allclose(sp["gate"], np.broadcast_to(expect[:, None, None], (L, B, T)),
                               rtol=1e-6)
    assert np.ptp(np.asarray(sp["mix"][0]), axis=(1, 2)).max() == 0  # constant over ex, tok
    np.testing.assert_array_equal(sp["static"], CAL["static"])  # nothing to average
    own = iv.mean_over(C, SCHEMA, ("token",))  # calib=None: the coefficients themselves
    np.testing.assert_allclose(own["gate"][:, :, 0], np.asarray(C["gate"]).mean(2), rtol=1e-6)
    assert all(a.dtype == b.dtype and a.shape == b.shape
               for a, b in zip(jax.tree.leaves(sp), jax.tree.leaves(C)))
    bf = iv.static_profile({"gate": C["gate"].astype(jnp.bfloat16)}, {"gate": GATE})
    assert bf["gate"].dtype == jnp.bfloat16


def test_structure_removed_source_uniform_and_global_mean():
    sr = iv.structure_removed(C, SCHEMA, CAL)
    sp = iv.static_profile(C, SCHEMA, CAL)
    for m, p in zip(sr["mix"], sp["mix"]):
        m, p = np.asarray(m), np.asarray(p)
        assert np.ptp(m, axis=(1, 2, 3)).max() == 0  # constant over example, token, source
        np.testing.assert_allclose(m.sum(-1), p.sum(-1), rtol=1e-5)  # signed sums kept
        assert np.ptp(m[:, 0, 0]) > 0  # but streams keep their own sums
    # GlobalMean: one scalar pooled over every leaf without a source axis
    pooled = np.concatenate([np.ravel(CAL["gate"]), np.ravel(CAL["static"])]).mean()
    np.testing.assert_allclose(sr["gate"], np.full((L, B, T), pooled), rtol=1e-6)
    np.testing.assert_allclose(sr["static"], np.full((L,), pooled), rtol=1e-6)




def test_registry():
    assert list(iv.CONDITIONS) == ["correct", "cross_input", "token_shuffle", "cross_shuffle",
                                   "layer_position_mean", "static_profile", "structure_removed"]
    assert {n for n, c in iv.CONDITIONS.items() if c.randomized} == {
        "cross_input", "token_shuffle", "cross_shuffle"}
    assert iv.apply_condition("correct", C, SCHEMA) is C
    with pytest.raises(ValueError, match="needs a key"):
        iv.apply_condition("cross_input", C, SCHEMA)


def test_token_shuffle_moves_sibling_readings_of_a_token_together():
    """MoD's router score and predictor logit describe the same token: one permutation."""
    rng = np.random.default_rng(3)
    c = {"router": jnp.asarray(rng.uniform(size=(L, B, T)), jnp.float32),
         "predictor": jnp.asarray(rng.uniform(size=(L, B, T)), jnp.float32)}
    schema = {"router": GATE, "predictor": GATE}
    out = iv.token_shuffle(c, schema, KEY)
    perm = lambda a, a0: np.array([[np.argsort(a0[l, e])[np.argsort(np.argsort(a[l, e]))]
                                    for e in range(B)] for l in range(L)])
    p_router = perm(np.asarray(out["router"]), np.asarray(c["router"]))
    p_pred = perm(np.asarray(out["predictor"]), np.asarray(c["predictor"]))
    np.testing.assert_array_equal(p_router, p_pred)
    assert not np.array_equal(np.asarray(out["router"]), np.asarray(c["router"]))
