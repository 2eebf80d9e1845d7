"""Task images as OCI container images, pushed to a registry for the Kubernetes backend.

A task image directory (`task_images.py`) becomes an OCI image of one layer per part, in the
order a sandbox mounts them: the root filesystem, each read-only bind at its mount point (the
interpreter copy, the venv), and the workspace seed at the workdir (/testbed, where SWE-bench's
images keep the repository). The image's config carries the manifest's environment and workdir.
Layers are written once into an OCI image layout (the root filesystem's and an environment's
layers are shared by every instance that uses them, so a registry stores them once) and pushed
with `skopeo copy` (Debian's skopeo; launch/install.sh installs it) under SWE-bench's naming,
`<registry>/sweb.eval.x86_64.<instance_id>:latest` (`dataset.container_image`).
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from typing import Sequence

from orchard_jax.env import images as env_images
from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe.instance import SWEInstance

_MEDIA = {"manifest": "application/vnd.oci.image.manifest.v1+json",
          "config": "application/vnd.oci.image.config.v1+json",
          "layer": "application/vnd.oci.image.layer.v1.tar+gzip"}
_SKIPPED_ROOT = ("dev", "proc", "sys")      # the runtime provides these


def _blob(layout: str, data: bytes) -> tuple[str, int]:
  digest = "sha256:" + hashlib.sha256(data).hexdigest()
  path = os.path.join(layout, "blobs", "sha256", digest.split(":")[1])
  if not os.path.exists(path):
    with open(path + ".tmp", "wb") as f:
      f.write(data)
    os.replace(path + ".tmp", path)
  return digest, len(data)


def _layer(layout: str, source: str, point: str, cache: dict) -> dict:
  """One gzip layer holding `source` at `point` (cached by source and point)."""
  key = f"{os.path.realpath(source)}->{point}"
  if key in cache and os.path.exists(os.path.join(layout, "blobs", "sha256",
                                                  cache[key]["digest"].split(":")[1])):
    return cache[key]
  with tempfile.TemporaryFile() as raw:
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
      parts = [p for p in point.strip("/").split("/") if p]
      for i in range(1, len(parts)):        # parent folders of the mount point
        info = tarfile.TarInfo("/".join(parts[:i]))
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
      prefix = "/".join(parts)
      if prefix:
        info = tar.gettarinfo(source, arcname=prefix)
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        tar.addfile(info)

      def skip(info):
        top = info.name[len(prefix):].lstrip("/").split("/")[0] if prefix else info.name.split(
            "/")[0]
        if point == "/" and top in _SKIPPED_ROOT and info.name.count("/") >= 1:
          return None
        if info.isdev():
          return None
        return info

      for entry in sorted(os.listdir(source)):
        name = f"{prefix}/{entry}" if prefix else entry
        tar.add(os.path.join(source, entry), arcname=name, filter=skip)
    raw.seek(0)
    data = raw.read()
  diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
  digest, size = _blob(layout, gzip.compress(data, compresslevel=1, mtime=0))
  cache[key] = {"digest": digest, "size": size, "diff_id": diff_id}
  return cache[key]


def export_image(image_dir: str, layout: str, ref: str, *, allowed_roots: Sequence[str]) -> str:
  """Writes the image directory as an OCI image named `ref` into the OCI layout `layout`.

  Returns:
    The manifest's digest.

  Raises:
    BuildError: the image directory is not a root-filesystem image.
  """
  spec = env_images.resolve_image(image_dir, allowed_roots=list(allowed_roots))
  if spec.kind != "rootfs":
    raise BuildError(f"{image_dir} is a {spec.kind!r} image; only root-filesystem task images "
                     f"can be exported as container images")
  os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
  if not os.path.exists(os.path.join(layout, "oci-layout")):
    with open(os.path.join(layout, "oci-layout"), "w") as f:
      json.dump({"imageLayoutVersion": "1.0.0"}, f)
  cache_path = os.path.join(layout, "orchard_layers.json")
  cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}
  parts = [(spec.root, "/")] + list(spec.binds)
  if spec.workspace_seed:
    parts.append((spec.workspace_seed, spec.workdir))
  layers = [_layer(layout, source, point, cache) for source, point in parts]
  with open(cache_path + ".tmp", "w") as f:
    json.dump(cache, f)
  os.replace(cache_path + ".tmp", cache_path)
  config = {"architecture": "amd64", "os": "linux",
            "config": {"Env": [f"{k}={v}" for k, v in spec.env], "WorkingDir": spec.workdir,
                       "Cmd": ["/bin/bash"]},
            "rootfs": {"type": "layers", "diff_ids": [l["diff_id"] for l in layers]}}
  config_digest, config_size = _blob(layout, json.dumps(config, sort_keys=True).encode())
  manifest = {"schemaVersion": 2, "mediaType": _MEDIA["manifest"],
              "config": {"mediaType": _MEDIA["config"], "digest": config_digest,
                         "size": config_size},
              "layers": [{"mediaType": _MEDIA["layer"], "digest": l["digest"], "size": l["size"]}
                         for l in layers]}
  digest, size = _blob(layout, json.dumps(manifest, sort_keys=True).encode())
  index_path = os.path.join(layout, "index.json")
  index = json.load(open(index_path)) if os.path.exists(index_path) else {
      "schemaVersion": 2, "manifests": []}
  index["manifests"] = [m for m in index["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != ref]
  index["manifests"].append({"mediaType": _MEDIA["manifest"], "digest": digest, "size": size,
                             "annotations": {"org.opencontainers.image.ref.name": ref}})
  with open(index_path + ".tmp", "w") as f:
    json.dump(index, f)
  os.replace(index_path + ".tmp", index_path)
  return digest


def push_instances(instances: Sequence[SWEInstance], registry: str, *, layout: str,
                   tls_verify: bool = True, timeout_s: float = 1800) -> list[SWEInstance]:
  """Exports each instance's image, pushes it to `registry`, and returns the instances with
  `test_spec.image` naming the pushed image (the same names `tasks.cluster_images` uses).

  Raises:
    BuildError: skopeo is missing or a push failed (with its message).
  """
  from orchard_jax.tasks.swe.dataset import container_image
  skopeo = shutil.which("skopeo")
  if skopeo is None:
    raise BuildError("pushing task images needs skopeo: apt-get install skopeo "
                     "(launch/install.sh installs it)")
  roots = [env_images.default_cache_dir()]
  out = []
  for instance in instances:
    target = container_image(instance.instance_id, registry.rstrip("/"))
    ref = target.rsplit("/", 1)[1].replace(":", "_")
    export_image(instance.test_spec.image, layout, ref, allowed_roots=roots)
    proc = subprocess.run([skopeo, "copy", "--quiet", f"--dest-tls-verify={str(tls_verify).lower()}",
                           f"oci:{layout}:{ref}", f"docker://{target}"],
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
      raise BuildError(f"pushing {instance.instance_id} to {target} failed: "
                       f"{proc.stderr.strip()[-500:]}")
    out.append(instance.replace(test_spec=dataclasses.replace(instance.test_spec, image=target)))
  return out
