"""The harness room's exceptions."""


class HarnessError(Exception):
  """Base class of every error raised by orchard_jax.harness."""


class ModelCallError(HarnessError):
  """The model endpoint could not be reached or answered with an error."""
