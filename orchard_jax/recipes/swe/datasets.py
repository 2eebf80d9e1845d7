"""Bring your own SWE-bench dataset (README "Bring your own dataset"): instances without a
test_spec get an environment and an image built for them (repo_env, from `tasks.mirrors` or
`tasks.url_template`), or container images on a cluster (`tasks.cluster_images`); the
swe.build_tasks job builds, validates and pushes such a dataset."""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from ml_collections import ConfigDict

from orchard_jax.recipes import ConfigError
from orchard_jax.recipes.agentic.sandboxes import sandbox_client
from orchard_jax.tasks.errors import InstanceError
from orchard_jax.tasks.swe.episode import sandbox_factory
from orchard_jax.tasks.swe.instance import SWEInstance, load_instances


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
