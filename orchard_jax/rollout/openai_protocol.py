"""Wire format of the OpenAI-compatible endpoints (`/v1/chat/completions`, `/v1/completions`).

Field names follow OpenAI's API reference as SGLang serves it, including SGLang's extra sampling
fields (`top_k`, `min_p`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`,
`no_stop_trim`, `chat_template_kwargs`, `separate_reasoning`). Requests accept unknown fields
(OpenAI clients send vendor extensions) and the server logs the ones it ignores; messages and
tools stay plain dicts, the form the chat template consumes.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

_ROLES = ("system", "user", "assistant", "tool", "developer")


class _Request(BaseModel):
  model_config = ConfigDict(extra="allow", allow_inf_nan=False)

  model: str = "default"
  temperature: Optional[float] = Field(None, ge=0.0)
  top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
  n: int = 1
  stream: bool = False
  stop: Optional[Union[str, list[str]]] = None
  seed: Optional[int] = None
  presence_penalty: Optional[float] = None
  frequency_penalty: Optional[float] = None
  logit_bias: Optional[dict[str, float]] = None
  user: Optional[str] = None
  # SGLang extensions
  top_k: Optional[int] = None
  min_p: Optional[float] = None
  stop_token_ids: Optional[list[int]] = None
  ignore_eos: bool = False
  skip_special_tokens: bool = True
  no_stop_trim: bool = False
  rid: Optional[str] = None

  @property
  def ignored_fields(self) -> list[str]:
    """Names of request fields this server does not know (left unused)."""
    return sorted((self.model_extra or {}).keys())

  def unsupported_reason(self) -> Optional[str]:
    """A sentence naming a requested feature the embedded engine lacks, or None."""
    if self.n != 1:
      return f"n={self.n}: the server generates one choice per request; send n requests"
    for name in ("presence_penalty", "frequency_penalty"):
      if getattr(self, name):
        return f"{name}={getattr(self, name)} is not implemented; send 0 or omit it"
    if self.logit_bias:
      return "logit_bias is not implemented"
    return None


class ChatCompletionRequest(_Request):
  """`/v1/chat/completions` request.

  Attributes:
    messages: OpenAI messages (role system/developer/user/assistant/tool); assistant messages
      may carry tool_calls, tool messages tool_call_id.
    tools: OpenAI tool schemas, rendered into the prompt by the model's chat template.
    tool_choice: "auto" (default), "none" (tools are not offered), "required" or a named tool
      (accepted; the engine does not constrain decoding, so the model may still answer in text).
    max_tokens / max_completion_tokens: most tokens to generate (the latter wins).
    logprobs / top_logprobs: return per-token log-probs of the sampled tokens.
    chat_template_kwargs: extra template variables (e.g. {"enable_thinking": false}).
    separate_reasoning: return <think> text as message.reasoning_content (default True).
  """
  messages: list[dict[str, Any]]
  tools: Optional[list[dict[str, Any]]] = None
  tool_choice: Optional[Union[str, dict[str, Any]]] = None
  max_tokens: Optional[int] = Field(None, ge=0)
  max_completion_tokens: Optional[int] = Field(None, ge=0)
  logprobs: bool = False
  top_logprobs: Optional[int] = Field(None, ge=0, le=20)
  parallel_tool_calls: Optional[bool] = None
  response_format: Optional[dict[str, Any]] = None
  stream_options: Optional[dict[str, Any]] = None
  chat_template_kwargs: Optional[dict[str, Any]] = None
  separate_reasoning: bool = True

  @pydantic.field_validator("messages")
  @classmethod
  def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not messages:
      raise ValueError("messages is empty; expected at least one message")
    for i, message in enumerate(messages):
      role = message.get("role")
      if role not in _ROLES:
        raise ValueError(f"messages[{i}].role is {role!r}; expected one of {_ROLES}")
    return messages

  @property
  def max_new_tokens(self) -> Optional[int]:
    if self.max_completion_tokens is not None:
      return self.max_completion_tokens
    return self.max_tokens

  def offered_tools(self) -> Optional[list[dict[str, Any]]]:
    """The tools to render into the prompt: none when tool_choice is "none"."""
    if self.tool_choice == "none":
      return None
    return self.tools or None


class CompletionRequest(_Request):
  """`/v1/completions` request: a prompt given as text, ids, or a batch of either.

  Attributes:
    prompt: a string, a list of strings, a list of ids, or a list of id lists.
    max_tokens: most tokens to generate (OpenAI's default is 16).
    logprobs: number of top log-probs per position (0 = only the sampled token's).
    echo: prepend the prompt to the returned text.
  """
  prompt: Union[str, list[str], list[int], list[list[int]]]
  max_tokens: Optional[int] = Field(16, ge=0)
  logprobs: Optional[int] = Field(None, ge=0, le=20)
  echo: bool = False
  suffix: Optional[str] = None

  def prompts(self) -> list[Union[str, list[int]]]:
    """The prompt as a list of prompts (text or ids)."""
    p = self.prompt
    if isinstance(p, str):
      return [p]
    if not p:
      raise ValueError("prompt is empty")
    if isinstance(p[0], int):
      return [list(p)]
    return list(p)


class TopLogprob(BaseModel):
  token: str
  logprob: float
  bytes: Optional[list[int]] = None


class TokenLogprob(BaseModel):
  """One sampled token's entry of `choices[i].logprobs.content`."""
  token: str
  logprob: float
  bytes: Optional[list[int]] = None
  top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
  content: Optional[list[TokenLogprob]] = None


class ToolCallFunction(BaseModel):
  name: str
  arguments: str


class ToolCallOut(BaseModel):
  id: str
  type: Literal["function"] = "function"
  function: ToolCallFunction


class ChatMessageOut(BaseModel):
  role: Literal["assistant"] = "assistant"
  content: Optional[str] = None
  reasoning_content: Optional[str] = None
  tool_calls: Optional[list[ToolCallOut]] = None


class ChatChoice(BaseModel):
  index: int = 0
  message: ChatMessageOut
  logprobs: Optional[ChoiceLogprobs] = None
  finish_reason: Optional[str] = None
  matched_stop: Optional[Union[int, str]] = None


class Usage(BaseModel):
  prompt_tokens: int
  completion_tokens: int
  total_tokens: int


def _new_id(prefix: str) -> str:
  return f"{prefix}-{uuid.uuid4().hex}"


class ChatCompletionResponse(BaseModel):
  """`/v1/chat/completions` response (non-streaming)."""
  model_config = ConfigDict(extra="allow")

  id: str = Field(default_factory=lambda: _new_id("chatcmpl"))
  object: Literal["chat.completion"] = "chat.completion"
  created: int = Field(default_factory=lambda: int(time.time()))
  model: str
  choices: list[ChatChoice]
  usage: Usage


class CompletionLogprobs(BaseModel):
  tokens: list[str] = Field(default_factory=list)
  token_logprobs: list[Optional[float]] = Field(default_factory=list)
  top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
  text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
  index: int = 0
  text: str
  logprobs: Optional[CompletionLogprobs] = None
  finish_reason: Optional[str] = None
  matched_stop: Optional[Union[int, str]] = None


class CompletionResponse(BaseModel):
  """`/v1/completions` response (non-streaming)."""
  id: str = Field(default_factory=lambda: _new_id("cmpl"))
  object: Literal["text_completion"] = "text_completion"
  created: int = Field(default_factory=lambda: int(time.time()))
  model: str
  choices: list[CompletionChoice]
  usage: Usage


def openai_finish_reason(finish_type: Optional[str], has_tool_calls: bool) -> Optional[str]:
  """OpenAI's finish_reason from SGLang's finish type: stop -> "stop" (or "tool_calls" when the
  turn called tools), length -> "length", abort -> "abort"."""
  if finish_type == "stop":
    return "tool_calls" if has_tool_calls else "stop"
  return finish_type
