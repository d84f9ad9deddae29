"""Peak host memory and wall time of ``hf.load`` on a sharded bf16 checkpoint, against
reading the same files (``cat > /dev/null``).

    python benchmarks/hf_load.py --dir=/tmp/hf_load_ckpt [--gb=2] [--out=results/hf_load.json]
    python benchmarks/hf_load.py --arch=qwen3_moe --dir=/tmp/hf_load_moe --cold \
        --out=results/hf_load_qwen3_moe.json

Makes (once; kept in ``--dir``, never committed) a random checkpoint of about ``--gb`` GB in
bfloat16, ``--arch`` llama (hidden 2048, GQA 16/4 heads, intermediate 5632, vocab 32000) or
qwen3_moe (hidden 1024, 16/4 heads of 64, 32 experts of 512 top-4 in every layer, q/k norms,
vocab 32000), as many layers as the size asks, saved with safetensors in ~500 MB shards with
model.safetensors.index.json and ``torch_dtype=bfloat16``, as transformers saves one. Then,
each in a fresh subprocess: ``hf.load(DIR)`` (the checkpoint's bf16), ``hf.load(DIR,
dtype=float32)`` and, for comparison, ``hf.load(DIR)`` reading through safetensors'
``safe_open`` as dynjax did before ``dynjax.loaders.tensors`` (every shard memory-mapped and
kept open), reporting the process's peak RSS (``VmHWM`` of /proc/self/status: getrusage's
ru_maxrss would carry the parent's size across fork and exec), the RSS after importing jax
and starting its backend (the floor no loader goes under) and the wall time from there; and
``cat`` of the shards before and after. The page cache is warm for these (the files were
just written or read), so the comparison is of CPU work, not of the disk. ``--cold`` adds
``cat`` and the bf16 load with the shards' pages first dropped from the page cache
(``posix_fadvise(DONTNEED)`` on each shard, after ``fsync``: no root needed, nothing else
evicted), as a checkpoint too large to stay cached is read. The load average is recorded
around every row. JSON out.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from dynjax.jsonio import command_line, publish_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {
    "llama": dict(model_type="llama", vocab_size=32000, hidden_size=2048,
                  intermediate_size=5632, num_attention_heads=16, num_key_value_heads=4,
                  head_dim=128, rms_norm_eps=1e-5, hidden_act="silu",
                  tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=2048,
                  torch_dtype="bfloat16", architectures=["LlamaForCausalLM"]),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=32000, hidden_size=1024,
                      intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4,
                      head_dim=64, num_experts=32, num_experts_per_tok=4,
                      moe_intermediate_size=512, norm_topk_prob=True, decoder_sparse_step=1,
                      rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
                      rope_theta=1000000.0, max_position_embeddings=4096,
                      torch_dtype="bfloat16", architectures=["Qwen3MoeForCausalLM"]),
}
SHARD_BYTES = 500 << 20
LABELS = {"default": "checkpoint dtype (bfloat16)",
          "cold": "checkpoint dtype (bfloat16), the shards dropped from the page cache first",
          "safe_open": "bfloat16, read through safetensors' safe_open (the loader before)"}

CHILD = r"""
import json, sys, time
import jax, numpy as np
from dynjax.loaders import hf

def status(key):   # this process's own memory (VmHWM: its peak), in bytes; reset by exec
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

if sys.argv[2] == "safe_open":   # the reading path before dynjax.loaders.tensors: every
    from safetensors import safe_open   # file open through safetensors' memory map
    from dynjax.loaders import tensors
    opened = {}
    def raw(self, name, out=None):
        f, key = self.source[name]
        if f not in opened:
            opened[f] = safe_open(f"{sys.argv[1]}/{f}", framework="numpy")
        a = opened[f].get_tensor(key)
        if out is None:
            return a
        out[...] = a
        return out
    tensors.Tensors._raw = raw
jax.devices()      # the backend starts before the clock
floor = status("VmRSS")
t0, c0 = time.perf_counter(), time.process_time()
model, params = hf.load(sys.argv[1], dtype=None if sys.argv[2] in ("default", "safe_open")
                        else sys.argv[2])
jax.block_until_ready(params)
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
leaves = jax.tree.leaves(params)
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "dtype": model.cfg.dtype,
                  "param_bytes": sum(int(a.nbytes) for a in leaves),
                  "params": sum(int(a.size) for a in leaves),
                  "rss_after_imports": floor, "peak_rss": status("VmHWM"),
                  "rss_after_load": status("VmRSS")}))
"""


def tensor_table(shape, n_layers):
    """(name, shape) of every tensor of a checkpoint of ``shape`` (an entry of SHAPES)."""
    D, I, V = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    hd, H, KV = shape["head_dim"], shape["num_attention_heads"], shape["num_key_value_heads"]
    rows = [("model.embed_tokens.weight", (V, D))]
    for i in range(n_layers):
        L = f"model.layers.{i}."
        rows += [(L + "input_layernorm.weight", (D,)), (L + "post_attention_layernorm.weight", (D,)),
                 (L + "self_attn.q_proj.weight", (H * hd, D)),
                 (L + "self_attn.k_proj.weight", (KV * hd, D)),
                 (L + "self_attn.v_proj.weight", (KV * hd, D)),
                 (L + "self_attn.o_proj.weight", (D, H * hd))]
        if "num_experts" not in shape:
            rows += [(L + "mlp.gate_proj.weight", (I, D)), (L + "mlp.up_proj.weight", (I, D)),
                     (L + "mlp.down_proj.weight", (D, I))]
            continue
        E, F = shape["num_experts"], shape["moe_intermediate_size"]
        rows += [(L + "self_attn.q_norm.weight", (hd,)), (L + "self_attn.k_norm.weight", (hd,)),
                 (L + "mlp.gate.weight", (E, D))]
        for e in range(E):
            M = L + f"mlp.experts.{e}."
            rows += [(M + "gate_proj.weight", (F, D)), (M + "up_proj.weight", (F, D)),
                     (M + "down_proj.weight", (D, F))]
    return rows + [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]


def make(path, gb, shape, shard_bytes=SHARD_BYTES):
    """A random bf16 checkpoint of ``shape`` and about ``gb`` GB in ``path``, in shards of
    about ``shard_bytes`` (tests/unit/loaders/test_hf_formats.py makes a small one)."""
    import ml_dtypes
    from safetensors.numpy import save_file

    per_layer = sum(np.prod(s) for _, s in tensor_table(shape, 1)) - sum(
        np.prod(s) for _, s in tensor_table(shape, 0))
    fixed = sum(np.prod(s) for _, s in tensor_table(shape, 0))
    n_layers = max(1, round((gb * 1e9 / 2 - fixed) / per_layer))
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    shards, current, size = [], {}, 0
    for name, dims in tensor_table(shape, n_layers):
        a = (rng.standard_normal(dims, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        current[name] = a
        size += a.nbytes
        if size >= shard_bytes:
            shards.append(current)
            current, size = {}, 0
    if current:
        shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update({k: file for k in shard})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**shape, "num_hidden_layers": n_layers}, f, indent=1)


def evict(files):
    """Drop the shards' pages from the page cache (written back first): the next read comes
    from the disk, as for a checkpoint too large to stay cached."""
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cat_seconds(files):
    """(wall, CPU) seconds of ``cat FILES > /dev/null``."""
    import resource

    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)


def load_in_child(path, dtype):
    before = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-c", CHILD, path, dtype], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return {**json.loads(out.stdout.strip().splitlines()[-1]),
            "load_average_1min": [before, os.getloadavg()[0]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where the checkpoint is made (or reused)")
    ap.add_argument("--arch", choices=sorted(SHAPES), default="llama")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--cold", action="store_true",
                    help="also cat and load with the shards dropped from the page cache")
    ap.add_argument("--out")
    args = ap.parse_args()
    shape = SHAPES[args.arch]
    if not os.path.exists(os.path.join(args.dir, "config.json")):
        make(args.dir, args.gb, shape)
    with open(os.path.join(args.dir, "config.json"), encoding="utf-8") as f:
        made = json.load(f)
    if made["model_type"] != shape["model_type"]:
        raise SystemExit(f"{args.dir} holds a {made['model_type']} checkpoint; give another "
                         f"--dir for --arch={args.arch}")
    files = sorted(glob.glob(os.path.join(args.dir, "*.safetensors")))
    file_bytes = sum(os.path.getsize(f) for f in files)
    load_average = [os.getloadavg()[0]]
    cat_before = cat_seconds(files)
    loads = {d: load_in_child(args.dir, d) for d in ("default", "float32", "safe_open")}
    cat_after = cat_seconds(files)
    cold = {}
    if args.cold:
        evict(files)
        cold["cat"] = cat_seconds(files)
        evict(files)
        loads["cold"] = load_in_child(args.dir, "default")
    load_average.append(os.getloadavg()[0])
    for name, row in loads.items():
        cat = cold["cat"] if name == "cold" else (min(cat_before[0], cat_after[0]),
                                                  min(cat_before[1], cat_after[1]))
        row["page_cache"] = "dropped before the load" if name == "cold" else "warm"
        row["peak_rss_over_param_bytes"] = row["peak_rss"] / row["param_bytes"]
        row["peak_rss_above_imports_over_param_bytes"] = (
            (row["peak_rss"] - row["rss_after_imports"]) / row["param_bytes"])
        row["seconds_over_cat"] = row["seconds"] / cat[0]
        row["cpu_seconds_over_cat"] = row["cpu_seconds"] / cat[1]
    publish_json({
        "command": command_line(), "runtime": describe(),
        "load_average_1min": {"start": load_average[0], "end": load_average[1]},
        "note": "wall times on a 2-core VM shared with other agents' work at the time: not a "
                "quiet measurement; peak RSS does not depend on the load",
        "checkpoint": {"files": len(files), "bytes": file_bytes,
                       "num_hidden_layers": made["num_hidden_layers"],
                       "shape": {k: v for k, v in shape.items() if isinstance(v, (int, str))
                                 and k != "torch_dtype"}},
        "cat_seconds": {"before": cat_before[0], "after": cat_after[0],
                        **({"cold": cold["cat"][0]} if cold else {})},
        "cat_cpu_seconds": {"before": cat_before[1], "after": cat_after[1],
                            **({"cold": cold["cat"][1]} if cold else {})},
        "goal": "peak RSS <= 1.25x the loaded parameters' bytes; load <= 1.5x cat",
        "loads": {LABELS.get(d, d): r for d, r in loads.items()}}, args.out)


if __name__ == "__main__":
    main()
