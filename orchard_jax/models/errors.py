"""The models room's exceptions: one base class, raised where bad input enters."""


class ModelError(Exception):
  """Base class of every error raised by orchard_jax.models."""


class ModelConfigError(ModelError, ValueError):
  """A model configuration is inconsistent or names something unknown."""


class CheckpointError(ModelError):
  """A checkpoint folder cannot be read or does not fit the model."""


class CheckpointMismatch(CheckpointError):
  """A checkpoint tensor is missing, unexpected, or has the wrong shape."""
