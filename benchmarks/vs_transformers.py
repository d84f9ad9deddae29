"""dynjax's Hugging Face port against transformers on the same CPU, in turns.

    pip install -e '.[hf]'           # torch==2.13.0 (CPU build) + transformers
    python -m benchmarks.vs_transformers --out results/vs_transformers.json

Random MoE checkpoints made by transformers and saved to a temporary directory, one per
``--model-types`` entry (:data:`SHAPES`: OLMoE- and Qwen3-MoE-shaped, d = 1024, 64 experts,
top-8, 4 layers: the production shapes scaled down so that a forward over 512 tokens takes
seconds on a 2-core CPU), each loaded in every ``--dtypes`` entry by every contender:

- ``dynjax``: ``dynjax.loaders.hf.load`` and the jitted forward (experts through the
  dropless dispatch);
- ``transformers``: eager attention and transformers' default experts implementation (the
  ``grouped_mm`` kernel where torch has one), what ``from_pretrained`` gives a user;
- ``transformers_loop``: eager attention and ``experts_implementation="eager"`` (its loop
  over the experts);
- ``torch_compile`` (``--compile``): ``transformers`` under ``torch.compile``.

Each contender runs in its own process, as a user runs it, all under dynjax's allocator
setting; the processes take turns, one forward each per round, medians after warm-up
(compilation excluded), each timed call after ``--settle`` untimed ones. The JSON names the
command, the runtime, the load average before and after each comparison, tokens/s of each
and dynjax's speed over each other contender's (the goal: >= 2 over ``transformers``). On a
GPU machine ``--torch-device cuda`` runs transformers there too (dynjax runs on JAX's default
device; ``scripts/gpu_checks.sh hf``).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from dynjax import runtime
from dynjax.runtime import describe  # noqa: E402

runtime.setup(__name__)

try:
    import torch
    import transformers
except ImportError:
    raise SystemExit("vs_transformers.py needs the hf extra: pip install -e '.[hf]' "
                     "(torch==2.13.0, CPU build, and transformers)") from None
import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import hf_gemm_bound  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402

COMMON = dict(vocab_size=8192, hidden_size=1024, num_hidden_layers=4, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
# OLMoE-1B-7B (d 2048, 16 heads of 128, 64 experts of width 1024, top-8, q/k norm over all
# heads) and Qwen3-30B-A3B (d 2048, 32 query / 4 key-value heads of 128, 128 experts of width
# 768, top-8, q/k norm per head) with the width and depth scaled down, 64 experts top-8 kept
SHAPES = {
    "olmoe": dict(intermediate_size=512, num_attention_heads=16, num_key_value_heads=16,
                  num_experts=64, num_experts_per_tok=8, norm_topk_prob=False),
    "qwen3_moe": dict(intermediate_size=2048, moe_intermediate_size=384, num_attention_heads=16,
                      num_key_value_heads=2, head_dim=64, num_experts=64,
                      num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1)}
CONTENDERS = ("dynjax", "transformers", "transformers_loop", "torch_compile")


def config(model_type):
    return {**COMMON, **SHAPES[model_type]}


def make_checkpoint(path, model_type):
    cfg = transformers.AutoConfig.for_model(model_type, **config(model_type))
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def timer(contender, args):
    """A function running one forward of the checkpoint on the benchmark's tokens, and what
    the contender runs (its experts implementation)."""
    tokens = np.random.default_rng(0).integers(0, COMMON["vocab_size"],
                                               (args.batch_size, args.seq_len))
    if contender == "dynjax":
        from dynjax.loaders import hf

        model, params = hf.load(args.checkpoint, dtype=args.dtype)
        fwd = jax.jit(lambda p, t: model.apply(p, t)[0])
        ids = jax.numpy.asarray(tokens, jax.numpy.int32)
        return (lambda: jax.block_until_ready(fwd(params, ids))), {
            "moe_dispatch": model.cfg.moe_dispatch, "attn_block": model.cfg.attn_block}
    experts = {"transformers_loop": "eager"}.get(contender)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.checkpoint, dtype=getattr(torch, args.dtype), attn_implementation="eager",
        **({"experts_implementation": experts} if experts else {})).eval()
    model.to(args.torch_device)
    ids = torch.as_tensor(tokens).to(args.torch_device)
    call = torch.compile(model) if contender == "torch_compile" else model

    def run():
        with torch.no_grad():
            logits = call(ids).logits
        if args.torch_device.startswith("cuda"):
            torch.cuda.synchronize()   # the forward has finished when the call returns
        return logits
    return run, {"experts_implementation": model.config._experts_implementation,
                 "attn_implementation": model.config._attn_implementation,
                 "torch_threads": torch.get_num_threads()}


def worker(contender, args):
    """Warm up, say "ready" (with what runs); then for each input line run ``--settle``
    untimed forwards and print one forward's seconds."""
    t0 = time.perf_counter()
    fn, info = timer(contender, args)
    fn()
    print(json.dumps({"ready": True, "warmup_s": time.perf_counter() - t0, **info}), flush=True)
    for _ in sys.stdin:
        for _ in range(args.settle):
            fn()
        t0 = time.perf_counter()
        fn()
        print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


def read_reply(proc) -> dict:
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"vs_transformers: a worker exited ({proc.wait()})")


def compare(args, ckpt, model_type, dtype, contenders):
    """One checkpoint in one dtype: every contender in turns; their medians and ratios."""
    workers, ready = {}, {}
    for c in contenders:   # one process each, started and warmed up one after another
        workers[c] = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.vs_transformers", "--worker", c,
             "--checkpoint", ckpt, "--dtype", dtype, *sys.argv[1:]], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
        ready[c] = read_reply(workers[c])
        ready[c].pop("ready")
    load_before, t0, times = os.getloadavg(), time.time(), {c: [] for c in contenders}
    for _ in range(args.repeats):
        for c, proc in workers.items():
            proc.stdin.write("forward\n")
            proc.stdin.flush()
            times[c].append(read_reply(proc)["seconds"])
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()
    tokens = args.batch_size * args.seq_len
    med = {c: statistics.median(t) for c, t in times.items()}
    floor = hf_gemm_bound.bound(config(model_type), args.batch_size, args.seq_len,
                                  dtype) if args.bound else None
    return {"model_type": model_type, "dtype": dtype, "config": config(model_type),
            "contenders": ready, "load_average_before": load_before,
            "load_average_after": os.getloadavg(), "timed_s": time.time() - t0,
            "seconds": times, "forward_s": med,
            "forward_tokens_per_s": {c: tokens / s for c, s in med.items()},
            "dynjax_over": {c: med[c] / med["dynjax"] for c in contenders if c != "dynjax"},
            "goal_met_ge_2x_transformers": med["transformers"] / med["dynjax"] >= 2.0,
            **({"matmul_floor": floor,
                "forward_over_matmul_floor": {c: s / floor["bound_s"] for c, s in med.items()},
                "goal_2x_over_matmul_floor": med["transformers"] / 2 / floor["bound_s"]}
               if floor else {})}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-types", default="olmoe,qwen3_moe",
                    help=f"comma-separated, of {sorted(SHAPES)}")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--settle", type=int, default=0)
    ap.add_argument("--loop", action=argparse.BooleanOptionalAction, default=True,
                    help="also time transformers' loop over the experts")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--bound", action=argparse.BooleanOptionalAction, default=True,
                    help="time the forward's matmuls alone (benchmarks/hf_gemm_bound.py): "
                         "the floor no contender can go under")
    ap.add_argument("--torch-device", default="cpu",
                    help="where transformers runs (cuda on a GPU machine: dynjax runs on JAX's "
                         "default device)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args)
    types = args.model_types.split(",")
    unknown = [t for t in types if t not in SHAPES]
    if unknown:
        raise SystemExit(f"--model-types {unknown[0]!r}: use some of {sorted(SHAPES)}")
    contenders = [c for c in CONTENDERS if (c != "transformers_loop" or args.loop)
                  and (c != "torch_compile" or args.compile)]
    runs = []
    for model_type in types:
        with tempfile.TemporaryDirectory() as ckpt:
            make_checkpoint(ckpt, model_type)
            for dtype in args.dtypes.split(","):
                runs.append(compare(args, ckpt, model_type, dtype, contenders))
                print(json.dumps({k: runs[-1][k] for k in
                                  ("model_type", "dtype", "forward_s", "dynjax_over")}),
                      file=sys.stderr, flush=True)
    publish_json({
        "command": command_line(), "runtime": describe(), "torch": torch.__version__,
        "transformers": transformers.__version__, "torch_device": args.torch_device,
        "jax_device": str(jax.devices()[0]), "batch_size": args.batch_size,
        "seq_len": args.seq_len, "repeats": args.repeats, "settle": args.settle,
        "runs": runs,
        "goal": "dynjax >= 2x transformers (eager attention, its default experts) per forward",
        "note": "medians of interleaved forwards in one run, one process per contender; "
                "production shapes scaled down (d 1024, 4 layers, 64 experts top-8, "
                "vocabulary 8192) to run in seconds on a 2-core CPU"},
        args.out, indent=2)


if __name__ == "__main__":
    main()
