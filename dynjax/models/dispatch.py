"""Dropless MoE dispatch: sort (token, expert) pairs by expert, one grouped matmul, combine.

Why. The GShard form (``dynjax.models.moe.token_choice``) builds one-hot dispatch and
combine tensors of size tokens x experts x capacity: its memory and FLOPs grow with that
product, and a full expert buffer drops tokens. Production MoE models (Mixtral, OLMoE,
Qwen-MoE, DeepSeek, GPT-OSS) never drop: every token reaches each of its top-k experts.
This module computes exactly that, with memory and FLOPs linear in tokens x k:

1. the N x k (token, expert) pairs are sorted by expert (a stable sort: within an expert,
   rows keep token order);
2. each expert's rows are contiguous, padded up to a multiple of ``block`` rows, so every
   block of ``block`` rows belongs to one expert. The number of rows M is static:
   ``(N * k + E * (block - 1)) // block`` blocks bound every possible routing, so one
   compiled program serves every input of a shape (nothing depends on data but values);
3. ``expert_fn(rows, groups)`` runs every expert on its own rows, usually through
   :func:`grouped_matmul`;
4. each pair's output row is gathered back and summed over k with the combine weights (the
   transpose of that gather is the scatter-add of the gradient).

A pair whose expert lies outside ``[0, num_experts)`` (integrated MoDE's no-op expert, a
token that did not enter a staged MoDE block) takes no row and adds nothing.

Grouped matmul. On CPU a loop over blocks multiplies each block by its own expert's
matrix, read in place (a batched matmul over a gather of the weights would copy
blocks x a x b floats, which cost more than the matmul at E = 64); its backward pass is
written out (``custom_vjp``) so no per-block weight copy is saved either: the input's
gradient is the same loop against the transposed weights, the weights' gradient one
accumulation per block into an (E, a, b) carry. On GPU/TPU it is ``jax.lax.ragged_dot`` over the same
layout: in jax 0.10 ``ragged_dot`` lowers on CPU to a dense masked matmul (E x the FLOPs)
and its batching rule rejects unbatched expert weights, so that path carries its own
differentiation (``custom_vjp``) and batching rule (``custom_vmap``: a loop over the
batch), and the audit's R reassignments stay one vmapped program on every platform.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

IMPLS = ("blocks", "ragged")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=("row_expert", "block_expert", "group_sizes"),
                   meta_fields=("block", "num_experts", "impl"))
@dataclasses.dataclass(frozen=True)
class Groups:
    """The sorted layout: ``row_expert`` (M,) the expert of every row (padding rows: a valid
    id, their output is discarded), ``block_expert`` (M // block,), ``group_sizes`` (E,)
    rows per expert including its padding (they sum to at most M), and the static block
    size, expert count and grouped-matmul implementation."""

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


def dropless(x, experts, weights, num_experts: int,
             expert_fn: Callable[[jax.Array, Groups], jax.Array],
             block: Optional[int] = None, impl: Optional[str] = None):
    """``y[n] = sum_j weights[n, j] * expert_fn(x[n])`` of expert ``experts[n, j]``.

    x (N, d); experts (N, k) int (outside ``[0, num_experts)``: routed nowhere); weights
    (N, k). ``expert_fn(rows, groups) -> (M, d_out)`` on rows sorted by expert. ``block``:
    rows per padding block (default :func:`default_block`); ``impl``: the grouped matmul,
    "blocks" or "ragged" (default by platform).
    """
    N, k = experts.shape
    flat = experts.reshape(N * k)
    dest, row_pair, groups = layout(flat, num_experts, block, impl)
    rows = x[row_pair // k]
    out = expert_fn(rows, groups)
    if out.shape[0] != groups.rows:
        raise ValueError(f"expert_fn returned {out.shape[0]} rows for {groups.rows}: it must "
                         "return one row per input row")
    live = (flat >= 0) & (flat < num_experts)
    picked = out[jnp.minimum(dest, groups.rows - 1)].reshape(N, k, -1)
    w = jnp.where(live.reshape(N, k), weights, 0).astype(out.dtype)
    return jnp.einsum("nk,nkd->nd", w, picked)


# ----------------------------------------------------------------------- grouped matmul

def grouped_matmul(rows, w, groups: Groups):
    """rows (M, a), w (E, a, b) -> (M, b): every row times its own expert's matrix."""
    if groups.impl == "ragged":
        return _ragged(rows, w, groups.group_sizes)
    return _blocks(rows, w, groups.block_expert)


def expert_bias(bias, groups: Groups):
    """bias (E, b) -> (M, b): each row's expert's bias (for experts with biases)."""
    return bias[groups.row_expert]


def _block_loop(rows, w, block_expert):
    """Block i of rows times w[block_expert[i]], one block per iteration."""
    nb = block_expert.shape[0]
    blocks = rows.reshape(nb, -1, rows.shape[-1])
    out = jax.lax.map(lambda i: blocks[i] @ w[block_expert[i]], jnp.arange(nb))
    return out.reshape(rows.shape[0], w.shape[-1])


@jax.custom_vjp
def _blocks(rows, w, block_expert):
    return _block_loop(rows, w, block_expert)


def _blocks_fwd(rows, w, block_expert):
    return _block_loop(rows, w, block_expert), (rows, w, block_expert)


def _blocks_bwd(res, g):
    rows, w, block_expert = res
    nb = block_expert.shape[0]
    d_rows = _block_loop(g, jnp.swapaxes(w, 1, 2), block_expert)
    xb, gb = rows.reshape(nb, -1, rows.shape[-1]), g.reshape(nb, -1, g.shape[-1])
    d_w = jax.lax.fori_loop(
        0, nb, lambda i, acc: acc.at[block_expert[i]].add(xb[i].T @ gb[i]),
        jnp.zeros(w.shape, jnp.result_type(rows, g)))
    return d_rows, d_w.astype(w.dtype), None


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
    return d_rows, d_w, None


_ragged.defvjp(_ragged_fwd, _ragged_bwd)
