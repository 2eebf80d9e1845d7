"""The exception base class of the train room."""


class TrainError(ValueError):
  """Bad trainer input or state: the message says what was expected and what was seen."""


class CheckpointMismatch(TrainError):
  """A checkpoint's tree does not fit the model being restored (names, shapes or dtypes)."""
