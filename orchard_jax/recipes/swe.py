"""The Orchard-SWE recipe: task set, sandboxes, evaluation, SFT, RL, value model.

Jobs:
  swe.build_tasks  build (or load from the cache) the task set and print what was tried, kept
                   and dropped                                   (experiments/swe_tasks.py)
  swe.evaluate     evaluate predictions ("gold", "empty" or a predictions file) in fresh
                   sandboxes and write per-instance reports + a summary; with
                   `checkpoint` set, run a policy checkpoint k times per instance and report
                   pass@1, pass@k, value best-of-k and random@k  (experiments/swe_eval.py)
  swe.sft          credit-assignment SFT                          (experiments/swe_sft.py)
  swe.rl           the main job: SFT warm start, then GRPO with BAR (+ RPR, + OPD) and a final
                   evaluation                  (experiments/swe_bar.py, swe_rpr.py, swe_opd.py)
  swe.value        the value model on the trajectory store       (experiments/swe_value.py)

Reusable pieces for later stages:
  load_task_set(config.tasks) -> list[SWEInstance]
  sandbox_client(config.env)  -> context manager yielding an Orchard Env SandboxClient
  sandbox_factory(client)     -> instance -> context manager yielding a fresh task Sandbox
  evaluate_patches(instances, predictions, client, output_dir, ...) -> EvalSummary
  expert_trajectories(instances, client, variants, ...) -> list of data.Trajectory
  run_episode(instance, client, base_url, ...) -> data.Trajectory (agent run + grading)
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from typing import Iterator, Mapping, Optional, Sequence

from ml_collections import ConfigDict

from orchard_jax.recipes import ConfigError, run_folder
from orchard_jax.tasks.swe import builder, evaluation, testbed
from orchard_jax.tasks.errors import InstanceError
from orchard_jax.tasks.swe.instance import SWEInstance, load_instances

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- task set


def build_settings(tasks: ConfigDict) -> builder.BuildSettings:
  """BuildSettings from a `common.swe_tasks()` ConfigDict.

  Raises:
    ConfigError: tasks.packages names a package without a build profile (checked for every
      name before any is built; the builder found it only after building the ones before it).
  """
  unknown = [name for name in tasks.packages if name not in builder.PROFILES]
  if unknown:
    raise ConfigError(f"tasks.packages: unknown package(s) {unknown}; expected names from "
                      f"{sorted(builder.PROFILES)}")
  return builder.BuildSettings(
      packages=tuple(tasks.packages), instances_per_package=int(tasks.instances_per_package),
      max_candidates_per_package=int(tasks.max_candidates_per_package),
      seconds_per_package=float(tasks.seconds_per_package), workers=int(tasks.workers),
      test_timeout_s=float(tasks.test_timeout_s), seed=int(tasks.seed), python=tasks.python)


def load_task_set(tasks: ConfigDict, *, progress: bool = True) -> list[SWEInstance]:
  """The instances the config names: a dataset file, or the default set (built if missing),
  cut to the first `tasks.limit` (0: all).

  Raises:
    ConfigError: tasks.limit is negative (checked before anything is built or loaded), or
      tasks.dataset names no file or holds a record that is not an instance.
  """
  limit = int(tasks.get("limit", 0))
  if limit < 0:        # instances[:-1] would silently drop the last instance
    raise ConfigError(f"tasks.limit is {limit}; expected 0 (every instance) or a positive count")
  if tasks.dataset:
    try:
      instances = load_instances(tasks.dataset)
    except FileNotFoundError as e:
      raise ConfigError(f"tasks.dataset: {tasks.dataset!r} does not exist; expected a SWE-bench "
                        "JSONL/JSON/parquet file, a datasets folder or a hub name") from e
    except InstanceError as e:
      raise ConfigError(f"tasks.dataset: {e}") from e
    instances = instances[:limit] if limit else instances
    if tasks.get("cluster_images") or any(i.test_spec is None for i in instances) and (
        tasks.get("mirrors") or tasks.get("url_template")):
      instances = prepare_dataset(tasks, instances, progress=progress)
    return instances
  else:
    task_set = builder.build_task_set(build_settings(tasks), output_dir=tasks.output_dir or None,
                                      rebuild=bool(tasks.rebuild), progress=progress)
    if not task_set.from_cache:
      print(task_set.summary(), flush=True)
    instances = task_set.instances
  return instances[:limit] if limit else instances


def dataset_settings(tasks: ConfigDict):
  """repo_env.DatasetSettings from the `tasks` block (README "Bring your own dataset")."""
  from orchard_jax.tasks.swe import repo_env
  if tasks.get("specs") and not os.path.exists(tasks.specs):
    raise ConfigError(f"tasks.specs: {tasks.specs!r} does not exist")
  if tasks.get("mirrors") and not os.path.isdir(tasks.mirrors):
    raise ConfigError(f"tasks.mirrors: {tasks.mirrors!r} is not a folder")
  return repo_env.DatasetSettings(
      source=repo_env.RepoSource(mirrors=tasks.get("mirrors", ""),
                                 url_template=tasks.get("url_template", "")),
      specs=tasks.get("specs", ""), workers=int(tasks.get("workers", 2)),
      test_timeout_s=max(float(tasks.get("test_timeout_s", 300.0)), 300.0),
      rootfs=tasks.get("rootfs", ""))


def _build_dir(tasks: ConfigDict) -> str:
  name = os.path.splitext(os.path.basename(str(tasks.dataset).rstrip("/")))[0] or "dataset"
  return tasks.get("build_dir") or os.path.join("runs", "swe_tasks", name)


def prepare_dataset(tasks: ConfigDict, instances: Sequence[SWEInstance], *,
                    progress: bool = True) -> list[SWEInstance]:
  """The dataset's instances ready to evaluate: an environment and image built for those without
  a test_spec, or container images on a cluster (tasks.cluster_images); prints the build report.

  Raises:
    ConfigError: a setting is unusable, or no instance could be built.
  """
  from orchard_jax.tasks.errors import BuildError
  from orchard_jax.tasks.swe import dataset
  try:
    ready, build = dataset.prepare(instances, dataset_settings(tasks),
                                   output_dir=os.path.join(_build_dir(tasks), "build"),
                                   cluster_images=tasks.get("cluster_images", ""),
                                   progress=progress)
  except BuildError as e:
    raise ConfigError(f"tasks: {e}") from e
  if build is not None:
    print(build.summary(), flush=True)
  if not ready:
    raise ConfigError(f"tasks.dataset: none of its {len(instances)} instances could be built")
  return ready


@dataclasses.dataclass
class DatasetJobResult:
  """What swe.build_tasks did with a dataset; `failure` (non-empty: exit 1) when instances ended
  in error."""
  build: object
  validation: object = None
  failure: str = ""


def build_dataset_job(config: ConfigDict) -> DatasetJobResult:
  """swe.build_tasks with tasks.dataset (or config.commits): build every instance's environment
  and image, then with config.validate run the validation pass (README "Bring your own
  dataset")."""
  from orchard_jax.tasks.errors import BuildError
  from orchard_jax.tasks.swe import collect, repo_env, validation
  tasks = config.tasks
  settings = dataset_settings(tasks)
  progress = bool(config.get("progress", True))
  try:
    if config.get("commits"):
      instances, problems = collect.collect(collect.load_commits(config.commits), settings.source)
      for problem in problems:
        print(f"not collected: {problem}", flush=True)
    else:
      instances = load_instances(tasks.dataset)
  except (BuildError, InstanceError, FileNotFoundError) as e:
    raise ConfigError(f"tasks: {e}") from e
  if tasks.limit:
    instances = instances[:int(tasks.limit)]
  out = _build_dir(tasks) if tasks.dataset else (tasks.get("build_dir") or os.path.join(
      "runs", "swe_tasks", os.path.splitext(os.path.basename(config.commits))[0]))
  try:
    build = repo_env.build_dataset([i.replace(test_spec=None) for i in instances], settings,
                                   output_dir=os.path.join(out, "build"), progress=progress)
  except BuildError as e:
    raise ConfigError(f"tasks: {e}") from e
  print(build.summary(), flush=True)
  result = DatasetJobResult(build)
  errors = build.counts[repo_env.ERROR]
  if errors:
    result.failure = (f"{errors} of {len(build.reports)} instance(s) could not be built (see "
                      f"{os.path.join(out, 'build', 'build_report.jsonl')})")
  if config.get("validate") and build.instances:
    with sandbox_client(config.env) as client:
      result.validation = validation.validate(
          build.instances, sandbox_factory(client), output_dir=os.path.join(out, "validate"),
          max_workers=int(config.env.max_parallel), progress=progress)
    print(result.validation.summary(), flush=True)
  if tasks.get("push_registry"):
    from orchard_jax.tasks.swe import oci
    from orchard_jax.tasks.swe.instance import save_instances
    chosen = result.validation.instances if result.validation else build.instances
    try:
      pushed = oci.push_instances(chosen, tasks.push_registry, layout=os.path.join(out, "oci"),
                                  tls_verify=bool(tasks.get("registry_tls_verify", True)))
    except BuildError as e:
      raise ConfigError(f"tasks.push_registry: {e}") from e
    path = save_instances(pushed, os.path.join(out, "pushed", "instances.jsonl"))
    print(f"pushed {len(pushed)} image(s) to {tasks.push_registry}; instances naming them: "
          f"{path}", flush=True)
  return result


def build_tasks(config: ConfigDict):
  """Job "swe.build_tasks": builds or loads the task set and prints its build report; with
  tasks.dataset or config.commits, builds (and validates) that dataset instead."""
  if config.tasks.get("dataset") or config.get("commits"):
    return build_dataset_job(config)
  task_set = builder.build_task_set(build_settings(config.tasks),
                                    output_dir=config.tasks.output_dir or None,
                                    rebuild=bool(config.tasks.rebuild),
                                    progress=bool(config.get("progress", True)))
  print(task_set.summary(), flush=True)
  return task_set


# ----------------------------------------------------------------------------- sandboxes


@contextlib.contextmanager
def sandbox_client(env: ConfigDict) -> Iterator:
  """An Orchard Env client: to `env.url` if set, else to an in-process local-backend service."""
  from orchard_jax.env.client import SandboxClient
  if env.url:
    with SandboxClient(env.url, env.api_key or None) as client:
      yield client
    return
  from orchard_jax.env.backends.local import LocalBackend
  from orchard_jax.env.orchestrator import Orchestrator
  from orchard_jax.harness import install
  # The external harness CLIs (agent.harness) run inside sandboxes from their install folder.
  shown = [install.harness_dir()] if os.path.isdir(install.harness_dir()) else []
  with Orchestrator(LocalBackend(shared_paths=shown)) as service, \
      SandboxClient(service.url, service.api_key) as client:
    yield client


def sandbox_factory(client, **create_kwargs):
  """`instance -> context manager yielding a fresh Sandbox` started from its test_spec image."""
  def factory(instance: SWEInstance):
    if instance.test_spec is None:
      raise evaluation.EvaluationError(
          f"instance {instance.instance_id!r} has no test_spec: no image to start")
    return testbed.open_sandbox(client, instance.test_spec.image, **create_kwargs)
  return factory


# ----------------------------------------------------------------------------- evaluation


def evaluate_patches(instances: Sequence[SWEInstance], predictions: Mapping[str, str], client, *,
                     output_dir: str, max_workers: int = 2,
                     progress: bool = True) -> evaluation.EvalSummary:
  """Evaluates {instance_id: patch} in fresh sandboxes of `client` (see tasks.swe.evaluation)."""
  return evaluation.evaluate_predictions(instances, predictions,
                                         sandbox_factory=sandbox_factory(client),
                                         output_dir=output_dir, max_workers=max_workers,
                                         progress=progress)


def evaluate(config: ConfigDict) -> evaluation.EvalSummary:
  """Job "swe.evaluate": grades config.predictions on the task set; prints the summary.

  Results go to <workdir or output_dir>/<run_id or the predictions' name>. With
  `config.checkpoint` set, evaluates a policy checkpoint instead (`evaluate_checkpoint`).

  Raises:
    ConfigError: config.predictions names no file (checked before the task set is loaded), or
      the file is not a predictions file of this task set.
  """
  if config.get("checkpoint"):
    return evaluate_checkpoint(config)
  check_cluster_settings(config, ("env.url",))
  if config.predictions not in ("gold", "empty") and not os.path.exists(config.predictions):
    raise ConfigError(f"config.predictions: expected 'gold', 'empty' or a predictions file; "
                      f"{config.predictions!r} does not exist")
  logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per sandbox call otherwise
  instances = load_task_set(config.tasks, progress=bool(config.get("progress", True)))
  try:
    predictions = evaluation.load_predictions(config.predictions, instances)
  except evaluation.EvaluationError as e:      # a malformed file: the user's input
    raise ConfigError(f"config.predictions: {e}") from e
  name = config.run_id or os.path.splitext(os.path.basename(config.predictions))[0]
  # A set workdir (sweep.py gives each point its own) is the run folder, as in every other job.
  output_dir = os.path.join(config.workdir or config.output_dir, name)
  missing = [i.instance_id for i in instances if i.instance_id in predictions and i.test_spec
             is None]
  if not config.env.url:                       # the local backend reads image directories
    absent = [i.test_spec.image for i in instances if i.test_spec is not None and
              i.test_spec.image.startswith("/") and not os.path.isdir(i.test_spec.image)]
    if absent:
      raise ConfigError(f"tasks.dataset: {len(absent)} instance image director(ies) do not exist "
                        f"(e.g. {absent[0]}); rebuild them or drop test_spec to build anew")
  if missing:                                  # refused before the first sandbox starts
    raise ConfigError(f"tasks.dataset: {len(missing)} instance(s) have no test_spec (e.g. "
                      f"{missing[:3]}); set tasks.build_environments=True (and tasks.repo_source) "
                      f"to build their images, see README 'Bring your own dataset'")
  with sandbox_client(config.env) as client:
    summary = evaluate_patches(instances, predictions, client, output_dir=output_dir,
                               max_workers=int(config.env.max_parallel),
                               progress=bool(config.get("progress", True)))
  print(summary.table(), flush=True)
  return summary


# ----------------------------------------------------------------------------- seed data


def expert_trajectories(instances: Sequence[SWEInstance], client, *,
                        variants: Sequence[str] = ("gold", "detour", "wrong_fix", "give_up"),
                        agent_config=None, output_dir: str | None = None, seed: int = 0,
                        experiment: str | None = None) -> list:
  """Executes the replay expert's variants on each instance and grades every submission.

  A variant that does not apply to an instance (e.g. "partial" on a one-hunk patch) is skipped.
  Returns `data.Trajectory` objects (outcome filled, expert evidence in metadata); with
  `output_dir`, each is also written as a mini-swe-agent `*.traj.json` file there.
  """
  from orchard_jax.data.miniswe import write_miniswe_trajectory
  from orchard_jax.harness import AgentConfig, HarnessError, run_expert
  factory = sandbox_factory(client)
  config = agent_config or AgentConfig()

  def grade(instance, patch):
    with factory(instance) as sandbox:
      return evaluation.evaluate_in_sandbox(sandbox, instance, patch)

  trajectories = []
  for instance in instances:
    for attempt, variant in enumerate(variants):
      try:
        run = run_expert(instance, variant, sandbox_factory=factory, evaluate=grade,
                         config=config, seed=seed + attempt)
      except HarnessError as e:
        _log.info("expert variant %s skipped on %s: %s", variant, instance.instance_id, e)
        continue
      trajectory = run.to_trajectory(instance.instance_id, attempt=attempt, experiment=experiment)
      trajectories.append(trajectory)
      if output_dir:
        write_miniswe_trajectory(trajectory, os.path.join(
            output_dir, variant, instance.instance_id, f"{instance.instance_id}.traj.json"))
  return trajectories


# ----------------------------------------------------------------------------- agent episodes


def agent_config(agent: ConfigDict, workdir: str = "/testbed"):
  """harness.AgentConfig from a `common.swe_agent()` ConfigDict."""
  from orchard_jax.harness import AgentConfig
  return AgentConfig(step_limit=int(agent.step_limit),
                     wall_time_limit_s=float(agent.wall_time_limit_s),
                     max_consecutive_format_errors=int(agent.max_consecutive_format_errors),
                     command_timeout_s=float(agent.command_timeout_s),
                     output_limit_chars=int(agent.output_limit_chars), workdir=workdir)


def run_episode(instance: SWEInstance, client, base_url: str, *, model: str = "default",
                config=None, session_id: str | None = None, attempt: int = 0,
                sampling: Mapping | None = None, evaluate_patch: bool = True,
                log_dir: str | None = None, harness: str = "bash"):
  """One rollout: the bash agent (or the external `harness`, run inside the sandbox by
  `swe_harness.run_cli_episode`) on `instance` in a fresh sandbox, then grading in another.

  Args:
    instance: an instance with a test_spec.
    client: an Orchard Env SandboxClient.
    base_url: the model's OpenAI-compatible base URL, normally the recording proxy's
      `http://HOST:PORT/sessions/{session_id}/v1`.
    model: the `model` field of requests.
    config: harness.AgentConfig (its workdir is replaced by the instance's).
    session_id: the proxy session, stored on the trajectory so its model calls can be joined.
    attempt: attempt number of this instance.
    sampling: extra ChatModel keywords (temperature, max_tokens, top_p).
    evaluate_patch: grade the submission (outcome "resolved"/... in `trajectory.outcome`).
    log_dir: evaluation logs folder.

  Returns:
    A `data.Trajectory` with the harness messages, exit status, submission and outcome.
  """
  from orchard_jax.harness import AgentConfig, BashAgent, ChatModel
  workdir = instance.test_spec.workdir
  config = dataclasses.replace(config or AgentConfig(), workdir=workdir)
  if harness != "bash":
    from orchard_jax.recipes import swe_harness
    return swe_harness.run_cli_episode(
        instance, client, base_url, harness=harness, model=model, agent=config,
        session_id=session_id, attempt=attempt, sampling=sampling,
        evaluate_patch=evaluate_patch, log_dir=log_dir)
  factory = sandbox_factory(client)
  with factory(instance) as sandbox:
    ready = sandbox.run(testbed.setup_script(instance, workdir=workdir), timeout_s=300)
    if ready.exit_code != 0:
      raise evaluation.EvaluationError(
          f"{instance.instance_id}: workspace setup failed: {ready.output[-500:]}")
    with ChatModel(base_url, model, **dict(sampling or {})) as chat:
      result = BashAgent(chat, sandbox, config).run(instance.problem_statement)
  trajectory = result.to_trajectory(task_id=instance.instance_id, attempt=attempt,
                                    session_id=session_id)
  if evaluate_patch:
    with factory(instance) as sandbox:
      graded = evaluation.evaluate_in_sandbox(sandbox, instance, result.submission,
                                              log_dir=log_dir)
    trajectory.outcome = {"resolved": graded.resolved, "status": graded.outcome,
                          **(graded.tests.to_dict() if graded.tests else {})}
  return trajectory


# ----------------------------------------------------------------------------- the recipe stages
# Jobs swe.sft, swe.rl (BAR, RPR, OPD), swe.value, and swe.evaluate's checkpoint mode. Their
# configs come from experiments/common.swe_base(preset); the modules swe_policy, swe_rollouts,
# swe_sft, swe_rl, swe_eval, swe_value, swe_judge and swe_annotate hold the pieces.


# Config fields the cluster preset (experiments/common.py) fills from the environment that the
# training Job sets (launch/k8s/training.py), and the variable each comes from.
CLUSTER_VARIABLES = {
    "workdir": "ORCHARD_CHECKPOINT_DIR",
    "env.url": "ORCHARD_ENV_URL",
    "engine.urls": "ORCHARD_SGLANG_POLICY_URLS",
    "opd.teacher_urls": "ORCHARD_SGLANG_TEACHER_URLS",
}


def check_cluster_settings(config: ConfigDict, fields: Sequence[str]) -> None:
  """With the cluster preset, checks before any work that each of `fields` (keys of
  CLUSTER_VARIABLES) is set: outside a training Job the preset leaves them empty, and the run
  would otherwise fail late on what it reads next (the tokenizer on the models volume).

  Raises:
    ConfigError: a field is empty; the message names its environment variable.
  """
  if config.get("preset") != "cluster":
    return
  missing = []
  for field in fields:
    value = config
    for part in field.split("."):
      value = value[part]
    if not str(value).strip():
      missing.append(f"{CLUSTER_VARIABLES[field]} (config.{field})")
  if missing:
    raise ConfigError(
        "the cluster preset reads the fleet's addresses from the environment of a training Job "
        f"(launch/fleet.py train); not set here: {', '.join(missing)}. Run it in that Job, "
        "export the variables, or set the fields with --config.FIELD=VALUE")


def run_dir(config: ConfigDict) -> str:
  """The run folder: config.workdir, or runs/<name>_<preset>."""
  return config.workdir or os.path.join("runs", f"{config.name}_{config.preset}")


def split_tasks(instances: Sequence[SWEInstance], heldout_fraction: float
                ) -> tuple[list[SWEInstance], list[SWEInstance]]:
  """(train, held-out): an instance is held out when crc32(instance_id) falls in the fraction,
  so the split does not change when instances are added or reordered."""
  import zlib
  cut = int(round(float(heldout_fraction) * 10_000))
  train_set, heldout = [], []
  for instance in instances:
    (heldout if zlib.crc32(instance.instance_id.encode()) % 10_000 < cut else train_set
     ).append(instance)
  return train_set, heldout


def expert_cost(instance: SWEInstance, tokenizer) -> int:
  """Tokens the replay expert's gold plan generates, estimated without a sandbox: the
  reproduction it writes (the FAIL_TO_PASS tests sliced from the hidden test file) plus the
  edit snippets (about the gold patch's size)."""
  from orchard_jax.harness.replay_expert import slice_tests
  hidden: dict[str, list[str]] = {}
  path, creating = None, False
  for line in instance.test_patch.splitlines():
    if line.startswith("--- "):
      creating = line[4:].strip() == "/dev/null"
    elif line.startswith("+++ "):
      path = line[4:].strip().removeprefix("b/")
      if creating:
        hidden[path] = []
    elif creating and path in hidden and line.startswith("+"):
      hidden[path].append(line[1:])
  names: dict[str, list[str]] = {}
  for test in instance.FAIL_TO_PASS:
    file, _, rest = test.partition("::")
    if file in hidden and rest:
      names.setdefault(file, []).append(rest.split("[")[0])
  reproduction = ""
  if names:
    file, tests = next(iter(names.items()))
    try:
      reproduction = slice_tests("\n".join(hidden[file]) + "\n", list(dict.fromkeys(tests))[:3])
    except SyntaxError:
      reproduction = "\n".join(hidden[file])
  return len(tokenizer.encode(reproduction)) + len(tokenizer.encode(instance.patch))


def training_subset(instances: Sequence[SWEInstance], tasks: ConfigDict, tokenizer,
                    *, count: Optional[int] = None) -> list[SWEInstance]:
  """The RL/SFT training subset of the training instances (tasks.selection):
  "all", "first" (the first N), or "shortest_expert" (the N whose replay-expert trajectories are
  shortest: what a tiny model on a CPU can learn in the time budget), at most
  tasks.per_package per package (0: no limit)."""
  count = int(tasks.train_tasks) if count is None else count
  if tasks.selection == "all" or count <= 0:
    return list(instances)
  ordered = list(instances)
  if tasks.selection == "shortest_expert":
    ordered.sort(key=lambda i: (expert_cost(i, tokenizer), i.instance_id))
  elif tasks.selection != "first":
    raise ConfigError(f"tasks.selection is {tasks.selection!r}; expected 'all', 'first' or "
                      "'shortest_expert'")
  limit = int(tasks.get("per_package", 0))
  chosen, per_package = [], {}
  for instance in ordered:
    package = instance.repo
    if limit and per_package.get(package, 0) >= limit:
      continue
    chosen.append(instance)
    per_package[package] = per_package.get(package, 0) + 1
    if len(chosen) == count:
      break
  return chosen


class _Run:
  """What every stage of one run shares: folders, tokenizer, mesh, store, task split.

  The run folder is removed again on close (or a failure here) when this run created it and
  it still holds no file: a run that failed before producing anything leaves no empty folder
  (recipes/run_folder.py).
  """

  def __init__(self, config: ConfigDict):
    from orchard_jax import data, parallel
    from orchard_jax.recipes import swe_harness, swe_policy
    self.config = config
    if config.policy.init:                   # a typo fails now, not after the task set
      swe_policy.check_checkpoint(config.policy.init, field="policy.init")
    swe_harness.check_harness_config(config)  # a CLI harness needs its install and the context
    if not str(config.engine.urls).strip():  # the embedded engine's sizes, likewise
      swe_policy.engine_config(config.engine)
    self.dir = run_dir(config)
    self._created_dir = run_folder.create_run_folder(self.dir)
    try:
      for name in ("httpx", "httpcore"):   # one INFO line per sandbox and model call otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
      self.store_path = config.store.path or os.path.join(self.dir, "store")
      self.tokenizer = swe_policy.load_tokenizer(config.policy)
      self.mesh = parallel.make_mesh(config.mesh)
      self.instances = load_task_set(config.tasks, progress=bool(config.progress))
      self.train_all, self.heldout = split_tasks(self.instances, config.tasks.heldout_fraction)
      self.store = data.TrajectoryStore(self.store_path)
    except BaseException:
      self._remove_dir_if_empty()
      raise

  def close(self):
    self.store.close()
    self._remove_dir_if_empty()

  def _remove_dir_if_empty(self):
    if self._created_dir:
      run_folder.remove_if_empty(self.dir)

  def agent_config(self):
    return agent_config(self.config.agent)

  def expert_agent_config(self):
    """The agent config of replay-expert runs: the rollouts' (same prompts and observation
    limits, so SFT data looks like what the policy sees), with room for the whole plan."""
    return dataclasses.replace(self.agent_config(),
                               step_limit=max(int(self.config.agent.step_limit), 50))

  def progress_factory(self):
    if not self.config.progress:
      return None
    from tqdm.auto import tqdm
    return lambda total, desc: tqdm(total=total, desc=desc, unit="rollout", leave=False,
                                    dynamic_ncols=True)

  def save_split(self, train_ids: Sequence[str], heldout_ids: Sequence[str]) -> None:
    import json
    with open(os.path.join(self.dir, "tasks.json"), "w") as f:
      json.dump({"train": list(train_ids), "heldout": list(heldout_ids)}, f, indent=1)

  def load_split(self, folder: str) -> Optional[dict]:
    import json
    path = os.path.join(folder, "tasks.json")
    if os.path.exists(path):
      with open(path) as f:
        return json.load(f)
    return None

  def sft_data(self, train_instances, env_client):
    """Credit-assignment SFT sequences from config.sft.source (see swe_sft)."""
    from orchard_jax.recipes import swe_sft
    c = self.config
    by_id = {i.instance_id: i for i in self.instances}
    if c.sft.source == "expert":
      trajectories = swe_sft.expert_trajectories(
          train_instances, env_client, self.store, variants=tuple(c.sft.variants),
          agent_config=self.expert_agent_config(), experiment=f"{c.name}-expert",
          parallel=int(c.env.max_parallel), seed=int(c.seed))
      source_store = self.store
    else:
      trajectories, source_store = swe_sft.load_trajectories(
          c.sft.source, experiments=tuple(c.sft.experiments))
    return swe_sft.credit_sequences(
        trajectories, tokenizer=self.tokenizer, annotator=swe_sft.make_annotator(c),
        mode=c.sft.mode, eps=float(c.sft.eps), max_tokens=int(c.sft.max_tokens),
        instances=by_id, store=source_store, parser=c.policy.tool_call_parser)


def _resolved_train_subset(run: _Run, env_client) -> list[SWEInstance]:
  """The training subset; with the replay expert as SFT source, candidates whose gold
  trajectory does not resolve, or is longer than sft.max_tokens, are replaced by the next ones
  (such a task would give SFT no positive example)."""
  c = run.config
  wanted = int(c.tasks.train_tasks)
  if c.tasks.selection == "all" or wanted <= 0 or c.sft.source != "expert" \
      or "gold" not in tuple(c.sft.variants):
    return training_subset(run.train_all, c.tasks, run.tokenizer)
  from orchard_jax.recipes import swe_sft
  pool = training_subset(run.train_all, c.tasks, run.tokenizer, count=len(run.train_all))
  chosen: list[SWEInstance] = []
  start = 0
  while len(chosen) < wanted and start < len(pool):
    batch = pool[start:start + (wanted - len(chosen))]
    start += len(batch)
    gold = swe_sft.expert_trajectories(batch, env_client, run.store, variants=("gold",),
                                       agent_config=run.expert_agent_config(),
                                       experiment=f"{c.name}-expert",
                                       parallel=int(c.env.max_parallel), seed=int(c.seed))
    limit = int(c.sft.max_tokens)
    solved = {t.task_id for t in gold if t.resolved and sum(
        len(q) for q in swe_sft.trajectory_sequences(t, run.tokenizer, run.store)) <= limit}
    skipped = [i.instance_id for i in batch if i.instance_id not in solved]
    if skipped:
      _log.warning("training subset: the replay expert's gold run does not resolve %s within "
                   "%d tokens; taking the next candidates", skipped, limit)
    chosen += [i for i in batch if i.instance_id in solved]
  return chosen


def _stage_sft(run: _Run, model, train_instances, env_client):
  """Warm start: credit-assignment SFT (swe_sft) into run.dir/sft; returns the trained model."""
  from orchard_jax.recipes import swe_sft
  sft_data = run.sft_data(train_instances, env_client)
  print("SFT data: " + ", ".join(f"{k}={v}" for k, v in sft_data.stats.items()), flush=True)
  model, metrics = swe_sft.train_sft(model, sft_data.sequences, run.config.sft, mesh=run.mesh,
                                     workdir=os.path.join(run.dir, "sft"),
                                     seed=int(run.config.seed),
                                     progress=bool(run.config.progress))
  print(f"SFT done: {metrics['steps']} steps over {metrics['batches']} batches, final loss "
        f"{metrics.get('loss', float('nan')):.4f}", flush=True)
  return model, sft_data.stats


def sft(config: ConfigDict) -> dict:
  """Job "swe.sft" (experiments/swe_sft.py): credit-assignment SFT of the policy on expert, store
  or mini-swe-agent trajectories; writes run_dir/sft/checkpoints. Returns the data stats."""
  from orchard_jax.recipes import swe_policy
  check_cluster_settings(config, ("workdir", "env.url"))
  _check_sft_config(config)
  _check_sft_inputs(config)
  run = _Run(config)
  try:
    with sandbox_client(config.env) as env_client:
      train_instances = _resolved_train_subset(run, env_client)
      run.save_split([i.instance_id for i in train_instances],
                     [i.instance_id for i in run.heldout])
      model = swe_policy.build_policy(config.policy, run.mesh,
                                      vocab_size=run.tokenizer.vocab_size, seed=int(config.seed))
      _, stats = _stage_sft(run, model, train_instances, env_client)
    run.tokenizer.save(os.path.join(run.dir, "tokenizer"))
    return stats
  finally:
    run.close()


def _eval_splits(run: _Run, train_instances, split_record: Optional[dict] = None) -> dict:
  c = run.config
  by_id = {i.instance_id: i for i in run.instances}
  if split_record:
    train_instances = [by_id[i] for i in split_record["train"] if i in by_id]
    heldout = [by_id[i] for i in split_record["heldout"] if i in by_id]
  else:
    heldout = run.heldout
  limit = int(c.eval.max_instances)
  splits = {"train": list(train_instances), "heldout": list(heldout)}
  return {name: (items[:limit] if limit else items) for name, items in splits.items()
          if name in tuple(c.eval.splits)}


def _runner(run: _Run, service, env_client, *, judge=None, experiment: str, log_name: str):
  from orchard_jax.recipes import swe_rollouts
  c = run.config
  return swe_rollouts.RolloutRunner(
      service, env_client, run.store, agent_config=run.agent_config(),
      sampling={"temperature": float(c.sampling.temperature), "top_p": float(c.sampling.top_p),
                "max_tokens": int(c.sampling.max_tokens)},
      judge=judge, rpr_alpha=float(c.rl.rpr_alpha), experiment=experiment,
      parallel=int(c.rl.parallel_rollouts), rollout_timeout_s=float(c.rl.rollout_timeout_s),
      judge_workers=int(c.judge.max_workers), log_dir=os.path.join(run.dir, "logs", log_name),
      episode_fn=functools.partial(run_episode, harness=str(c.agent.get("harness", "bash"))))


def _final_eval(run: _Run, service, env_client, train_instances, *, policy_version,
                split_record=None, value_scorer=None) -> dict:
  from orchard_jax.recipes import swe_eval
  c = run.config
  runner = _runner(run, service, env_client, experiment=f"{c.name}-eval", log_name="eval")
  runner.sampling["temperature"] = float(c.eval.temperature)
  if int(c.eval.parallel):
    runner.parallel = int(c.eval.parallel)
  report = swe_eval.evaluate_policy(
      runner, _eval_splits(run, train_instances, split_record), k=int(c.eval.k),
      seed=int(c.eval.seed), value_scorer=value_scorer,
      output_dir=c.eval.output_dir or os.path.join(run.dir, "eval"),
      policy_version=policy_version, progress_factory=run.progress_factory())
  print(swe_eval.format_report(report), flush=True)
  return report


def rl(config: ConfigDict) -> dict:
  """Job "swe.rl" (experiments/swe_bar.py, swe_rpr.py, swe_opd.py): the main job.

  Task set -> (SFT warm start unless policy.init is set) -> RL iterations (BAR rollouts through
  the proxy in sandboxes, grading, RPR judging, group filter, packed updates, weight sync,
  checkpoints) -> final checkpoint evaluation. Returns {"iterations": [per-iteration stats],
  "eval": the final evaluation report}.
  """
  import time as _time
  import jax
  from orchard_jax import rl as rl_lib
  from orchard_jax import train
  from orchard_jax.recipes import swe_judge, swe_policy, swe_rl, swe_rollouts
  c = config
  check_cluster_settings(c, ("workdir", "env.url", "engine.urls")
                         + (("opd.teacher_urls",) if c.opd.mode != "none"
                            and not c.opd.teacher_init else ()))
  _check_rl_config(c)
  main_process = jax.process_index() == 0
  if jax.process_count() > 1 and not (str(c.engine.urls).strip() and (
      c.opd.mode == "none" or str(c.opd.teacher_urls).strip())):
    raise ConfigError("a multi-host run needs remote engines (engine.urls, and opd.teacher_urls "
                      "with OPD; the cluster preset sets both): an embedded engine would serve a "
                      "model sharded over every host from process 0 alone and hang")
  run = _Run(config)
  history: list[dict] = []
  started = _time.perf_counter()
  try:
    with sandbox_client(c.env) as env_client:
      train_instances = _resolved_train_subset(run, env_client)
      if not train_instances:
        raise evaluation.EvaluationError("no training instance: the task set is empty or the "
                                         "replay expert resolved none of the candidates")
      run.save_split([i.instance_id for i in train_instances],
                     [i.instance_id for i in run.heldout])
      print(f"tasks: {len(run.instances)} ({len(run.train_all)} train / {len(run.heldout)} "
            f"held out); training subset {[i.instance_id for i in train_instances]}", flush=True)
      model = swe_policy.build_policy(c.policy, run.mesh, vocab_size=run.tokenizer.vocab_size,
                                      seed=int(c.seed))
      rl_dir = os.path.join(run.dir, "rl")
      resuming = swe_policy.find_checkpoint_dir(rl_dir) is not None
      if not c.policy.init and c.sft.enabled and not resuming:
        model, _ = _stage_sft(run, model, train_instances, env_client)
      judge = swe_judge.make_judge(c.judge) if c.rl.reward == "rpr" else None
      bar = rl_lib.BARConfig(group_size=int(c.rl.bar.group_size),
                             max_rollouts=int(c.rl.bar.max_rollouts), stride=int(c.rl.bar.stride),
                             positive_fraction=tuple(c.rl.bar.positive_fraction))
      loss = swe_rl.policy_loss(c)
      with train.Trainer(model, loss, swe_rl.trainer_config(c, rl_dir, model.config),
                         mesh=run.mesh) as trainer, \
          swe_policy.PolicyService(c, trainer.model(), run.tokenizer, run.store,
                                   engine_seed=int(c.seed)) as service, \
          contextlib.ExitStack() as stack:
        teacher = stack.enter_context(swe_rl.Teacher(c, run.tokenizer, run.mesh)) \
            if c.opd.mode != "none" else None
        start_iteration = int(trainer.meta.get("iteration", 0))
        if trainer.restored_step is not None:
          service.sync_weights(trainer.model(), version=trainer.step)
          print(f"resumed at iteration {start_iteration} (step {trainer.step})", flush=True)
        runner = _runner(run, service, env_client, judge=judge, experiment=c.name, log_name="rl")
        for iteration in range(start_iteration, int(c.rl.iterations)):
          runner.timing = {"rollout_s": 0.0, "judge_s": 0.0}
          prompts = swe_rl.choose_prompts(
              train_instances, int(c.rl.prompts_per_iteration) + int(c.rl.oversample),
              iteration=iteration, seed=int(c.seed))
          groups = []
          if main_process:
            groups = swe_rollouts.balanced_groups(
                runner, prompts, bar, iteration=iteration, seed=int(c.seed),
                policy_version=service.version, progress_factory=run.progress_factory())
          stats = swe_rl.iteration_stats(groups)
          it_data = swe_rl.group_sequences(groups, run.store,
                                           num_groups=int(c.rl.prompts_per_iteration))
          stats.update(it_data.stats)
          sequences = it_data.sequences
          if teacher is not None and sequences:
            sequences = swe_rl.add_teacher_logprobs(sequences, teacher)
          batches, pack_stats = swe_rl.pack_updates(
              sequences, c, data_parallel_size=train.data_parallel_size(run.mesh),
              seed=int(c.seed) + iteration)
          stats.update(pack_stats)
          keys = list(batches[0]) if batches else list(data_keys(c))
          batches = swe_rl.broadcast_batches(batches, keys=keys, shape=(
              int(c.rl.batch_size), int(c.rl.seq_len)))
          stats.update(swe_rl.train_iteration(trainer, batches,
                                              extra_meta={"iteration": iteration + 1}))
          stats["time/rollout_s"] = runner.timing["rollout_s"]
          stats["time/judge_s"] = runner.timing["judge_s"]
          if batches:
            service.sync_weights(trainer.model(), version=trainer.step)
          trainer.save(force=True, extra_meta={"iteration": iteration + 1})
          trainer.metrics.write(trainer.step, {k: v for k, v in stats.items()
                                               if isinstance(v, (int, float))})
          history.append(stats)
          if main_process:     # other hosts train on process 0's batches; they roll out nothing
            print(swe_rl.summary_line(iteration, int(c.rl.iterations), stats), flush=True)
        report = {}
        if c.rl.final_eval and main_process:   # rollouts, like RL's, run on process 0 only
          report = _final_eval(run, service, env_client, train_instances,
                               policy_version=service.version)
    if main_process:
      print(f"run finished in {(_time.perf_counter() - started) / 60:.1f} min; resolved rate "
            f"(first rollouts of each prompt) per iteration: "
            f"{[round(h['resolved/first'], 3) for h in history]}", flush=True)
    return {"iterations": history, "eval": report, "workdir": run.dir}
  finally:
    run.close()


def _check_sft_config(c: ConfigDict) -> None:
  """Settings the SFT stage would otherwise reject only after the task set and the expert's
  trajectories (minutes in).

  Raises:
    ConfigError: an unknown sft.mode or annotator.kind.
  """
  from orchard_jax.recipes import swe_annotate, swe_sft
  if c.sft.mode not in swe_sft.SFT_MODES:
    raise ConfigError(f"sft.mode is {c.sft.mode!r}; expected one of {swe_sft.SFT_MODES}")
  if c.annotator.kind not in swe_annotate.ANNOTATOR_KINDS:
    raise ConfigError(f"annotator.kind is {c.annotator.kind!r}; expected one of "
                      f"{swe_annotate.ANNOTATOR_KINDS}")


def _check_sft_inputs(c: ConfigDict) -> None:
  """A non-expert sft.source exists, checked before the task set, the replay expert and
  tasks.json (a typo otherwise fails after them, as a traceback, leaving a run folder behind).
  policy.init is checked by _Run, which every job builds before any work.

  Raises:
    ConfigError: sft.source names nothing (the message names the field).
  """
  if c.sft.source != "expert" and not os.path.exists(c.sft.source):
    raise ConfigError(f"sft.source: {c.sft.source!r} does not exist; expected 'expert', a "
                      "trajectory store folder or a mini-swe-agent trajectory folder")


def _check_rl_config(c: ConfigDict) -> None:
  """Settings swe.rl would otherwise reject only after the task set and SFT (minutes in).

  Raises:
    ConfigError: an unknown rl.reward, judge.kind (with the rpr reward), opd.mode, sft.mode or
      annotator.kind, OPD without a teacher, a negative rl.iterations or a non-positive
      rl.prompts_per_iteration, BAR settings BARConfig refuses, or a policy.init, SFT source
      or opd.teacher_init folder that does not exist.
  """
  from orchard_jax import rl as rl_lib
  from orchard_jax.recipes import swe_judge, swe_policy
  from orchard_jax.train import OPD_MODES
  _check_sft_config(c)
  if not c.policy.init and c.sft.enabled:     # (policy.init itself: _Run)
    _check_sft_inputs(c)
  if int(c.rl.iterations) < 0:
    raise ConfigError(f"rl.iterations is {c.rl.iterations}; expected 0 (SFT and the final "
                      "evaluation only) or a positive count")
  if int(c.rl.prompts_per_iteration) < 1 or int(c.rl.oversample) < 0:
    raise ConfigError(f"rl.prompts_per_iteration is {c.rl.prompts_per_iteration} and "
                      f"rl.oversample {c.rl.oversample}; expected at least 1 and at least 0")
  try:
    rl_lib.BARConfig(group_size=int(c.rl.bar.group_size),
                     max_rollouts=int(c.rl.bar.max_rollouts), stride=int(c.rl.bar.stride),
                     positive_fraction=tuple(c.rl.bar.positive_fraction))
  except rl_lib.RLError as e:
    raise ConfigError(f"rl.bar: {e}") from e
  if c.rl.reward == "rpr" and c.judge.kind not in swe_judge.JUDGE_KINDS:
    raise ConfigError(f"judge.kind is {c.judge.kind!r}; expected one of {swe_judge.JUDGE_KINDS}")
  if c.rl.reward not in ("rpr", "binary"):
    raise ConfigError(f"rl.reward is {c.rl.reward!r}; expected 'binary' or 'rpr'")
  if c.opd.mode not in OPD_MODES:
    raise ConfigError(f"opd.mode is {c.opd.mode!r}; expected one of {OPD_MODES}")
  if c.opd.mode != "none" and not (str(c.opd.teacher_urls).strip() or c.opd.teacher_init):
    raise ConfigError(f"opd.mode is {c.opd.mode!r} but there is no teacher: set "
                      "opd.teacher_urls (SGLang servers) or opd.teacher_init (a checkpoint, run "
                      "or Hugging Face folder served by a second embedded engine, e.g. "
                      "--config.opd.teacher_init=runs/swe_rpr_tiny)")
  if c.opd.mode != "none" and not str(c.opd.teacher_urls).strip():
    swe_policy.check_checkpoint(c.opd.teacher_init, field="opd.teacher_init")


def data_keys(config: ConfigDict) -> tuple[str, ...]:
  """The keys of the RL packed batches (REQUIRED_KEYS, plus the teacher's with OPD)."""
  from orchard_jax import data
  keys = tuple(data.REQUIRED_KEYS)
  if config.opd.mode != "none":
    keys += ("teacher_logprobs", "teacher_mask")
  return keys


def value(config: ConfigDict) -> dict:
  """Job "swe.value" (experiments/swe_value.py): trains the value model on the trajectory
  store(s) and reports held-out AUC, calibration and best-of-k vs pass@k vs random@k."""
  from orchard_jax import parallel
  from orchard_jax.recipes import swe_policy, swe_value
  check_cluster_settings(config, ("workdir",))
  directory = run_dir(config)
  tokenizer = swe_policy.load_tokenizer(config.policy)
  report = swe_value.train_value(config, directory, parallel.make_mesh(config.mesh), tokenizer)
  print(swe_value.format_value_report(report), flush=True)
  return report


def evaluate_checkpoint(config: ConfigDict) -> dict:
  """swe.evaluate with `--config.checkpoint=PATH`: serves the policy checkpoint (a run folder,
  trainer folder or HF folder) and runs the harness eval.k times on the evaluation splits
  (the run's own training subset and held-out instances when PATH is a run folder with
  tasks.json), reporting pass@1, pass@k, random@k and value-model best-of-k."""
  from orchard_jax.recipes import swe_policy, swe_value
  check_cluster_settings(config, ("env.url", "engine.urls"))
  swe_policy.check_checkpoint(config.checkpoint, field="config.checkpoint")  # before any work
  if config.eval.value_checkpoint:
    swe_value.value_checkpoint_dir(config.eval.value_checkpoint)
  run = _Run(config)
  try:
    record = run.load_split(config.checkpoint)
    train_instances = training_subset(run.train_all, config.tasks, run.tokenizer)
    model = swe_policy.build_policy(config.policy, run.mesh, vocab_size=run.tokenizer.vocab_size,
                                    init=config.checkpoint)
    scorer = None
    if config.eval.value_checkpoint:
      value_model = swe_value.load_value_model(config, config.eval.value_checkpoint, run.mesh,
                                               run.tokenizer)
      scorer = swe_value.rollout_scorer(value_model, run.store, run.tokenizer,
                                        seq_len=int(config.value.seq_len),
                                        batch_size=int(config.value.batch_size), mesh=run.mesh)
    with sandbox_client(config.env) as env_client, \
        swe_policy.PolicyService(config, model, run.tokenizer, run.store,
                                 engine_seed=int(config.seed)) as service:
      return _final_eval(run, service, env_client, train_instances, policy_version=None,
                         split_record=record, value_scorer=scorer)
  finally:
    run.close()
