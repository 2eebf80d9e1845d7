"""Credit-assignment SFT targets (Orchard-SWE; docs/algorithms.md section 1).

A trajectory is h_0, a_0, o_0, a_1, o_1, ...: actions a_t (model turns) and observations o_t.
An annotator gives V(s_t) = P(resolve | history up to step t, outcome) at a few key steps; the
steps between annotated ones are linearly interpolated, and steps before the first (after the
last) annotation take the first (last) annotated value. The credit of step t is
c_t = V(s_{t+1}) - V(s_t), for t = 0 .. T-2. A rise segment is a maximal run of steps
[t_i, t_j] (t_j > t_i) with c_t >= eps for every t in [t_i, t_j - 1]; the actions inside it are
a_{t_i} .. a_{t_j} inclusive, as the definition reads (a single rising credit makes a 2-step
segment, matching the paper's median segment length of about 2).

Loss: L = - sum_{t in S} log pi(a_t | h_t) summed over each action's tokens; S is every action
of a resolved trajectory, and only the actions inside rise segments of an unresolved one.
Observation and prompt tokens never carry loss but stay in the context.

Host-side NumPy over one trajectory at a time.
"""
import dataclasses
from typing import Collection, Iterable, Optional, Sequence

import numpy as np

from orchard_jax.rl.errors import RLError


def interpolate_values(num_steps: int, annotated_steps: Sequence[int],
                       annotated_values: Sequence[float]) -> np.ndarray:
  """V(s_t) for every step from sparse annotations, by linear interpolation.

  Args:
    num_steps: T, the number of actions in the trajectory.
    annotated_steps: step indices in [0, T) with an annotation, strictly increasing.
    annotated_values: V at those steps, each in [0, 1].
  Returns:
    [T] float64 values. Steps outside the annotated range hold the nearest annotated value.
  Raises:
    RLError: no annotation, steps out of range or not increasing, values outside [0, 1].
  """
  steps = np.asarray(annotated_steps, np.int64)
  values = np.asarray(annotated_values, np.float64)
  if num_steps < 1:
    raise RLError(f"a trajectory needs at least one step; saw num_steps={num_steps}")
  if steps.ndim != 1 or steps.shape != values.shape or steps.size == 0:
    raise RLError(f"need one or more (step, value) annotations of equal count; saw "
                  f"{steps.size} steps and {values.size} values")
  if steps.min() < 0 or steps.max() >= num_steps:
    raise RLError(f"annotated steps must lie in [0, {num_steps}); saw {steps.tolist()}")
  if np.any(np.diff(steps) <= 0):
    raise RLError(f"annotated steps must be strictly increasing; saw {steps.tolist()}")
  if not np.all((values >= 0.0) & (values <= 1.0)):
    raise RLError(f"annotated values are probabilities in [0, 1]; saw {values.tolist()}")
  return np.interp(np.arange(num_steps, dtype=np.float64), steps, values)


def step_credits(values) -> np.ndarray:
  """c_t = V(s_{t+1}) - V(s_t) for t = 0 .. T-2; [T - 1] (empty for a one-step trajectory)."""
  values = np.asarray(values, np.float64)
  return values[1:] - values[:-1]


def rise_segments(credits, eps: float = 0.05) -> list[tuple[int, int]]:
  """Maximal runs of steps [t_i, t_j] (inclusive, t_j > t_i) whose credits c_{t_i..t_j-1} >= eps.

  Args:
    credits: [T - 1] step credits.
    eps: rise threshold (0.05 in the paper).
  Returns:
    List of (t_i, t_j) step ranges, in order; empty when no credit reaches eps.
  """
  rising = np.asarray(credits, np.float64) >= eps
  segments = []
  t = 0
  while t < rising.size:
    if not rising[t]:
      t += 1
      continue
    start = t
    while t < rising.size and rising[t]:
      t += 1
    segments.append((start, t))  # credits start..t-1 rise, so steps start..t are in the segment
  return segments


def trained_steps(num_steps: int, resolved: bool, *,
                  annotated_steps: Sequence[int] = (), annotated_values: Sequence[float] = (),
                  eps: float = 0.05) -> tuple[np.ndarray, list[tuple[int, int]]]:
  """The set S of steps whose actions carry loss, as a mask.

  Args:
    num_steps: T, the number of actions.
    resolved: the trajectory's final outcome.
    annotated_steps, annotated_values: the annotator's sparse V (needed when unresolved).
    eps: rise threshold.
  Returns:
    (mask [T] bool, rise segments). Resolved: every step, segments computed when annotations are
    given (for statistics) else []. Unresolved: steps inside rise segments only.
  Raises:
    RLError: an unresolved trajectory without annotations, or bad annotations.
  """
  if num_steps < 1:
    raise RLError(f"a trajectory needs at least one step; saw num_steps={num_steps}")
  segments: list[tuple[int, int]] = []
  if len(annotated_steps) or not resolved:
    if not len(annotated_steps):
      raise RLError("an unresolved trajectory needs value annotations to find rise segments; "
                    "saw none")
    values = interpolate_values(num_steps, annotated_steps, annotated_values)
    segments = rise_segments(step_credits(values), eps)
  if resolved:
    return np.ones(num_steps, bool), segments
  mask = np.zeros(num_steps, bool)
  for start, end in segments:
    mask[start:end + 1] = True
  return mask, segments


def token_loss_weights(step_ids, step_mask) -> np.ndarray:
  """Per-token loss weights from each token's action step and the mask of trained steps.

  Args:
    step_ids: [seq] int, the index of the action step each token belongs to, -1 for every
      token that is not model output (system prompt, task, observations, chat-template tokens
      the model did not generate). Aligned as docs/contracts.md says: entry t is for predicting
      token t.
    step_mask: [T] bool from `trained_steps`.
  Returns:
    [seq] float32, 1 on tokens of trained actions, 0 elsewhere.
  Raises:
    RLError: a step id outside [-1, T).
  """
  step_ids = np.asarray(step_ids, np.int64)
  step_mask = np.asarray(step_mask, bool)
  if step_ids.size and (step_ids.min() < -1 or step_ids.max() >= step_mask.size):
    raise RLError(f"step ids must lie in [-1, {step_mask.size}); saw range "
                  f"[{step_ids.min()}, {step_ids.max()}]")
  padded = np.concatenate([step_mask, [False]])  # index -1 reads the extra False
  return padded[step_ids].astype(np.float32)


@dataclasses.dataclass(frozen=True)
class CreditSFTExample:
  """One trajectory's credit-assignment SFT targets.

  Attributes:
    loss_weights: [seq] float32 per-token weights.
    step_mask: [T] bool, the trained steps S.
    rise_segments: (t_i, t_j) inclusive step ranges.
    num_trained_tokens: number of tokens with weight 1.
  """
  loss_weights: np.ndarray
  step_mask: np.ndarray
  rise_segments: tuple[tuple[int, int], ...]
  num_trained_tokens: int


def credit_assignment_sft(step_ids, resolved: bool, *, annotated_steps: Sequence[int] = (),
                          annotated_values: Sequence[float] = (), eps: float = 0.05,
                          num_steps: Optional[int] = None) -> CreditSFTExample:
  """Loss weights of one trajectory for credit-assignment SFT (docs/algorithms.md section 1).

  Args:
    step_ids: [seq] int action step of each token, -1 for tokens that carry no loss ever.
    resolved: whether the trajectory resolved its task.
    annotated_steps, annotated_values: sparse V annotations (required when unresolved).
    eps: rise threshold.
    num_steps: T; defaults to max(step_ids) + 1.
  Returns:
    CreditSFTExample. An unresolved trajectory without rise segments has all-zero weights
    (the caller counts and usually drops it).
  Raises:
    RLError: see `trained_steps` and `token_loss_weights`.
  """
  step_ids = np.asarray(step_ids, np.int64)
  if num_steps is None:
    num_steps = int(step_ids.max()) + 1 if step_ids.size else 0
  mask, segments = trained_steps(num_steps, resolved, annotated_steps=annotated_steps,
                                 annotated_values=annotated_values, eps=eps)
  weights = token_loss_weights(step_ids, mask)
  return CreditSFTExample(loss_weights=weights, step_mask=mask, rise_segments=tuple(segments),
                          num_trained_tokens=int(weights.sum()))


def has_undefined_tool_call(called_tools: Iterable[Optional[str]],
                            defined_tools: Collection[str]) -> bool:
  """True when any action calls a tool name that the trajectory's tool list does not define.

  `called_tools` holds the tool name of each tool call (None for an action without one).
  """
  defined = set(defined_tools)
  return any(name is not None and name not in defined for name in called_tools)


FILTER_REASONS = ("too_long", "undefined_tool_call", "unparsable_action")


def filter_sft_trajectories(num_tokens, *, max_tokens: int, undefined_tool_call=None,
                            unparsable_action=None) -> tuple[np.ndarray, dict[str, int]]:
  """The paper's SFT trajectory filters: too long, undefined tool call, unparsable action.

  Args:
    num_tokens: [n] int token count of each trajectory (prompt + all turns).
    max_tokens: the training context length; longer trajectories are dropped, never truncated.
    undefined_tool_call: [n] bool, a call to a tool the trajectory does not define
      (see `has_undefined_tool_call`); None means no trajectory has one.
    unparsable_action: [n] bool, an action the harness could not parse; None means none.
  Returns:
    keep: [n] bool.
    stats: counts "total", "kept", "dropped", and "dropped_<reason>" for each reason in
      FILTER_REASONS (a trajectory failing two checks counts under both reasons, once in
      "dropped").
  Raises:
    RLError: arrays of different lengths or max_tokens < 1.
  """
  num_tokens = np.asarray(num_tokens, np.int64)
  n = num_tokens.shape[0]
  if max_tokens < 1:
    raise RLError(f"max_tokens must be >= 1; saw {max_tokens}")
  reasons = {"too_long": num_tokens > max_tokens}
  for name, flags in (("undefined_tool_call", undefined_tool_call),
                      ("unparsable_action", unparsable_action)):
    flags = np.zeros(n, bool) if flags is None else np.asarray(flags, bool)
    if flags.shape != (n,):
      raise RLError(f"{name} has shape {flags.shape}; expected ({n},) like num_tokens")
    reasons[name] = flags
  dropped = np.zeros(n, bool)
  for flags in reasons.values():
    dropped |= flags
  stats = {"total": int(n), "kept": int((~dropped).sum()), "dropped": int(dropped.sum())}
  stats.update({f"dropped_{name}": int(flags.sum()) for name, flags in reasons.items()})
  return ~dropped, stats
