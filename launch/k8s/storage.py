"""PersistentVolumeClaims shared by the fleet: model weights and checkpoints.

`fleet.py down` leaves them in place (they hold data no one can re-create cheaply) unless it
is given `--delete-volumes`.
"""
import re

from launch.k8s import common

COMPONENT = "storage"
WEIGHTS_COMPONENT = "weights"


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


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_FOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def weights_job(config, repo_id: str, folder: str, *, revision: str = "") -> dict:
  """A Job that downloads Hugging Face model `repo_id` into `<models volume>/<folder>`.

  It runs in the SGLang image (which ships huggingface_hub) with the models volume mounted
  read-write, so SGLang's `--model-path /models/<folder>` finds the weights. A token for gated
  models comes from the Secret named by config.weights.hf_token_secret (key "token").

  Raises:
    common.FleetError: `repo_id` is not "owner/name" or `folder` is not a plain folder name.
  """
  if not _REPO_ID.match(repo_id):
    raise common.FleetError(f"model repo is {repo_id!r}; expected owner/name, e.g. "
                            "Qwen/Qwen3-30B-A3B")
  if not _FOLDER.match(folder):
    raise common.FleetError(f"weights folder is {folder!r}; expected one plain folder name "
                            "on the models volume, e.g. qwen3_5_35b_a3b")
  w = config.weights
  mount = config.volumes.models.mount_path
  name = "weights-" + re.sub(r"[^a-z0-9-]", "-", folder.lower()).strip("-")[:50]
  script = ("from huggingface_hub import snapshot_download; import sys; "
            "snapshot_download(repo_id=sys.argv[1], local_dir=sys.argv[2], "
            "revision=sys.argv[3] or None)")
  env = [{"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "0"}]
  if w.hf_token_secret:
    env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": w.hf_token_secret, "key": "token"}}})
  container = {
      "name": "download",
      "image": w.image or config.sglang.image,
      "imagePullPolicy": "IfNotPresent",
      "command": ["python3", "-c", script, repo_id, f"{mount}/{folder}", revision],
      "env": env,
      "resources": common.resources(w.cpu, w.memory),
      "volumeMounts": [{"name": "models", "mountPath": mount}],
  }
  job = {
      "apiVersion": "batch/v1", "kind": "Job",
      "metadata": common.metadata(config, name, WEIGHTS_COMPONENT, config.namespace),
      "spec": {
          "backoffLimit": 3,                 # downloads resume where they stopped
          "ttlSecondsAfterFinished": 24 * 3600,
          "template": {
              "metadata": {"labels": common.labels(config, WEIGHTS_COMPONENT, name)},
              "spec": {"restartPolicy": "Never", "containers": [container],
                       "volumes": [common.pvc_volume("models", config.volumes.models.claim)]},
          },
      },
  }
  common.check_manifests([job])
  return job
