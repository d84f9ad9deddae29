"""dynjax against PyTorch on the same CPU: the same dense and MoD models, timed in turns.

    pip install -e '.[bench]'        # torch==2.13.0, the CPU build (or: pip install torch==2.13.0)
    python -m benchmarks.vs_pytorch --out results/vs_pytorch.json
    python -m benchmarks.vs_pytorch --quick --no-compile    # smoke test: T=128, batch 2

Model (both frameworks): byte-level pre-norm decoder, 8 blocks, d=256, 4 heads, d_ff=1024,
rotary positions, tanh-GELU MLP, RMSNorm, untied head; T=1024, batch 8, float32. ``mod``:
blocks 1, 3, 5, 7 are Mixture-of-Depths blocks at capacity c = 0.125 (router r = w.h, top-k
k = 128 tokens in their original order, update x sigmoid(r), the router and predictor BCE
losses), as ``configs/mod_tiny.py``. Train step: forward, backward, global-norm clipping and
AdamW (weight decay on matrices, warm-up cosine schedule). Forward: logits, no gradient.
The PyTorch models here are this file's own implementation (SDPA attention, causal).

Two dynjax paths. ``dynjax``: the isolated step, one jitted train step (or forward) per
call. ``dynjax_loop``, the user path: ``train.py``'s own loop (``dynjax.train.loop.train``)
on the same model (``benchmarks/user_path.py``: batches cut from the corpus each step, the
non-finite guard, a metrics line and TensorBoard events every ``--loop-log-every`` steps, the
progress bar; no checkpoint or validation inside the timed run), seconds per step over
``--loop-steps`` steps; its forward is the loop's validation step (``evaluation.evaluate``)
on one batch of windows. PyTorch's rows are its step alone, without data loading: a lower
bound of a PyTorch user's loop, so the user-path ratios are conservative. The goals (issue
32), on the user path: train >= 1.5x PyTorch eager and >= 1.25x ``torch.compile``, forward
>= 1.75x eager (``goals_met``; ``goals_met_isolated``: the same goals for the isolated step).

Against the CPU's limit (``benchmarks/cpu_limit.py``): ``gemm``, float32 matmul FLOP/s
through jax at the model's shapes, measured in the dynjax worker's turn of every round;
``mfu``, each row's model FLOP/s (the analytic count) over the rate its matmuls would reach
at those measured speeds, and the matmul-only bound in seconds; ``profile``, a
``jax.profiler`` trace of ``--profile-steps`` steps of train.py's loop after the rounds,
its op time by category (matmuls, attention softmax, elementwise, data movement, optimizer)
and the time per step the program was not executing (host work the loop did not overlap).

Each framework runs in its own process, as a user runs it (dynjax, one train.py loop per
variant, PyTorch eager and ``torch.compile``, all under dynjax's allocator setting,
``dynjax/runtime.py``); the processes take turns, one call of every model and framework per
round, so load from other processes falls on all alike;
medians after warm-up (compilation excluded). Within its turn each timed call follows
``--settle`` untimed calls of the same function (default 1), so it runs as a training loop's
step does, right after the previous one. Why both matter on this machine (a Firecracker VM
with free-page reporting): XLA:CPU frees its temporaries after every call, memory left free
for the seconds another turn takes goes back to the host and faults in again slowly, and in
one process with PyTorch the dynjax step ran at 3.1-4.4 s in every arrangement against 2.2-2.3
s alone (``benchmarks/interleave_cost.py``). The JSON names the command, the load average
before and after, and tokens/s ratios of dynjax over PyTorch eager and over
``torch.compile``, for both paths.
"""
import argparse
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

from dynjax import runtime
from dynjax.runtime import describe  # noqa: E402

runtime.setup(__name__)

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    raise SystemExit("vs_pytorch.py needs PyTorch: pip install -e '.[bench]' (torch==2.13.0, "
                     "CPU build) or pip install torch==2.13.0") from None
import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import cpu_limit  # noqa: E402
from benchmarks.vs_pytorch_tables import GOALS  # noqa: E402
from benchmarks.common import D, D_FF, HEADS, LAYERS, VOCAB, bench_config, dynjax_timers  # noqa: E402
from dynjax.configs import mod_tiny  # noqa: E402
from dynjax.models.transformer import ModelConfig  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402


# ------------------------------------------------------------------------- PyTorch

def rotary(x, cos, sin):
    """Rotate-half rotary embedding; x (B, T, H, Dh), cos/sin (B, T, 1, Dh/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(torch.nn.Module):
    """Pre-norm block returning its update a + m (dynjax.models.transformer.Block)."""

    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = torch.nn.RMSNorm(D, eps=1e-6), torch.nn.RMSNorm(D, eps=1e-6)
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        self.out = torch.nn.Linear(D, D, bias=False)
        self.up, self.down = torch.nn.Linear(D, D_FF, bias=False), torch.nn.Linear(D_FF, D, bias=False)

    def forward(self, h, cos, sin):
        B, T, _ = h.shape
        q, k, v = self.qkv(self.attn_norm(h)).view(B, T, 3, HEADS, D // HEADS).unbind(2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        a = self.out(o.transpose(1, 2).reshape(B, T, D))
        m = self.down(F.gelu(self.up(self.mlp_norm(h + a)), approximate="tanh"))
        return a + m


class ModBlock(torch.nn.Module):
    """A Mixture-of-Depths block: the top-k tokens by router score, in their original order
    (so causal by index is causal by position), run the block; update x sigmoid(r)."""

    def __init__(self, capacity):
        super().__init__()
        self.block, self.capacity = Block(), capacity
        self.router = torch.nn.Linear(D, 1, bias=False)
        self.predictor = torch.nn.Sequential(torch.nn.Linear(D, 32), torch.nn.GELU("tanh"),
                                             torch.nn.Linear(32, 1))

    def forward(self, h, cos, sin):
        B, T, _ = h.shape
        k = int(math.floor(self.capacity * T + 1e-9))
        r = self.router(h).squeeze(-1)
        pred = self.predictor(h.detach()).squeeze(-1)
        idx = r.topk(k, dim=-1).indices.sort(dim=-1).values                  # (B, k)
        rows = idx[..., None].expand(B, k, D)
        x = h.gather(1, rows)
        pick = lambda t: t.expand(B, -1, -1, -1).gather(1, idx[:, :, None, None].expand(
            B, k, 1, t.shape[-1]))
        w = torch.sigmoid(r.gather(1, idx))[..., None]
        h = h.scatter(1, rows, x + w * self.block(x, pick(cos), pick(sin)))
        target = torch.zeros_like(r).scatter(1, idx, 1.0)
        aux = 0.01 * (F.binary_cross_entropy_with_logits(r, target)
                      + F.binary_cross_entropy_with_logits(pred, target))
        return h, aux


class TorchDecoder(torch.nn.Module):
    def __init__(self, variant, capacity=0.125):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList(
            ModBlock(capacity) if variant == "mod" and i % 2 == 1 else Block()
            for i in range(LAYERS))
        self.final_norm = torch.nn.RMSNorm(D, eps=1e-6)
        self.lm_head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        half = D // HEADS // 2
        freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
        angle = torch.arange(T, dtype=torch.float32)[:, None] * freq          # (T, half)
        cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]
        h, aux = self.embed(tokens), 0.0
        for layer in self.layers:
            if isinstance(layer, ModBlock):
                h, a = layer(h, cos, sin)
                aux = aux + a / (LAYERS // 2)
            else:
                h = h + layer(h, cos, sin)
        return self.lm_head(self.final_norm(h)), aux


def torch_timers(variant, args, tokens, compile_):
    model = TorchDecoder(variant)
    run = torch.compile(model) if compile_ else model
    tc = mod_tiny.get_config(variant).train
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=tc.lr, betas=(tc.b1, tc.b2))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / tc.warmup_steps)
                                              * (0.55 + 0.45 * math.cos(math.pi * min(1.0, s / tc.steps))))

    def train():
        logits, aux = run(tokens)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)) + aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
        opt.step()
        sched.step()
        return loss.detach()

    def forward():
        with torch.no_grad():
            return run(tokens)[0]
    return {"train": train, "forward": forward}


def timers_of(framework, args, gemm=True):
    """This process's timers, (variant, name) -> fn, for one framework."""
    tokens = np.random.default_rng(1).integers(0, VOCAB, (args.batch_size, args.seq_len))
    timers = {}
    for variant in args.variants.split(","):
        if framework == "dynjax":
            config = bench_config(variant, args.batch_size, args.seq_len,
                                  attn_block=args.attn_block)
            fns = dynjax_timers(config, jax.numpy.asarray(tokens, dtype="int32"))
        else:
            torch.manual_seed(0)
            fns = torch_timers(variant, args, torch.from_numpy(tokens), framework == "torch_compile")
        for name, fn in fns.items():
            timers[(variant, name)] = fn
    if framework == "dynjax" and gemm:   # the GEMM microbenchmark (benchmarks/cpu_limit.py)
        timers.update(cpu_limit.gemm_timers(cpu_limit.gemm_shapes(
            model_config("dense", args), args.batch_size, args.seq_len)))
    return timers


def model_config(variant, args) -> ModelConfig:
    return ModelConfig.from_dict(bench_config(variant, args.batch_size, args.seq_len,
                                              attn_block=args.attn_block).model.to_dict())


def worker(framework, args):
    """Serve timings over stdin/stdout: warm up every timer (compiling), say "ready"; then
    for each line "VARIANT NAME", run ``--settle`` untimed calls and print one call's seconds.
    ``dynjax_loop:VARIANT`` is train.py's loop (``benchmarks/user_path.py``); the dynjax
    worker also answers "gemm all" with one timed call of every GEMM shape."""
    if framework.startswith("dynjax_loop:"):
        from benchmarks import user_path
        try:
            return user_path.loop_worker(framework.split(":", 1)[1], args)
        except Exception as e:  # noqa: BLE001 - report it to the orchestrator
            print(json.dumps({"failed": f"{type(e).__name__}: {e}"[:500]}), flush=True)
            return
    lever = framework.startswith(LEVER)
    try:
        timers = timers_of("dynjax" if lever else framework, args, gemm=not lever)
        for fn in timers.values():
            block(fn())
    except Exception as e:  # noqa: BLE001 - torch.compile may fail on a CPU; report it
        print(json.dumps({"failed": f"{type(e).__name__}: {e}"[:500]}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.split() == ["gemm", "all"]:
            print(json.dumps({"gemm": {name: timed(fn, args.settle, GEMM_MIN_S) for name, fn
                                       in timers.items() if isinstance(name, str)}}), flush=True)
            continue
        variant, name = line.split()
        if name == "digest":   # the forward's logits, to compare bits across levers
            logits = np.asarray(timers[(variant, "forward")]())
            print(json.dumps({"digest": hashlib.sha256(logits.tobytes()).hexdigest()}),
                  flush=True)
            continue
        print(json.dumps({"seconds": timed(timers[(variant, name)], args.settle)}),
              flush=True)


GEMM_MIN_S = 0.05   # a GEMM's timed calls, one after another, last at least this long


def timed(fn, settle: int, min_s: float = 0.0) -> float:
    """Seconds of one call of ``fn`` after ``settle`` untimed ones; with ``min_s``, the mean
    of as many calls (each waited for) as the last untimed call says fill ``min_s``."""
    last = 0.0
    for _ in range(settle):
        t0 = time.perf_counter()
        block(fn())
        last = time.perf_counter() - t0
    n = max(1, math.ceil(min_s / last)) if min_s and last else 1
    t0 = time.perf_counter()
    for _ in range(n):
        block(fn())
    return (time.perf_counter() - t0) / n


def block(x):
    """Wait for a result of either framework (JAX dispatches asynchronously)."""
    return jax.block_until_ready(x) if not isinstance(x, torch.Tensor) else x


def read_reply(proc) -> dict:
    """The worker's next JSON line (other lines a library prints are skipped)."""
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    return {"failed": f"the worker exited ({proc.wait()})"}


# XLA:CPU levers of jax 0.10 (issue 50), each tried alone in a dynjax worker of its own
# (the isolated step) beside the default one, in the same rounds: --levers NAME,... or all
# (each worker holds its own step's buffers: at batch 8, all of them at once ran this 23 GB
# VM out of memory). --xla_cpu_use_thunk_runtime=false is not one: jax 0.10 ignores it.
LEVERS = {
    "eigen_one_thread": "--xla_cpu_multi_thread_eigen=false",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "xnn_graph_greedy": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "ynn_fusion_off": "--xla_cpu_experimental_ynn_fusion_type=",
    "onednn": "--xla_cpu_use_onednn=true",
    "vector_width_512": "--xla_cpu_prefer_vector_width=512",
    "fast_math": "--xla_cpu_enable_fast_math=true",
}
LEVER = "dynjax@"   # a lever's worker: "dynjax@NAME"


FULL = dict(seq_len=1024, batch_size=8, repeats=5, loop_steps=5, loop_log_every=5,
            profile_steps=3)
QUICK = dict(seq_len=128, batch_size=2, repeats=2, loop_steps=2, loop_log_every=2,
             profile_steps=2)   # --quick: a smoke run of every part in a few minutes


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke-test sizes: {QUICK} (flags given explicitly still win)")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--attn-block", type=int, default=ModelConfig.attn_block,
                    help="dynjax's model.attn_block (0: full T x T attention)")
    ap.add_argument("--settle", type=int, default=1,
                    help="untimed calls before each timed call, as in a loop of steps")
    ap.add_argument("--loop-steps", type=int,
                    help="train.py loop steps timed per turn (the user path)")
    ap.add_argument("--loop-log-every", type=int,
                    help="the loop's train.log_every (a metrics line, TensorBoard events)")
    ap.add_argument("--profile-steps", type=int, help="loop steps in the profiler trace")
    ap.add_argument("--variants", default="dense,mod")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--levers", default="",
                    help=f"XLA:CPU flags to try one at a time, 'all' or some of {sorted(LEVERS)}")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    args.levers = [] if not args.levers else sorted(LEVERS) if args.levers == "all" else \
        args.levers.split(",")
    unknown = [name for name in args.levers if name not in LEVERS]
    if unknown:
        ap.error(f"--levers: unknown {unknown}; choose from {sorted(LEVERS)} or all")
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def start_workers(args) -> tuple[dict, dict]:
    """{(framework, variant or None): process}, warmed up one after another, and notes."""
    variants = args.variants.split(",")
    specs = ([("dynjax", None)] + [("dynjax_loop", v) for v in variants]
             + [("torch_eager", None)] + ([] if args.no_compile else [("torch_compile", None)])
             + [(LEVER + lever, None) for lever in args.levers])
    workers, notes = {}, {}
    for fw, variant in specs:   # one process each, as a user runs them
        name = fw if variant is None else f"{fw}:{variant}"
        env = dict(os.environ, PYTHONPATH=os.getcwd())
        if fw.startswith(LEVER):
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {LEVERS[fw[len(LEVER):]]}".strip()
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.vs_pytorch", "--worker", name,
                                 *sys.argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env)
        reply = read_reply(proc)
        if "failed" in reply:
            proc.kill()
            if fw == "dynjax" or fw.startswith("dynjax_loop") or fw == "torch_eager":
                # the comparison needs dynjax and PyTorch eager
                raise SystemExit(f"vs_pytorch: the {name} worker failed: {reply['failed']}")
            notes[fw] = "failed: " + reply["failed"]
        else:
            workers[(fw, variant)] = proc
    return workers, notes


def ask(proc, line: str) -> dict:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return read_reply(proc)


def compare(r: dict) -> None:
    """Add one variant's ratios (tokens/s of dynjax over the other) and goals to ``r``."""
    per_call = lambda a, b: {name: r[a][f"{name}_s"] / r[b][f"{name}_s"]  # noqa: E731
                             for name in ("train", "forward")}
    for mine, prefix in (("dynjax", "dynjax"), ("dynjax_loop", "user_path")):
        for other in ("torch_eager", "torch_compile"):
            if other in r:
                r[f"{prefix}_over_{other}"] = per_call(other, mine)
    r["user_path_over_isolated"] = per_call("dynjax_loop", "dynjax")   # > 1: the loop slower
    for key, prefix in (("goals_met", "user_path"), ("goals_met_isolated", "dynjax")):
        r[key] = {goal: (r[f"{prefix}_over_{other}"][name] >= need
                         if f"{prefix}_over_{other}" in r else None)
                  for goal, (name, other, need) in GOALS.items()}


def levers_report(args, variants, medians, digests) -> dict:
    """Per lever and variant: its step's seconds, the default dynjax step's over its own
    (> 1: the lever is faster), PyTorch's over it, and whether its forward's logits are
    the default's bit for bit."""
    out = {}
    for lever in args.levers:
        fw = LEVER + lever
        row = out[lever] = {"xla_flags": LEVERS[lever]}
        if (variants[0], fw, "train") not in medians:
            row["failed"] = True
            continue
        for variant in variants:
            t = {name: medians[(variant, fw, name)] for name in ("train", "forward")}
            r = row[variant] = {f"{name}_s": t[name] for name in t}
            for other, key in (("dynjax", "default"), ("torch_eager", "torch_eager"),
                               ("torch_compile", "torch_compile")):
                if (variant, other, "train") in medians:
                    r[f"speed_over_{key}"] = {name: medians[(variant, other, name)] / t[name]
                                              for name in t}
            r["forward_bitwise_default"] = digests[(fw, variant)] == digests[("dynjax", variant)]
    return out


def main():
    args = parse_args()
    if args.worker:
        return worker(args.worker, args)
    variants = args.variants.split(",")
    workers, notes = start_workers(args)
    load_before = os.getloadavg()
    t0 = time.time()
    times, extra, gemm_times = {}, {}, {}
    for _ in range(args.repeats):   # every (variant, framework, call) takes a turn per round
        for variant in variants:
            for (fw, owner), proc in workers.items():
                if owner not in (None, variant):
                    continue
                for name in ("train", "forward"):
                    reply = ask(proc, f"{variant} {name}")
                    if "seconds" not in reply:
                        raise SystemExit(f"vs_pytorch: {fw} {variant} {name}: {reply}")
                    times.setdefault((variant, fw, name), []).append(reply["seconds"])
                    for key in ("host_gap_s", "dispatch_s"):
                        if reply.get(key) is not None:
                            extra.setdefault((variant, fw, key), []).append(reply[key])
        for name, s in ask(workers[("dynjax", None)], "gemm all")["gemm"].items():
            gemm_times.setdefault(name, []).append(s)
    profiles = {variant: ask(workers[("dynjax_loop", variant)], f"{variant} profile").get(
        "profile") for variant in variants}
    digests = {(fw, variant): ask(proc, f"{variant} digest")["digest"]
               for (fw, owner), proc in workers.items()
               if fw == "dynjax" or fw.startswith(LEVER) for variant in variants}
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()
    timed_s = time.time() - t0
    medians = {k: statistics.median(v) for k, v in times.items()}
    tokens_per_call = args.batch_size * args.seq_len
    res = {"command": command_line(), "runtime": describe(),
           "torch": torch.__version__,
           "jax": jax.__version__, "torch_threads": torch.get_num_threads(), "settle": args.settle,
           "processes": "one per framework (dynjax, torch_eager, torch_compile) and one per "
                        "variant for train.py's loop (dynjax_loop), taking turns",
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "timed_s": timed_s, "repeats": args.repeats,
           "batch_size": args.batch_size, "seq_len": args.seq_len,
           "attn_block": args.attn_block, "loop_steps": args.loop_steps,
           "loop_log_every": args.loop_log_every, "profile_steps": args.profile_steps,
           "notes": notes,
           "paths": {"dynjax": "the isolated step: one jitted train step (state donated) or "
                               "forward per timed call, after --settle untimed ones",
                     "dynjax_loop": "the user path: train.py's loop (dynjax.train.loop.train: "
                                    "batches from the corpus, the guard, metrics and "
                                    "TensorBoard every loop_log_every steps, progress bar; "
                                    "no checkpoint or validation inside), seconds per step "
                                    "over loop_steps steps; forward: its validation step "
                                    "(evaluation.evaluate) on one batch of windows",
                     "torch_eager": "this file's PyTorch model, one step per call (no data "
                                    "loading: a lower bound of a PyTorch user's loop)",
                     "torch_compile": "the same under torch.compile"},
           "note": "medians of interleaved calls in one run; seconds per call; ratios are "
                   "dynjax tokens/s over the other's (>1: dynjax faster)"}
    res["levers"] = levers_report(args, variants, medians, digests)
    for (variant, fw, name), t in medians.items():
        if fw.startswith(LEVER):
            continue
        res.setdefault(variant, {}).setdefault(fw, {})[f"{name}_s"] = t
        res[variant][fw][f"{name}_tokens_per_s"] = tokens_per_call / t
    for (variant, fw, key), v in extra.items():
        res[variant][fw][f"train_{key}"] = statistics.median(v)
    for variant in variants:
        compare(res[variant])
    gemm = cpu_limit.gemm_summary(cpu_limit.gemm_shapes(
        model_config("dense", args), args.batch_size, args.seq_len),
        {name: statistics.median(v) for name, v in gemm_times.items()})
    res["gemm"] = gemm
    res["mfu"] = {variant: cpu_limit.limit_report(
        model_config(variant, args), args.batch_size, args.seq_len, gemm,
        {fw: {name: res[variant][fw].get(f"{name}_s") for name in ("train", "forward")}
         for fw in res[variant] if isinstance(res[variant][fw], dict)
         and "train_s" in res[variant][fw]}) for variant in variants}
    res["profile"] = profiles
    publish_json(res, args.out, indent=2)


if __name__ == "__main__":
    main()
