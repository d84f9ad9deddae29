"""What one-program replay costs: FLOPs and times of the audit's record and replay forwards.

    python benchmarks/replay_cost.py     # from a checkout's root; prints one JSON line

configs/tiny.py-sized models (d=128, 4 layers, T=128, 16 rows; layers unrolled so
cost_analysis counts every layer) of four families. Since record and replay became one
program (dynjax.coeffs.site) the controller runs in replay too; run this in a checkout from
before that change (7e561ab, where replay skipped the controller) and in one after to
compare. FLOPs are exact; times are medians of interleaved calls (noisy on a shared machine).
"""
import json, sys, time, statistics
sys.path.insert(0, ".")
import jax, jax.numpy as jnp
from dynjax.models import build
new = hasattr(__import__("dynjax.coeffs").coeffs, "site")
out = {}
for fam, var in [("gates", "feature_gate"), ("mudd", "mudd"), ("mod", "mod"), ("moe", "moe")]:
    m = build(dict(family=fam, variant=var, d_model=128, n_heads=4, n_layers=4, d_ff=512,
                   scan_layers=False))
    tok = jax.random.randint(jax.random.key(1), (16, 128), 0, 256)
    p = m.init(jax.random.key(0), tok)
    f = jax.jit(m.apply)
    if new:
        from dynjax import coeffs as C
        shapes = jax.eval_shape(lambda p, t: m.apply(p, t)[1], p, tok)
        rec_args = (p, tok, C.recording(C.zeros_like(shapes)))
        _, c = f(*rec_args)
        rep_args = (p, tok, C.replaying(c))
    else:
        rec_args = (p, tok)
        _, c = f(*rec_args)
        rep_args = (p, tok, c)
    fl = lambda a: f.lower(*a).compile().cost_analysis()["flops"]
    ts = {"record": [], "replay": []}
    for _ in range(3):
        jax.block_until_ready(f(*rec_args)); jax.block_until_ready(f(*rep_args))
    for _ in range(15):
        for k, a in (("record", rec_args), ("replay", rep_args)):
            t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts[k].append(time.perf_counter() - t0)
    out[f"{fam}/{var}"] = {"flops_record": fl(rec_args), "flops_replay": fl(rep_args),
                           "median_s_record": statistics.median(ts["record"]),
                           "median_s_replay": statistics.median(ts["replay"])}
print(json.dumps({"code": "new" if new else "old", **out}))
