"""The tasks room's exception hierarchy: every error a task domain raises derives from TaskError."""


class TaskError(Exception):
  """Base class of every error raised by orchard_jax.tasks."""


class InstanceError(TaskError, ValueError):
  """A task instance (or a file of them) does not match the expected schema."""


class PatchError(TaskError):
  """A patch could not be parsed or applied."""


class BuildError(TaskError):
  """Building a package environment or a task set failed."""


class EvaluationError(TaskError):
  """Evaluation could not run (as opposed to a prediction that failed its tests)."""
