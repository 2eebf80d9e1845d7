"""PersistentVolumeClaims shared by the fleet: model weights and checkpoints.

`fleet.py down` leaves them in place (they hold data no one can re-create cheaply) unless it
is given `--delete-volumes`.
"""
from launch.k8s import common

COMPONENT = "storage"


def volume_claims(config) -> list[dict]:
  """One PersistentVolumeClaim per entry of config.volumes whose `create` is set."""
  claims = []
  for key in sorted(config.volumes):
    volume = config.volumes[key]
    if not volume.create:
      continue
    if volume.access_mode not in ("ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany",
                                  "ReadWriteOncePod"):
      raise common.FleetError(
          f"volumes.{key}.access_mode is {volume.access_mode!r}; expected a Kubernetes "
          "access mode such as ReadWriteMany")
    claim = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": common.metadata(config, volume.claim, COMPONENT, config.namespace),
        "spec": {"accessModes": [volume.access_mode],
                 "resources": {"requests": {"storage": volume.size}}},
    }
    if volume.storage_class:
      claim["spec"]["storageClassName"] = volume.storage_class
    claims.append(claim)
  return claims
