"""Mixture-of-experts feed-forward: softmax top-k router, routed SwiGLU experts, optional
sigmoid-gated shared expert, and three interchangeable dispatch paths.

Router (transformers' Qwen3MoeTopKRouter): p = softmax(x Wr) in float32, keep the top k,
renormalise them to sum 1 when norm_topk_prob (always for Qwen3.5). Output for token x:
  y = sum_{e in topk} p_e * down_e(silu(gate_e x) * up_e x)   [+ sigmoid(x ws) * shared(x)]

Dispatch paths (ModelConfig.moe_dispatch), all computing that same y:
  "dense"  every expert on every token, weighted by the (mostly zero) combine matrix. Costs
           num_experts / k times the useful work; the reference for tests.
  "sort"   sort the (token, expert) assignments by expert, then either
           - (moe_capacity_factor None, the default, without a multi-device mesh) pad each
             expert's rows to a multiple of moe_block_size and run one 2-D SwiGLU per block in
             a lax.scan (blocked_dispatch: dropless, padding bounded by experts * block rows
             whatever the routing imbalance; the fast exact path on CPU), or
           - (a capacity factor, or under a multi-device mesh) gather per dispatch group into
             a [groups, experts, capacity, hidden] buffer (GShard / Switch Transformer
             dispatch), run each expert on its buffer, gather back. Capacity per group of n
             tokens is ceil(capacity_factor * n * k / experts), rounded up to a multiple of 8,
             at most n (one token sends at most one assignment to an expert, so capacity n
             never drops; it is what a multi-device mesh uses without a factor). With
             moe_dropless a lax.switch picks at run time the smallest of (capacity, twice it,
             n) that holds the fullest expert, so results never depend on the batch. Groups
             are batch rows under a multi-device mesh (the sort stays local to a data shard),
             else the whole batch (ModelConfig.moe_group). The buffer's expert dimension
             follows the weights' "expert" mesh axis (expert parallelism).
  "decode" for a few tokens (decode steps): gathered expert weights per assignment, or all
           experts as one batched matmul; see models.decode. Not meant for long sequences.
  "ragged" sort all assignments of the batch by expert and run jax.lax.ragged_dot with the
           group sizes (dropless, no padding). The fast path on GPU/TPU; on CPU ragged_dot
           lowers to a masked dense matmul (num_experts times the work), so it is not the
           CPU default.

Load balancing (Switch Transformer, Fedus et al. 2021, eq. 4; transformers'
load_balancing_loss_func): for one layer with N non-padding tokens,
  f_e = (# top-k assignments to e) / N,  P_e = (sum of router probs of e) / N,
  loss = num_experts * sum_e f_e P_e
(equal to k for perfectly uniform routing). The decoder averages it over MoE layers.
"""
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from orchard_jax.models.config import ModelConfig
from orchard_jax.models.decode import decode_dispatch
from orchard_jax.models.layers import MLP, dtype_of, normal, param
from orchard_jax.parallel.rules import constrain


def route(logits: jax.Array, k: int, normalize: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Softmax top-k routing.

  Args:
    logits: [..., experts] router logits.
    k: experts per token.
    normalize: renormalise the k kept probabilities to sum to 1.
  Returns:
    probs [..., experts] float32, weights [..., k] float32, indices [..., k] int32.
  """
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  weights, indices = jax.lax.top_k(probs, k)
  if normalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return probs, weights, indices.astype(jnp.int32)


def capacity(seq: int, k: int, experts: int, factor: Optional[float]) -> int:
  """Per-row, per-expert buffer size of the "sort" path (see module docstring)."""
  if factor is None:
    return seq
  c = math.ceil(factor * seq * k / experts)
  c = -(-c // 8) * 8
  return max(1, min(seq, c))


def _swiglu(x, w_gate, w_up, w_down):
  return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def _use_unrolled(loop: str, experts: int) -> bool:
  if loop != "auto":
    return loop == "unrolled"
  mesh = jax.sharding.get_abstract_mesh()
  expert_sharded = not mesh.empty and dict(mesh.shape).get("expert", 1) > 1
  return jax.default_backend() == "cpu" and not expert_sharded and experts <= 256


def expert_ffn(buf: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array, *,
               unrolled: bool) -> jax.Array:
  """Runs expert e on buf[:, e]: [batch, experts, cap, hidden] -> same shape."""
  b, e, c, d = buf.shape
  if unrolled:
    outs = [_swiglu(buf[:, i].reshape(b * c, d), w_gate[i], w_up[i], w_down[i]).reshape(b, c, d)
            for i in range(e)]
    return jnp.stack(outs, axis=1)
  buf = constrain(buf, ("batch", "experts", None, "act_embed"))
  h = jnp.einsum("becd,edf->becf", buf, w_gate)
  u = jnp.einsum("becd,edf->becf", buf, w_up)
  h = constrain(jax.nn.silu(h) * u, ("batch", "experts", None, "expert_mlp"))
  out = jnp.einsum("becf,efd->becd", h, w_down)
  return constrain(out, ("batch", "experts", None, "act_embed"))


def _sort_plan(indices: jax.Array, valid: jax.Array, experts: int):
  """Sorts each row's assignments by expert.

  Args:
    indices: [batch, seq, k] expert ids; valid: [batch, seq] bool.
  Returns:
    order [batch, seq*k] (assignment ids sorted by expert; padding last), counts [batch,
    experts], starts [batch, experts], rank [batch, seq*k] (position of each *original*
    assignment within its expert's group).
  """
  b, s, k = indices.shape
  flat = jnp.where(valid[:, :, None], indices, experts).reshape(b, s * k)
  order = jnp.argsort(flat, axis=1, stable=True)
  sorted_e = jnp.take_along_axis(flat, order, axis=1)
  counts = jnp.sum(jax.nn.one_hot(flat, experts + 1, dtype=jnp.int32), axis=1)
  starts = jnp.cumsum(counts, axis=1) - counts
  sorted_rank = jnp.arange(s * k)[None, :] - jnp.take_along_axis(starts, sorted_e, axis=1)
  rank = jnp.zeros_like(sorted_rank).at[jnp.arange(b)[:, None], order].set(sorted_rank)
  return order, counts[:, :experts], starts[:, :experts], rank


def sort_dispatch(x: jax.Array, weights: jax.Array, indices: jax.Array, valid: jax.Array,
                  w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array, *, cap: int,
                  unrolled: bool) -> tuple[jax.Array, jax.Array]:
  """Sort-and-group dispatch with a fixed capacity (assignments past it are dropped).

  Args:
    x: [batch, seq, hidden]; weights, indices: [batch, seq, k]; valid: [batch, seq].
    w_gate, w_up: [experts, hidden, mlp]; w_down: [experts, mlp, hidden].
    cap: tokens per row and expert.
  Returns:
    y [batch, seq, hidden], and whether any assignment was dropped (bool scalar).
  """
  b, s, d = x.shape
  k = indices.shape[-1]
  e = w_gate.shape[0]
  order, counts, starts, rank = _sort_plan(indices, valid, e)
  # Dispatch: slot c of expert e holds sorted assignment starts[e] + c, if c < counts[e].
  slot = jnp.arange(cap)
  src = jnp.clip(starts[:, :, None] + slot, 0, s * k - 1)                     # [b, e, cap]
  filled = slot[None, None, :] < counts[:, :, None]
  assignment = jnp.take_along_axis(order, src.reshape(b, e * cap), axis=1)
  token = assignment // k
  buf = jnp.take_along_axis(x, token[:, :, None], axis=1).reshape(b, e, cap, d)
  buf = buf * filled[..., None].astype(x.dtype)
  out = expert_ffn(buf, w_gate, w_up, w_down, unrolled=unrolled)            # [b, e, cap, d]
  # Combine: assignment (t, j) reads out[e = indices[t, j], rank[t, j]] if rank < cap.
  rank = rank.reshape(b, s, k)
  kept = (rank < cap) & valid[:, :, None]
  flat_pos = indices * cap + jnp.minimum(rank, cap - 1)
  y = jnp.take_along_axis(out.reshape(b, e * cap, d), flat_pos.reshape(b, s * k)[:, :, None],
                          axis=1).reshape(b, s, k, d)
  w = jnp.where(kept, weights, 0.0).astype(y.dtype)
  dropped = jnp.any(counts > cap)
  return jnp.einsum("bskd,bsk->bsd", y, w), dropped



def _sort_by_expert(indices: jax.Array, valid: jax.Array, num_experts: int
                    ) -> tuple[jax.Array, jax.Array]:
  """Orders a batch's assignments by expert.

  Args:
    indices: [batch, seq, k] routed expert ids.
    valid: [batch, seq] bool; padding tokens' assignments sort last and are not counted.
    num_experts: E.
  Returns:
    order [batch * seq * k] (stable argsort of the flattened assignments by expert) and
    counts [E] int32 (assignments per expert, padding excluded).
  """
  flat = jnp.where(valid[:, :, None], indices, num_experts).reshape(-1)
  order = jnp.argsort(flat, stable=True)
  counts = jnp.sum(jax.nn.one_hot(flat, num_experts + 1, dtype=jnp.int32), axis=0)[:num_experts]
  return order, counts

def blocked_dispatch(x: jax.Array, weights: jax.Array, indices: jax.Array, valid: jax.Array,
                     w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array, *,
                     block: int) -> jax.Array:
  """Dropless block-sparse dispatch (the MegaBlocks layout, Gale et al. 2022, on a scan).

  All assignments of the batch are sorted by expert; each expert's rows are padded to a
  multiple of `block`, so every block of `block` rows belongs to one expert. A lax.scan runs
  one [block, hidden] x [hidden, mlp] SwiGLU per block with that expert's weights (2-D
  matmuls, fast on XLA:CPU). Padding is at most experts * block rows whatever the routing
  imbalance, and no assignment is ever dropped. Shapes as sort_dispatch.

  Memory: the backward pass keeps per block only the gate and up projections ([block, mlp]
  each). The block's input rows are gathered from x inside the scan step, so the backward
  gathers them again instead of storing the [rows, hidden] dispatch buffer, and the routing
  weight scales each row before the down projection, p (h W_down) = (p h) W_down, so its
  gradient needs h (recomputed from the gate and up projections) rather than the expert
  outputs. At the `small` preset (4 x 1024 tokens, 16 experts, top-4) that is 75 MB per layer
  less than storing the buffer and the gathered outputs, and no extra matmul.
  """
  b, s, d = x.shape
  k = indices.shape[-1]
  e = w_gate.shape[0]
  n = b * s * k
  order, counts = _sort_by_expert(indices, valid, e)
  starts = jnp.cumsum(counts) - counts
  padded = (counts + block - 1) // block * block
  padded_end = jnp.cumsum(padded)
  padded_start = padded_end - padded
  num_blocks = -(-n // block) + e
  rows = jnp.arange(num_blocks * block)
  row_expert = jnp.minimum(jnp.searchsorted(padded_end, rows, side="right"), e - 1)
  offset = rows - padded_start[row_expert]
  filled = (offset < counts[row_expert]) & (rows < padded_end[-1])
  assignment = jnp.take(order, jnp.clip(starts[row_expert] + offset, 0, n - 1))
  token = (assignment // k).reshape(num_blocks, block)
  # Padding rows run on some token's input with weight 0, so their outputs are exactly 0.
  row_weight = jnp.where(filled, jnp.take(weights.reshape(n), assignment), 0.0)
  row_weight = row_weight.astype(x.dtype).reshape(num_blocks, block)
  block_expert = row_expert[::block]
  x_flat = x.reshape(b * s, d)

  def swiglu(xb, wr, wg, wu, wd):
    h = jax.nn.silu(xb @ wg) * (xb @ wu) * wr[:, None]
    return h @ wd

  def skip(xb, *_):
    return jnp.zeros_like(xb)

  # The blocks past the last expert's padded rows hold padding only (their output is 0): a
  # lax.cond skips their matmuls, forward and backward. The scan's length is fixed at the worst
  # case n / block + E; the blocks used depend on the routing (about n / block + E / 2 when
  # each expert's last block is half full). The cond takes the block's rows and weight slices,
  # not the whole x and weights, so its backward branch returns block-sized gradients.
  used = padded_end[-1] // block

  # Save only the matmul outputs for the backward pass: without the policy the scan would
  # keep every block's [hidden, mlp] weight slices (3 x blocks x hidden x mlp floats) and its
  # gathered input rows.
  @functools.partial(jax.checkpoint,
                     policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  def step(carry, inputs):
    i, tok, wr, ex = inputs
    xb = jnp.take(x_flat, tok, axis=0)
    return carry, jax.lax.cond(i < used, swiglu, skip, xb, wr, w_gate[ex], w_up[ex],
                               w_down[ex])

  _, out = jax.lax.scan(step, None, (jnp.arange(num_blocks), token, row_weight, block_expert))
  out = out.reshape(num_blocks * block, d)
  # Assignment i (original order) sits at sorted position inverse[i], padded row dest.
  inverse = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
  # Padding tokens read the last row, which is always a padding row (the padded rows end at
  # most at n + e (block - 1) <= num_blocks * block - e), so their output is 0.
  expert_of = jnp.where(valid[:, :, None], indices, 0).reshape(n)
  dest = padded_start[expert_of] + inverse - starts[expert_of]
  dest = jnp.where(jnp.broadcast_to(valid[:, :, None], (b, s, k)).reshape(n), dest,
                   num_blocks * block - 1)
  y = jnp.take(out, dest, axis=0).reshape(b, s, k, d)
  return jnp.sum(y, axis=2)


def ragged_dispatch(x: jax.Array, weights: jax.Array, indices: jax.Array, valid: jax.Array,
                    w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
  """Dropless dispatch with jax.lax.ragged_dot over all assignments of the batch, sorted by
  expert. Shapes as sort_dispatch."""
  b, s, d = x.shape
  k = indices.shape[-1]
  e = w_gate.shape[0]
  n = b * s * k
  order, group_sizes = _sort_by_expert(indices, valid, e)
  rows = jnp.take(x.reshape(b * s, d), order // k, axis=0)
  real = (jnp.arange(n) < jnp.sum(group_sizes))[:, None]
  rows = rows * real.astype(rows.dtype)
  h = jax.nn.silu(jax.lax.ragged_dot(rows, w_gate, group_sizes)) * jax.lax.ragged_dot(
      rows, w_up, group_sizes)
  out = jax.lax.ragged_dot(h, w_down, group_sizes) * real.astype(rows.dtype)
  inverse = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
  y = jnp.take(out, inverse, axis=0).reshape(b, s, k, d)
  w = jnp.where(valid[:, :, None], weights, 0.0).astype(y.dtype)
  return jnp.einsum("bskd,bsk->bsd", y, w)


def dense_dispatch(x: jax.Array, weights: jax.Array, indices: jax.Array, valid: jax.Array,
                   w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
  """Reference: every expert on every token, weighted. Shapes as sort_dispatch."""
  e = w_gate.shape[0]
  combine = jnp.sum(jax.nn.one_hot(indices, e, dtype=jnp.float32) * weights[..., None], axis=2)
  combine = combine * valid[..., None]
  h = jax.nn.silu(jnp.einsum("bsd,edf->bsef", x, w_gate)) * jnp.einsum("bsd,edf->bsef", x, w_up)
  y = jnp.einsum("bsef,efd->bsed", h, w_down)
  return jnp.einsum("bsed,bse->bsd", y, combine.astype(y.dtype))


class MoE(nnx.Module):
  """Router + routed experts (+ shared expert for Qwen3.5), see the module docstring."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, f, e = config.hidden_size, config.moe_intermediate_size, config.num_experts
    pdt = dtype_of(config.param_dtype)
    init = normal(config.initializer_range)
    self.config = config
    self.dtype = dtype_of(config.dtype)
    self.router = param(rngs, init, (d, e), ("embed", "router_experts"), pdt)
    self.w_gate = param(rngs, init, (e, d, f), ("experts", "embed", "expert_mlp"), pdt)
    self.w_up = param(rngs, init, (e, d, f), ("experts", "embed", "expert_mlp"), pdt)
    self.w_down = param(rngs, init, (e, f, d), ("experts", "expert_mlp", "embed"), pdt)
    if config.shared_expert_intermediate_size:
      self.shared_expert = MLP(d, config.shared_expert_intermediate_size, config=config,
                               rngs=rngs)
      self.shared_expert_gate = param(rngs, init, (d,), ("embed",), pdt)
    else:
      self.shared_expert = None
      self.shared_expert_gate = None

  def __call__(self, x: jax.Array, valid: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Routes and runs the experts.

    Args:
      x: [batch, seq, hidden] normalised hidden states.
      valid: [batch, seq] bool, False for padding (not routed, not counted in the statistics).
    Returns:
      y [batch, seq, hidden] and routing statistics: "counts" [experts] top-k assignments of
      valid tokens, "prob_sum" [experts] summed router probabilities of valid tokens,
      "tokens" scalar number of valid tokens (all float32).
    """
    cfg = self.config
    dt = self.dtype
    x = x.astype(dt)
    logits = jnp.einsum("bsd,de->bse", x.astype(jnp.float32),
                        self.router[...].astype(jnp.float32))
    probs, weights, indices = route(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)
    wg, wu, wd = (self.w_gate[...].astype(dt), self.w_up[...].astype(dt),
                  self.w_down[...].astype(dt))
    if cfg.moe_dispatch == "dense":
      y = dense_dispatch(x, weights, indices, valid, wg, wu, wd)
    elif cfg.moe_dispatch == "decode":
      y = decode_dispatch(x, weights, indices, valid, wg, wu, wd)
    elif cfg.moe_dispatch == "ragged":
      y = ragged_dispatch(x, weights, indices, valid, wg, wu, wd)
    else:
      y = self._sort(x, weights, indices, valid, wg, wu, wd)
    if self.shared_expert is not None:
      gate = jax.nn.sigmoid(x.astype(jnp.float32) @ self.shared_expert_gate[...].astype(
          jnp.float32))
      y = y + (gate[..., None] * self.shared_expert(x).astype(jnp.float32)).astype(y.dtype)
    validf = valid.astype(jnp.float32)
    stats = {
        "counts": jnp.sum(jax.nn.one_hot(indices, cfg.num_experts, dtype=jnp.float32)
                          * validf[:, :, None, None], axis=(0, 1, 2)),
        "prob_sum": jnp.sum(probs * validf[..., None], axis=(0, 1)),
        "tokens": jnp.sum(validf),
    }
    return y, stats

  def _sort(self, x, weights, indices, valid, wg, wu, wd):
    cfg = self.config
    b, s, d = x.shape
    k, e = cfg.num_experts_per_tok, cfg.num_experts
    unrolled = _use_unrolled(cfg.moe_expert_loop, e)
    mesh = jax.sharding.get_abstract_mesh()
    multi_device = not mesh.empty and mesh.size > 1
    per_row = cfg.moe_group == "row" or (cfg.moe_group == "auto" and multi_device)
    groups = b if per_row else 1
    n = b * s // groups                                  # tokens per dispatch group
    x, weights, indices, valid = (x.reshape(groups, n, d), weights.reshape(groups, n, k),
                                  indices.reshape(groups, n, k), valid.reshape(groups, n))
    # (blocked_dispatch flattens its groups: with one group the reshape is free)
    if cfg.moe_capacity_factor is None and not multi_device:
      return blocked_dispatch(x, weights, indices, valid, wg, wu, wd,
                              block=cfg.moe_block_size).reshape(b, s, d)
    cap = capacity(n, k, e, cfg.moe_capacity_factor)

    def run(c):
      y, _ = sort_dispatch(x, weights, indices, valid, wg, wu, wd, cap=c, unrolled=unrolled)
      return y.reshape(b, s, d)

    if cap >= n or not cfg.moe_dropless:
      return run(cap)
    # Dropless: count first (cheap), then run the smallest capacity that holds the fullest
    # expert: cap, 2 cap, or n (which always suffices).
    levels = sorted({cap, capacity(n, k, e, 2 * cfg.moe_capacity_factor), n})
    _, counts, _, _ = _sort_plan(indices, valid, e)
    level = jnp.sum(jnp.asarray(levels[:-1]) < jnp.max(counts)).astype(jnp.int32)
    if multi_device:
      # Every device must take the same branch (the branches hold collectives): make the
      # index an explicitly replicated global reduction.
      level = jax.lax.with_sharding_constraint(level, jax.sharding.PartitionSpec())
    # Larger levels are rematerialised: lax.switch keeps the residuals of every branch for
    # the backward pass, and theirs would cost up to num_experts / k times the activations
    # of the common case.
    branches = [lambda c=c: run(c) for c in levels[:1]] + [
        jax.checkpoint(lambda c=c: run(c)) for c in levels[1:]]
    return jax.lax.switch(level, branches)


def load_balancing_loss(counts: jax.Array, prob_sum: jax.Array, tokens: jax.Array) -> jax.Array:
  """Switch-style loss per MoE layer (module docstring), averaged over layers.

  Args:
    counts, prob_sum: [layers, experts] statistics from MoE.__call__.
    tokens: [layers] valid tokens per layer.
  Returns:
    scalar float32 (un-weighted; multiply by router_aux_loss_coef).
  """
  n = jnp.maximum(tokens, 1.0)[:, None]
  per_layer = counts.shape[-1] * jnp.sum((counts / n) * (prob_sum / n), axis=-1)
  return jnp.mean(per_layer)
