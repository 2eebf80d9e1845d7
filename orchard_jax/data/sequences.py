"""Training sequences: recorded model calls (or chat messages) -> token ids with loss masks.

The RL path never re-tokenises sampled text (docs/cases.md 1 and 2): a session's calls are joined by
their recorded ids. When call k+1's prompt starts with everything recorded so far (call k's
prompt + sampled output), only the new tokens (tool results, the next turn header) are appended;
when it does not (the harness edited or compacted its history), a new sequence starts.

Token alignment (docs/contracts.md): every per-token array describes predicting input_ids[t] from the
tokens before it. Sampled tokens get loss weight 1 and their recorded log-prob; prompt, tool
output and template tokens get weight 0 and log-prob 0. The first token never carries weight.

Images (vision-language calls): a sequence carries the digests of the images whose placeholder
runs appear in its ids, in order (`TrainingSequence.images`); a call extends the current
sequence only when its ids extend the recorded ids *and* its first images are the recorded
ones, so a harness that swaps a screenshot for another of the same size (same placeholder
ids) starts a new sequence instead of training on the wrong image.

Text-only records (a hosted teacher returned text, no ids) have nothing sampled to align with.
The SFT path tokenises them with the student's chat template exactly as inference would see
them: the prompt rendered with the generation prompt and encoded on its own, then the
completion (the rendered assistant turn up to and including its end-of-turn token) encoded on
its own. The RL path refuses them (`TextOnlyRecordError`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from orchard_jax.data.errors import ChatTemplateError, DataError, TextOnlyRecordError
from orchard_jax.data.images import (ImageError, expand_image_tokens, image_bytes, image_digest,
                                     image_parts, is_digest)
from orchard_jax.data.records import ModelCall, chat_messages


@dataclasses.dataclass
class TrainingSequence:
  """One training sequence: [n] arrays aligned per docs/contracts.md, plus where it came from.

  Attributes:
    input_ids: [n] int32 token ids.
    loss_weights: [n] float32; 1 on sampled (assistant) tokens, 0 elsewhere; [0] == 0.
    old_logprobs: [n] float32 sampling log-prob of input_ids[t]; 0 where unknown.
    temperatures: [n] float32 softmax temperature of the distribution input_ids[t] was sampled
      from and old_logprobs[t] is of (its call's `ModelCall.temperature`); 1 on prompt and
      observation tokens and where nothing was sampled. The policy loss computes pi_theta at
      these temperatures (docs/algorithms.md section 3); SFT ignores them.
    action_ids: [n] int32 index of the assistant turn that sampled the token, counted over
      the session's delivered calls (the turns the harness saw: 0, 1, 2, ... as its steps);
      -1 for prompt/observation tokens. Credit-assignment SFT and per-turn rewards weight
      actions through it (`with_action_weights`).
    advantages: [n] float32 (zeros until a recipe sets them, `with_advantage`).
    teacher_logprobs, teacher_mask: [n] float32 or None (on-policy distillation).
    ref_logprobs: [n] float32 or None (KL to a reference policy).
    session_id, segment_index, call_indices: provenance.
    logprobs_known: False when old_logprobs are placeholders (text-only SFT data).
    metadata: anything a recipe wants to carry along (trajectory_id, reward, ...).
    images: digests of the images whose placeholder runs appear in input_ids, in order
      (vision-language sequences; data.images, TrajectoryStore.get_image).
  """
  input_ids: np.ndarray
  loss_weights: np.ndarray
  old_logprobs: np.ndarray
  action_ids: np.ndarray
  temperatures: np.ndarray | None = None
  advantages: np.ndarray | None = None
  teacher_logprobs: np.ndarray | None = None
  teacher_mask: np.ndarray | None = None
  ref_logprobs: np.ndarray | None = None
  session_id: str | None = None
  segment_index: int = 0
  call_indices: tuple[int, ...] = ()
  logprobs_known: bool = True
  metadata: dict = dataclasses.field(default_factory=dict)
  images: tuple[str, ...] = ()

  def __post_init__(self):
    self.images = tuple(self.images)
    self.input_ids = np.asarray(self.input_ids, dtype=np.int32)
    n = len(self.input_ids)
    self.loss_weights = _vector(self.loss_weights, n, np.float32, "loss_weights")
    self.old_logprobs = _vector(self.old_logprobs, n, np.float32, "old_logprobs")
    self.action_ids = _vector(self.action_ids, n, np.int32, "action_ids")
    self.temperatures = (np.ones(n, np.float32) if self.temperatures is None
                         else _vector(self.temperatures, n, np.float32, "temperatures"))
    if not np.all(np.isfinite(self.temperatures) & (self.temperatures > 0)):
      raise DataError("temperatures must be finite and > 0 (1 where nothing was sampled)")
    self.advantages = (np.zeros(n, np.float32) if self.advantages is None
                       else _vector(self.advantages, n, np.float32, "advantages"))
    for name in ("teacher_logprobs", "teacher_mask", "ref_logprobs"):
      value = getattr(self, name)
      if value is not None:
        setattr(self, name, _vector(value, n, np.float32, name))
    if (self.teacher_logprobs is None) != (self.teacher_mask is None):
      raise DataError("teacher_logprobs and teacher_mask must be given together")

  def __len__(self) -> int:
    return len(self.input_ids)

  @property
  def num_loss_tokens(self) -> int:
    return int(np.count_nonzero(self.loss_weights))

  def with_advantage(self, advantage: float | np.ndarray) -> "TrainingSequence":
    """Copy with advantages set: a scalar (GRPO sequence advantage) is broadcast to [n]."""
    value = np.broadcast_to(np.asarray(advantage, np.float32), (len(self),)).copy()
    return dataclasses.replace(self, advantages=value)

  def with_action_weights(self, weights: Sequence[float] | Mapping[int, float]
                          ) -> "TrainingSequence":
    """Copy whose loss weights are scaled per action: weight[t] *= weights[action_ids[t]].

    Args:
      weights: indexed by action id (session call index); a Mapping may omit actions, which
        then get weight 0 (e.g. credit-assignment SFT keeps only rise-segment actions).
    """
    if isinstance(weights, Mapping):
      scale = np.array([weights.get(int(a), 0.0) for a in self.action_ids], np.float32)
    else:
      table = np.asarray(weights, np.float32)
      valid = self.action_ids >= 0
      if valid.any() and self.action_ids[valid].max() >= len(table):
        raise DataError(
          f"weights cover actions 0..{len(table) - 1}, the sequence has action "
          f"{int(self.action_ids.max())}")
      scale = np.where(valid, table[np.maximum(self.action_ids, 0)], 0.0).astype(np.float32)
    return dataclasses.replace(self, loss_weights=self.loss_weights * scale)


def sequences_from_model_calls(calls: Iterable[ModelCall], *, mode: Literal["rl", "sft"],
                               tokenizer: Any = None,
                               image_tokens: Callable[[str], int] | None = None
                               ) -> list[TrainingSequence]:
  """Turn recorded model calls into training sequences, one session at a time.

  Calls are grouped by session and taken in call_index order; calls the caller never got
  (`ModelCall.delivered` False) are left out, as they never happened for the harness. Within a
  session, a call whose
  prompt_ids start with the ids recorded so far extends the current sequence (its prompt
  suffix as context, its output_ids as sampled tokens); any other call starts a new sequence.
  Sampled ids are used exactly as recorded, never decoded and re-encoded.

  Args:
    calls: ModelCall records (any number of sessions).
    mode: "rl" (text-only calls and calls without log-probs are refused) or "sft" (text-only
      calls are tokenised with `tokenizer`'s chat template; missing log-probs become 0 with
      logprobs_known=False).
    tokenizer: the student's `Tokenizer`; needed in SFT mode when a call is text-only.
    image_tokens: digest -> the image's language-model token count (its processed grid),
      needed to tokenise a text-only call whose messages show images.
  Returns:
    Sequences with at least one loss token, ordered by session then position.
  Raises:
    TextOnlyRecordError: mode "rl" and a call is text-only.
    DataError: mode "rl" and a call lacks log-probs; a text-only call in SFT mode without a
      tokenizer; an empty prompt; an unknown mode.
  """
  if mode not in ("rl", "sft"):
    raise DataError(f"mode must be 'rl' or 'sft', got {mode!r}")
  sessions: dict[str, list[ModelCall]] = {}
  for call in calls:
    if call.delivered:
      sessions.setdefault(call.session_id, []).append(call)
  result = []
  for session_id in sorted(sessions):
    ordered = sorted(sessions[session_id], key=lambda c: c.call_index)
    pieces = []
    for call in ordered:
      if call.text_only:
        if mode == "rl":
          raise TextOnlyRecordError(
            f"session {session_id!r} call {call.call_index} was recorded text-only (the "
            "upstream returned no token ids); RL trains only on ids the policy sampled, with "
            "their log-probs. Use such records for SFT, or leave the session out of RL.")
        if tokenizer is None:
          raise DataError(
            f"session {session_id!r} call {call.call_index} is text-only: SFT needs the "
            "student's tokenizer to tokenise it (pass tokenizer=...)")
        pieces.append(_tokenise_text_only(call, tokenizer, image_tokens))
      else:
        if mode == "rl" and not call.has_logprobs:
          raise DataError(
            f"session {session_id!r} call {call.call_index} has {len(call.output_ids)} output "
            "ids but no output_logprobs; RL needs the sampling log-probs (request them with "
            "return_logprob / logprobs=true)")
        logprobs = call.output_logprobs or [0.0] * len(call.output_ids)
        pieces.append((call.prompt_ids, call.output_ids, logprobs, bool(call.output_logprobs),
                       tuple(call.images)))
    result.extend(_join(session_id, ordered, pieces))
  return result


def sft_sequences_from_messages(messages: Sequence[Mapping[str, Any]], tokenizer: Any, *,
                                tools: Sequence[dict] | None = None,
                                session_id: str | None = None) -> list[TrainingSequence]:
  """SFT sequences of a chat (e.g. a trajectory's harness messages), every assistant turn
  trained.

  Each assistant message becomes one text-only call whose prompt is the chat before it, then
  the calls are joined as in `sequences_from_model_calls` (SFT mode). Roles a chat template
  does not render (mini-swe-agent's "exit") and keys such as "extra" are dropped first.

  Args:
    messages: OpenAI-format chat.
    tokenizer: the student's `Tokenizer`.
    tools: tool schemas shown in the system prompt.
    session_id: provenance recorded on the sequences.
  Returns:
    Sequences; action_ids count assistant turns from 0.
  """
  chat = chat_messages(messages)
  calls = []
  for i, message in enumerate(chat):
    if message["role"] == "assistant" and i > 0:
      calls.append(ModelCall(
        session_id=session_id or "messages", call_index=len(calls), messages=chat[:i],
        tools=list(tools) if tools else None, response=message, text_only=True))
  return sequences_from_model_calls(calls, mode="sft", tokenizer=tokenizer)


def lm_sequences(texts: Iterable[str], tokenizer: Any, *, max_len: int) -> list[TrainingSequence]:
  """Plain next-token training sequences from documents (e.g. `tokenizer.stdlib_corpus()`).

  Each document is encoded, closed with <|endoftext|> (the eos id when the vocabulary lacks
  it) and cut into chunks of at most `max_len` tokens; every token of a chunk but its first
  carries loss weight 1. Chunks of one token are dropped (nothing to predict).

  Args:
    texts: documents.
    tokenizer: a `Tokenizer`.
    max_len: longest chunk, normally the packed seq_len.
  Returns:
    Sequences in document order (action_ids -1, old log-probs 0, logprobs_known False).
  Raises:
    DataError: max_len < 2.
  """
  if max_len < 2:
    raise DataError(f"max_len must be >= 2, got {max_len}")
  end = tokenizer.token_to_id("<|endoftext|>")
  end = tokenizer.eos_id if end is None else end
  result = []
  for ids in tokenizer.encode_batch(list(texts)):
    ids = np.asarray(ids + [end], np.int32)
    for start in range(0, len(ids), max_len):
      chunk = ids[start:start + max_len]
      if len(chunk) < 2:
        continue
      weights = np.ones(len(chunk), np.float32)
      weights[0] = 0.0
      result.append(TrainingSequence(
        input_ids=chunk, loss_weights=weights, old_logprobs=np.zeros(len(chunk), np.float32),
        action_ids=np.full(len(chunk), -1, np.int32), logprobs_known=False))
  return result


def _tokenise_text_only(call: ModelCall, tokenizer: Any,
                        image_tokens: Callable[[str], int] | None = None):
  """(prompt ids, completion ids, zero log-probs, False, image digests) of a text-only call, as
  inference would have tokenised it (image placeholders widened to each image's tokens)."""
  messages = chat_messages(call.messages)
  digests = tuple(call.images) or _digests_of(messages)
  if call.response is None:
    prompt = list(tokenizer.render_chat(call.messages, call.tools))
    return _expand(prompt, digests, call, tokenizer, image_tokens), [], [], False, digests
  response = chat_messages([{"role": "assistant", **call.response}])[0]
  prompt = tokenizer.render_chat_text(messages, call.tools, add_generation_prompt=True)
  full = tokenizer.render_chat_text(messages + [response], call.tools,
                                    add_generation_prompt=False)
  if not full.startswith(prompt):
    raise ChatTemplateError(
      f"session {call.session_id!r} call {call.call_index}: the chat template renders the "
      "assistant turn in a way that does not extend the generation prompt "
      f"(prompt ends {prompt[-40:]!r}, turn starts {full[len(prompt) - 40:len(prompt)]!r}); "
      "cannot tell which tokens the model would have produced")
  completion = tokenizer.encode(full[len(prompt):])
  stops = [i for i, t in enumerate(completion) if t in set(tokenizer.stop_ids)]
  if stops:
    completion = completion[:stops[-1] + 1]  # what follows the end-of-turn is template
  prompt_ids = _expand(tokenizer.encode(prompt), digests, call, tokenizer, image_tokens)
  return prompt_ids, completion, [0.0] * len(completion), False, digests


def _digests_of(messages) -> tuple[str, ...]:
  """Digests of a chat's images: recorded messages name them by digest already; an image
  given as data (a data URL) is hashed (the caller stores it: TrajectoryStore.put_image)."""
  out = []
  for source in image_parts(messages):
    out.append(source if is_digest(source) else image_digest(image_bytes(source)))
  return tuple(out)


def _expand(ids, digests, call: ModelCall, tokenizer: Any,
            image_tokens: Callable[[str], int] | None) -> list[int]:
  """A rendered prompt's ids with each image's one placeholder widened to its tokens."""
  if not digests:
    return list(ids)
  image_id = getattr(tokenizer, "image_token_id", None)
  if image_id is None:
    raise DataError(f"session {call.session_id!r} call {call.call_index} shows "
                    f"{len(digests)} image(s) but the tokenizer has no <|image_pad|> token")
  if image_tokens is None:
    raise DataError(f"session {call.session_id!r} call {call.call_index} shows images: "
                    "tokenising it needs image_tokens= (digest -> the image's token count)")
  try:
    return expand_image_tokens(ids, image_id, [image_tokens(d) for d in digests])
  except ImageError as e:
    raise DataError(f"session {call.session_id!r} call {call.call_index}: {e}") from e


def _join(session_id: str, calls: Sequence[ModelCall], pieces) -> list[TrainingSequence]:
  sequences, current = [], None
  for turn, (call, (prompt, output, logprobs, known, images)) in enumerate(zip(calls, pieces)):
    if not prompt:
      raise DataError(
        f"session {session_id!r} call {call.call_index} has an empty prompt; a sampled token "
        "needs at least one token before it")
    prompt = np.asarray(prompt, np.int32)
    if (current is not None and _extends(prompt, current["ids"])
        and images[:len(current["images"])] == current["images"]):
      context = prompt[sum(map(len, current["ids"])):]
    else:
      if current is not None:
        sequences.append(current)
      current = {"ids": [], "weights": [], "logprobs": [], "temperatures": [], "actions": [],
                 "calls": [], "segment": call.segment_index, "known": True}
      context = prompt
    current["images"] = images
    n_out = len(output)
    current["ids"] += [context, np.asarray(output, np.int32)]
    current["weights"] += [np.zeros(len(context), np.float32), np.ones(n_out, np.float32)]
    current["logprobs"] += [np.zeros(len(context), np.float32), np.asarray(logprobs, np.float32)]
    # The temperature the sampled tokens' log-probs are of (1 for text-only records: nothing
    # was sampled here).
    temperature = 1.0 if call.text_only else call.temperature
    current["temperatures"] += [np.ones(len(context), np.float32),
                                np.full(n_out, temperature, np.float32)]
    current["actions"] += [np.full(len(context), -1, np.int32),
                           np.full(n_out, turn, np.int32)]
    current["calls"].append(call.call_index)
    current["known"] &= known or n_out == 0
  if current is not None:
    sequences.append(current)
  result = []
  for s in sequences:
    weights = np.concatenate(s["weights"])
    if not weights.any():
      continue
    result.append(TrainingSequence(
      input_ids=np.concatenate(s["ids"]), loss_weights=weights,
      old_logprobs=np.concatenate(s["logprobs"]), action_ids=np.concatenate(s["actions"]),
      temperatures=np.concatenate(s["temperatures"]), session_id=session_id, segment_index=s["segment"], call_indices=tuple(s["calls"]),
      logprobs_known=s["known"], images=s["images"]))
  return result


def _extends(prompt: np.ndarray, recorded: list[np.ndarray]) -> bool:
  """True when `prompt` starts with the concatenation of `recorded`."""
  pos = 0
  for part in recorded:
    if pos + len(part) > len(prompt) or not np.array_equal(prompt[pos:pos + len(part)], part):
      return False
    pos += len(part)
  return True


def _vector(value: Any, n: int, dtype, name: str) -> np.ndarray:
  array = np.asarray(value, dtype=dtype)
  if array.shape != (n,):
    raise DataError(f"{name} must have shape ({n},) like input_ids, got {array.shape}")
  return array
