"""Staged MoDE beyond the unit tier (tests/unit/models/test_mode.py): the causal route
with binding expert capacity against the KV-cache decoder, and a train step of each mode_tiny
config."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.models import build
from tests.unit.models.test_mode import (
    CAUSAL, TOKENS, check_causal_staged_mode_with_binding_expert_capacity)


@pytest.mark.parametrize("route,top_k,cf", CAUSAL)
def test_causal_staged_mode_with_binding_expert_capacity(route, top_k, cf):
    check_causal_staged_mode_with_binding_expert_capacity(route, top_k, cf)


@pytest.mark.parametrize("variant", ["mode_staged", "mode_integrated"])
def test_mode_tiny_configs_build_and_train_one_step(variant):
    import optax

    from configs import mode_tiny
    c = mode_tiny.get_config(variant)
    c.model.update(d_model=32, n_heads=2, d_ff=64, n_layers=2)
    model = build(c.model.to_dict())
    tokens = TOKENS[:, :16]
    params = model.init(jax.random.key(4), tokens)

    def loss(p):
        logits, _, aux = model.apply(p, tokens, with_aux=True)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
            logits[:, :-1], tokens[:, 1:])) + sum(aux.values())
    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    assert c.model.family == ("mod" if variant == "mode_staged" else "moe")
    with pytest.raises(ValueError, match="unknown variant"):
        mode_tiny.get_config("nope")
