"""Creates, inspects and removes the orchard_jax fleet on a Kubernetes cluster.

  python launch/fleet.py up      [--config launch/k8s/config.py:cluster] [--dry-run]
  python launch/fleet.py status  [--config ...] [--dry-run]
  python launch/fleet.py train   [--config ...] [--job-name NAME] [--set rl.lr=3e-6 ...] [--dry-run]
  python launch/fleet.py weights --repo Qwen/Qwen3.5-35B-A3B --folder qwen3_5_35b_a3b [--dry-run]
  python launch/fleet.py down    [--config ...] [--delete-volumes] [--dry-run]

`up` applies (server-side apply) the long-lived objects: namespaces, the model and checkpoint
volumes, Orchard Env (orchestrator Deployment and Service, RBAC, API-key Secret, Redis), the
sandbox namespace's network policies, and the SGLang servers. `train` submits one training
run (an Indexed Job under jax.distributed); each `--set FIELD=VALUE` becomes an experiment
override `--config.FIELD=VALUE` of launch/run.py in the Job. `weights` submits a Job that
downloads a Hugging Face model into the models volume (SGLang's --model-path reads it there).
`status` reports every object and exits 1 when something is missing or not ready.
`down` deletes what `up` and `train` created, keeping the volumes (and the namespace that holds
them) unless `--delete-volumes` is given. `--dry-run` touches nothing: `up`, `train` and
`weights` print the manifests they would apply as YAML, `down` the objects it would delete (and
keep), `status` the objects it would read. Fleet fields are overridden like experiment fields:
`--config.env.replicas=5`. The cluster is the one of the current kubeconfig context (or
`--kubeconfig`, `--context`).
"""
import os
import secrets
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from launch import k8s  # noqa: E402
from launch import overrides  # noqa: E402
from launch.k8s import client as kube  # noqa: E402
from launch.k8s import common  # noqa: E402

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s", "config.py")
_CONFIG = overrides.define_config_file(    # the default is loaded now: see there
    "config", _DEFAULT_CONFIG + ":default",
    "Fleet config: launch/k8s/config.py[:default|cluster].")
_DRY_RUN = flags.DEFINE_bool("dry-run", False, "Print the manifests as YAML; change nothing.")
_KUBECONFIG = flags.DEFINE_string("kubeconfig", None, "kubeconfig file (default: kubectl's).")
_CONTEXT = flags.DEFINE_string("context", None, "kubeconfig context (default: current).")
_DELETE_VOLUMES = flags.DEFINE_bool(
    "delete-volumes", False, "down: also delete the model and checkpoint volumes.")
_JOB_NAME = flags.DEFINE_string("job-name", None, "train: the Job's name "
                                "(default: config.training.name).")
_SET = flags.DEFINE_multi_string(
    "set", [], "train: an experiment override FIELD=VALUE (repeatable), passed to "
    "launch/run.py in the Job as --config.FIELD=VALUE.")
_WAIT = flags.DEFINE_integer("wait", 0, "up: seconds to wait for every Deployment and "
                             "StatefulSet to be ready (0: do not wait).")

_REPO = flags.DEFINE_string("repo", None, "weights: Hugging Face model, owner/name.")
_FOLDER = flags.DEFINE_string("folder", None, "weights: folder on the models volume.")
_REVISION = flags.DEFINE_string("revision", "", "weights: branch, tag or commit (default: main).")

_WORKLOADS = ("Deployment", "StatefulSet")
COMMANDS = ("up", "down", "status", "train", "weights")


def _say(text: str) -> None:
  print(text, flush=True)


# --- up ---------------------------------------------------------------------------------


def _api_key(client: kube.KubeClient, config) -> tuple[str, bool]:
  """(key, secret exists): the existing Secret wins, then config.env.api_key, then new."""
  existing = client.read("Secret", config.env.api_key_secret, config.namespace)
  if existing is not None:
    return "", True
  return config.env.api_key or secrets.token_urlsafe(32), False


def up(client: kube.KubeClient, config, *, wait_seconds: int = 0) -> list[dict]:
  """Applies every long-lived object of the fleet; returns what was applied.

  The API-key Secret is created once and never overwritten, so existing clients keep their
  key. Raises FleetError on the first object the API server refuses.
  """
  key, secret_exists = _api_key(client, config)
  applied = []
  for obj in k8s.render_fleet(config, api_key=key or k8s.DRY_RUN_API_KEY):
    if obj["kind"] == "Secret":
      if secret_exists:
        _say(f"kept    {kube.describe(obj)} (exists; delete it to rotate the key)")
        continue
      client.create(obj)
      _say(f"created {kube.describe(obj)} (read the key with: kubectl -n {config.namespace} "
           f"get secret {config.env.api_key_secret} -o jsonpath='{{.data.api-keys}}' "
           "| base64 -d)")
    else:
      client.apply(obj)
      _say(f"applied {kube.describe(obj)}")
    applied.append(obj)
  if wait_seconds > 0:
    wait_until_ready(client, config, timeout_seconds=wait_seconds)
  return applied


def wait_until_ready(client: kube.KubeClient, config, *, timeout_seconds: float,
                     poll_seconds: float = 2.0) -> None:
  """Waits until every Deployment and StatefulSet of the fleet has all its replicas ready.

  Raises:
    FleetError: some workload is still not ready after `timeout_seconds`; the message
      lists which and how many replicas are ready.
  """
  deadline = time.monotonic() + timeout_seconds
  while True:
    pending = []
    for obj in k8s.render_fleet(config):
      if obj["kind"] not in _WORKLOADS:
        continue
      state = client.read(obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"])
      ready, wanted = _deployment_ready(state, obj)
      if ready < wanted:
        pending.append(f"{kube.describe(obj)} {ready}/{wanted} ready")
    if not pending:
      _say("every Deployment and StatefulSet is ready")
      return
    if time.monotonic() > deadline:
      raise common.FleetError(f"not ready after {timeout_seconds:g} s: " + "; ".join(pending))
    time.sleep(poll_seconds)


# --- train ------------------------------------------------------------------------------


def train(client: kube.KubeClient, config, *, name=None, overrides=()) -> list[dict]:
  """Submits one training run: applies its headless Service, creates its Indexed Job.

  Raises:
    FleetError: a Job of that name exists (Jobs cannot be changed once created: pick another
      --job-name, or delete the old one with `kubectl delete job NAME`).
  """
  service, job = k8s.training_job(config, name=name, overrides=overrides)
  job_name = job["metadata"]["name"]
  if client.read("Job", job_name, config.namespace) is not None:
    raise common.FleetError(
        f"training Job {config.namespace}/{job_name} exists; pass another --job-name or "
        f"delete it first (kubectl -n {config.namespace} delete job {job_name})")
  client.apply(service)
  client.create(job)
  _say(f"created {kube.describe(job)} with {config.training.num_hosts} host(s); follow it "
       f"with: kubectl -n {config.namespace} logs -f job/{job_name}")
  return [service, job]


def weights(client: kube.KubeClient, config, *, repo_id: str, folder: str,
            revision: str = "") -> dict:
  """Submits the Job that downloads `repo_id` into the models volume's `folder`.

  Raises:
    FleetError: a bad repo or folder name, or a download Job for `folder` already exists.
  """
  job = k8s.storage.weights_job(config, repo_id, folder, revision=revision)
  name = job["metadata"]["name"]
  if client.read("Job", name, config.namespace) is not None:
    raise common.FleetError(f"Job {config.namespace}/{name} exists (a download of {folder!r} "
                            f"is running or finished); delete it first to download again")
  client.create(job)
  _say(f"created {kube.describe(job)}; follow it with: kubectl -n {config.namespace} logs -f "
       f"job/{name}")
  return job


# --- status -----------------------------------------------------------------------------


def _deployment_ready(state, obj) -> tuple[int, int]:
  wanted = obj["spec"]["replicas"]
  if state is None:
    return 0, wanted
  return int((state.get("status") or {}).get("readyReplicas") or 0), wanted


def _describe_state(kind: str, state: dict, obj: dict) -> tuple[str, bool]:
  """(one-line state, healthy) of an object as the API server reports it."""
  status = state.get("status") or {}
  if kind in _WORKLOADS:
    ready, wanted = _deployment_ready(state, obj)
    return f"{ready}/{wanted} ready", ready >= wanted
  if kind == "PersistentVolumeClaim":
    # Pending is normal until the first pod uses the claim (WaitForFirstConsumer classes).
    phase = status.get("phase", "Pending")
    return phase, phase in ("Bound", "Pending")
  if kind == "Namespace":
    phase = status.get("phase", "Active")
    return phase, phase == "Active"
  if kind == "Job":
    return _job_state(state), not status.get("failed")
  if kind == "Service":
    spec = state.get("spec") or {}
    return f"clusterIP {spec.get('clusterIP', '?')}", True
  return "present", True


def _job_state(state: dict) -> str:
  status = state.get("status") or {}
  parts = [f"{key} {status.get(key) or 0}" for key in ("active", "succeeded", "failed")]
  return ", ".join(parts)


def status_targets(config) -> list[str]:
  """What `status` reads, one line each, without a cluster (`status --dry-run`)."""
  lines = [f"read {kube.describe(obj)}" for obj in k8s.render_fleet(config)]
  lines.append(f"list Jobs in {config.namespace} labelled {_training_selector(config)}")
  lines.append(f"list Pods in {config.sandbox_namespace}")
  return lines


def status(client: kube.KubeClient, config) -> tuple[list[tuple[str, str, bool]], bool]:
  """Reports every object of the fleet, the training Jobs, and the sandbox pods.

  Returns:
    (rows, healthy): rows of (object, state, healthy); healthy is False when an object is
    missing, a Deployment or StatefulSet is short of ready replicas, a claim is lost or a Job
    failed.
  """
  rows = []
  for obj in k8s.render_fleet(config):
    meta = obj["metadata"]
    state = client.read(obj["kind"], meta["name"], meta.get("namespace"))
    if state is None:
      rows.append((kube.describe(obj), "missing", False))
    else:
      rows.append((kube.describe(obj), *_describe_state(obj["kind"], state, obj)))
  for job in client.list("Job", config.namespace, _training_selector(config)):
    rows.append((kube.describe(dict(job, kind="Job")), _job_state(job),
                 not (job.get("status") or {}).get("failed")))
  phases: dict[str, int] = {}
  for pod in client.list("Pod", config.sandbox_namespace):
    phase = (pod.get("status") or {}).get("phase", "Unknown")
    phases[phase] = phases.get(phase, 0) + 1
  summary = ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items())) or "none"
  rows.append((f"sandbox pods in {config.sandbox_namespace}", summary, True))
  return rows, all(ok for _, _, ok in rows)


def _print_status(rows, healthy: bool) -> None:
  from rich.console import Console
  from rich.table import Table
  table = Table(title="orchard fleet")
  for column in ("object", "state", "ok"):
    table.add_column(column)
  for name, state, ok in rows:
    table.add_row(name, state, "yes" if ok else "NO")
  Console(width=160).print(table)
  _say("fleet is healthy" if healthy else "fleet is NOT healthy (see rows marked NO)")


# --- down -------------------------------------------------------------------------------


def _training_selector(config) -> str:
  return common.fleet_selector(config) + ",app.kubernetes.io/component=training"


def down(client: kube.KubeClient, config, *, delete_volumes: bool = False) -> list[str]:
  """Deletes the fleet: its Jobs (training runs, weight downloads) and the training runs'
  Services, then every rendered object in
  reverse order. Volumes, and the fleet namespace that holds them, stay unless
  `delete_volumes`. Namespaces are deleted only when labelled as created by this fleet.

  Returns:
    descriptions of the objects deleted.
  """
  deleted = []
  for kind, selector in _down_selectors(config):
    for obj in client.list(kind, config.namespace, selector):
      if client.delete(kind, obj["metadata"]["name"], config.namespace):
        deleted.append(kube.describe(dict(obj, kind=kind)))
        _say(f"deleted {deleted[-1]}")
  for obj, kept in _down_order(config, delete_volumes):
    kind, meta = obj["kind"], obj["metadata"]
    if kept:
      _say(f"kept    {kube.describe(obj)} ({kept})")
      continue
    if kind == "Namespace":
      live = client.read("Namespace", meta["name"])
      owner = ((live or {}).get("metadata", {}).get("labels") or {}).get(
          "app.kubernetes.io/instance")
      if live is None or owner != config.name:
        continue
    if client.delete(kind, meta["name"], meta.get("namespace")):
      deleted.append(kube.describe(obj))
      _say(f"deleted {kube.describe(obj)}")
  return deleted


def _down_selectors(config) -> tuple[tuple[str, str], ...]:
  """(kind, label selector) of what `down` deletes first: every Job of the fleet (training
  runs, weight downloads) and the training runs' Services."""
  return (("Job", common.fleet_selector(config)), ("Service", _training_selector(config)))


def _down_order(config, delete_volumes: bool):
  """Yields (object, why it is kept or None) for every rendered object, in deletion order."""
  for obj in reversed(k8s.render_fleet(config)):
    kind, meta = obj["kind"], obj["metadata"]
    if kind == "PersistentVolumeClaim" and not delete_volumes:
      yield obj, "pass --delete-volumes to delete it"
    elif kind == "Namespace" and meta["name"] == config.namespace and not delete_volumes:
      yield obj, "it holds the volumes"
    else:
      yield obj, None


def down_targets(config, *, delete_volumes: bool = False) -> list[str]:
  """What `down` deletes and keeps, in its order, one line each, without a cluster
  (`down --dry-run`)."""
  lines = [f"delete every {kind} in {config.namespace} labelled {selector}"
           for kind, selector in _down_selectors(config)]
  for obj, kept in _down_order(config, delete_volumes):
    if kept:
      lines.append(f"keep   {kube.describe(obj)} ({kept})")
    elif obj["kind"] == "Namespace":
      lines.append(f"delete {kube.describe(obj)} (only if labelled "
                   f"app.kubernetes.io/instance={config.name}, i.e. this fleet created it)")
    else:
      lines.append(f"delete {kube.describe(obj)}")
  return lines


def _required(holder, name: str) -> str:
  if not holder.value:
    raise app.UsageError(f"`weights` needs --{name}")
  return holder.value


def experiment_override(text: str) -> str:
  """"rl.lr=3e-6" -> "--config.rl.lr=3e-6" (launch/run.py's override syntax).

  Raises:
    app.UsageError: `text` is not FIELD=VALUE.
  """
  field, sep, value = text.partition("=")
  field = field.strip().removeprefix("--config.").removeprefix("config.")
  if not sep or not field:
    raise app.UsageError(f"--set takes FIELD=VALUE, e.g. rl.lr=3e-6; saw {text!r}")
  return f"--config.{field}={value}"


def check_overrides(experiment: str, args: list[str]) -> None:
  """Checks `--config.FIELD=VALUE` args against the experiment's config before submitting.

  Raises:
    app.UsageError: the experiment has no such field, or the value does not parse.
  """
  pairs = [tuple(a.removeprefix("--config.").split("=", 1)) for a in args]
  try:
    overrides.check(overrides.load_experiment(experiment), pairs, flag="--set")
  except overrides.OverrideError as e:
    raise app.UsageError(str(e)) from None


# --- main -------------------------------------------------------------------------------


def main(argv):
  if len(argv) < 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"expected a command, one of {COMMANDS}; saw {argv[1:2] or 'none'}")
  command = argv[1]
  if argv[2:]:
    raise app.UsageError(f"unexpected arguments {argv[2:]}; experiment overrides go in "
                         "--set FIELD=VALUE")
  if _SET.value and command != "train":
    raise app.UsageError("--set is for `train` (experiment overrides of the training Job)")
  extra = [experiment_override(text) for text in _SET.value]
  config = _CONFIG.value
  if command == "train":     # a misspelt experiment or preset fails here, not in the pod
    try:
      experiment = overrides.cluster_experiment(
          config.training.experiment,
          pinned_workdir=any(a.startswith("--config.workdir=") for a in extra))
    except overrides.OverrideError as e:
      raise app.UsageError(f"training.experiment: {e}") from None
    check_overrides(experiment, extra)
    with config.unlocked():
      config.training.experiment = experiment
  try:
    if _DRY_RUN.value:
      if command == "train":
        manifests = k8s.training_job(config, name=_JOB_NAME.value, overrides=extra)
      elif command == "weights":
        manifests = [k8s.storage.weights_job(config, _required(_REPO, "repo"),
                                             _required(_FOLDER, "folder"),
                                             revision=_REVISION.value)]
      elif command == "up":
        manifests = k8s.render_fleet(config)
      else:                      # down and status change nothing in a manifest: say what
        lines = (down_targets(config, delete_volumes=_DELETE_VOLUMES.value)
                 if command == "down" else status_targets(config))
        _say("\n".join(f"would {line}" for line in lines))
        return 0
      sys.stdout.write(k8s.to_yaml(manifests))
      return 0
    with kube.KubeClient.from_kubeconfig(_KUBECONFIG.value, _CONTEXT.value) as client:
      if command == "up":
        up(client, config, wait_seconds=_WAIT.value)
      elif command == "train":
        train(client, config, name=_JOB_NAME.value, overrides=extra)
      elif command == "weights":
        weights(client, config, repo_id=_required(_REPO, "repo"),
                folder=_required(_FOLDER, "folder"), revision=_REVISION.value)
      elif command == "down":
        down(client, config, delete_volumes=_DELETE_VOLUMES.value)
      else:
        rows, healthy = status(client, config)
        _print_status(rows, healthy)
        return 0 if healthy else 1
  except common.FleetError as e:
    print(f"fleet {command} failed: {type(e).__name__}: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  app.run(overrides.usage_errors_as_one_line(main),
          flags_parser=overrides.flags_parser("config"))
