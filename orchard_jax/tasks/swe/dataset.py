"""A user's SWE-bench dataset, end to end: instances without a test_spec get one (and an image),
and on a cluster each instance can name a container image instead (configuration only).

`prepare` is what the recipes call for `tasks.dataset`: it builds what is missing
(`repo_env.build_dataset`) and, for the Kubernetes backend, maps instances to container images:
  "swebench"        SWE-bench's published evaluation images, by their documented naming
                    (`<namespace>/sweb.eval.x86_64.<instance_id>:latest`, lower case, "__"
                    written "_1776_"; namespace "swebench"), with the test command run in the
                    images' `testbed` conda environment at /testbed;
  "<registry/path>" the same naming under a registry of your own, for images built and pushed
                    from this builder's image directories.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from orchard_jax.tasks.errors import BuildError
from orchard_jax.tasks.swe import repo_env, repo_specs
from orchard_jax.tasks.swe.instance import SWEInstance, TestSpec

SWEBENCH_NAMESPACE = "swebench"
# The published images keep the repository at /testbed and its environment in conda's
# `testbed` env (SWE-bench's Dockerfiles); this PATH activates it for the test command.
_SWEBENCH_PATH = ("/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:/usr/local/sbin:"
                  "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def container_image(instance_id: str, namespace: str = SWEBENCH_NAMESPACE,
                    tag: str = "latest") -> str:
  """SWE-bench's image name for an instance (swebench's own `ImageSpec.name`)."""
  from swebench.image_builder.image_spec import ImageSpec
  return ImageSpec(instance_id=instance_id, dockerfile="-", namespace=namespace, tag=tag).name


def with_cluster_images(instances: Sequence[SWEInstance], choice: str) -> list[SWEInstance]:
  """Instances whose test_spec names a container image (see the module docstring).

  Args:
    instances: instances with or without a test_spec.
    choice: "swebench" or a registry path such as "registry.local:5000/orchard".

  Raises:
    BuildError: `choice` is empty or not a registry path.
  """
  if not choice or choice.startswith("/") or " " in choice:
    raise BuildError(f"tasks.cluster_images is {choice!r}; expected 'swebench' or a registry "
                     f"path such as 'registry.local:5000/orchard'")
  namespace = SWEBENCH_NAMESPACE if choice == "swebench" else choice.rstrip("/")
  out = []
  for instance in instances:
    spec = instance.test_spec
    image = container_image(instance.instance_id, namespace)
    if spec is None:
      spec = TestSpec(image=image, test_cmd=repo_specs.DEFAULT_TEST_CMD,
                      test_files=repo_specs.test_directives(instance.test_patch),
                      log_parser=repo_specs.swebench_parser(instance.repo))
    env = dict(spec.env)
    if choice == "swebench":
      env.setdefault("PATH", _SWEBENCH_PATH)
    out.append(instance.replace(test_spec=dataclasses.replace(spec, image=image, env=env)))
  return out


def prepare(instances: Sequence[SWEInstance], settings: repo_env.DatasetSettings, *,
            output_dir: str, cluster_images: str = "", progress: bool = True
            ) -> tuple[list[SWEInstance], repo_env.DatasetBuild | None]:
  """The instances ready to evaluate: built where they lack a test_spec, or mapped to cluster
  images. Returns (instances, the build or None); an instance that could not be built is left
  out and named in the build's report."""
  if cluster_images:
    return with_cluster_images(instances, cluster_images), None
  missing = [i for i in instances if i.test_spec is None]
  if not missing:
    return list(instances), None
  build = repo_env.build_dataset(missing, settings, output_dir=output_dir, progress=progress)
  built = {i.instance_id: i for i in build.instances}
  ready = [built.get(i.instance_id, i) if i.test_spec is None else i for i in instances]
  return [i for i in ready if i.test_spec is not None], build
