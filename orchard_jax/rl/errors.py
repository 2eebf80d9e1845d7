"""The exception base class of the rl room."""


class RLError(ValueError):
  """Bad input to one of the algorithms: the message says what was expected and what was seen."""
