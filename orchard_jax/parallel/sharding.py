"""Parameter shardings from logical axis names, sharded model creation, and a check that no
large parameter was left replicated."""
import math
from typing import Callable, Optional, TypeVar

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orchard_jax.parallel.mesh import ShardingError
from orchard_jax.parallel.rules import Rules, axis_rules, logical_to_spec, spec_size

M = TypeVar("M", bound=nnx.Module)


def _logical_axes(var: nnx.Variable) -> tuple:
  axes = var.get_metadata().get("logical_axes")
  return tuple(axes) if axes else (None,) * len(var.shape)


def state_shardings(state: nnx.State, mesh: Mesh, rules: Optional[Rules] = None) -> nnx.State:
  """NamedSharding for every Variable of `state` (abstract or concrete), from the logical axis
  names in its `logical_axes` metadata (variables without names are replicated).

  Returns a State of the same structure whose leaves are NamedShardings: usable as jit's
  out_shardings / in_shardings for the state, or for optimizer states that mirror it.
  """
  mesh_shape = dict(mesh.shape)

  def one(var):
    if not hasattr(var, "shape"):
      return NamedSharding(mesh, PartitionSpec())
    spec = logical_to_spec(_logical_axes(var), rules=rules, mesh_shape=mesh_shape,
                           shape=var.shape)
    return var.replace(NamedSharding(mesh, spec))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def create_sharded(constructor: Callable[[], M], mesh: Mesh, rules: Optional[Rules] = None) -> M:
  """Builds the module returned by `constructor` with every parameter already sharded.

  The constructor runs under jax.jit with output shardings derived from the logical axis
  names, so each device materialises only its shards (no full copy on one device).

  Args:
    constructor: a zero-argument function returning the module, e.g.
      `lambda: CausalLM(config, rngs=nnx.Rngs(0))`.
    mesh: the device mesh (parallel.make_mesh).
    rules: logical axis rules; default parallel.rules.current_rules().
  Returns:
    The module, its state placed on `mesh`.
  """
  abstract = nnx.eval_shape(constructor)
  graphdef, abstract_state = nnx.split(abstract)
  shardings = state_shardings(abstract_state, mesh, rules)

  def init():
    return nnx.split(constructor())[1]

  with jax.set_mesh(mesh), axis_rules(rules) if rules else _null():
    state = jax.jit(init, out_shardings=shardings)()
  return nnx.merge(graphdef, state)


class _null:
  def __enter__(self):
    return None

  def __exit__(self, *exc):
    return False


def unsharded_params(module_or_state, mesh: Mesh, *, min_size: int = 2 ** 16) -> list[str]:
  """Names of parameters with at least `min_size` elements that are not split over any mesh
  axis (every device holds the whole array). Empty when the mesh has one device."""
  if math.prod(mesh.shape.values()) == 1:
    return []
  state = module_or_state if isinstance(module_or_state, nnx.State) else nnx.state(
      module_or_state, nnx.Param)
  found = []
  for path, var in nnx.to_flat_state(state):
    value = var[...] if isinstance(var, nnx.Variable) else var
    if math.prod(value.shape) < min_size:
      continue
    sharding = getattr(value, "sharding", None)
    if isinstance(sharding, NamedSharding):
      shards = spec_size(sharding.spec, dict(sharding.mesh.shape))
    else:
      shards = 1 if sharding is None or sharding.is_fully_replicated else 2
    if shards == 1:
      found.append("/".join(map(str, path)) + f" {tuple(value.shape)}")
  return found


def check_sharded(module_or_state, mesh: Mesh, *, min_size: int = 2 ** 16) -> None:
  """Raises ShardingError listing every large parameter left fully replicated on `mesh`."""
  found = unsharded_params(module_or_state, mesh, min_size=min_size)
  if found:
    raise ShardingError(f"{len(found)} parameters of >= {min_size} elements are replicated on "
                        f"mesh {dict(mesh.shape)} (expected sharded): {found[:8]}")
