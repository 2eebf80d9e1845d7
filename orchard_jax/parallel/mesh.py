"""Device meshes with the named axes ("data", "fsdp", "tensor", "expert") built from config."""
import math
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

MESH_AXES = ("data", "fsdp", "tensor", "expert")


class ParallelError(Exception):
  """Base class of errors raised by orchard_jax.parallel."""


class MeshError(ParallelError, ValueError):
  """A mesh shape does not fit the devices."""


class ShardingError(ParallelError):
  """Parameters are not sharded the way the mesh asks (e.g. a large one left replicated)."""


def mesh_shape(spec: Mapping[str, Any], num_devices: int) -> dict[str, int]:
  """Resolves a mesh spec to sizes for each of MESH_AXES.

  Args:
    spec: {axis: size} for some of MESH_AXES (a dict or ml_collections ConfigDict); missing
      axes are 1; at most one axis may be -1, meaning "all remaining devices".
    num_devices: devices available.
  Returns:
    {axis: size} over MESH_AXES whose product is num_devices.
  Raises:
    MeshError: unknown axis names, more than one -1, or sizes that do not multiply to
      num_devices.
  """
  if hasattr(spec, "to_dict"):
    spec = spec.to_dict()
  unknown = sorted(set(spec) - set(MESH_AXES))
  if unknown:
    raise MeshError(f"mesh axes {unknown} are unknown; expected names from {MESH_AXES}")
  sizes = {axis: int(spec.get(axis, 1)) for axis in MESH_AXES}
  free = [a for a, s in sizes.items() if s == -1]
  if len(free) > 1:
    raise MeshError(f"at most one mesh axis may be -1; got {free}")
  fixed = math.prod(s for s in sizes.values() if s != -1)
  if any(s == 0 or s < -1 for s in sizes.values()):
    raise MeshError(f"mesh axis sizes must be positive or -1; got {sizes}")
  if free:
    if num_devices % fixed:
      raise MeshError(f"{num_devices} devices do not split into the fixed mesh axes {sizes}")
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes.values()) != num_devices:
    raise MeshError(f"mesh {sizes} has {math.prod(sizes.values())} devices; "
                    f"{num_devices} are available")
  return sizes


def make_mesh(spec: Optional[Mapping[str, Any]] = None,
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A Mesh over `devices` (default all) with axes MESH_AXES in that order, Auto axis types.

  Args:
    spec: sizes as for `mesh_shape`; default {"fsdp": -1} (everything FSDP).
    devices: the devices; default jax.devices().
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = mesh_shape(spec if spec is not None else {"fsdp": -1}, len(devices))
  shape = tuple(sizes[a] for a in MESH_AXES)
  if devices == list(jax.devices()):
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))
