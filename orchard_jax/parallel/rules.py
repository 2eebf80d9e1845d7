"""Logical axis names and the rules that map them onto mesh axes.

Every parameter of orchard_jax.models carries a tuple of logical axis names in its
`logical_axes` metadata (e.g. the expert up-projection is ("experts", "embed", "expert_mlp")).
A rule table maps each logical name to a mesh axis, a tuple of mesh axes, or None
(replicated). The same names shard activations through `constrain`.

Mesh axes (parallel.mesh): "data" (pure data parallel), "fsdp" (data parallel with parameters
sharded along their "embed" dimension, ZeRO-3 style), "tensor" (Megatron-style head / MLP
sharding), "expert" (expert parallelism; outside the MoE blocks it shards the batch).
"""
import contextlib
import math
from typing import Iterator, Optional, Sequence, Union

import jax
from flax.core import spmd as _flax_spmd
from jax.sharding import PartitionSpec

MeshAxes = Union[None, str, tuple[str, ...]]
Rules = tuple[tuple[str, MeshAxes], ...]

# Logical name -> mesh axes. Activations: batch, seq, act_*; parameters: the rest.
DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp", "expert")),
    ("seq", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("experts", "expert"),
    ("expert_mlp", "tensor"),
    ("router_experts", None),
    ("linear_k_heads", "tensor"),
    ("linear_v_heads", "tensor"),
    ("conv", None),
    ("norm", None),
)


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
  if axes is None:
    return ()
  if isinstance(axes, str):
    return (axes,)
  return tuple(axes)


def current_rules() -> Rules:
  """The rules in effect: those set by `axis_rules(...)` (or flax's logical_axis_rules),
  else DEFAULT_RULES."""
  return tuple(_flax_spmd.get_logical_axis_rules()) or DEFAULT_RULES


@contextlib.contextmanager
def axis_rules(rules: Rules) -> Iterator[None]:
  """Sets the logical axis rules for the block (shared with flax's logical_axis_rules)."""
  with _flax_spmd.logical_axis_rules(rules):
    yield


def logical_to_spec(logical_axes: Sequence[Optional[str]], *, rules: Optional[Rules] = None,
                    mesh_shape: Optional[dict[str, int]] = None,
                    shape: Optional[Sequence[int]] = None) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec.

  A mesh axis is used at most once per spec (the first dimension that asks for it wins).
  Given `mesh_shape` ({axis: size}), mesh axes absent from the mesh or of size 1 are dropped;
  given also the array `shape`, mesh axes whose size does not divide the dimension are dropped
  (that dimension falls back to fewer axes or to replication; `check_sharded` reports large
  parameters left fully replicated).

  Args:
    logical_axes: one name (or None) per array dimension.
    rules: logical name -> mesh axes; defaults to `current_rules()`.
    mesh_shape: the mesh's {axis name: size}.
    shape: the array's shape.
  Returns:
    A PartitionSpec with one entry per dimension.
  """
  table = dict(current_rules() if rules is None else rules)
  used: set[str] = set()
  entries = []
  for dim, name in enumerate(logical_axes):
    chosen = []
    size = 1
    for axis in _as_tuple(table.get(name)) if name is not None else ():
      if axis in used:
        continue
      if mesh_shape is not None:
        axis_size = mesh_shape.get(axis, 1)
        if axis_size == 1:
          continue
        if shape is not None and shape[dim] % (size * axis_size) != 0:
          continue
        size *= axis_size
      chosen.append(axis)
    used.update(chosen)
    entries.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return PartitionSpec(*entries)


def constrain(x: jax.Array, logical_axes: Sequence[Optional[str]]) -> jax.Array:
  """`with_sharding_constraint` by logical names, under the current mesh (jax.set_mesh).

  A no-op when no mesh is set, so models run unchanged on one device.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = logical_to_spec(logical_axes, mesh_shape=dict(mesh.shape), shape=x.shape)
  return jax.lax.with_sharding_constraint(x, spec)


def spec_size(spec: PartitionSpec, mesh_shape: dict[str, int]) -> int:
  """Number of shards a spec splits an array into on a mesh of this shape."""
  return math.prod(mesh_shape.get(axis, 1) for entry in spec for axis in _as_tuple(entry))
