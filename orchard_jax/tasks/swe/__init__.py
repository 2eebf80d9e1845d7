"""SWE-bench-style tasks: instances, bug synthesis from real packages, evaluation.

Public API:
  SWEInstance, TestSpec, load_instances, save_instances   the SWE-bench schema and its I/O
  build_task_set, BuildSettings, TaskSet                   real tasks from real packages
  parse_test_log                                           per-test status from a test log
  clean_patch, patch_files                                 model-patch handling
  build_dataset, DatasetSettings, RepoSource               your own SWE-bench data: environments
                                                           and images for any repo at any commit
  validate                                                 gold twice, empty twice, flaky tests out
  instance_from_commit                                     an instance from an upstream fix
  build_rootfs                                             the task images' Debian root filesystem
"""
from orchard_jax.tasks.errors import (BuildError, EvaluationError, InstanceError, PatchError,
                                      TaskError)
from orchard_jax.tasks.swe.builder import BuildSettings, TaskSet, build_task_set
from orchard_jax.tasks.swe.instance import SWEInstance, TestSpec, load_instances, save_instances
from orchard_jax.tasks.swe.log_parsers import parse_test_log
from orchard_jax.tasks.swe.packages import DEFAULT_PACKAGES, PROFILES, PackageProfile
from orchard_jax.tasks.swe.patches import clean_patch, patch_files
from orchard_jax.tasks.swe.collect import instance_from_commit
from orchard_jax.tasks.swe.repo_env import DatasetSettings, RepoSource, build_dataset
from orchard_jax.tasks.swe.rootfs import build_rootfs
from orchard_jax.tasks.swe.validation import validate
