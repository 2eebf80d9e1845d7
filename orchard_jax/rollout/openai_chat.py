"""OpenAI chat/completions on top of token-level generation: sampling settings in, messages out.

Shared by the engine's server (`/v1/chat/completions`, `/v1/completions`) and the recording
proxy, so both turn a request into `SamplingParams` and a generated turn into an assistant
message (content, reasoning_content, tool_calls parsed by the model family's tool-call parser)
the same way.
"""
from __future__ import annotations

import json
from typing import Any, Iterator, Optional, Sequence

from orchard_jax.data import (
  chat_messages, parse_assistant_text, parse_reasoning, split_reasoning)
from orchard_jax.rollout.chat_checks import check_chat
from orchard_jax.rollout.errors import RequestError
from orchard_jax.rollout.openai_protocol import (
  ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatMessageOut, ChoiceLogprobs,
  TokenLogprob, ToolCallFunction, ToolCallOut, TopLogprob, Usage, _Request,
  openai_finish_reason)
from orchard_jax.rollout.protocol import SamplingParams


def sampling_params_of(request: _Request, max_new_tokens: Optional[int]) -> SamplingParams:
  """SGLang sampling parameters for an OpenAI request (temperature and top_p default to 1).

  Raises:
    RequestError: the request asks for something the engine does not implement, or for
      invalid values.
  """
  reason = request.unsupported_reason()
  if reason:
    raise RequestError(reason)
  fields: dict[str, Any] = {
    "max_new_tokens": max_new_tokens, "stop": request.stop, "stop_token_ids": request.stop_token_ids,
    "ignore_eos": request.ignore_eos, "skip_special_tokens": request.skip_special_tokens,
    "no_stop_trim": request.no_stop_trim, "sampling_seed": request.seed}
  for name in ("temperature", "top_p", "top_k", "min_p"):
    value = getattr(request, name)
    if value is not None:
      fields[name] = value
  try:
    return SamplingParams(**fields)
  except ValueError as e:
    raise RequestError(f"invalid sampling settings: {e}") from e


def check_chat_request(request: ChatCompletionRequest, *, images: bool = False) -> None:
  """`chat_checks.check_chat` on a chat-completions request's messages, tools, tool_choice and
  template variables. Used where this project renders the prompt itself (the engine's server,
  the proxy in front of a token-level upstream); a hosted upstream behind the proxy validates
  its own requests. images: the policy reads image parts (a vision-language model).

  Raises:
    RequestError: names the field by its path and what was expected.
  """
  check_chat(request.messages, request.tools, request.tool_choice,
             request.chat_template_kwargs, images=images)


def template_messages(messages: Sequence[dict]) -> list[dict]:
  """The messages the chat template renders: developer -> system, roles and keys the template
  does not read (a harness's own, such as "extra") dropped (`data.chat_messages`)."""
  renamed = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
  return chat_messages(renamed)


def assistant_message(text: str, tools: Optional[Sequence[dict]], *, parser: str,
                      separate_reasoning: bool = True) -> tuple[ChatMessageOut, Any]:
  """Parse one generated turn into an assistant message.

  Args:
    text: the turn's text, decoded without dropping markup tags (<tool_call>, <think>).
    tools: tools offered in the request; tool calls are parsed out only when some were.
    parser: tool-call parser name (data.TOOL_CALL_PARSERS).
    separate_reasoning: put <think> text in reasoning_content (else leave it in content).
  Returns:
    (message, parsed): parsed is the data room's ParsedResponse, whose `errors` are the turn's
    format errors (a tool call that did not parse and stays in the content as text, an
    undeclared parameter, a think block that never closed, an undefined tool).
  """
  if not tools:
    reasoning, rest = split_reasoning(text) if separate_reasoning else (None, text)
    return ChatMessageOut(content=rest, reasoning_content=reasoning), parse_reasoning(text)
  parsed = parse_assistant_text(text, tools, parser=parser)
  calls = [ToolCallOut(id=c.id, function=ToolCallFunction(
    name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)))
    for c in parsed.tool_calls]
  content = parsed.content
  if not separate_reasoning and parsed.reasoning_content is not None:
    content = f"<think>\n{parsed.reasoning_content}\n</think>\n\n{content}"
  return ChatMessageOut(
    content=content if (content or not calls) else None,
    reasoning_content=parsed.reasoning_content if separate_reasoning else None,
    tool_calls=calls or None), parsed


def token_logprobs(tokenizer: Any, ids: Sequence[int], logprobs: Sequence[float],
                   tops: Optional[Sequence[Optional[Sequence[tuple]]]] = None,
                   top_n: int = 0) -> ChoiceLogprobs:
  """OpenAI `choices[i].logprobs` for sampled ids: token text, log-prob, UTF-8 bytes, top-n."""
  content = []
  for j, (token_id, lp) in enumerate(zip(ids, logprobs)):
    text = tokenizer.decode([int(token_id)])
    top = []
    if top_n and tops is not None and tops[j] is not None:
      for entry in list(tops[j])[:top_n]:
        t_text = tokenizer.decode([int(entry[1])])
        top.append(TopLogprob(token=t_text, logprob=float(entry[0]),
                              bytes=list(t_text.encode("utf-8"))))
    content.append(TokenLogprob(token=text, logprob=float(lp), bytes=list(text.encode("utf-8")),
                                top_logprobs=top))
  return ChoiceLogprobs(content=content)


def chat_completion(request: ChatCompletionRequest, *, message: ChatMessageOut,
                    finish_type: Optional[str], matched: Any, prompt_tokens: int,
                    completion_tokens: int, logprobs: Optional[ChoiceLogprobs],
                    model: Optional[str] = None) -> ChatCompletionResponse:
  """Assemble the non-streaming chat completion response."""
  return ChatCompletionResponse(
    model=model or request.model,
    choices=[ChatChoice(
      message=message, logprobs=logprobs,
      finish_reason=openai_finish_reason(finish_type, bool(message.tool_calls)),
      matched_stop=matched)],
    usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens))


def stream_chat_chunks(response: ChatCompletionResponse) -> Iterator[str]:
  """Server-sent events for a finished chat completion (OpenAI `chat.completion.chunk`s).

  The turn is sent as a role chunk, one content (and reasoning) chunk, one chunk per tool call
  and a final chunk with finish_reason and usage, then `data: [DONE]`.
  """
  choice = response.choices[0]
  base = {"id": response.id, "object": "chat.completion.chunk", "created": response.created,
          "model": response.model}

  def event(delta: dict, finish: Optional[str] = None, usage: Optional[dict] = None) -> str:
    body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}]}
    if usage is not None:
      body["usage"] = usage
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

  yield event({"role": "assistant", "content": ""})
  message = choice.message
  if message.reasoning_content:
    yield event({"reasoning_content": message.reasoning_content})
  if message.content:
    yield event({"content": message.content})
  for i, call in enumerate(message.tool_calls or []):
    yield event({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                 "function": call.function.model_dump()}]})
  yield event({}, finish=choice.finish_reason, usage=response.usage.model_dump())
  yield "data: [DONE]\n\n"

