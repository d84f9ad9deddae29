"""The interventions as the audit engine runs them, compiled and vmapped over reassignment keys,
equal the eager reference (tests/unit/audit/test_audit_interventions.py: each condition's
semantics)."""
import jax
import numpy as np

from dynjax.audit import interventions as iv
from tests.unit.audit.test_audit_interventions import C, CAL, KEY, SCHEMA, leaves


def test_jit_and_vmap_over_keys():
    keys = jax.random.split(KEY, 4)
    for name in ("cross_input", "token_shuffle", "cross_shuffle"):
        run = jax.jit(jax.vmap(lambda k: iv.apply_condition(name, C, SCHEMA, key=k)))
        batched = run(keys)
        for i in (0, 3):
            eager = iv.CONDITIONS[name](C, SCHEMA, keys[i])
            for a, b in zip(leaves(jax.tree.map(lambda x: x[i], batched)), leaves(eager)):
                np.testing.assert_array_equal(a, b)
        assert not np.array_equal(batched["gate"][0], batched["gate"][1])
    for name in ("layer_position_mean", "static_profile", "structure_removed"):
        out = jax.jit(lambda c, cal: iv.apply_condition(name, c, SCHEMA, calib=cal))(C, CAL)
        for a, b in zip(leaves(out), leaves(iv.CONDITIONS[name](C, SCHEMA, CAL))):
            np.testing.assert_allclose(a, b, rtol=1e-6)
