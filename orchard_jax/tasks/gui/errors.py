"""Errors of the GUI domain (all derive from tasks.errors.TaskError)."""
from orchard_jax.tasks.errors import TaskError


class GUIError(TaskError):
  """Base class of every error raised by orchard_jax.tasks.gui."""


class BrowserSandboxError(GUIError):
  """A browser sandbox could not start, or a control call to it failed outside an episode."""


class BrowserAborted(GUIError):
  """The browser crashed, was closed, or its page stopped responding: the episode ends as
  aborted with this reason."""


class TaskFormatError(GUIError, ValueError):
  """A task does not match the task schema (the message names the task and field)."""


class GraderError(GUIError):
  """A checker or judge could not grade an episode; the outcome is `grader_error`, never a
  silent failure."""
