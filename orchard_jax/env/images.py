"""Sandbox images: what the `image` string of a create request means, and the image-directory format.

An image is one of (docs/contracts.md "Env images"):

- `"host"`: a read-only view of the host's system folders (/usr, /bin, /lib*, /etc, /opt...).
- an absolute path to an **image directory** on the orchestrator's machine (local backend),
  which must lie under one of the configured image roots (by default the orchard_jax cache
  folder, `$XDG_CACHE_HOME/orchard_jax` or `~/.cache/orchard_jax`). An image directory is
  either
  * a full root filesystem (it has `bin/sh` or `usr/bin/sh`), mounted read-only at `/`, or
  * a layer over the host described by `image.json` in it (format version 1):

        {"version": 1,
         "base": "host",                    # or "rootfs": the directory itself is the root
         "rootfs": "/abs/rootfs",           # with base "rootfs": a shared root filesystem
                                            # to use instead of the directory itself (optional)
         "binds": {"venv": "/opt/venv"},    # <path in image dir> -> <mount point>, read-only
         "workdir": "/testbed",             # the private writable workspace (default /workspace)
         "env": {"PATH": "/opt/venv/bin:/usr/bin:/bin"},
         "workspace_seed": "repo"}          # copied into the workspace at creation (optional)

  A relative path in `binds` or `workspace_seed` is inside the image directory and may not
  leave it (symlinks included). A bind source and `rootfs` may also be absolute paths to
  content shared by many images (a Debian root filesystem, an interpreter, a venv); those must
  lie under an allowed image root too, like the image directory itself, so a sandbox sees only
  what lies under the roots. Everything from the image is read-only; the workspace at
  `workdir` is private to each sandbox and writable.
- anything else is a container image reference (`python:3.11-slim`), for the Kubernetes backend.

`write_image_manifest` writes `image.json` in this format (the SWE task builder uses it), and
`resolve_image` reads and checks it. The format is stable: new keys are only ever added.
"""
import dataclasses
import json
import os
from typing import Optional, Sequence

from orchard_jax.env.errors import ImageError, ImageNotAllowed

IMAGE_MANIFEST = "image.json"
MANIFEST_VERSION = 1
DEFAULT_WORKDIR = "/workspace"
_MANIFEST_KEYS = {"version", "base", "rootfs", "binds", "workdir", "env", "workspace_seed"}
_FORBIDDEN_MOUNTS = ("/proc", "/dev", "/sys")


@dataclasses.dataclass(frozen=True)
class ImageSpec:
  """A resolved image.

  Attributes:
    source: the image string as given.
    kind: "host", "rootfs" (an image directory that is a root filesystem), "layer" (an
      image directory over the host) or "container" (a container image reference).
    root: the host folder mounted at / for "rootfs", else None.
    binds: ((host path, mount point), ...) read-only binds from the image directory.
    workdir: where the private writable workspace is mounted.
    env: environment variables the image sets for every command.
    workspace_seed: host folder copied into the workspace at creation, or None.
  """
  source: str
  kind: str
  root: Optional[str] = None
  binds: tuple = ()
  workdir: str = DEFAULT_WORKDIR
  env: tuple = ()
  workspace_seed: Optional[str] = None

  @property
  def env_dict(self) -> dict:
    return dict(self.env)


def default_cache_dir() -> str:
  """The orchard_jax cache folder: $XDG_CACHE_HOME/orchard_jax or ~/.cache/orchard_jax."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "orchard_jax")


def write_image_manifest(folder: str, *, base: str = "host", binds: Optional[dict] = None,
                         workdir: str = DEFAULT_WORKDIR, env: Optional[dict] = None,
                         workspace_seed: Optional[str] = None,
                         rootfs: Optional[str] = None) -> str:
  """Writes `folder/image.json` in the image-directory format (see the module docstring).

  Args:
    folder: the image directory (created if missing).
    base: "host" or "rootfs".
    binds: {path relative to folder, or an absolute path of shared content: mount point}.
    workdir: absolute path of the writable workspace inside the sandbox.
    env: environment variables for every command.
    workspace_seed: path relative to folder copied into the workspace at creation.
    rootfs: with base "rootfs", the absolute path of a shared root filesystem (default: the
      folder itself is the root).
  Returns:
    The manifest's path.
  Raises:
    ImageError: a value is malformed (checked with the same rules the service applies).
  """
  os.makedirs(folder, exist_ok=True)
  manifest = {"version": MANIFEST_VERSION, "base": base, "binds": dict(binds or {}),
              "workdir": workdir, "env": dict(env or {})}
  if workspace_seed is not None:
    manifest["workspace_seed"] = workspace_seed
  if rootfs is not None:
    manifest["rootfs"] = rootfs
  _check_manifest(os.path.realpath(folder), manifest)
  path = os.path.join(folder, IMAGE_MANIFEST)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  os.replace(tmp, path)
  return path


def is_image_path(image: str) -> bool:
  return image.startswith("/")


def resolve_image(image: str, *, allowed_roots: Sequence[str],
                  allow_container: bool = False) -> ImageSpec:
  """Turns an image string into an ImageSpec, checking the directory format and the roots.

  Raises:
    ImageNotAllowed: an image directory outside every allowed root.
    ImageError: missing folder, malformed image.json, unusable root filesystem, or a
      container reference where the backend runs none.
  """
  if not isinstance(image, str) or not image:
    raise ImageError(f"image must be 'host', an absolute image directory or a container "
                     f"reference; got {image!r}")
  if image == "host":
    return ImageSpec(source=image, kind="host")
  if not is_image_path(image):
    if allow_container:
      return ImageSpec(source=image, kind="container")
    raise ImageError(f"image {image!r} is neither 'host' nor an absolute path to an image "
                     f"directory; container images need the kubernetes backend")
  real = os.path.realpath(image)
  roots = [os.path.realpath(r) for r in allowed_roots]
  if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
    raise ImageNotAllowed(f"image directory {image!r} (resolved to {real!r}) is outside the "
                          f"allowed image roots {roots}; add its parent to image_roots",
                          details={"image": image, "allowed_roots": roots})
  if not os.path.isdir(real):
    raise ImageError(f"image directory {image!r} does not exist or is not a directory")
  manifest_path = os.path.join(real, IMAGE_MANIFEST)
  if os.path.exists(manifest_path):
    try:
      with open(manifest_path) as f:
        manifest = json.load(f)
    except (OSError, ValueError) as e:
      raise ImageError(f"{manifest_path} is not valid JSON: {e}") from None
    return _spec_from_manifest(image, real, manifest, roots)
  if not _looks_like_rootfs(real):
    raise ImageError(f"image directory {image!r} has no {IMAGE_MANIFEST} and is not a root "
                     f"filesystem (no bin/sh or usr/bin/sh in it)")
  return ImageSpec(source=image, kind="rootfs", root=real)


def _looks_like_rootfs(folder):
  return any(os.path.lexists(os.path.join(folder, p)) for p in ("bin/sh", "usr/bin/sh"))


def _inside(folder, rel, what, roots=None):
  if not isinstance(rel, str) or not rel:
    raise ImageError(f"{what} must be a non-empty path relative to the image directory; got {rel!r}")
  if os.path.isabs(rel):
    return _shared(rel, what, roots)
  path = os.path.realpath(os.path.join(folder, rel))
  if path != folder and not path.startswith(folder + "/"):
    raise ImageError(f"{what} {rel!r} leaves the image directory {folder!r} (resolves to {path!r})")
  if not os.path.exists(path):
    raise ImageError(f"{what} {rel!r} does not exist in the image directory {folder!r}")
  return path


def _shared(path, what, roots):
  """An absolute path of shared content: it must exist and, when `roots` is given (resolving
  for a sandbox rather than writing), lie under one of them."""
  real = os.path.realpath(path)
  if roots is not None and not any(real == r or real.startswith(r.rstrip("/") + "/")
                                   for r in roots):
    raise ImageNotAllowed(f"{what} {path!r} (resolved to {real!r}) is outside the allowed "
                          f"image roots {list(roots)}", details={"path": path,
                                                                  "allowed_roots": list(roots)})
  if not os.path.exists(real):
    raise ImageError(f"{what} {path!r} does not exist")
  return real


def _check_mount_point(point, what):
  if not isinstance(point, str) or not point.startswith("/") or os.path.normpath(point) == "/":
    raise ImageError(f"{what} must be an absolute path other than '/'; got {point!r}")
  norm = os.path.normpath(point)
  if any(norm == p or norm.startswith(p + "/") for p in _FORBIDDEN_MOUNTS):
    raise ImageError(f"{what} {point!r} is under {_FORBIDDEN_MOUNTS}, which the sandbox owns")
  return norm


def _check_manifest(folder, manifest, roots=None):
  if not isinstance(manifest, dict):
    raise ImageError(f"{IMAGE_MANIFEST} must hold a JSON object; got {type(manifest).__name__}")
  unknown = set(manifest) - _MANIFEST_KEYS
  if unknown:
    raise ImageError(f"{IMAGE_MANIFEST} has unknown keys {sorted(unknown)}; expected a subset "
                     f"of {sorted(_MANIFEST_KEYS)}")
  version = manifest.get("version", MANIFEST_VERSION)
  if version != MANIFEST_VERSION:
    raise ImageError(f"{IMAGE_MANIFEST} version {version!r} is not supported (expected 1)")
  base = manifest.get("base", "host")
  if base not in ("host", "rootfs"):
    raise ImageError(f"{IMAGE_MANIFEST} base must be 'host' or 'rootfs'; got {base!r}")
  binds = manifest.get("binds", {})
  if not isinstance(binds, dict):
    raise ImageError(f"{IMAGE_MANIFEST} binds must map paths in the image directory to mount "
                     f"points; got {binds!r}")
  out_binds = []
  for rel, point in binds.items():
    out_binds.append((_inside(folder, rel, "bind source", roots),
                      _check_mount_point(point, "mount point")))
  workdir = _check_mount_point(manifest.get("workdir", DEFAULT_WORKDIR), "workdir")
  env = manifest.get("env", {})
  if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items()):
    raise ImageError(f"{IMAGE_MANIFEST} env must map strings to strings; got {env!r}")
  seed = manifest.get("workspace_seed")
  seed_path = None if seed is None else _inside(folder, seed, "workspace_seed", roots)
  if seed_path is not None and not os.path.isdir(seed_path):
    raise ImageError(f"workspace_seed {seed!r} must be a directory")
  root = folder
  if manifest.get("rootfs") is not None:
    if base != "rootfs" or not isinstance(manifest["rootfs"], str) or not os.path.isabs(
        manifest["rootfs"]):
      raise ImageError(f"{IMAGE_MANIFEST} rootfs must be an absolute path, with base 'rootfs'; "
                       f"got base {base!r}, rootfs {manifest['rootfs']!r}")
    root = _shared(manifest["rootfs"], "rootfs", roots)
  if base == "rootfs" and not _looks_like_rootfs(root):
    raise ImageError(f"{IMAGE_MANIFEST} says base 'rootfs' but {root!r} has no bin/sh")
  return base, tuple(out_binds), workdir, tuple(sorted(env.items())), seed_path, root


def _spec_from_manifest(image, folder, manifest, roots):
  base, binds, workdir, env, seed, root = _check_manifest(folder, manifest, roots)
  return ImageSpec(source=image, kind="rootfs" if base == "rootfs" else "layer",
                   root=root if base == "rootfs" else None, binds=binds, workdir=workdir,
                   env=env, workspace_seed=seed)
