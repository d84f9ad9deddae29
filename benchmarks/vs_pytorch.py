"""dynjax against PyTorch on the same CPU: the same dense and MoD models, timed in turns.

    pip install -e '.[bench]'        # torch==2.13.0, the CPU build (or: pip install torch==2.13.0)
    python -m benchmarks.vs_pytorch --out results/vs_pytorch.json

Model (both frameworks): byte-level pre-norm decoder, 8 blocks, d=256, 4 heads, d_ff=1024,
rotary positions, tanh-GELU MLP, RMSNorm, untied head; T=1024, batch 8, float32. ``mod``:
blocks 1, 3, 5, 7 are Mixture-of-Depths blocks at capacity c = 0.125 (router r = w.h, top-k
k = 128 tokens in their original order, update x sigmoid(r), the router and predictor BCE
losses), as ``configs/mod_tiny.py``. Train step: forward, backward, global-norm clipping and
AdamW (weight decay on matrices, warm-up cosine schedule). Forward: logits, no gradient.
The PyTorch models here are this file's own implementation (SDPA attention, causal).

Each framework runs in its own process, as a user runs it (dynjax, PyTorch eager and
``torch.compile``, all under dynjax's allocator setting, ``dynjax/_alloc.py``); the processes
take turns, one call of every model and framework per round, so load from other processes
falls on all alike;
medians after warm-up (compilation excluded). Within its turn each timed call follows
``--settle`` untimed calls of the same function (default 1), so it runs as a training loop's
step does, right after the previous one. Why both matter on this machine (a Firecracker VM
with free-page reporting): XLA:CPU frees its temporaries after every call, memory left free
for the seconds another turn takes goes back to the host and faults in again slowly, and in
one process with PyTorch the dynjax step ran at 3.1-4.4 s in every arrangement against 2.2-2.3
s alone (``benchmarks/interleave_cost.py``). The JSON names the command, the load average
before and after, and tokens/s ratios of dynjax over PyTorch eager (the goals: train >= 1.25,
forward >= 1.5) and over ``torch.compile``.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

from dynjax import _alloc
from dynjax._alloc import runtime  # noqa: E402

_alloc.reexec(__name__)

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    raise SystemExit("vs_pytorch.py needs PyTorch: pip install -e '.[bench]' (torch==2.13.0, "
                     "CPU build) or pip install torch==2.13.0") from None
import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import D, D_FF, HEADS, LAYERS, VOCAB, bench_config, dynjax_timers  # noqa: E402
from configs import mod_tiny  # noqa: E402
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


def timers_of(framework, args):
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
    return timers


def worker(framework, args):
    """Serve timings over stdin/stdout: warm up every timer (compiling), say "ready"; then
    for each line "VARIANT NAME", run ``--settle`` untimed calls and print one call's seconds."""
    try:
        timers = timers_of(framework, args)
        for fn in timers.values():
            block(fn())
    except Exception as e:  # noqa: BLE001 - torch.compile may fail on a CPU; report it
        print(json.dumps({"failed": f"{type(e).__name__}: {e}"[:500]}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        fn = timers[tuple(line.split())]
        for _ in range(args.settle):
            block(fn())
        t0 = time.perf_counter()
        block(fn())
        print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


def block(x):
    """Wait for a result of either framework (JAX dispatches asynchronously)."""
    return jax.block_until_ready(x) if not isinstance(x, torch.Tensor) else x


def read_reply(proc) -> dict:
    """The worker's next JSON line (other lines a library prints are skipped)."""
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    return {"failed": f"the worker exited ({proc.wait()})"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--attn-block", type=int, default=ModelConfig.attn_block,
                    help="dynjax's model.attn_block (0: full T x T attention)")
    ap.add_argument("--settle", type=int, default=1,
                    help="untimed calls before each timed call, as in a loop of steps")
    ap.add_argument("--variants", default="dense,mod")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args)
    frameworks = ["dynjax", "torch_eager"] + ([] if args.no_compile else ["torch_compile"])
    workers, notes = {}, {}
    for fw in frameworks:   # one process each, started and warmed up one after another
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.vs_pytorch", "--worker", fw,
                                 *sys.argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
        reply = read_reply(proc)
        if "failed" in reply:
            proc.kill()
            if fw != "torch_compile":   # the comparison needs dynjax and PyTorch eager
                raise SystemExit(f"vs_pytorch: the {fw} worker failed: {reply['failed']}")
            notes[fw] = "failed: " + reply["failed"]
        else:
            workers[fw] = proc
    load_before = os.getloadavg()
    t0 = time.time()
    times = {}
    for _ in range(args.repeats):   # every (variant, framework, call) takes a turn per round
        for variant in args.variants.split(","):
            for fw, proc in workers.items():
                for name in ("train", "forward"):
                    proc.stdin.write(f"{variant} {name}\n")
                    proc.stdin.flush()
                    times.setdefault((variant, fw, name), []).append(read_reply(proc)["seconds"])
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()
    medians = {k: statistics.median(v) for k, v in times.items()}
    tokens_per_call = args.batch_size * args.seq_len
    res = {"command": command_line(), "runtime": runtime(),
           "torch": torch.__version__,
           "jax": jax.__version__, "torch_threads": torch.get_num_threads(), "settle": args.settle,
           "processes": "one per framework (dynjax, torch_eager, torch_compile), taking turns",
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "timed_s": time.time() - t0, "repeats": args.repeats,
           "batch_size": args.batch_size, "seq_len": args.seq_len,
           "attn_block": args.attn_block, "notes": notes,
           "note": "medians of interleaved calls in one run; seconds per call; ratios are "
                   "dynjax tokens/s over the other's (>1: dynjax faster)"}
    for (variant, fw, name), t in medians.items():
        res.setdefault(variant, {}).setdefault(fw, {})[f"{name}_s"] = t
        res[variant][fw][f"{name}_tokens_per_s"] = tokens_per_call / t
    for variant in args.variants.split(","):
        r = res[variant]
        for other in ("torch_eager", "torch_compile"):
            if other in r:
                r[f"dynjax_over_{other}"] = {name: r[other][f"{name}_s"] / r["dynjax"][f"{name}_s"]
                                             for name in ("train", "forward")}
        eager = r["dynjax_over_torch_eager"]
        r["goals_met"] = {"train_ge_1.25x_eager": eager["train"] >= 1.25,
                          "forward_ge_1.5x_eager": eager["forward"] >= 1.5}
    publish_json(res, args.out, indent=2)


if __name__ == "__main__":
    main()
