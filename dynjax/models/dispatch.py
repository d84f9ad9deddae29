"""Dropless MoE dispatch: sort (token, expert) pairs by expert, one grouped matmul, combine.

Every token reaches each of its top-k experts, as production MoE models compute, with
memory and FLOPs linear in tokens x k; padded blocks bound every routing, so shapes are
static. The grouped matmul is a per-expert loop on CPU and ``jax.lax.ragged_dot`` on
GPU/TPU, each with a written-out backward (and batching rule) that copies no weights.
Depth: docs/moe.md#dropless-dispatch-and-the-grouped-matmul-dynjaxmodelsdispatchpy
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from dynjax.models import activation_sharding
from dynjax.models import matmul

IMPLS = ("blocks", "ragged")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=("row_expert", "block_expert", "group_sizes"),
                   meta_fields=("block", "num_experts", "impl"))
@dataclasses.dataclass(frozen=True)
class Groups:
    """The sorted layout: ``row_expert`` (M,) the expert of every row (padding rows: a valid
    id, their output is discarded), ``block_expert`` (M // block,), ``group_sizes`` (E,)
    rows per expert including its padding (they sum to at most M; the blocks after them
    are neither computed nor read), and the static block size, expert count and
    grouped-matmul implementation."""

    row_expert: jax.Array
    block_expert: jax.Array
    group_sizes: jax.Array
    block: int
    num_experts: int
    impl: str

    @property
    def rows(self) -> int:
        return self.row_expert.shape[-1]


def default_impl() -> str:
    """``ragged_dot`` where it is a real grouped kernel (GPU, TPU), padded blocks on CPU."""
    return "blocks" if jax.default_backend() == "cpu" else "ragged"


def default_block(n_pairs: int, num_experts: int) -> int:
    """Rows per block: a quarter of the mean rows per expert as a power of two in [8, 64]
    (padding, under a block per expert, adds about an eighth to the rows; larger blocks
    waste more, smaller ones loop more)."""
    quarter = max(1, -(-n_pairs // (4 * num_experts)))
    return int(min(64, max(8, 1 << (quarter - 1).bit_length())))


def n_rows(n_pairs: int, num_experts: int, block: int) -> int:
    """Static row count: sum_e ceil(c_e / block) * block over any counts summing to n_pairs."""
    return (n_pairs + num_experts * (block - 1)) // block * block


def layout(experts, num_experts: int, block: Optional[int] = None,
           impl: Optional[str] = None):
    """(dest (P,), row_token (M,), groups) for the flattened pairs ``experts`` (P,): the row
    of every pair (M for a pair routed nowhere) and the source pair of every row."""
    E, P = num_experts, experts.shape[0]
    block = default_block(P, E) if block is None else int(block)
    impl = default_impl() if impl is None else impl
    if impl not in IMPLS:
        raise ValueError(f"dispatch impl={impl!r}; use one of {IMPLS}")
    M = n_rows(P, E, block)
    live = (experts >= 0) & (experts < E)
    key = jnp.where(live, experts, E).astype(jnp.int32)      # routed nowhere: sorts last
    order = jnp.argsort(key, stable=True)
    skey = key[order]
    counts = jnp.zeros(E + 1, jnp.int32).at[key].add(1)[:E]
    sizes = (counts + block - 1) // block * block
    ends = jnp.cumsum(sizes)
    starts, first = ends - sizes, jnp.cumsum(counts) - counts
    e = jnp.minimum(skey, E - 1)
    dest_sorted = jnp.where(skey < E, starts[e] + jnp.arange(P) - first[e], M)
    dest = jnp.zeros(P, jnp.int32).at[order].set(dest_sorted.astype(jnp.int32),
                                                   unique_indices=True)
    row_pair = jnp.zeros(M, jnp.int32).at[dest].set(jnp.arange(P, dtype=jnp.int32),
                                                    mode="drop", unique_indices=True)
    block_expert = jnp.minimum(
        jnp.searchsorted(ends // block, jnp.arange(M // block), side="right"), E - 1)
    row_expert = jnp.repeat(block_expert, block, total_repeat_length=M)
    groups = Groups(row_expert.astype(jnp.int32), block_expert.astype(jnp.int32), sizes,
                    block, E, impl)
    return dest, row_pair, groups


def sorted_rows(n_pairs: int, num_experts: int, block: Optional[int] = None) -> int:
    """Rows :func:`dropless` allocates for ``n_pairs`` pairs (``block`` None: the default)."""
    block = default_block(n_pairs, num_experts) if block is None else int(block)
    return n_rows(n_pairs, num_experts, block)


def dropless(x, experts, weights, num_experts: int, expert_fn: Callable,
             block: Optional[int] = None, impl: Optional[str] = None, expert_params=None):
    """``y[n] = sum_j weights[n, j] * expert_fn(x[n])`` of expert ``experts[n, j]``.

    x (N, d); experts (N, k) int (outside ``[0, num_experts)``: routed nowhere); weights
    (N, k). ``expert_fn(rows, groups) -> (M, d_out)`` on rows sorted by expert, or, when
    ``expert_params`` (a pytree of per-expert arrays, experts leading) is given,
    ``expert_fn(expert_params, rows, groups)``: the form expert parallelism needs, since
    each device then holds only its own experts' slice of ``expert_params``. ``block``:
    rows per padding block (default :func:`default_block`); ``impl``: the grouped matmul,
    "blocks" or "ragged" (default by platform).

    Under a mesh whose rules map the logical axis "expert" to a mesh axis of more than one
    device (``activation_sharding.traced_under``, e.g. the ``ep`` sharding preset), and with
    ``expert_params``, the experts are split over that axis and the pairs travel to them by
    all-to-all (:func:`dropless_expert_parallel`); the result is the same function.
    """
    if expert_params is not None:
        ep = expert_mesh()
        if ep is not None:
            return dropless_expert_parallel(x, experts, weights, num_experts, expert_fn,
                                            expert_params, *ep, block=block, impl=impl)
        expert_fn = functools.partial(expert_fn, expert_params)
    N, k = experts.shape
    picked, live = _per_pair(x, experts.reshape(N * k), k, num_experts, expert_fn, block, impl)
    w = jnp.where(live.reshape(N, k), weights, 0).astype(picked.dtype)
    return jnp.einsum("nk,nkd->nd", w, picked.reshape(N, k, -1))


def _per_pair(x, flat, k: int, num_experts: int, expert_fn, block, impl):
    """(out (P, d_out), live (P,)): every pair's expert output (token ``p // k`` of x) and
    whether its expert is real; a pair routed nowhere gets some row's output (mask it)."""
    dest, row_pair, groups = layout(flat, num_experts, block, impl)
    out = expert_fn(x[row_pair // k], groups)
    if out.shape[0] != groups.rows:
        raise ValueError(f"expert_fn returned {out.shape[0]} rows for {groups.rows}: it must "
                         "return one row per input row")
    live = (flat >= 0) & (flat < num_experts)
    return out[jnp.minimum(dest, groups.rows - 1)], live


# ------------------------------------------------------------------- expert parallelism

def _axes(spec) -> tuple:
    if spec is None:
        return ()
    return tuple(spec) if isinstance(spec, (tuple, list)) else (spec,)


def expert_mesh():
    """``(mesh, expert_axis, batch_axes)`` while tracing under ``activation_sharding`` with
    rules that map "expert" to one mesh axis of more than one device; None otherwise (one
    device, no rules, experts replicated)."""
    active = activation_sharding.active()
    if active is None:
        return None
    mesh, rules = active
    first = lambda name: next((a for n, a in rules if n == name), None)
    axis = _axes(first("expert"))
    if not axis or all(mesh.shape[a] == 1 for a in axis):
        return None
    if len(axis) > 1:
        raise ValueError(f"sharding rules map 'expert' to {axis}: expert parallelism takes "
                         "one mesh axis")
    return mesh, axis[0], tuple(a for a in _axes(first("batch")) if mesh.shape[a] > 1)


def dropless_expert_parallel(x, experts, weights, num_experts: int, expert_fn, expert_params,
                             mesh, axis: str, batch_axes: tuple = (),
                             block: Optional[int] = None, impl: Optional[str] = None):
    """:func:`dropless` with the experts split over mesh axis ``axis`` (S devices, E / S
    experts each, ``expert_params`` split on their leading axis) inside ``shard_map``.

    Tokens arrive split over ``batch_axes`` (the data-parallel axes). When ``axis`` is not
    one of them every device of an ``axis`` group holds the same tokens, so each takes 1/S
    of them. Each device then sends every one of its (token, expert) pairs to the device
    that holds the expert, by one all-to-all, runs the dropless grouped matmul on the pairs
    it received for its own experts, and sends the outputs back by a second all-to-all;
    the weights combine them at home, and (when ``axis`` is not a batch axis) a sum over
    ``axis`` of each device's share (an all-gather) returns every token's output to the
    group. Shapes are static: with no capacity every pair may go to one device, so the
    exchange buffers hold S x the device's pairs (rows not addressed to a device carry
    expert -1 and are not computed: the CPU grouped matmul loops over the used blocks
    only). Gradients flow through
    ``shard_map``'s transposes (all-to-all back, the group sum to a slice, the
    expert weights' gradient summed over the data axes)."""
    S = mesh.shape[axis]
    E = num_experts
    if E % S:
        raise ValueError(f"{E} experts do not split evenly over the {S} devices of mesh axis "
                         f"{axis!r}; choose a mesh axis size that divides the expert count")
    El, N, k = E // S, experts.shape[0], experts.shape[1]
    split = axis in batch_axes
    groups = math.prod(mesh.shape[a] for a in batch_axes) * (1 if split else S)
    pad = -N % groups
    if pad:   # padding tokens route nowhere
        x = jnp.pad(x, ((0, pad), (0, 0)))
        experts = jnp.pad(experts, ((0, pad), (0, 0)), constant_values=-1)
        weights = jnp.pad(weights, ((0, pad), (0, 0)))
    tokens = jax.sharding.PartitionSpec(batch_axes or None)
    params_spec = jax.tree.map(lambda _: jax.sharding.PartitionSpec(axis), expert_params)

    def local(x, experts, weights, params):
        if not split:   # the group's devices share these tokens: each takes its 1/S
            n = x.shape[0] // S
            r = jax.lax.axis_index(axis)
            x, experts, weights = (jax.lax.dynamic_slice_in_dim(a, r * n, n)
                                   for a in (x, experts, weights))
        n = x.shape[0]
        flat = experts.reshape(n * k)
        live = (flat >= 0) & (flat < E)
        owner = jnp.where(live, flat // El, S)
        # to device s: every pair, with its local expert id where s holds it, else -1
        ids = jnp.where(owner[None] == jnp.arange(S)[:, None], (flat % El)[None], -1)
        rows = jnp.broadcast_to(x[jnp.arange(n * k) // k], (S, n * k, x.shape[-1]))
        ids = jax.lax.all_to_all(ids, axis, 0, 0, tiled=True)
        rows = jax.lax.all_to_all(rows, axis, 0, 0, tiled=True)
        b = default_block(n * k, El) if block is None else block   # ~ n k real rows arrive
        out, got = _per_pair(rows.reshape(S * n * k, -1), ids.reshape(S * n * k), 1, El,
                             functools.partial(expert_fn, params), b, impl)
        out = jnp.where(got[:, None], out, 0).reshape(S, n * k, -1)
        back = jax.lax.all_to_all(out, axis, 0, 0, tiled=True).sum(0)   # one s holds each
        w = jnp.where(live.reshape(n, k), weights, 0).astype(back.dtype)
        y = jnp.einsum("nk,nkd->nd", w, back.reshape(n, k, -1))
        if split:
            return y
        # every device of the group gets all its tokens back: each writes its share into
        # zeros and the group sums (an all-gather whose result is one value over ``axis``)
        r = jax.lax.axis_index(axis)
        full = jnp.zeros((S * n,) + y.shape[1:], y.dtype)
        return jax.lax.psum(jax.lax.dynamic_update_slice_in_dim(full, y, r * n, 0), axis)

    y = jax.shard_map(local, mesh=mesh, in_specs=(tokens, tokens, tokens, params_spec),
                      out_specs=tokens)(x, experts, weights, expert_params)
    return y[:N] if pad else y


# ----------------------------------------------------------------------- grouped matmul

def grouped_matmul(rows, w, groups: Groups):
    """rows (M, a), w (E, a, b) -> (M, b): every row times its own expert's matrix."""
    if groups.impl == "ragged":
        return _ragged(rows, w, groups.group_sizes)
    return _blocks(rows, w, groups.group_sizes, groups.block)


def expert_bias(bias, groups: Groups):
    """bias (E, b) -> (M, b): each row's expert's bias (for experts with biases)."""
    return bias[groups.row_expert]


def _zeros_varying_like(shape, dtype, *refs):
    """Zeros to start a loop's carry, varying over the same ``shard_map`` axes as ``refs``
    (inside ``shard_map`` a carry must keep its type; outside, plain zeros)."""
    out = jnp.zeros(shape, dtype)
    vma = frozenset().union(*(_varying(r) for r in refs))
    return jax.lax.pcast(out, tuple(sorted(vma)), to="varying") if vma else out


def _varying(x) -> frozenset:
    """The ``shard_map`` axes ``x`` varies over (empty outside ``shard_map``)."""
    t = jax.typeof(x)
    manual = getattr(t, "manual_axis_type", None)
    return frozenset(manual.varying) if manual is not None else frozenset(getattr(t, "vma", ()))


def _sum_to(ct, primal):
    """A cotangent summed over the ``shard_map`` axes it varies over and its primal does not
    (a custom_vjp's gradient must have its argument's type: the expert weights, shared by
    the data-parallel devices, take the sum of their gradients)."""
    extra = _varying(ct) - _varying(primal)
    return jax.lax.psum(ct, tuple(sorted(extra))) if extra else ct


CHUNK = 4   # blocks of one expert multiplied together where it has that many


def _block_ranges(group_sizes, block: int):
    """(first block, block count) of every expert's rows."""
    counts = group_sizes // block
    return jnp.cumsum(counts) - counts, counts


def _over_blocks(first, count, step, carry, n_blocks: int):
    """``step(i, n, carry)`` over blocks ``first .. first + count`` of one expert: chunks of
    :data:`CHUNK` blocks (``n = CHUNK``: one larger matmul, fewer iterations; fewer where
    all experts together have fewer than ``n_blocks``: a slice may not exceed them), then the
    remaining blocks one by one (``n = 1``)."""
    chunk = min(CHUNK, n_blocks)
    whole = count // chunk
    carry = jax.lax.fori_loop(0, whole, lambda j, c: step(first + j * chunk, chunk, c), carry)
    return jax.lax.fori_loop(whole * chunk, count, lambda j, c: step(first + j, 1, c), carry)


def _take(a, i, n: int):
    """``a[i:i + n]`` along the first axis. A 16-bit float array is sliced as its bits: a dot
    reading a bfloat16 array through a dynamic slice makes XLA:CPU widen the whole array to
    float32 on every call (and the dot then runs in float32); through the bits it does not."""
    if not matmul.narrow(a.dtype):
        return jax.lax.dynamic_slice_in_dim(a, i, n)
    bits = jax.lax.bitcast_convert_type(a, jnp.uint16)
    return jax.lax.bitcast_convert_type(jax.lax.dynamic_slice_in_dim(bits, i, n), a.dtype)


def _block_loop(rows, w, group_sizes, block: int):
    """Every block of rows times its expert's matrix: a loop over the experts, each taking
    its matrix once (one copy of it; a slice per block would copy it once per block) and
    looping over its own blocks, so unused blocks are neither computed nor read. Narrow
    (bfloat16) operands are multiplied natively into a float32 buffer rounded once at the
    end (:mod:`dynjax.models.matmul`'s rounding)."""
    nb = rows.shape[0] // block
    firsts, counts = _block_ranges(group_sizes, block)
    dt = jnp.result_type(rows, w)
    narrow = matmul.narrow(dt)
    acc = jnp.float32 if narrow else dt

    def per_expert(e, out):
        we = _take(w, e, 1)[0] if narrow else w[e]

        def step(i, n, out):
            x = _take(rows, i * block, n * block)
            y = jnp.matmul(x, we, preferred_element_type=acc) if narrow else x @ we
            return jax.lax.dynamic_update_slice_in_dim(out, y, i * block, 0)
        return _over_blocks(firsts[e], counts[e], step, out, nb)

    out = jax.lax.fori_loop(0, counts.shape[0], per_expert, _zeros_varying_like(
        (rows.shape[0], w.shape[-1]), acc, rows, w, group_sizes))
    return out.astype(dt)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _blocks(rows, w, group_sizes, block):
    return _block_loop(rows, w, group_sizes, block)


def _blocks_fwd(rows, w, group_sizes, block):
    return _block_loop(rows, w, group_sizes, block), (rows, w, group_sizes)


def _blocks_bwd(block, res, g):
    rows, w, group_sizes = res
    nb = rows.shape[0] // block
    d_rows = _block_loop(g, jnp.swapaxes(w, 1, 2), group_sizes, block)
    xb, gb = rows.reshape(nb, block, rows.shape[-1]), g.reshape(nb, block, g.shape[-1])
    firsts, counts = _block_ranges(group_sizes, block)
    dt = jnp.result_type(rows, g)

    def step(i, n, acc):
        take = lambda a: jax.lax.dynamic_slice_in_dim(a, i, n).reshape(n * block, -1)
        return acc + take(xb).T @ take(gb)

    def per_expert(e, d_w):   # one expert's gradient summed over its blocks, written once
        acc = _over_blocks(firsts[e], counts[e], step,
                           _zeros_varying_like(w.shape[1:], dt, rows, g, group_sizes), nb)
        return d_w.at[e].set(acc)

    d_w = jax.lax.fori_loop(0, counts.shape[0], per_expert,
                            _zeros_varying_like(w.shape, dt, rows, g, w, group_sizes))
    return _sum_to(d_rows, rows), _sum_to(d_w.astype(w.dtype), w), None


_blocks.defvjp(_blocks_fwd, _blocks_bwd)


def _batched_rule(fn):
    """A ``custom_vmap`` rule that loops ``fn`` over the batch (``ragged_dot``'s own rule
    rejects unbatched expert weights): still one compiled program."""
    def rule(axis_size, in_batched, *args):
        full = [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)
                for a, b in zip(args, in_batched)]
        shared = {i: a for i, (a, b) in enumerate(zip(args, in_batched)) if not b}

        def one(sliced):
            it = iter(sliced)
            return fn(*[shared[i] if i in shared else next(it) for i in range(len(args))])

        out = jax.lax.map(one, [a for i, a in enumerate(full) if i not in shared])
        return out, jax.tree.map(lambda _: True, out)
    return rule


@custom_vmap
def _ragged_fwd_kernel(rows, w, sizes):
    return jax.lax.ragged_dot(rows, w, sizes)


_ragged_fwd_kernel.def_vmap(_batched_rule(lambda r, w, s: jax.lax.ragged_dot(r, w, s)))


def _ragged_vjp(rows, w, sizes, g):
    _, vjp = jax.vjp(lambda r, ww: jax.lax.ragged_dot(r, ww, sizes), rows, w)
    return vjp(g)


@custom_vmap
def _ragged_bwd_kernel(rows, w, sizes, g):
    return _ragged_vjp(rows, w, sizes, g)


_ragged_bwd_kernel.def_vmap(_batched_rule(_ragged_vjp))


@jax.custom_vjp
def _ragged(rows, w, sizes):
    return _ragged_fwd_kernel(rows, w, sizes)


def _ragged_fwd(rows, w, sizes):
    return _ragged_fwd_kernel(rows, w, sizes), (rows, w, sizes)


def _ragged_bwd(res, g):
    rows, w, sizes = res
    d_rows, d_w = _ragged_bwd_kernel(rows, w, sizes, g)
    return _sum_to(d_rows, rows), _sum_to(d_w, w), None


_ragged.defvjp(_ragged_fwd, _ragged_bwd)
