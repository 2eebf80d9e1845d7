"""Device meshes, logical axis rules and partition specs.

Public API:
  make_mesh(spec=None, devices=None) -> Mesh       axes ("data", "fsdp", "tensor", "expert");
                                                   spec {axis: size}, one size may be -1
  mesh_shape(spec, num_devices) -> {axis: size}
  DEFAULT_RULES, axis_rules(rules) (context), current_rules()
  logical_to_spec(logical_axes, *, rules=None, mesh_shape=None, shape=None) -> PartitionSpec
  constrain(x, logical_axes)                       sharding constraint under jax.set_mesh
  state_shardings(state, mesh, rules=None) -> State of NamedSharding
  create_sharded(constructor, mesh, rules=None) -> module with parameters created sharded
  unsharded_params(module_or_state, mesh, *, min_size) / check_sharded(...)
  ParallelError, MeshError, ShardingError
  distributed.initialize_from_env()                multi-host jax.distributed set-up
"""
from orchard_jax.parallel.mesh import (MESH_AXES, MeshError, ParallelError, ShardingError,
                                       make_mesh, mesh_shape)
from orchard_jax.parallel.rules import (DEFAULT_RULES, axis_rules, constrain, current_rules,
                                        logical_to_spec)
from orchard_jax.parallel.sharding import (check_sharded, create_sharded, state_shardings,
                                           unsharded_params)

__all__ = [
    "DEFAULT_RULES", "MESH_AXES", "MeshError", "ParallelError", "ShardingError", "axis_rules",
    "check_sharded", "constrain", "create_sharded", "current_rules", "logical_to_spec",
    "make_mesh", "mesh_shape", "state_shardings", "unsharded_params",
]
