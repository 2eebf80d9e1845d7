"""Errors of the Claw domain (all derive from tasks.errors.TaskError)."""
from orchard_jax.tasks.errors import TaskError


class ClawError(TaskError):
  """Base class of every error raised by orchard_jax.tasks.claw."""


class TaskFormatError(ClawError, ValueError):
  """A task file does not match the task schema (the message names the file and field)."""


class ServicesError(ClawError):
  """A rollout's services could not start, or a control call to them failed."""


class ServiceDied(ServicesError):
  """A service stopped answering during an episode (the rollout is aborted with this reason)."""


class GraderError(ClawError):
  """A grader raised while grading; the trial's outcome is `grader_error`, never a silent 0."""
