"""The two record kinds of the trajectory store: model calls and trajectories.

A `ModelCall` is what the recording proxy saw for one chat-completion request of one harness
session: the prompt token ids the engine was given, the ids it sampled with their log-probs,
and the request/response messages. A `Trajectory` is what a recipe or harness knows about one
attempt at one task: the harness's messages, how the run ended, the evaluation outcome and the
rewards. They are linked by `session_id` (the proxy session the harness talked through).

Both serialise to JSON-compatible dicts (`to_dict` / `from_dict`); `from_dict` checks the
fields and raises `StoreError` naming the field, what was expected and what was seen.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Mapping, Sequence

import numpy as np

from orchard_jax.data.errors import StoreError
from orchard_jax.data.images import is_digest

MODEL_CALL = "model_call"
TRAJECTORY = "trajectory"
# Roles a chat template renders; harness-specific roles (mini-swe-agent's "exit") are not.
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass
class ModelCall:
  """One model call recorded by the proxy (one chat-completion request and its response).

  Token alignment: `output_logprobs[j]` is the sampling policy's log-prob of `output_ids[j]`
  given `prompt_ids + output_ids[:j]` (what engines report as output_token_logprobs), under the
  distribution the token was sampled from: log_softmax(logits / temperature).

  Attributes:
    session_id: the harness session (proxy URL /sessions/{session_id}/v1).
    call_index: 0, 1, 2, ... in the order the session made its calls.
    prompt_ids: every token id the engine was given for this call, [prompt_len]. Empty when
      `text_only`.
    output_ids: the ids the engine sampled, [num_generated] (including a final stop token when
      the engine returned one). Empty when `text_only`.
    output_logprobs: one float per output id (natural log), or empty when the engine did not
      return them.
    segment_index: the proxy's segment counter: it increases when a request's prefix diverged
      from the ids recorded so far (the harness edited or compacted its history).
    messages: the request's messages (OpenAI chat format).
    tools: the request's tool schemas, or None.
    response: the assistant message returned to the harness (content, tool_calls,
      reasoning_content), or None when the call failed.
    finish_reason: "stop", "length", "tool_calls", "abort", or None.
    delivered: False when the caller never got the answer (it disconnected while the call was
      generated or sent; the engine request was aborted): kept as a record of what happened,
      never trained on (`sequences_from_model_calls` leaves it out), and the proxy's session
      continues from the last delivered call, as the caller's retry does.
    text_only: True when the upstream returned text only (a hosted API): there are no sampled
      ids, and the record can train SFT (re-tokenised by the student) but never RL.
    model: the served model name.
    policy_version: version of the weights that sampled (RL staleness), or None.
    temperature: the softmax temperature of the distribution `output_ids` were sampled from and
      `output_logprobs` are of (the request's sampling temperature; 1.0 for a greedy call,
      whose log-probs are of the raw logits). The trainer computes its log-probs of these
      tokens at this temperature (docs/algorithms.md section 3). Records written before the
      field existed read as 1.0, which is what their log-probs were taken at.
    sampling_params: temperature, top_p, max_new_tokens, ... as sent.
    started_at, finished_at: unix time in seconds.
    metadata: anything else (usage, upstream URL, errors).
    images: content digests ("sha256:<hex>", data.images.image_digest) of the images whose
      placeholder runs appear in prompt_ids, in order; the images themselves are blobs of the
      trajectory store (TrajectoryStore.put_image), and image parts of `messages` name them
      by the same digests. Empty for a text-only prompt.
  """
  session_id: str
  call_index: int
  prompt_ids: list[int] = dataclasses.field(default_factory=list)
  output_ids: list[int] = dataclasses.field(default_factory=list)
  output_logprobs: list[float] = dataclasses.field(default_factory=list)
  segment_index: int = 0
  messages: list[dict] = dataclasses.field(default_factory=list)
  tools: list[dict] | None = None
  response: dict | None = None
  finish_reason: str | None = None
  delivered: bool = True
  text_only: bool = False
  model: str | None = None
  policy_version: int | None = None
  temperature: float = 1.0
  sampling_params: dict = dataclasses.field(default_factory=dict)
  started_at: float = 0.0
  finished_at: float = 0.0
  metadata: dict = dataclasses.field(default_factory=dict)
  images: list[str] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    self.images = [str(d) for d in self.images]
    _check(all(is_digest(d) for d in self.images), "images",
           "image digests 'sha256:<64 hex digits>'", self.images)
    self.prompt_ids = _as_list(self.prompt_ids, int)
    self.output_ids = _as_list(self.output_ids, int)
    self.output_logprobs = _as_list(self.output_logprobs, float)
    _check(isinstance(self.session_id, str) and self.session_id, "session_id",
           "a non-empty string", self.session_id)
    _check(isinstance(self.call_index, int) and self.call_index >= 0, "call_index",
           "an int >= 0", self.call_index)
    _check(isinstance(self.temperature, (int, float)) and not isinstance(self.temperature, bool)
           and 0 < self.temperature < float("inf"), "temperature",
           "a finite number > 0 (1.0 for greedy calls)", self.temperature)
    self.temperature = float(self.temperature)
    if self.output_logprobs:
      _check(len(self.output_logprobs) == len(self.output_ids), "output_logprobs",
             f"one log-prob per output id ({len(self.output_ids)})",
             f"{len(self.output_logprobs)} values")
    if self.text_only:
      _check(not self.prompt_ids and not self.output_ids, "prompt_ids/output_ids",
             "no ids on a text_only record", f"{len(self.prompt_ids)}/{len(self.output_ids)} ids")

  @property
  def has_logprobs(self) -> bool:
    return bool(self.output_logprobs) or not self.output_ids

  @property
  def latency_s(self) -> float:
    return max(0.0, self.finished_at - self.started_at)

  def to_dict(self) -> dict[str, Any]:
    """JSON-compatible dict with "kind": "model_call" first."""
    # dataclasses.asdict deep-copies every id one by one (milliseconds per long prompt).
    ids = ("prompt_ids", "output_ids", "output_logprobs", "images")
    return {"kind": MODEL_CALL, **{
      f.name: list(getattr(self, f.name)) if f.name in ids else copy.deepcopy(getattr(self, f.name))
      for f in dataclasses.fields(self)}}

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "ModelCall":
    """Inverse of `to_dict` (unknown keys go to metadata["_extra"]). Raises StoreError."""
    return _from_dict(cls, data, MODEL_CALL)


@dataclasses.dataclass
class Trajectory:
  """One attempt at one task, written by a recipe or harness.

  A trajectory may be appended again with the same `trajectory_id` (for example once when the
  harness finishes and again with the evaluation outcome); the store returns the latest.

  Attributes:
    trajectory_id: unique id of this attempt.
    task_id: the task (SWE-bench instance_id, claw task id, ...).
    attempt: 0, 1, ... for repeated attempts at one task.
    session_id: proxy session whose model calls belong to this trajectory, or None.
    messages: the harness's messages (OpenAI chat format; harness-specific keys and roles,
      such as mini-swe-agent's "extra" and "exit", are kept as written).
    tools: tool schemas the harness offered, or None.
    exit_status: how the harness stopped ("Submitted", "LimitsExceeded", "TimeExceeded",
      "FormatError", "aborted", ...).
    submission: what the agent submitted (SWE: the model patch, a unified diff; otherwise its
      final answer); "" when none.
    outcome: evaluation result, e.g. {"resolved": True, "status": "resolved",
      "FAIL_TO_PASS": {...}}; {} when not evaluated.
    rewards: named rewards, e.g. {"binary": 1.0, "rubric": 0.8, "total": 1.4}.
    experiment: experiment name (queries filter on it).
    iteration: training iteration / RL step that produced it.
    policy_version: weights version that produced it.
    created_at: unix time in seconds.
    metadata: anything else (harness name, model, teacher, token counts, filters).
  """
  trajectory_id: str
  task_id: str
  attempt: int = 0
  session_id: str | None = None
  messages: list[dict] = dataclasses.field(default_factory=list)
  tools: list[dict] | None = None
  exit_status: str = ""
  submission: str = ""
  outcome: dict = dataclasses.field(default_factory=dict)
  rewards: dict = dataclasses.field(default_factory=dict)
  experiment: str | None = None
  iteration: int | None = None
  policy_version: int | None = None
  created_at: float = dataclasses.field(default_factory=time.time)
  metadata: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    _check(isinstance(self.trajectory_id, str) and self.trajectory_id, "trajectory_id",
           "a non-empty string", self.trajectory_id)
    _check(isinstance(self.task_id, str) and self.task_id, "task_id", "a non-empty string",
           self.task_id)
    _check(isinstance(self.attempt, int) and self.attempt >= 0, "attempt", "an int >= 0",
           self.attempt)
    _check(isinstance(self.messages, list), "messages", "a list of messages",
           type(self.messages).__name__)

  @property
  def resolved(self) -> bool | None:
    """outcome["resolved"], or None when the trajectory was not evaluated."""
    value = self.outcome.get("resolved")
    return None if value is None else bool(value)

  @property
  def num_turns(self) -> int:
    """Number of assistant messages (model turns)."""
    return sum(1 for m in self.messages if m.get("role") == "assistant")

  def to_dict(self) -> dict[str, Any]:
    """JSON-compatible dict with "kind": "trajectory" first."""
    return {"kind": TRAJECTORY, **dataclasses.asdict(self)}

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "Trajectory":
    """Inverse of `to_dict` (unknown keys go to metadata["_extra"]). Raises StoreError."""
    return _from_dict(cls, data, TRAJECTORY)


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
  """The messages a chat template renders: chat roles only, harness-only keys removed.

  Keeps role, content, tool_calls, tool_call_id, name and reasoning_content of messages whose
  role is system/user/assistant/tool; drops others (mini-swe-agent's "exit") and keys such as
  "extra".
  """
  keep = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
  return [{k: m[k] for k in keep if k in m} for m in messages if m.get("role") in CHAT_ROLES]


def _as_list(values: Any, kind: type) -> list:
  """Plain Python ints/floats (JSON-serialisable) from a list, tuple or numpy array."""
  if isinstance(values, np.ndarray):
    return values.astype(np.int64 if kind is int else np.float64).tolist()
  return list(map(kind, values))


def _check(ok: bool, field: str, expected: str, seen: Any) -> None:
  if not ok:
    raise StoreError(f"record field {field!r}: expected {expected}, got {seen!r}")


def _from_dict(cls, data: Mapping[str, Any], kind: str):
  if not isinstance(data, Mapping):
    raise StoreError(f"expected a {kind} record (a JSON object), got {type(data).__name__}")
  if data.get("kind", kind) != kind:
    raise StoreError(f"expected a record of kind {kind!r}, got kind {data.get('kind')!r}")
  names = {f.name for f in dataclasses.fields(cls)}
  required = [f.name for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  missing = [name for name in required if name not in data]
  if missing:
    raise StoreError(f"{kind} record lacks required field(s) {missing}; has {sorted(data)}")
  values = {k: v for k, v in data.items() if k in names}
  extra = {k: v for k, v in data.items() if k not in names and k != "kind"}
  if extra:
    values["metadata"] = {**dict(values.get("metadata") or {}), "_extra": extra}
  try:
    return cls(**values)
  except (TypeError, ValueError) as e:
    raise StoreError(f"malformed {kind} record: {e}") from e
