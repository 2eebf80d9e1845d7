"""The data room's exceptions: one base class, `DataError`, and a subclass per kind of fault."""


class DataError(Exception):
  """Base class of every error raised by orchard_jax.data."""


class TokenizerError(DataError):
  """A tokenizer folder or name could not be loaded, or lacks what the project needs."""


class ChatTemplateError(DataError):
  """A chat could not be rendered, or a rendering was not what a caller relies on."""


class ToolCallParseError(DataError):
  """Generated text holds a tool call that cannot be parsed (raised only in strict mode)."""


class StoreError(DataError):
  """The trajectory store was given a malformed record or holds an unreadable one."""


class TextOnlyRecordError(DataError):
  """A model call recorded without token ids (a hosted API's text) was sent to the RL path.

  RL needs the ids and log-probs the policy sampled; text-only calls are fine for SFT, where
  the student's chat template tokenises them.
  """


class PackingError(DataError):
  """Sequences could not be packed into the requested fixed-shape batches."""


class TrajectoryFormatError(DataError):
  """A trajectory file (e.g. mini-swe-agent's *.traj.json) does not have the expected format."""
