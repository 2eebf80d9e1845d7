"""SWE-bench-style tasks: instances, bug synthesis from real packages, evaluation.

Public API:
  SWEInstance, TestSpec, load_instances, save_instances   the SWE-bench schema and its I/O
  build_task_set, BuildSettings, TaskSet                   real tasks from real packages
  parse_test_log                                           per-test status from a test log
  clean_patch, patch_files                                 model-patch handling
"""
from orchard_jax.tasks.errors import (BuildError, EvaluationError, InstanceError, PatchError,
                                      TaskError)
from orchard_jax.tasks.swe.builder import BuildSettings, TaskSet, build_task_set
from orchard_jax.tasks.swe.instance import SWEInstance, TestSpec, load_instances, save_instances
from orchard_jax.tasks.swe.log_parsers import parse_test_log
from orchard_jax.tasks.swe.packages import DEFAULT_PACKAGES, PROFILES, PackageProfile
from orchard_jax.tasks.swe.patches import clean_patch, patch_files
