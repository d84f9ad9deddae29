"""How close a step comes to this CPU's matmul limit: GEMM rates, MFU, and where time goes.

Used by ``benchmarks/vs_pytorch.py`` (its ``gemm``, ``mfu`` and ``profile`` fields); three parts:

- **GEMM microbenchmark** (:func:`gemm_shapes`, :func:`gemm_timers`): float32 matmuls through
  ``jax.jit`` at the benchmark model's own shapes, N = batch x T tokens: the q/k/v/out
  projections [N, d] x [d, d] (dynjax projects q, k and v separately; PyTorch's fused
  [N, d] x [d, 3d] is timed beside it), the MLP's [N, d] x [d, d_ff] and
  [N, d_ff] x [d_ff, d], the head [N, d] x [d, V], the weight gradients [in, N] x [N, out],
  and attention per (batch x head): scores [blk, Dh] x [Dh, L] and values [blk, L] x [L, Dh]
  for a query block of ``attn_block`` rows over its mean block-causal key prefix L, the
  key/value gradients [L, blk] x [blk, Dh], and the full T x T square's two products.
- **Limit and MFU** (:func:`limit_report`): model FLOPs per step are
  ``dynjax.measure.mfu.train_step_flops`` (3 x ``analytic_forward_flops``: matmuls only,
  2 x MACs, attention over the full T x T square, MoD blocks on their k = floor(cT) tokens);
  a forward is 1 x. ``mfu`` = model FLOP/s / the fastest measured GEMM rate at the model's
  shapes (the CPU's attainable float32 matmul rate standing in for a datasheet peak).
  ``matmul_bound_s`` is the time the step's *executed* matmuls take if each runs at its own
  measured rate (forward, input gradient and weight gradient at their shapes; attention at
  block-causal size, the (m + 1) / 2m of the square it computes with m = T / attn_block
  blocks), and ``matmul_bound_fraction`` = bound / step time: 1.0 would be a step that is
  nothing but its matmuls at microbenchmark speed.
- **Profile** (:func:`profile_trace`): a ``jax.profiler`` trace of a few steps. XLA:CPU's
  runtime records one event per executed thunk (an HLO instruction of the compiled
  program: a fusion, a dot, a copy, ...) with its ``hlo_op`` name; each name is looked up
  in the compiled program's HLO text (:func:`classify_hlo`), whose instructions carry
  their Python stack frames. Categories: ``matmul`` (the instruction is or contains a dot:
  the fusions YNNPACK/XLA build around matmuls count here), ``attention_softmax`` (other
  work whose innermost frame is in dynjax's attention functions: scale, mask, logsumexp,
  exp), ``optimizer`` (frames in optax: AdamW, global-norm clipping, the gradient norm),
  ``guard`` (the loop's non-finite guard, ``dynjax/train/guard.py``),
  ``gather_scatter_copy`` (data movement only: copies, transposes, gathers, scatters,
  slices, concatenations, MoD's top-k), ``elementwise`` (every other fusion: norms, GELU,
  rotary, residual adds, the loss). Seconds are per step, summed over the runtime's
  threads (independent thunks can overlap, so the sum can exceed the wall time);
  ``device_busy_s`` is the union of those events per step on the clock and ``span_s`` the
  time from the traced steps' first instruction to their last, per step; the difference
  (``not_executing_s``) is time the program waited between instructions and between steps:
  host work the loop did not overlap (a log step's sync, the next batch and dispatch after
  it). ``step_breakdown_s`` splits ``span_s`` into the categories' shares of the busy time
  plus that host part (``data_host``), so its entries add up to the step.
  Robust on the CPU because it needs no extra ops, no sub-programs and no XLA flags: the
  compiled text comes from ``lower(...).compile()`` of the same jitted function (a cache
  hit, not a second compilation).
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import math
import os
import re
import statistics

import jax
import jax.numpy as jnp

from dynjax.measure.lm_execution import analytic_forward_flops
from dynjax.measure.mfu import train_step_flops
from dynjax.models import mod
from dynjax.models.transformer import ModelConfig

# ------------------------------------------------------------------------ GEMM shapes


def _attention_sizes(cfg: ModelConfig, T: int) -> tuple[int, int, int]:
    """(query block rows, mean key prefix L, blocks m) of causal_attention at length T."""
    blk = cfg.attn_block
    if blk <= 0 or T <= blk:
        return T, T, 1
    m = T // blk
    return blk, blk * (m + 1) // 2, m


def gemm_shapes(cfg: ModelConfig, batch: int, T: int) -> dict:
    """name -> (einsum, lhs shape, rhs shape): the matmuls of a train step of ``cfg``."""
    N, d, f, V = batch * T, cfg.d_model, cfg.d_ff, cfg.vocab_size
    bh, dh = batch * cfg.n_heads, cfg.head_dim
    blk, L, _ = _attention_sizes(cfg, T)
    mm, bmm = "nk,km->nm", "bnk,bkm->bnm"
    return {
        "proj [N,d]x[d,d]": (mm, (N, d), (d, d)),
        "qkv_fused [N,d]x[d,3d]": (mm, (N, d), (d, 3 * d)),
        "proj_wgrad [d,N]x[N,d]": (mm, (d, N), (N, d)),
        "mlp_up [N,d]x[d,dff]": (mm, (N, d), (d, f)),
        "mlp_down [N,dff]x[dff,d]": (mm, (N, f), (f, d)),
        "mlp_wgrad [d,N]x[N,dff]": (mm, (d, N), (N, f)),
        "head [N,d]x[d,V]": (mm, (N, d), (d, V)),
        "head_wgrad [d,N]x[N,V]": (mm, (d, N), (N, V)),
        "attn_scores [BH,blk,Dh]x[BH,Dh,L]": (bmm, (bh, blk, dh), (bh, dh, L)),
        "attn_values [BH,blk,L]x[BH,L,Dh]": (bmm, (bh, blk, L), (bh, L, dh)),
        "attn_kv_grad [BH,L,blk]x[BH,blk,Dh]": (bmm, (bh, L, blk), (bh, blk, dh)),
        "attn_scores_full [BH,T,Dh]x[BH,Dh,T]": (bmm, (bh, T, dh), (bh, dh, T)),
        "attn_values_full [BH,T,T]x[BH,T,Dh]": (bmm, (bh, T, T), (bh, T, dh)),
    }


def gemm_flops(spec) -> float:
    _, lhs, rhs = spec
    return 2.0 * math.prod(lhs) * rhs[-1]


def gemm_timers(shapes: dict) -> dict:
    """name -> zero-argument callable running that matmul once (jitted, float32 inputs)."""
    timers = {}
    keys = iter(jax.random.split(jax.random.key(2), 2 * len(shapes)))
    for name, (eq, lhs, rhs) in shapes.items():
        a = jax.random.normal(next(keys), lhs, jnp.float32)
        b = jax.random.normal(next(keys), rhs, jnp.float32)
        fn = jax.jit(lambda x, y, eq=eq: jnp.einsum(eq, x, y))
        timers[name] = lambda fn=fn, a=a, b=b: fn(a, b)
    return timers


def gemm_summary(shapes: dict, seconds: dict) -> dict:
    """Median seconds per shape -> FLOP/s per shape and the fastest."""
    rows = {name: {"lhs": list(spec[1]), "rhs": list(spec[2]), "flops": gemm_flops(spec),
                   "median_s": seconds[name], "flops_per_s": gemm_flops(spec) / seconds[name]}
            for name, spec in shapes.items() if name in seconds}
    return {"shapes": rows, "peak_flops_per_s": max(r["flops_per_s"] for r in rows.values()),
            "dtype": "float32",
            "note": "jax.jit(einsum) of one matmul, median over the run's rounds of the mean "
                    "of calls filling 50 ms after --settle untimed ones, in the dynjax "
                    "worker's turn"}


# ----------------------------------------------------------------- limit and MFU

def matmul_flops_by_class(cfg: ModelConfig, batch: int, T: int) -> dict:
    """Executed forward matmul FLOPs by the GEMM they run as: projections, MLP, head, and
    attention at block-causal size; ``other`` (routers, predictors) is the rest of the
    analytic count."""
    d, f = cfg.d_model, cfg.d_ff
    mod_ids = mod.mod_layer_ids(cfg) if cfg.family == "mod" else ()
    tokens = [mod.capacity(cfg, T) if i in mod_ids else T for i in range(cfg.n_layers)]
    n_attn = [_attention_sizes(cfg, n)[2] for n in tokens]
    out = {"proj": sum(2 * n * 4 * d * d for n in tokens),
           "mlp": sum(2 * n * 2 * d * f for n in tokens),
           "attention": sum(2 * 2 * n * n * d * (mm + 1) / (2 * mm) for n, mm in
                            zip(tokens, n_attn)),
           "head": 2 * T * d * cfg.vocab_size}
    out = {k: batch * v for k, v in out.items()}
    analytic = analytic_forward_flops(cfg, batch, T)["total"]
    full_attention = batch * sum(2 * 2 * n * n * d for n in tokens)
    out["other"] = max(0.0, analytic - full_attention - out["proj"] - out["mlp"] - out["head"])
    return out


def _rate(gemm: dict, name: str) -> float:
    return next(r["flops_per_s"] for k, r in gemm["shapes"].items() if k.startswith(name + " "))


def matmul_bound(cfg: ModelConfig, batch: int, T: int, gemm: dict) -> dict:
    """Seconds the executed matmuls of a forward and a train step take at the measured rates
    (a train step: forward, input gradients, weight gradients, each at its own shape)."""
    F = matmul_flops_by_class(cfg, batch, T)
    r = lambda name: _rate(gemm, name)  # noqa: E731
    half_mlp = F["mlp"] / 2
    forward = (F["proj"] / r("proj") + half_mlp / r("mlp_up") + half_mlp / r("mlp_down")
               + F["head"] / r("head") + F["other"] / r("proj")
               + F["attention"] / 2 / r("attn_scores") + F["attention"] / 2 / r("attn_values"))
    backward = (F["proj"] / r("proj") + F["proj"] / r("proj_wgrad")
                + half_mlp / r("mlp_down") + half_mlp / r("mlp_up") + F["mlp"] / r("mlp_wgrad")
                + F["head"] / r("head") + F["head"] / r("head_wgrad")
                + 2 * F["other"] / r("proj")
                + F["attention"] / 2 / r("attn_scores") + F["attention"] / 2 / r("attn_values")
                + F["attention"] / r("attn_kv_grad"))
    executed = sum(F.values())
    return {"executed_matmul_flops": {"forward": executed, "train": 3 * executed},
            "by_class_forward": F,
            "matmul_bound_s": {"forward": forward, "train": forward + backward},
            "matmul_mix_flops_per_s": {"forward": executed / forward,
                                       "train": 3 * executed / (forward + backward)}}


def limit_report(cfg: ModelConfig, batch: int, T: int, gemm: dict, step_seconds: dict) -> dict:
    """``step_seconds``: {row: {"train": s, "forward": s}} -> model FLOP/s, MFU, bound
    fraction per row, and the bound itself."""
    bound = matmul_bound(cfg, batch, T, gemm)
    model = {"train": train_step_flops(cfg, batch, T),
             "forward": analytic_forward_flops(cfg, batch, T)["total"]}
    rows = {}
    for row, times in step_seconds.items():
        rows[row] = {}
        for name, s in times.items():
            if s is None:
                continue
            achieved = model[name] / s
            rows[row][name] = {
                "model_flops_per_s": achieved,
                "mfu": achieved / gemm["peak_flops_per_s"],
                "matmul_bound_fraction": bound["matmul_bound_s"][name] / s}
    return {"model_flops": model,
            "model_flops_count": "dynjax.measure.mfu.train_step_flops (3x analytic forward) "
                                 "and analytic_forward_flops: matmuls only, 2 x MACs, attention "
                                 "over the full T x T square, MoD blocks on k tokens",
            "mfu_of": "gemm.peak_flops_per_s, the fastest measured GEMM at the model's shapes",
            **bound, "rows": rows}


# ------------------------------------------------------------------------ profile

CATEGORIES = ("matmul", "attention_softmax", "elementwise", "gather_scatter_copy",
              "optimizer", "guard", "other")
ATTENTION_FUNCTIONS = {"_attend", "attention_scores", "causal_attention", "fused_attention"}
DATA_MOVEMENT = {"parameter", "constant", "bitcast", "copy", "transpose", "gather", "scatter",
                 "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad",
                 "broadcast", "reshape", "iota", "tuple", "get-tuple-element", "sort",
                 "custom-call", "reverse"}
NO_VOTE = {"parameter", "constant", "bitcast", "broadcast", "reshape", "iota", "tuple",
           "get-tuple-element"}
CONTROL = {"while", "conditional", "call"}   # their bodies' thunks are traced on their own
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_CALLED_SET = re.compile(r"(?:calls|called_computations|branch_computations)=\{([^}]*)\}")
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_KV = re.compile(r"(\w+)=(\d+)")


def _parse_hlo(text: str):
    """(module name, computations {name: [(instr, opcode, [called], frame id)]}, entry name,
    frames {id: (file, function, parent)})."""
    module = re.match(r"HloModule\s+([\w.\-]+)", text).group(1)
    tables = {"FileNames": {}, "FunctionNames": {}, "FileLocations": {}, "StackFrames": {}}
    comps, current, entry, section = {}, None, None, None
    for line in text.splitlines():
        if line in tables:
            section = line
            continue
        if section and current is None:
            m = re.match(r"^(\d+) (.*)$", line)
            if m:
                body = m.group(2)
                tables[section][int(m.group(1))] = (body.strip('"') if body.startswith('"')
                                                    else dict((k, int(v)) for k, v in
                                                              _KV.findall(body)))
                continue
            section = None
        if current is None:
            if line.rstrip().endswith("{") and " = " not in line and not line.startswith("HloModule"):
                head = line.split()
                is_entry = head[0] == "ENTRY"
                current = head[1 if is_entry else 0].lstrip("%")
                comps[current] = []
                entry = current if is_entry else entry
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        rest = m.group(2)
        op = _OPCODE.search(" " + rest)
        called = _CALLED.findall(rest)
        for group in _CALLED_SET.findall(rest):
            called += [c.strip().lstrip("%") for c in group.split(",") if c.strip()]
        frame = _FRAME.search(rest)
        comps[current].append((m.group(1), op.group(1) if op else "?", called,
                               int(frame.group(1)) if frame else None))
    files, funcs = tables["FileNames"], tables["FunctionNames"]
    locs, stack = tables["FileLocations"], tables["StackFrames"]
    frames = {}
    for fid, fr in stack.items():
        loc = locs.get(fr.get("file_location_id"), {})
        frames[fid] = (files.get(loc.get("file_name_id"), ""),
                       funcs.get(loc.get("function_name_id"), ""), fr.get("parent_frame_id"))
    return module, comps, entry, frames


def _frame_category(frame_id, frames) -> str | None:
    """attention_softmax / optimizer from an instruction's innermost Python frame."""
    if frame_id is None or frame_id not in frames:
        return None
    file, func, _ = frames[frame_id]
    if "/optax/" in file:
        return "optimizer"
    if file.endswith("dynjax/train/guard.py"):
        return "guard"
    if func.split(".")[-1] in ATTENTION_FUNCTIONS and "dynjax/models" in file:
        return "attention_softmax"
    return None


def classify_hlo(text: str) -> tuple[str, dict]:
    """(module name, {instruction name: category}) for every instruction of the compiled
    program (see the module docstring for the categories). An instruction containing a dot
    is ``matmul``, one that only moves data ``gather_scatter_copy`` (whatever frame it
    carries: XLA gives a parameter's relayout copy the frame of the call that passed it);
    otherwise its computing instructions (a fusion's) vote with their innermost Python frame,
    and a plurality without a frame category is ``elementwise``."""
    module, comps, entry, frames = _parse_hlo(text)
    memo = {}

    def contents(comp, seen=()):
        """(opcodes, frame votes) of a computation and everything it calls."""
        if comp in memo:
            return memo[comp]
        ops, votes = collections.Counter(), collections.Counter()
        for _, op, called, frame in comps.get(comp, []):
            ops[op] += 1
            if op not in DATA_MOVEMENT | NO_VOTE:
                votes[_frame_category(frame, frames) or "none"] += 1
            for c in called:
                if c not in seen:
                    o, v = contents(c, seen + (comp,))
                    ops.update(o)
                    votes.update(v)
        memo[comp] = ops, votes
        return memo[comp]

    out = {}
    for comp, instrs in comps.items():
        for name, op, called, frame in instrs:
            if op in CONTROL:
                out[name] = "control"
                continue
            ops, votes = collections.Counter({op: 1}), collections.Counter()
            if not called and op not in DATA_MOVEMENT | NO_VOTE:
                votes[_frame_category(frame, frames) or "none"] += 1
            for c in called:
                o, v = contents(c)
                ops.update(o)
                votes.update(v)
            if ops["dot"] or ops["convolution"]:
                out[name] = "matmul"
            elif set(ops) <= DATA_MOVEMENT | NO_VOTE | {"fusion"}:
                out[name] = "gather_scatter_copy"
            else:
                top = votes.most_common(1)[0][0] if votes else "none"
                out[name] = "elementwise" if top == "none" else top
    return module, out


def _trace_events(trace_dir: str) -> list:
    paths = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                             recursive=True))
    if not paths:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(paths[-1], "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def profile_trace(trace_dir: str, hlo_text: str, steps: int) -> dict:
    """Per-step seconds by category of the compiled program ``hlo_text`` in a trace of
    ``steps`` executions, its busy time on the clock, and its largest instructions."""
    module, category = classify_hlo(hlo_text)
    per_cat = collections.Counter()
    per_op = collections.Counter()
    intervals, unknown = [], 0
    for e in _trace_events(trace_dir):
        args = e.get("args") or {}
        if e.get("ph") != "X" or args.get("hlo_module") != module or "hlo_op" not in args:
            continue
        cat = category.get(args["hlo_op"])
        if cat == "control":
            continue
        if cat is None:
            cat, unknown = "other", unknown + 1
        dur = float(e.get("dur", 0.0)) * 1e-6
        per_cat[cat] += dur
        per_op[(args["hlo_op"], cat)] += dur
        intervals.append((float(e["ts"]) * 1e-6, float(e["ts"]) * 1e-6 + dur))
    busy, end = 0.0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            busy += hi - lo
            end = hi
        elif hi > end:
            busy += hi - end
            end = hi
    total = sum(per_cat.values())
    if not total:
        raise RuntimeError(f"the trace has no events of {module} (hlo_op names): this "
                           "jax's CPU runtime does not trace per-instruction events")
    span = max(hi for _, hi in intervals) - min(lo for lo, _ in intervals)
    return {"module": module, "steps_traced": steps,
            "op_s_per_step": {c: per_cat[c] / steps for c in CATEGORIES},
            "op_share": {c: per_cat[c] / total for c in CATEGORIES},
            "op_s_per_step_total": total / steps,
            "device_busy_s": busy / steps,
            "span_s": span / steps,
            "events_not_in_hlo": unknown,
            "top_ops": [{"op": op, "category": cat, "s_per_step": s / steps}
                        for (op, cat), s in per_op.most_common(12)]}


def median_or_none(xs):
    return statistics.median(xs) if xs else None
