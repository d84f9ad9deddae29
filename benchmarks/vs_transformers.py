"""dynjax's Hugging Face port against transformers' eager forward, on the same CPU, in turns.

    pip install -e '.[hf]'           # torch==2.13.0 (CPU build) + transformers
    bash /work/wt/quiet.sh python -m benchmarks.vs_transformers --out results/vs_transformers.json

One random mid-sized MoE checkpoint, made by transformers and saved to a temporary
directory (default: Qwen3-MoE, 8 layers, d = 512, 8 query / 4 key-value heads, 16 experts of
width 256, top-2, vocabulary 4096), is loaded by both: transformers with eager attention,
dynjax through ``dynjax.loaders.hf.load`` (jitted forward; experts through the dropless
dispatch). Each framework runs in its own process, as a user runs it, both under dynjax's
allocator setting; the processes take turns, one forward each per round, medians after
warm-up (compilation excluded), each timed call after ``--settle`` untimed ones. The JSON
names the command, the runtime, the load average before and after, tokens/s of each and the
ratio dynjax / transformers (the goal: >= 2). On a GPU machine ``--torch-device cuda`` runs
transformers there too (dynjax runs on JAX's default device; ``scripts/gpu_checks.sh hf``).
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

from dynjax.jsonio import command_line, publish_json  # noqa: E402

CONFIG = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
              num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
              num_experts=16, num_experts_per_tok=2, norm_topk_prob=True,
              decoder_sparse_step=1, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make_checkpoint(path, model_type):
    cfg = transformers.AutoConfig.for_model(model_type, **CONFIG)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def timer(framework, args):
    """A function running one forward of the checkpoint on the benchmark's tokens."""
    tokens = np.random.default_rng(0).integers(0, CONFIG["vocab_size"],
                                               (args.batch_size, args.seq_len))
    if framework == "dynjax":
        from dynjax.loaders import hf

        model, params = hf.load(args.checkpoint)
        fwd = jax.jit(lambda p, t: model.apply(p, t)[0])
        ids = jax.numpy.asarray(tokens, jax.numpy.int32)
        return lambda: jax.block_until_ready(fwd(params, ids))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.checkpoint, dtype=torch.float32, attn_implementation="eager").eval()
    model.to(args.torch_device)
    ids = torch.as_tensor(tokens).to(args.torch_device)

    def run():
        with torch.no_grad():
            logits = model(ids).logits
        if args.torch_device.startswith("cuda"):
            torch.cuda.synchronize()   # the forward has finished when the call returns
        return logits
    return run


def worker(framework, args):
    """Warm up, say "ready"; then for each input line run ``--settle`` untimed forwards and
    print one forward's seconds."""
    fn = timer(framework, args)
    fn()
    print(json.dumps({"ready": True}), flush=True)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-type", default="qwen3_moe")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--settle", type=int, default=1)
    ap.add_argument("--torch-device", default="cpu",
                    help="where transformers runs (cuda on a GPU machine: dynjax runs on JAX's "
                         "default device)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args)
    frameworks = ("dynjax", "transformers")
    with tempfile.TemporaryDirectory() as ckpt:
        make_checkpoint(ckpt, args.model_type)
        workers = {}
        for fw in frameworks:   # one process each, started and warmed up one after another
            workers[fw] = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.vs_transformers", "--worker", fw,
                 "--checkpoint", ckpt, *sys.argv[1:]], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
            read_reply(workers[fw])
        load_before, t0, times = os.getloadavg(), time.time(), {fw: [] for fw in frameworks}
        for _ in range(args.repeats):
            for fw, proc in workers.items():
                proc.stdin.write("forward\n")
                proc.stdin.flush()
                times[fw].append(read_reply(proc)["seconds"])
        for proc in workers.values():
            proc.stdin.close()
            proc.wait()
    tokens = args.batch_size * args.seq_len
    med = {fw: statistics.median(t) for fw, t in times.items()}
    publish_json({
        "command": command_line(), "runtime": describe(), "torch": torch.__version__,
        "transformers": transformers.__version__, "model_type": args.model_type,
        "torch_device": args.torch_device, "jax_device": str(jax.devices()[0]),
        "config": CONFIG, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "repeats": args.repeats, "settle": args.settle, "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "timed_s": time.time() - t0, "seconds": times,
        "forward_s": med, "forward_tokens_per_s": {fw: tokens / s for fw, s in med.items()},
        "dynjax_over_transformers": med["transformers"] / med["dynjax"],
        "goal_met_ge_2x": med["transformers"] / med["dynjax"] >= 2.0,
        "note": "medians of interleaved forwards in one run, one process per framework"},
        args.out, indent=2)


if __name__ == "__main__":
    main()
