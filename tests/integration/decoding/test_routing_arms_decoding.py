"""KV-cache decoding of the routing study's hash and mHC arms equals their forward: a hash
layer routes the decoded token by its id, and every block sits behind its hyper-connection."""
import jax
import numpy as np
import pytest

from dynjax import decoding
from dynjax.models import llm
from tests.unit.models.test_routing_arms import TOKENS, tiny


@pytest.mark.parametrize("arm", ["hash", "mhc"])
def test_decoding_equals_the_forward(arm):
    cfg = tiny(arm).cfg
    params = llm.init(cfg, jax.random.key(5))
    if arm == "mhc":   # controllers away from their near-identity start, as trained ones
        params["layers"] = [dict(p, attn_hc=jax.tree.map(lambda a: a + 0.5, p["attn_hc"]))
                            for p in params["layers"]]
    full, _ = llm.forward(cfg, params, TOKENS)
    cached, _ = jax.jit(lambda p: decoding.cached_forward(cfg, p, TOKENS))(params)
    np.testing.assert_allclose(cached, full, atol=1e-4, rtol=1e-4)
