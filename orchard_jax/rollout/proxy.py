"""The recording proxy: an OpenAI-compatible endpoint per session that records every model call.

A harness gets a base URL `http://HOST:PORT/sessions/{session_id}/v1` and calls
`/chat/completions` there as it would call any OpenAI-compatible API. For a token-level
upstream (SGLang or the embedded engine, `SGLangUpstream`) the proxy

1. turns the request's messages into prompt token ids itself. When the messages start with the
   history the session already recorded (everything up to and including the assistant turn
   the proxy returned last), it keeps the recorded ids, which end with the tokens exactly as
   sampled, and appends only the ids of the new messages (tool results, the next user turn,
   the generation prompt): the chat template renders the new text, which is tokenised on its
   own, starting right after the sampled end-of-turn token. History already recorded is never
   rendered or tokenised again (docs/cases.md 1 and 2). When the messages do not start with a
   recorded history (the harness edited or compacted it, or changed its tools), the prompt is
   rendered from scratch and a new segment starts;
2. sends the ids to the engine's `/generate` (token in, token out) with return_logprob;
3. parses the sampled text into an assistant message (content, reasoning, tool calls) with the
   model family's tool-call parser, returns it as a chat completion, and appends a
   `data.ModelCall` (prompt ids, output ids, log-probs, messages, tools, response, finish
   reason, segment index, timing) to the trajectory store as the call finishes. The record is
   built and written by a background thread (`recorder.RecordWriter`, in call order) that
   is woken once the answer has been sent, so neither is on the harness's latency path.
   `end_session(session_id)` (and `flush()`) wait
   until every answered call is written; read the store after calling it.

Records are what happened. A session is held from a call's arrival until its answer was sent
(calls of one session are recorded one at a time, in order). A caller that disconnects while
its call is generated cancels it: the upstream request is closed (the engine aborts it) and the
call is recorded `delivered=False` with the output generated so far (a streamed call) or none.
An answer that could not be written to its caller in full is recorded `delivered=False` with
its output. Undelivered calls are never trained on and leave the session's history,
checkpoints and `segment_index` where the last delivered call left them, so the caller's retry
continues the same segment. A refused call (invalid request, upstream error) is not recorded
and moves no counter. A sampled turn counts as closed only when it ends with the chat
template's end-of-turn token (`tokenizer.eos_id`); otherwise the next prompt's new ids start
with that token, as the template renders every assistant turn.

A session's id is its capability: the proxy has no other credential, and any program that can
reach it (a harness inside a sandbox whose egress allows the proxy) can call, and end, every
session whose id it knows. `new_session_id` ends each id with 128 random bits, so one rollout
cannot guess another's.

For a text-level upstream (`OpenAIUpstream`, e.g. a hosted teacher) it forwards the request
and records the messages and the response, marked `text_only` (SFT re-tokenises those with the
student's template; RL refuses them).

Example:
  with InferenceServer(engine) as server, TrajectoryStore(path) as store, \\
       RecordingProxy(SGLangUpstream(server.url), tokenizer=tok, store=store) as proxy:
    base_url = proxy.session_url("task-1-attempt-0")     # give this to the harness
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import json
import logging
import secrets
import time
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Union

import fastapi
import orjson
import pydantic
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from orchard_jax.data import ChatTemplateError, ModelCall
from orchard_jax.data.images import ImageError, expand_image_tokens, part_source
from orchard_jax.rollout.background import BackgroundServer
from orchard_jax.rollout.body_limit import (MAX_REQUEST_BYTES, BodyTooLarge, check_limit,
                                            read_body, replayed)
from orchard_jax.rollout.disconnect import ClientDisconnected, DisconnectWatch
from orchard_jax.rollout.errors import (
  RequestError, RolloutError, SessionError, UpstreamError, validation_message)
from orchard_jax.rollout.openai_chat import (
  assistant_message, chat_completion, check_chat_request, sampling_params_of,
  template_messages, token_logprobs)
from orchard_jax.rollout.openai_protocol import ChatCompletionRequest, ChatCompletionResponse
from orchard_jax.rollout.protocol import SamplingParams
from orchard_jax.rollout.multimodal import ChatImages, resolve_chat_images
from orchard_jax.rollout.offload import OFF_LOOP_BYTES, off_loop
from orchard_jax.rollout.recorder import RecordWriter
from orchard_jax.rollout.server import JSONErrors, answer_bytes, error_response
from orchard_jax.rollout.upstream import OpenAIUpstream, SGLangUpstream
from orchard_jax.rollout.wires.registry import CHAT, MESSAGES, WIRES, Wire
from orchard_jax.rollout.wires.turn_stream import THINK_CLOSE, THINK_OPEN, TurnSplitter

_log = logging.getLogger(__name__)
_CHECKPOINTS_KEPT = 4


@dataclasses.dataclass
class _Checkpoint:
  """Token ids recorded for a chat prefix.

  `assistant` checkpoints cover messages ending with an assistant turn the proxy returned
  (ids = prompt + sampled output); `request` checkpoints cover a request's messages (ids = the
  prompt, ending with the generation prompt).
  """
  key: tuple
  ids: list[int]
  assistant: bool
  closed: bool  # assistant turn ended with a sampled stop token (end of turn)
  call_index: int
  # Assistant checkpoints: (whether a system message leads, the chat template's text of
  # [system message, this turn] through the turn's end-of-turn token), rendered after the
  # answer was sent (`PromptBuilder.prepare`); None until then.
  prepared: Optional[tuple[bool, str]] = None


@dataclasses.dataclass
class _Session:
  """A harness session's state. `call_index` counts every recorded call; `segment_index`,
  `checkpoints` and `latest` move only with delivered calls (an undelivered one never
  happened for the harness, whose retry continues from the last delivered call)."""
  id: str
  lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
  call_index: int = 0
  segment_index: int = 0
  context_key: Optional[bytes] = None
  checkpoints: list = dataclasses.field(default_factory=list)
  latest: Optional[_Checkpoint] = None
  unprepared: Optional[tuple] = None   # PromptBuilder.prepare's arguments, after the answer
  prompt_tokens: int = 0
  completion_tokens: int = 0


class _Answer:
  """A call's response, ready to be sent, and what to do once it was (or was not).

  Non-streamed: `settle(delivered)` commits the call to its session (checkpoints, segment and
  call counters) and submits its record, marked undelivered when the caller never got it, then
  releases the session for its next call; it runs once, and the proxy always settles an answer
  it made. Streamed (`streamed` True): the response generates, sends and commits the call
  itself as its events go out, and releases the session when it is over.
  """

  def __init__(self, response: Response, commit: Optional[Callable[[bool], None]] = None,
               release: Optional[Callable[[], None]] = None, *, streamed: bool = False):
    self.response = response
    self.streamed = streamed
    self._commit = commit
    self._release = release
    self._settled = streamed

  def settle(self, delivered: bool) -> None:
    if self._settled:
      return
    self._settled = True
    try:
      self._commit(delivered)
    finally:
      self._release()


@dataclasses.dataclass(frozen=True)
class _Call:
  """One model call between planning and its finished turn: timings (time.time() at the
  start, perf_counter() before and after planning), the rendered inputs, the prompt plan,
  the sampling settings, the wire's name and the chat's images."""
  started_at: float
  t0: float
  t1: float
  messages: list
  tools: Optional[list]
  kwargs: dict
  plan: "PromptPlan"
  params: SamplingParams
  wire: str
  images: Optional[ChatImages] = None    # a vision-language chat's images, in prompt order
  size: int = 0                          # the request body's bytes (offload.off_loop)

  def image_urls(self) -> Optional[list[str]]:
    """The images as data URLs for the upstream's image_data (None without images)."""
    return self.images.data_urls() if self.images is not None else None


@dataclasses.dataclass(frozen=True)
class PromptPlan:
  """How a request's prompt ids were made.

  Attributes:
    ids: the prompt token ids.
    reused: number of leading ids taken from a recorded checkpoint (0: rendered from scratch).
    continues_segment: the prompt extends the session's latest recorded call (prompt +
      output), so the call belongs to the current segment.
    key: the messages' history keys (`message_key` of each), for the session's checkpoints.
    context: the request's tools and template arguments (`_context_key`); recorded ids are
      reused only within one context.
  """
  ids: list[int]
  reused: int
  continues_segment: bool
  key: tuple = ()
  context: bytes = b""


SESSION_SECRET_BITS = 128


def new_session_id(prefix: str) -> str:
  """A session id: `prefix` (for people reading logs; it may be guessable) then 128 random bits
  as 32 hex digits, which no other rollout can guess (module docstring). Raises ValueError for
  a prefix the proxy's URLs cannot carry (a '/')."""
  if "/" in prefix:
    raise ValueError(f"session id prefix {prefix!r} must contain no '/'")
  return f"{prefix}-{secrets.token_hex(SESSION_SECRET_BITS // 8)}"


def message_key(message: dict) -> tuple:
  """What identifies a message for history matching: role, text, tool calls (name and
  canonical arguments). Call ids, reasoning text and harness-only keys are ignored."""
  role = message.get("role")
  role = "system" if role == "developer" else role
  calls = []
  for call in message.get("tool_calls") or []:
    fn = call.get("function", call) if isinstance(call, dict) else {}
    args = fn.get("arguments")
    calls.append((fn.get("name"), _canonical_arguments(args) if isinstance(args, str)
                  else json.dumps(args, sort_keys=True, ensure_ascii=False)))
  return (role, _text(message.get("content")).strip(), tuple(calls))


@functools.lru_cache(maxsize=4096)
def _canonical_arguments(args: str) -> str:
  """Tool-call arguments JSON with sorted keys (the text as given when it is not JSON).
  Cached: a session sends the same history's arguments again on every call."""
  try:
    value = json.loads(args)
  except ValueError:
    value = args
  return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _text(content: Any) -> str:
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    return "".join(_part_text(p) for p in content)
  return str(content)


def _part_text(part: Any) -> str:
  """A content part's text for history matching; an image part (its url, which is the image's
  digest once the proxy read it) counts too, so the same words beside another screenshot are
  another message."""
  if not isinstance(part, dict):
    return str(part)
  if part.get("type") in ("image_url", "image"):
    return f"\x00image:{part_source(part)}\x00"
  return part.get("text", "")


class PromptBuilder:
  """Builds prompt ids for a session's requests, extending recorded ids (see module docstring).

  Args:
    tokenizer: a `data.Tokenizer` with a chat template.
  """

  def __init__(self, tokenizer: Any):
    self.tokenizer = tokenizer
    self.eos_text = tokenizer.id_to_token(tokenizer.eos_id)

  def plan(self, session: _Session, messages: list[dict], tools: Optional[list[dict]],
           template_kwargs: dict) -> PromptPlan:
    """Prompt ids for `messages` (already cleaned) in `session`'s context."""
    key = tuple(message_key(m) for m in messages)
    context = _context_key(tools, template_kwargs)
    best = None
    if session.context_key == context:
      for cp in session.checkpoints:
        n = len(cp.key)
        fits = (cp.assistant and n < len(key)) or (not cp.assistant and n == len(key))
        if fits and key[:n] == cp.key and (best is None or n > len(best.key)):
          best = cp
    if best is not None and not best.assistant:
      return PromptPlan(list(best.ids), len(best.ids), False, key, context)
    if best is not None:
      suffix = self._new_text(messages, len(best.key), tools, template_kwargs, best.closed,
                              best.prepared)
      if suffix is not None:
        ids = best.ids + self.tokenizer.encode(suffix)
        return PromptPlan(ids, len(best.ids), best is session.latest, key, context)
      _log.info("session %s: chat template is not prefix-stable here; rendering the prompt "
                "from scratch", session.id)
    ids = self.tokenizer.encode(self.tokenizer.render_json_chat_text(
      messages, tools, add_generation_prompt=True, **template_kwargs))
    return PromptPlan(ids, 0, False, key, context)

  def _new_text(self, messages: list[dict], k: int, tools, template_kwargs: dict,
                closed: bool, prepared: Optional[tuple[bool, str]] = None) -> Optional[str]:
    """Text the template adds after the recorded assistant turn messages[k-1] (the data room's
    `Tokenizer.render_continuation`): the separator after its end-of-turn token, the new
    messages and the generation prompt, preceded by the end-of-turn token itself when the
    sampled ids lack it (the turn was cut by max_tokens or a stop string). None when the
    template gives no such continuation."""
    # First render only the system message (templates treat it specially), the last recorded
    # turn and the new messages: cheap, and exact for templates that render each message
    # independently of the ones before (ChatML / Qwen families). Then the whole chat.
    system = [messages[0]] if messages[0].get("role") == "system" and k > 1 else []
    short = system + messages[k - 1:]
    for chat, recorded in ((short, len(system) + 1), (messages, k)):
      try:
        if chat is short and prepared is not None and prepared[0] == bool(system):
          # The recorded turn's rendering was made after the last answer went out: one
          # render here instead of two (`Tokenizer.render_continuation`'s rule, on its text).
          text = _continuation_after(prepared[1], self.tokenizer.render_json_chat_text(
            chat, tools, add_generation_prompt=True, **template_kwargs), self.eos_text)
        else:
          text = self.tokenizer.render_continuation(chat, recorded, tools,
                                                    add_generation_prompt=True,
                                                    **template_kwargs)
      except ChatTemplateError:
        continue
      return text if closed else self.eos_text + text
    return None

  def prepare(self, checkpoint: _Checkpoint, head: list[dict], tools: Optional[list[dict]],
              template_kwargs: dict) -> None:
    """Render [system message, assistant turn] (`head`) of an assistant checkpoint for the
    session's next call, whose continuation then needs one render instead of two. Run after
    the answer was sent; a template that fails here leaves the checkpoint unprepared."""
    try:
      text = self.tokenizer.render_json_chat_text(head, tools, add_generation_prompt=False,
                                                  **template_kwargs)
    except ChatTemplateError:
      return
    end = text.rfind(self.eos_text)
    if end >= 0:
      checkpoint.prepared = (len(head) > 1, text[:end + len(self.eos_text)])


def _continuation_after(recorded: str, full: str, eos: str) -> str:
  """The text of `full` (a chat's rendering) after the recorded turn whose rendering, through
  its end-of-turn token `eos`, is `recorded`: what follows that prefix, or, for templates that
  rewrite earlier turns, what follows the same number of end-of-turn tokens (the rule of
  `data.Tokenizer.render_continuation`).

  Raises:
    ChatTemplateError: `full` holds fewer end-of-turn tokens than `recorded`.
  """
  if full.startswith(recorded):
    return full[len(recorded):]
  pos = -len(eos)
  for _ in range(recorded.count(eos)):
    pos = full.find(eos, pos + len(eos))
    if pos < 0:
      raise ChatTemplateError(
        f"the whole chat's rendering holds fewer than the {recorded.count(eos)} end-of-turn "
        f"tokens {eos!r} of the recorded messages' rendering")
  return full[pos + len(eos):]


def _context_key(tools: Optional[list[dict]], template_kwargs: dict) -> bytes:
  """The tools and template arguments as canonical JSON (sorted keys), computed once per call:
  an external CLI's tool schemas are ~30 kB, which `json.dumps(sort_keys=True)` took 0.15 ms
  to serialise and orjson 0.03 ms. orjson writes NaN and infinities as null, so a key holding
  null is made by the standard library instead (which keeps them apart), as is one with an
  integer beyond 64 bits, which orjson refuses."""
  value = [tools or [], template_kwargs]
  try:
    key = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if b"null" not in key:
      return key
  except TypeError:   # orjson.JSONEncodeError: an integer beyond 64 bits
    pass
  return json.dumps(value, sort_keys=True, ensure_ascii=False).encode()


class RecordingProxy:
  """The recording proxy as a context manager serving on host:port (see module docstring).

  Args:
    upstream: `SGLangUpstream` (token-level) or `OpenAIUpstream` (text-level).
    tokenizer: the policy's `data.Tokenizer` (needed for a token-level upstream).
    store: a `data.TrajectoryStore` to append model calls to (None records nothing).
    tool_call_parser: data.TOOL_CALL_PARSERS name for the model family.
    served_model_name: model id reported to harnesses.
    sampling_defaults: SamplingParams fields used when a request does not set them (e.g.
      {"max_new_tokens": 2048}).
    sampling_overrides: SamplingParams fields that replace the request's (e.g. an RL recipe
      forcing {"temperature": 1.0}).
    host, port: where to listen (port 0 picks a free one).
    freeze_gc: on entering, move every object alive in the process to the garbage
      collector's permanent generation (`gc.freeze`), so full collections, which otherwise
      stall the proxy's event loop for ~0.2 s in a process holding JAX and transformers,
      scan only objects made afterwards; leaving unfreezes them (`gc.unfreeze`). A
      process-wide setting; pass False to leave the collector alone.
    image_processor: a vision-language policy's `data.images.ImageProcessor`: chats may show
      images ("image_url" parts with data URLs); each is named by its digest in the records
      and history matching, stored once in the store (`TrajectoryStore.put_image`), its
      placeholder widened to its tokens in the recorded ids, and sent upstream as image_data.
      None: the policy reads text only (image parts are a 400).
    max_request_bytes: the largest request body accepted; a longer one (announced by its
      Content-Length or not) is answered 413 in the wire's error shape before it is parsed,
      so a harness (model-written code inside a sandbox) cannot make the proxy, which lives in
      the trainer's process, hold and tokenise an unbounded body. The default, 64 MiB, is far
      above any context a policy reads (images travel inline as data URLs).

  Attributes:
    app: the FastAPI app (health, models, session end, OpenAPI schema). The server puts
      `_WireFastPath` in front of it, so model calls do not pass through middleware
      added to `app`.
  """

  def __init__(self, upstream: Union[SGLangUpstream, OpenAIUpstream], *, tokenizer: Any = None,
               store: Any = None, tool_call_parser: str = "qwen3",
               served_model_name: str = "orchard",
               sampling_defaults: Optional[dict] = None,
               sampling_overrides: Optional[dict] = None, host: str = "127.0.0.1",
               port: int = 0, freeze_gc: bool = True, image_processor: Any = None,
               max_request_bytes: int = MAX_REQUEST_BYTES):
    if not upstream.text_only and tokenizer is None:
      raise RequestError("a token-level upstream needs the policy's tokenizer to render prompts")
    self.upstream = upstream
    self.tokenizer = tokenizer
    self.store = store
    self.tool_call_parser = tool_call_parser
    self.served_model_name = served_model_name
    self.sampling_defaults = dict(sampling_defaults or {})
    self.sampling_overrides = dict(sampling_overrides or {})
    self.freeze_gc = freeze_gc
    self.max_request_bytes = check_limit(max_request_bytes, "RecordingProxy max_request_bytes")
    if image_processor is not None and (tokenizer is None or tokenizer.image_token_id is None):
      raise RequestError("an image processor needs the policy's vision-language tokenizer "
                         "(one with <|image_pad|>)")
    self.image_processor = image_processor
    self.builder = PromptBuilder(tokenizer) if tokenizer is not None else None
    self.sessions: dict[str, _Session] = {}
    self.writer = RecordWriter(store) if store is not None else None
    self.app = self._create_app()
    self._server = BackgroundServer(_WireFastPath(self, self.app), host=host, port=port)

  # ------------------------------------------------------------------ lifecycle

  @property
  def url(self) -> str:
    return self._server.url

  def session_url(self, session_id: str) -> str:
    """The OpenAI base URL a harness uses for one session."""
    if not session_id or "/" in session_id:
      raise RequestError(f"session id {session_id!r} must be non-empty and contain no '/'")
    return f"{self.url}/sessions/{session_id}/v1"

  def end_session(self, session_id: str, timeout_s: float = 60.0) -> None:
    """Wait until the session's records are in the store, then forget its state (records
    stay in the store). Call from outside the proxy's event loop (recipes, harness drivers)."""
    self.flush(session_id, timeout_s=timeout_s)
    self._forget(session_id)

  def _forget(self, session_id: str) -> None:
    self.sessions.pop(session_id, None)
    self.upstream.release_session(session_id)

  def flush(self, session_id: Optional[str] = None, timeout_s: float = 60.0) -> None:
    """Block until every answered call (of one session, or all) has been appended to the
    store.

    Raises:
      SessionError: records still pending after timeout_s.
    """
    if self.writer is not None:
      self.writer.flush(session_id, timeout_s=timeout_s)

  def _reserve(self, session_id: str) -> None:
    if self.writer is not None:
      self.writer.reserve(session_id)

  def _record(self, session_id: str, build: Any, *, reserved: bool = False) -> None:
    if self.writer is not None:   # woken once the answer is sent (`_after_answer`)
      self.writer.submit(session_id, build, wake=False, reserved=reserved)

  def _wake_writer(self) -> None:
    if self.writer is not None:
      self.writer.wake()

  def __enter__(self) -> "RecordingProxy":
    if self.freeze_gc:
      # Full collections scan every tracked object; in a process that has imported JAX and
      # transformers one took ~0.2 s, stalling every session's call in flight. Objects alive
      # now (modules, the model) are left out of later collections.
      gc.freeze()
    self._server.start()
    return self

  def __exit__(self, *exc: Any) -> None:
    self._server.stop()
    if self.freeze_gc:
      gc.unfreeze()   # frozen objects that became garbage meanwhile can be collected again
    if self.writer is not None:
      try:
        self.writer.close(timeout_s=60.0)
      except SessionError:
        _log.exception("leaving the proxy with unwritten records")

  # ------------------------------------------------------------------ app

  def _create_app(self) -> fastapi.FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: fastapi.FastAPI):
      yield
      await self.upstream.aclose()

    app = fastapi.FastAPI(title="orchard_jax recording proxy", lifespan=lifespan)
    app.add_middleware(JSONErrors)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: fastapi.Request, exc: RequestValidationError):
      return error_response(validation_message(exc.errors()), 400)

    @app.exception_handler(RolloutError)
    async def _rollout(request: fastapi.Request, exc: RolloutError):
      return _rollout_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _no_route(request: fastapi.Request, exc: StarletteHTTPException):
      # A base URL set wrong (the proxy's root, an Anthropic base URL ending in /v1, a session
      # id holding '/') is the usual cause: name the routes a harness should call.
      routes = ("POST /sessions/{id}/v1/chat/completions, /sessions/{id}/v1/responses or "
                "/sessions/{id}/v1/messages (base URL /sessions/{id}/v1, or /sessions/{id} for "
                "Anthropic clients; a session id holds no '/')")
      if exc.status_code == 404:
        return error_response(f"no route {request.method} {request.url.path}; model calls "
                              f"go to {routes}", 404, "NotFoundError")
      if exc.status_code == 405:
        return error_response(f"{request.method} is not allowed on {request.url.path}; model "
                              f"calls are {routes}", 405, "MethodNotAllowedError")
      return error_response(str(exc.detail), exc.status_code, "HTTPError")

    @app.get("/health")
    async def health():
      return {"status": "ok", "sessions": len(self.sessions)}

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str):
      return {"object": "list", "data": [{"id": self.served_model_name, "object": "model",
                                          "created": 0, "owned_by": "orchard_jax"}]}

    # Served by `_WireFastPath` ahead of FastAPI's middleware and routing; declared here too
    # for the OpenAPI schema and for callers of `self.app` (the same handler either way).
    for suffix, wire in WIRES.items():
      self._declare_wire_route(app, suffix, wire)

    @app.post(_PREFIX + "{session_id}/v1/messages/count_tokens")
    async def count_tokens(session_id: str, raw: fastapi.Request):
      try:   # an Anthropic route: its errors in Anthropic's shape, as the Messages wire's
        return await self._count_tokens(await raw.body())
      except RolloutError as e:
        return MESSAGES.error(_rollout_message(e), _rollout_status(e))

    @app.delete("/sessions/{session_id}")
    async def end(session_id: str):
      self._wake_writer()
      while self.writer is not None and self.writer.pending(session_id):
        await asyncio.sleep(0.001)
      self._forget(session_id)
      return {"ended": session_id}

    return app

  def _declare_wire_route(self, app: fastapi.FastAPI, suffix: str, wire: Wire) -> None:
    async def handler(session_id: str, raw: fastapi.Request):
      # Reached only by callers of `app` itself: the server answers model calls through
      # `_WireFastPath`, which also sees whether an answer was delivered. Here it is assumed.
      answer = await self._serve(wire, session_id, await raw.body())
      answer.settle(True)
      return answer.response

    app.post(_PREFIX + "{session_id}/v1/" + suffix, response_model=None, name=wire.name)(handler)

  async def _serve(self, wire: Wire, session_id: str, raw_body: bytes) -> _Answer:
    """One model call of a session on `wire`: the answer to send, then to settle.

    The body is validated by pydantic-core straight from JSON bytes and the answer serialised
    by it (a declared FastAPI body parameter and a JSONResponse cost about twice the CPU).
    The session is held from here until the answer was settled (a streamed call: until its
    last event was sent), so its calls are recorded and committed one at a time, in order.

    Raises:
      RolloutError: RequestError for an invalid body, UpstreamError, SessionError.
    """
    size = len(raw_body)   # a large request's parsing and rendering run off the event loop
    request, wire_request = await off_loop(size, wire.parse, raw_body)
    if not self.upstream.text_only:  # we render the prompt; a hosted API checks its own
      check_chat_request(request, images=self.image_processor is not None)
    session = self.sessions.get(session_id)
    if session is None:
      session = self.sessions.setdefault(session_id, _Session(session_id))
    await session.lock.acquire()
    partials = call = None
    try:
      if not self.upstream.text_only and request.stream:
        call = await off_loop(size, self._plan_call, session, request, wire.name, size)
        # The first result (after prefill and one decode step) is awaited before the answer
        # starts, so a request the upstream refuses is an HTTP error, as when not streamed.
        partials = self.upstream.generate_stream(
          call.plan.ids, call.params, session_id=session.id,
          top_logprobs_num=request.top_logprobs or 0, **self._image_kwargs(call))
        first = await partials.__anext__()
        events = self._stream_call(session, request, call, partials, first,
                                   wire.stream(wire_request, self.served_model_name))
        return _Answer(_LockedStream(events, session.lock, media_type="text/event-stream",
                                     background=BackgroundTask(self._after_stream, session),
                                     upstream=partials),
                       streamed=True)
      if self.upstream.text_only:
        data, commit = await self._text_only_call(session, request, wire.name)
        response = self._text_only_response(wire, wire_request, request, data)
      else:
        chat, commit = await self._token_call(session, request, wire.name, size)
        logprobs = chat.choices[0].logprobs
        entries = sum(1 + len(c.top_logprobs) for c in logprobs.content) if logprobs else 0
        response = Response(await off_loop(100 * entries, wire.body, wire_request, chat,
                                           self.served_model_name),
                            media_type="application/json")
      self._reserve(session.id)   # flush() waits for the record from here on
    except BaseException as e:
      if partials is not None:
        await partials.aclose()
        if isinstance(e, asyncio.CancelledError):   # the caller went away during prefill
          self._record_abandoned(session, call)
      session.lock.release()
      if isinstance(e, StopAsyncIteration):
        raise UpstreamError("the upstream stream ended without a result") from None
      raise

    def release() -> None:
      session.lock.release()
      self._after_answer(session)

    return _Answer(response, commit, release)

  def _text_only_response(self, wire: Wire, wire_request: Any, request: ChatCompletionRequest,
                          data: dict) -> Response:
    """A text-level upstream's chat completion in the wire's shape (streamed as one body)."""
    if wire is CHAT and not request.stream:
      return Response(orjson.dumps(data), media_type="application/json")
    chat = ChatCompletionResponse.model_validate(data)
    if not request.stream:
      return Response(wire.body(wire_request, chat, self.served_model_name),
                      media_type="application/json")
    stream = wire.stream(wire_request, self.served_model_name)
    message = chat.choices[0].message
    events = (stream.open(chat.usage.prompt_tokens)
              + stream.delta(message.reasoning_content or "", message.content or "")
              + stream.close(chat))
    return Response(events, media_type="text/event-stream")

  async def _stream_call(self, session: _Session, request: ChatCompletionRequest, call: "_Call",
                         partials: AsyncIterator[Any], first: Any, stream: Any
                         ) -> AsyncIterator[str]:
    """The events of one streamed call: the wire's opening events, reasoning and content
    deltas after each engine step (`partials`, whose first result is `first`), then the
    parsed turn's closing events.

    The call is committed (the session's history moves on) and recorded once its closing
    events were handed to the server, i.e. when the response asks for more after them. A
    caller that goes away before (the response cancels this generator or closes it) aborts
    the upstream stream, and the call is recorded undelivered with the output generated so
    far. A stream the upstream failed records nothing."""
    yield stream.open(len(call.plan.ids))
    splitter = TurnSplitter(reasoning_open=self._opens_reasoning(call.plan.ids))
    out, commit = None, None
    try:
      try:
        async with contextlib.aclosing(partials):
          out = first
          while out.meta_info.finish_reason is None:
            text = stream.delta(*splitter.feed(out.text))
            if text:
              yield text
            try:
              out = await partials.__anext__()
            except StopAsyncIteration:
              raise UpstreamError("the upstream stream ended before the turn finished") from None
        last = stream.delta(*splitter.finish(out.text))
        response, commit = await off_loop(_answer_size(request, out), self._finish_call,
                                          session, request, call, out, time.perf_counter())
      except RolloutError as e:
        _log.warning("streamed call of session %s failed: %s", session.id, e)
        yield stream.fail(str(e), _rollout_status(e))
        return
      message = response.choices[0].message
      if request.separate_reasoning is False:
        remainder = ("", "")
      else:
        remainder = splitter.remainder(message.reasoning_content, message.content)
      self._reserve(session.id)   # flush() waits for the record from here on
      yield last + stream.close(response, remainder)
      done, commit = commit, None
      done(True)
    except (GeneratorExit, asyncio.CancelledError):
      if commit is not None:        # the turn was done but its closing events never went out
        done, commit = commit, None
        done(False)
      else:
        self._record_abandoned(session, call, out)
      raise

  async def _after_stream(self, session: _Session) -> None:
    """`_after_answer` as a streamed response's background task (a coroutine: Starlette runs
    a plain function given as a background task in its thread pool)."""
    self._after_answer(session)

  def _opens_reasoning(self, prompt_ids: list[int]) -> bool:
    """Whether the prompt's generation prompt leaves a think block open."""
    tail = self.tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)
    return tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)

  async def _count_tokens(self, raw_body: bytes) -> Response:
    """`/v1/messages/count_tokens`: the prompt's length in the policy's tokens, rendered from
    scratch (Anthropic's shape, {"input_tokens": n})."""
    request, _ = await off_loop(len(raw_body), MESSAGES.parse, raw_body)
    if self.tokenizer is None:
      raise RequestError("count_tokens needs the policy's tokenizer (a token-level upstream)")
    check_chat_request(request)
    try:
      ids = await off_loop(len(raw_body), self.tokenizer.render_chat,
                           template_messages(request.messages), request.offered_tools(),
                           add_generation_prompt=True,
                           **dict(request.chat_template_kwargs or {}))
    except ChatTemplateError as e:
      raise RequestError(f"the chat template cannot render these messages: {e}") from None
    return Response(orjson.dumps({"input_tokens": len(ids)}), media_type="application/json")

  def _after_answer(self, session: _Session) -> None:
    """Work left for after the answer was sent: wake the record writer, and render the
    returned turn for the session's next call (`PromptBuilder.prepare`)."""
    self._wake_writer()
    todo, session.unprepared = session.unprepared, None
    if todo is not None and self.builder is not None:
      self.builder.prepare(*todo)

  def _sampling(self, request: ChatCompletionRequest) -> SamplingParams:
    """The request's sampling settings (validated), with the proxy's defaults for fields the
    request left unset and its overrides.

    The request's settings are validated as they are, then only the fields the proxy changes:
    no check of `SamplingParams` spans two fields, so that equals validating the merged
    settings whole, and costs a fifth of it (test_proxy_sampling holds them equal).

    Raises:
      RequestError: invalid or unsupported settings, the request's or the proxy's.
    """
    params = sampling_params_of(request, request.max_new_tokens)
    changes = {name: value for name, value in self.sampling_defaults.items()
               if name not in request.model_fields_set and not (
                 name == "max_new_tokens" and request.max_new_tokens is not None)}
    changes.update(self.sampling_overrides)
    if not changes:
      return params
    try:
      changed = SamplingParams(**changes)
    except ValueError as e:
      raise RequestError(f"invalid sampling settings after proxy defaults/overrides: {e}") from e
    return params.model_copy(update={name: getattr(changed, name) for name in changes
                                     if name in SamplingParams.model_fields})

  def _image_kwargs(self, call: "_Call") -> dict:
    """The upstream's images argument of a call (nothing for a chat without images, so a
    text-only upstream's signature is not required to take it)."""
    return {"images": call.image_urls()} if call.images is not None else {}

  def _store_images(self, images: Optional[ChatImages]) -> list[str]:
    """Stores a call's images in the trajectory store (each once: content-addressed) and
    returns their digests; run by the record writer, off the answer's path."""
    if images is None:
      return []
    if self.store is not None:
      for blob in images.blobs:
        self.store.put_image(blob)
    return list(images.digests)

  def _plan_call(self, session: _Session, request: ChatCompletionRequest,
                 wire: str = "chat_completions", size: int = 0) -> "_Call":
    """The prompt ids and sampling settings of one call (nothing sent yet; the session is
    not changed). `size`: the request body's bytes; a large call is planned in a worker
    thread (`offload.off_loop`), so this touches no event-loop object.

    Raises:
      RequestError: invalid sampling settings, or messages the chat template cannot render.
    """
    started_at, t0 = time.time(), time.perf_counter()
    messages = template_messages(request.messages)
    images = None
    if self.image_processor is not None:
      # Images are named by digest from here on (history matching, records); the prompt's
      # placeholders are widened to each image's tokens, the ids the engine prefills.
      messages, images = resolve_chat_images(messages, self.image_processor)
    tools = request.offered_tools()
    kwargs = dict(request.chat_template_kwargs or {})
    params = self._sampling(request)
    try:
      plan = self.builder.plan(session, messages, tools, kwargs)
    except ChatTemplateError as e:
      raise RequestError(f"the chat template cannot render these messages: {e}") from None
    if images is not None:
      try:
        ids = expand_image_tokens(plan.ids, self.tokenizer.image_token_id, images.num_tokens)
      except ImageError as e:
        raise RequestError(f"the chat template's image placeholders: {e}") from None
      plan = dataclasses.replace(plan, ids=ids)
    return _Call(started_at, t0, time.perf_counter(), messages, tools, kwargs, plan, params, wire,
                 images, size)

  async def _token_call(self, session: _Session, request: ChatCompletionRequest,
                        wire: str = "chat_completions", size: int = 0
                        ) -> tuple[ChatCompletionResponse, Callable[[bool], None]]:
    """One chat completion through a token-level upstream: the response, and the function
    that commits the call to the session and records it once delivery is known
    (`_finish_call`). A caller that goes away meanwhile cancels this, and the call is recorded
    undelivered (`_record_abandoned`)."""
    call = await off_loop(size, self._plan_call, session, request, wire, size)
    try:
      out = await self.upstream.generate(call.plan.ids, call.params, session_id=session.id,
                                         top_logprobs_num=request.top_logprobs or 0,
                                         **self._image_kwargs(call))
    except asyncio.CancelledError:   # the caller went away: the upstream request was closed
      self._record_abandoned(session, call)
      raise
    # A long turn's parsing and log-probs (with top_logprobs, seconds) run off the event loop.
    return await off_loop(_answer_size(request, out), self._finish_call, session, request, call,
                          out, time.perf_counter())

  def _segment_of(self, session: _Session, plan: PromptPlan) -> int:
    """The call's segment: the session's, plus one when the prompt does not extend the last
    delivered call's ids (the counter itself moves when the call is committed delivered)."""
    return session.segment_index + (session.latest is not None and not plan.continues_segment)

  def _finish_call(self, session: _Session, request: ChatCompletionRequest, call: "_Call",
                   out: Any, t2: float
                   ) -> tuple[ChatCompletionResponse, Callable[[bool], None]]:
    """Parse the generated turn: the chat completion, and `commit(delivered)`, which moves the
    session (history checkpoints, segment and call counters; only the call counter when the
    answer was not delivered) and submits the call's record (taking a writer reservation).

    Raises:
      UpstreamError: the upstream sent no log-probs of the sampled tokens.
    """
    plan, params, messages, tools, kwargs = (call.plan, call.params, call.messages, call.tools,
                                             call.kwargs)
    try:
      output_logprobs = out.output_logprobs
    except ValueError as e:
      raise UpstreamError(str(e), url=self.upstream.description) from None
    message, parsed = assistant_message(out.text, tools, parser=self.tool_call_parser,
                                        separate_reasoning=request.separate_reasoning)
    finish = out.meta_info.finish_reason
    logprobs = None
    if request.logprobs or request.top_logprobs:
      logprobs = token_logprobs(self.tokenizer, out.output_ids, output_logprobs,
                                out.meta_info.output_top_logprobs, request.top_logprobs or 0)
    response = chat_completion(
      request, message=message, finish_type=finish.type if finish else None,
      matched=finish.matched if finish else None, prompt_tokens=len(plan.ids),
      completion_tokens=len(out.output_ids), logprobs=logprobs, model=self.served_model_name)
    returned = message.model_dump(exclude_none=True)
    # The turn is closed only by the chat template's end-of-turn token; a turn cut by a stop
    # string, another stop id or the length limit gets it from the next prompt's continuation
    # (`PromptBuilder._new_text`), as the template renders every assistant turn.
    closed = bool(out.output_ids) and out.output_ids[-1] == self.tokenizer.eos_id
    segment_index = self._segment_of(session, plan)
    t3, finished_at = time.perf_counter(), time.time()
    timing = {"prompt": call.t1 - call.t0, "upstream": t2 - call.t1, "response": t3 - t2,
              "total": t3 - call.t0}

    def commit(delivered: bool) -> None:
      call_index = session.call_index
      session.call_index += 1
      if delivered:
        # Checkpoints share the prompt's id list (never mutated: a later prompt is a new list).
        request_cp = _Checkpoint(plan.key, plan.ids, False, False, call_index)
        answer_cp = _Checkpoint(plan.key + (message_key(returned),),
                                plan.ids + out.output_ids, True, closed, call_index)
        session.segment_index = segment_index
        session.context_key = plan.context
        session.checkpoints = (session.checkpoints
                               + [request_cp, answer_cp])[-2 * _CHECKPOINTS_KEPT:]
        session.latest = answer_cp
        system = [messages[0]] if messages[0].get("role") == "system" else []
        if call.size < OFF_LOOP_BYTES:   # a large one's next call renders in a worker thread
          session.unprepared = (answer_cp, system + template_messages([returned]), tools,
                                kwargs)
        session.prompt_tokens += len(plan.ids)
        session.completion_tokens += len(out.output_ids)

      def record() -> ModelCall:
        metadata = {"timing_s": timing, "reused_prompt_ids": plan.reused,
                    "upstream": self.upstream.description, "rid": out.meta_info.id,
                    "wire": call.wire, "stream": bool(request.stream),
                    "format_errors": [dataclasses.asdict(e) for e in parsed.errors]}
        if not delivered:
          metadata["undelivered"] = ("the caller disconnected before the whole answer was "
                                     "sent; the session continued from its last delivered call")
        return ModelCall(
          images=self._store_images(call.images),
          session_id=session.id, call_index=call_index, prompt_ids=plan.ids,
          output_ids=out.output_ids, output_logprobs=output_logprobs,
          segment_index=segment_index, messages=messages, tools=tools,
          response=returned, finish_reason=response.choices[0].finish_reason,
          delivered=delivered, text_only=False, model=self.served_model_name,
          policy_version=_version(out.meta_info.weight_version),
          temperature=params.logprob_temperature,
          sampling_params=params.model_dump(exclude_defaults=True),
          started_at=call.started_at, finished_at=finished_at, metadata=metadata)

      self._record(session.id, record, reserved=True)

    return response, commit

  def _record_abandoned(self, session: _Session, call: "_Call", partial: Any = None) -> None:
    """Record a call whose caller went away while it was generated (its upstream request was
    closed, which aborts it in the engine): undelivered, finish reason abort, with the output
    a stream had produced so far (none otherwise); the session does not move but for its
    call counter."""
    call_index = session.call_index
    session.call_index += 1
    finished_at = time.time()
    output_ids, output_logprobs = [], []
    if partial is not None:
      try:
        output_logprobs = partial.output_logprobs
        output_ids = list(partial.output_ids)[:len(output_logprobs)]
        output_logprobs = output_logprobs[:len(output_ids)]
      except ValueError:
        output_ids, output_logprobs = [], []

    def record() -> ModelCall:
      return ModelCall(
        images=self._store_images(call.images),
        session_id=session.id, call_index=call_index, prompt_ids=call.plan.ids,
        output_ids=output_ids, output_logprobs=output_logprobs,
        segment_index=self._segment_of(session, call.plan), messages=call.messages,
        tools=call.tools, response=None, finish_reason="abort", delivered=False,
        text_only=False, model=self.served_model_name,
        temperature=call.params.logprob_temperature,
        sampling_params=call.params.model_dump(exclude_defaults=True),
        started_at=call.started_at, finished_at=finished_at,
        metadata={"upstream": self.upstream.description, "reused_prompt_ids": call.plan.reused,
                  "wire": call.wire, "undelivered": "the caller disconnected while the call "
                                                   "was generated; the upstream request was "
                                                   "aborted"})

    self._record(session.id, record)
    self._wake_writer()

  async def _text_only_call(self, session: _Session, request: ChatCompletionRequest,
                            wire: str = CHAT.name
                            ) -> tuple[dict[str, Any], Callable[[bool], None]]:
    """One chat completion through a text-level upstream: the response body, and the function
    that records the call (text-only, with the wire it came on) once delivery is known."""
    started_at, t0 = time.time(), time.perf_counter()
    body = request.model_dump(exclude_unset=True)
    body.pop("stream", None)
    data = await self.upstream.chat(body)
    choice = data["choices"][0]
    total, finished_at = time.perf_counter() - t0, time.time()

    def commit(delivered: bool) -> None:
      call_index = session.call_index
      session.call_index += 1

      def record() -> ModelCall:
        # Images the hosted model was shown are stored once and named by digest, as for a
        # token-level upstream (text-only records with images can train SFT).
        messages, images = template_messages(request.messages), None
        try:
          messages, images = resolve_chat_images(messages, None)
        except RequestError:
          _log.warning("session %s: an image of a text-only call could not be read; its "
                       "messages are recorded as sent", session.id)
        return ModelCall(
          images=self._store_images(images),
          session_id=session.id, call_index=call_index,
          messages=messages, tools=request.offered_tools(),
          response=choice.get("message"), finish_reason=choice.get("finish_reason"),
          delivered=delivered, text_only=True, model=data.get("model") or self.upstream.model,
          sampling_params={k: v for k, v in body.items()
                           if k not in ("messages", "tools", "model", "tool_choice")},
          started_at=started_at, finished_at=finished_at,
          metadata={"timing_s": {"total": total}, "wire": wire,
                    "stream": bool(request.stream),
                    "upstream": self.upstream.description, "usage": data.get("usage")})

      self._record(session.id, record, reserved=True)

    return data, commit


_PREFIX = "/sessions/"


def _answer_size(request: ChatCompletionRequest, out: Any) -> int:
  """About how many bytes of JSON the answer to `out` takes (`offload.off_loop`'s size)."""
  return answer_bytes(out, request.top_logprobs or 0,
                      bool(request.logprobs or request.top_logprobs))


class _LockedStream(StreamingResponse):
  """A streaming response that releases its session's lock once it is over, also when the
  client went away before the body's first event (its generator then never starts)."""

  def __init__(self, content: AsyncIterator[str], lock: asyncio.Lock, *,
               upstream: Optional[AsyncIterator[Any]] = None, **kwargs: Any):
    super().__init__(content, **kwargs)
    self._lock = lock
    self._upstream = upstream   # closed here too when the body's generator never started

  async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
    try:
      await super().__call__(scope, receive, send)
    finally:
      await self._close()

  async def send_watched(self, watch: DisconnectWatch, send: Callable) -> None:
    """Stream the events to `send` unless the caller goes away (`watch` sees it, and cancels
    the stream: the body's generator records its call undelivered), then run the background
    task. What `__call__` does, without the anyio task group Starlette watches with under an
    ASGI server of spec 2.3 (uvicorn's), which cost ~0.3 ms of CPU per streamed call."""
    try:
      try:
        await watch.run(self.stream_response(send))
      except ClientDisconnected:
        pass
      if self.background is not None:
        await self.background()
    finally:
      await self._close()

  async def _close(self) -> None:
    for iterator in (self.body_iterator, self._upstream):
      aclose = getattr(iterator, "aclose", None)
      if aclose is not None:
        await aclose()
    if self._lock.locked():
      self._lock.release()


def _wire_of(path: str) -> Optional[tuple[str, Wire]]:
  """(session id, wire) of a model-call path `/sessions/{id}/v1/{wire path}`, else None."""
  if not path.startswith(_PREFIX):
    return None
  session_id, sep, rest = path[len(_PREFIX):].partition("/v1/")
  wire = WIRES.get(rest) if sep else None
  if wire is None or not session_id or "/" in session_id:
    return None
  return session_id, wire


class _WireFastPath:
  """ASGI app in front of the proxy's FastAPI app: serves `POST /sessions/{id}/v1/{chat/
  completions, responses, messages}` itself (Starlette's Request and Response, the same
  `RecordingProxy._serve`) and hands everything else, lifespan included, to FastAPI.

  FastAPI's middleware stack, routing and dependency solving cost ~0.2 ms of CPU per request
  on the routes every model call takes; errors get the same bodies as FastAPI's handlers,
  in each wire's shape.
  """

  def __init__(self, proxy: "RecordingProxy", app: fastapi.FastAPI):
    self.proxy = proxy
    self.app = app

  async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    path = scope.get("path", "")
    found = _wire_of(path) if scope["method"] == "POST" else None
    try:   # every route's body is bounded, count_tokens' and the session routes' too
      body = await read_body(scope, receive, self.proxy.max_request_bytes,
                             setting="RecordingProxy max_request_bytes")
    except ClientDisconnect:
      return
    except BodyTooLarge as e:
      wire = found[1] if found else (WIRES["messages"] if "/v1/messages" in path
                                     else WIRES["chat/completions"])
      return await wire.error(str(e), 413)(scope, receive, send)
    if found is None:
      return await self.app(scope, replayed(body, receive), send)
    session_id, wire = found
    async with DisconnectWatch(receive) as watch:
      try:
        # A caller that goes away cancels its call (and the upstream request with it).
        answer = await watch.run(self.proxy._serve(wire, session_id, body))
      except ClientDisconnected:
        return
      except RolloutError as e:
        return await wire.error(_rollout_message(e), _rollout_status(e))(scope, receive, send)
      except Exception as e:  # noqa: BLE001 - answer like FastAPI would, with the reason
        _log.exception("%s call of session %s failed", wire.name, session_id)
        response = wire.error(f"internal error: {type(e).__name__}: {e}", 500)
        return await response(scope, receive, send)
      if answer.streamed:
        return await answer.response.send_watched(watch, send)
      delivered = False
      try:
        delivered = await watch.deliver(answer.response, scope, receive, send)
      finally:
        answer.settle(delivered)


def _rollout_status(exc: RolloutError) -> int:
  """400 for a bad request (or one the upstream refused as bad), 502 for another upstream
  failure, 503 otherwise."""
  if isinstance(exc, RequestError):
    return 400
  if isinstance(exc, UpstreamError):
    return 400 if exc.status_code == 400 else 502
  return 503


def _rollout_message(exc: RolloutError) -> str:
  return f"upstream {exc.url}: {exc}" if isinstance(exc, UpstreamError) else str(exc)


def _rollout_error_response(exc: RolloutError) -> Response:
  """The OpenAI-style error answer for a rollout error: 400 for a bad request (or one the
  upstream refused as bad), 502 for another upstream failure, 503 otherwise."""
  if isinstance(exc, RequestError):
    return error_response(str(exc), 400)
  if isinstance(exc, UpstreamError):
    status = 400 if exc.status_code == 400 else 502
    return error_response(f"upstream {exc.url}: {exc}", status,
                          "BadRequestError" if status == 400 else "UpstreamError")
  return error_response(str(exc), 503, "ServiceUnavailableError")


def _version(value: Optional[str]) -> Optional[int]:
  try:
    return int(value) if value is not None else None
  except ValueError:
    return None
