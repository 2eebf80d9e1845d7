"""Orchard Env: the sandbox service, its SDK and its backends.

A standalone service (it imports nothing else of orchard_jax): a REST API (FastAPI) that
creates isolated sandboxes, runs commands in them as jobs, moves files and patches in and out,
exposes ports and serves interactive terminals, over a local bubblewrap backend or Kubernetes.

SDK:
  SandboxClient(url, api_key).create_sandbox(image="host", cpu=, memory=, disk=, pids=,
      timeout=, heartbeat_timeout=, network=False, env=, labels=, workdir=) -> Sandbox
  Sandbox.exec(command, cwd=, env=, timeout=, merge_stderr=, max_output_bytes=, stdin=,
      check=False) -> ExecResult;  .start(...) -> Job;  .upload(path, data);  .download(path)
      -> bytes;  .list_files(path);  .apply_patch(diff, cwd=, check=True) -> PatchResult;
      .expose_port(port, ttl=);  .heartbeat();  .stats();  .delete()
  AsyncSandboxClient / AsyncSandbox / AsyncJob: the same, awaitable.
Service:
  Orchestrator(LocalBackend(...), api_keys=[...]) as service -> service.url  (in-process)
  ServiceProcess([...]) (a child process);  `python -m orchard_jax.env serve --backend local`.
Images: see orchard_jax.env.images (write_image_manifest, the image.json format).
"""
from orchard_jax.env.async_client import AsyncJob, AsyncSandbox, AsyncSandboxClient
from orchard_jax.env.backends.base import Backend, SandboxSpec
from orchard_jax.env.backends.local import LocalBackend
from orchard_jax.env.client import Job, Sandbox, SandboxClient
from orchard_jax.env.errors import (AuthenticationError, BackendUnavailable, CapacityError,
                                    CommandFailed, EnvError, ExposureNotFound,
                                    FileOperationError, ImageError, ImageNotAllowed,
                                    InvalidRequest, JobNotFound, LimitNotEnforceable, NotFound,
                                    PatchError, PayloadTooLarge, PermissionDenied,
                                    QuotaExceeded, SandboxFailed,
                                    SandboxFileNotFound, SandboxNotFound, SandboxStateError,
                                    ServiceUnavailable)
from orchard_jax.env.images import (IMAGE_MANIFEST, ImageSpec, default_cache_dir,
                                    resolve_image, write_image_manifest)
from orchard_jax.env.jobs import JobResult, JobSpec
from orchard_jax.env.manager import ServiceConfig
from orchard_jax.env.orchestrator import Orchestrator, ServiceProcess, load_api_keys
from orchard_jax.env.results import ExecResult, PatchResult
from orchard_jax.env.store import MemoryStore, Store
from orchard_jax.env._http import RetryPolicy


def __getattr__(name):
  if name == "KubernetesBackend":   # imported lazily: the kubernetes client is slow to import
    from orchard_jax.env.backends.kubernetes import KubernetesBackend
    return KubernetesBackend
  raise AttributeError(f"module 'orchard_jax.env' has no attribute {name!r}")
