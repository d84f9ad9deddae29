"""The benchmark model both vs_pytorch.py and alloc_speed.py time, as dynjax builds it."""
import jax

from dynjax.configs import mod_tiny
from dynjax.models import build
from dynjax.models.transformer import ModelConfig
from dynjax.train.lm import init_state, make_optimizer, make_train_step

D, HEADS, LAYERS, D_FF, VOCAB = 256, 4, 8, 1024, 256


def bench_config(variant, batch_size, seq_len, **model):
    """configs/mod_tiny.py (``dense`` or ``mod``) at 8 blocks, d=256, 4 heads, d_ff=1024."""
    config = mod_tiny.get_config(variant)
    config.train.batch_size, config.data.seq_len = batch_size, seq_len
    config.model.update(dict(d_model=D, n_heads=HEADS, n_layers=LAYERS, d_ff=D_FF, **model))
    return config


def dynjax_timers(config, tokens):
    """Zero-argument callables: one jitted train step (state donated) and one forward."""
    model = build(ModelConfig.from_dict(config.model.to_dict()))
    step = jax.jit(make_train_step(model, make_optimizer(config.train)), donate_argnums=0)
    state = {"s": init_state(config, model, jax.random.key(0))}
    params = model.init(jax.random.key(0), tokens)
    forward = jax.jit(lambda p, t: model.apply(p, t)[0])

    def train():
        state["s"], metrics = step(state["s"], tokens)
        return metrics["loss"]
    return {"train": train, "forward": lambda: forward(params, tokens)}
