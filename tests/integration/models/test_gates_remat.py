"""FeatureGate's training gradient under remat (two gradient programs compiled; the gate
family's other promises: tests/unit/models/test_gates.py)."""
import chex
import jax

from dynjax.models.transformer import next_token_nll
from tests.unit.models.test_gates import _model, _tokens


def test_remat_keeps_featuregate_features_and_not_attention_maps(capsys):
    """Under remat the backward pass keeps the (B, T, 4) features (``REMAT_SAVED``), so it
    needs neither the features' (T, T) passes nor the carried (B, H, T, T) log-probs; the
    gradients are those of the plain program."""
    from jax.ad_checkpoint import print_saved_residuals

    tokens = _tokens(shape=(3, 32))
    grads = {}
    for remat in (False, True):
        model = _model("feature_gate", remat=remat)
        params = model.init(jax.random.key(0), tokens)
        loss = lambda p: next_token_nll(model.apply(p, tokens)[0], tokens).mean()
        grads[remat] = jax.jit(jax.grad(loss))(params)
        if remat:
            print_saved_residuals(loss, params)
    saved = capsys.readouterr().out
    assert "f32[3,3,32,4] output of scan" in saved          # (layer, B, T, feature)
    assert "f32[3,3,2,32,32]" not in saved                  # no (layer, B, H, T, T) residual
    chex.assert_trees_all_close(grads[True], grads[False], atol=1e-6, rtol=1e-5)
