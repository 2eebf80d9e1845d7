"""The embedded engine's HTTP server: SGLang's native endpoints and the OpenAI-compatible ones.

Native (SGLang wire format, protocol.py):
  POST /generate                    text or input_ids, sampling_params, return_logprob,
                                    image_data (vision-language models), ...
                                    (batched prompts; "stream": true answers with SSE)
  GET  /health, /health_generate    liveness; the latter generates one token
  GET  /get_model_info, /model_info model path, weight_version, plus compile_count
  GET  /get_server_info             engine configuration and load
  GET  /get_weight_version, /weight_version
  POST /update_weights_from_disk    {"model_path", "load_format", "weight_version"}
  POST /flush_cache                 drops the prefix cache's resident rows (every scheduler)
OpenAI-compatible:
  GET  /v1/models
  POST /v1/chat/completions         messages + tools rendered by the model's chat template,
                                    tool calls parsed back, logprobs; a vision-language model
                                    also reads "image_url" parts (data URLs, file paths)
  POST /v1/completions              text or id prompts

Errors answer {"object": "error", "message", "type", "param", "code"} with HTTP 400 for bad
requests (the message names the field), 413 for a body over `max_request_bytes` (refused
before it is read further, `body_limit`), 503 when the engine cannot serve, and a JSON 500 for
a fault of the server itself; the connection stays usable after any of them. A client that
disconnects before its answer aborts its engine requests (queued ones never run, running ones
leave their batch at the next step). A large request's parsing, rendering and tokenising, and a
long answer's detokenising and serialising, run off the event loop (`offload.off_loop`), so one
client's 5 MB prompt does not hold up the others.

Example (in-process, e.g. in a recipe or test):
  with InferenceServer(engine) as server:
    client = SGLangClient(server.url)
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator

import fastapi
import pydantic
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from orchard_jax.data import ChatTemplateError
from orchard_jax.data.images import image_parts
from orchard_jax.rollout.background import BackgroundServer
from orchard_jax.rollout.body_limit import MAX_REQUEST_BYTES, BodyLimit
from orchard_jax.rollout.disconnect import ClientDisconnected, DisconnectWatch
from orchard_jax.rollout.engine import Engine
from orchard_jax.rollout.errors import RequestError, RolloutError, validation_message
from orchard_jax.rollout.offload import OFF_LOOP_BYTES, off_loop
from orchard_jax.rollout.openai_chat import (
  assistant_message, chat_completion, check_chat_request, sampling_params_of,
  stream_chat_chunks, template_messages, token_logprobs)
from orchard_jax.rollout.openai_protocol import (
  ChatCompletionRequest, CompletionChoice, CompletionLogprobs, CompletionRequest,
  CompletionResponse, Usage, openai_finish_reason)
from orchard_jax.rollout.protocol import (
  GenerateRequest, GenerateResponse, SamplingParams, SingleGenerateRequest,
  UpdateWeightsFromDiskRequest)

_log = logging.getLogger(__name__)


def _validation_message(error: pydantic.ValidationError) -> str:
  """`field.path: what is wrong` per error, as the OpenAI routes report them (pydantic's own
  text carries input echoes and a documentation URL on several lines)."""
  prefix = "sampling_params." if error.title == "SamplingParams" else ""
  return validation_message(error.errors(), prefix)


def error_response(message: str, status: int, kind: str = "BadRequestError") -> JSONResponse:
  """OpenAI/SGLang-style error body."""
  return JSONResponse({"object": "error", "message": message, "type": kind, "param": None,
                       "code": status}, status_code=status)


class JSONErrors:
  """ASGI middleware: an exception that escaped the app's own handlers is answered with a JSON
  500 naming it, instead of Starlette's plain-text one, whose exception the server then sees
  as a broken application (uvicorn closes the keep-alive connection, so the caller's next
  request on it fails too). Once a response has started there is nothing to answer with; the
  exception is logged and the connection left to the server."""

  def __init__(self, app: Any):
    self.app = app

  async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    started = False

    async def tracking_send(message: dict) -> None:
      nonlocal started
      started = started or message["type"] == "http.response.start"
      await send(message)

    try:
      await self.app(scope, receive, tracking_send)
    except Exception as e:  # noqa: BLE001 - answered, not propagated
      _log.exception("request %s %s failed", scope.get("method"), scope.get("path"))
      if started:
        raise
      await error_response(f"internal error: {type(e).__name__}: {e}", 500,
                           "InternalServerError")(scope, receive, send)


async def until_disconnect(raw: fastapi.Request, awaitable: Any) -> Any:
  """`awaitable`'s result, or, when the client disconnects first, cancel it (aborting its
  engine requests) and raise ClientDisconnected (`disconnect.DisconnectWatch`)."""
  async with DisconnectWatch(raw.receive) as watch:
    return await watch.run(awaitable)


def create_app(engine: Engine, *, served_model_name: str = "orchard",
               tool_call_parser: str = "qwen3",
               max_request_bytes: int = MAX_REQUEST_BYTES) -> fastapi.FastAPI:
  """The FastAPI app serving `engine` (see the module docstring for the endpoints).

  Args:
    engine: a started `Engine`.
    served_model_name: the model id reported by /v1/models and in responses.
    tool_call_parser: data.TOOL_CALL_PARSERS name used by /v1/chat/completions.
    max_request_bytes: the largest request body accepted; a longer one (by its Content-Length,
      or as a chunked body arrives) is answered 413 before it is parsed (`body_limit`). The
      default, 64 MiB, is far above any prompt the engine reads (images travel inline).
  Raises:
    ValueError: max_request_bytes is not a whole number >= 1.
  """
  app = fastapi.FastAPI(title="orchard_jax inference engine")
  app.add_middleware(JSONErrors)
  app.add_middleware(   # added last: the outermost, so no route or middleware reads a body first
    BodyLimit, limit=max_request_bytes, setting="InferenceServer max_request_bytes",
    refuse=lambda message: error_response(message, 413, "RequestTooLargeError"))
  warned: set[str] = set()

  @app.exception_handler(RequestValidationError)
  async def _invalid(request: fastapi.Request, exc: RequestValidationError):
    return error_response(validation_message(exc.errors()), 400)

  @app.exception_handler(RequestError)
  async def _bad(request: fastapi.Request, exc: RequestError):
    return error_response(str(exc), 400)

  @app.exception_handler(ChatTemplateError)
  async def _template(request: fastapi.Request, exc: ChatTemplateError):
    return error_response(f"messages: the chat template cannot render them: {exc}", 400)

  @app.exception_handler(ClientDisconnected)
  async def _gone(request: fastapi.Request, exc: ClientDisconnected):
    return fastapi.Response(status_code=499)   # nobody reads it (nginx's "client closed")

  @app.exception_handler(RolloutError)
  async def _engine(request: fastapi.Request, exc: RolloutError):
    return error_response(str(exc), 503, "ServiceUnavailableError")

  async def submit(single: SingleGenerateRequest, **kwargs) -> Any:
    # A request with images is read and preprocessed as it is submitted (tens to hundreds
    # of ms for a screenshot), a long text prompt tokenised: off the event loop, so other
    # requests are not held up.
    size = (OFF_LOOP_BYTES if single.image_data
            else len(single.text or "") + 8 * len(single.input_ids or ()))   # ~bytes as JSON
    return await off_loop(size, engine.submit, single, **kwargs)

  async def run(single: SingleGenerateRequest) -> GenerateResponse:
    return await asyncio.wrap_future(await submit(single))

  # ------------------------------------------------------------------ native

  @app.get("/health")
  async def health():
    return fastapi.Response(status_code=200)

  @app.get("/health_generate")
  async def health_generate():
    await run(SingleGenerateRequest(input_ids=[0], sampling_params=SamplingParams(
      max_new_tokens=1, temperature=0.0)))
    return fastapi.Response(status_code=200)

  @app.get("/get_model_info")
  @app.get("/model_info")
  async def model_info():
    return engine.model_info()

  @app.get("/get_server_info")
  async def server_info():
    config = engine.config
    return {"served_model_name": served_model_name, "tool_call_parser": tool_call_parser,
            "max_batch_size": config.max_batch_size, "batch_buckets": config.batch_buckets,
            "max_seq_len": config.max_seq_len, "cache_len_buckets": config.cache_buckets,
            "prefill_chunk_buckets": config.prefill_chunk_buckets,
            "decode_steps": config.decode_steps, **engine.model_info()}

  @app.get("/get_weight_version")
  @app.get("/weight_version")
  async def weight_version():
    return {"weight_version": engine.weight_version}

  @app.post("/flush_cache")
  async def flush_cache():
    dropped = await asyncio.to_thread(engine.flush_cache)
    return fastapi.Response(content=f"Cache flushed ({dropped} resident rows).\n",
                            status_code=200)

  def parse_generate(body: bytes) -> tuple[GenerateRequest, list[SingleGenerateRequest]]:
    try:
      request = GenerateRequest.model_validate_json(body)
      return request, request.split()
    except pydantic.ValidationError as e:   # not JSON, or not an object: the body as a whole
      whole = all(not error["loc"] for error in e.errors())
      raise RequestError(("request body: " if whole else "") + _validation_message(e)) from e
    except ValueError as e:
      raise RequestError(str(e)) from e

  @app.api_route("/generate", methods=["POST", "PUT"])
  async def generate(raw: fastapi.Request):
    # Parsed from the body's bytes, a large one in a worker thread: 1.8M prompt ids are 15 MB
    # of JSON, ~0.75 s of parsing that held up every other request on the event loop.
    body = await raw.body()
    request, singles = await off_loop(len(body), parse_generate, body)
    if request.stream:
      if request.is_batch:
        raise RequestError("stream=true takes one prompt; send batched prompts unstreamed")
      # Submitted before the response starts, so a prompt the engine refuses (too long,
      # ids outside the vocabulary) is a 400, not a stream broken after its headers.
      loop = asyncio.get_running_loop()
      updates: asyncio.Queue = asyncio.Queue()
      future = await submit(singles[0], on_update=lambda partial: loop.call_soon_threadsafe(
        updates.put_nowait, partial))
      return StreamingResponse(_stream(asyncio.wrap_future(future), updates),
                               media_type="text/event-stream")
    results = await until_disconnect(raw, asyncio.gather(*[run(s) for s in singles]))
    payload = [r.model_dump(mode="json") for r in results]
    return payload if request.is_batch else payload[0]

  @app.post("/update_weights_from_disk")
  async def update_weights(body: UpdateWeightsFromDiskRequest):
    try:
      await asyncio.to_thread(engine.update_weights_from_disk, body.model_path,
                              body.load_format, body.weight_version)
    except RolloutError as e:
      return JSONResponse({"success": False, "message": str(e), "num_paused_requests": 0},
                          status_code=400)
    return {"success": True, "message": "Succeeded to update model weights.",
            "num_paused_requests": 0}

  # ------------------------------------------------------------------ OpenAI

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{
      "id": served_model_name, "object": "model", "created": 0, "owned_by": "orchard_jax",
      "root": engine.model_path or served_model_name,
      "max_model_len": engine.config.max_seq_len}]}

  def note_ignored(request) -> None:
    for name in request.ignored_fields:
      if name not in warned:
        warned.add(name)
        _log.info("ignoring request field %r (not part of this server's API)", name)

  @app.post("/v1/chat/completions")
  async def chat(request: ChatCompletionRequest, raw: fastapi.Request):
    note_ignored(request)
    reads_images = engine.vision_config is not None
    check_chat_request(request, images=reads_images)
    tools = request.offered_tools()
    messages = template_messages(request.messages)
    prompt = await off_loop(len(await raw.body()), engine.tokenizer.render_chat, messages, tools,
                            add_generation_prompt=True, **(request.chat_template_kwargs or {}))
    params = sampling_params_of(request, request.max_new_tokens)
    want_logprobs = request.logprobs or bool(request.top_logprobs)
    out = await until_disconnect(raw, run(SingleGenerateRequest(
      input_ids=prompt, sampling_params=params, return_logprob=want_logprobs,
      top_logprobs_num=request.top_logprobs or 0, rid=request.rid,
      image_data=(image_parts(messages) or None) if reads_images else None)))

    def answer() -> tuple[Any, Any]:
      # Parsing the turn, detokenising its log-probs and serialising the answer grow with the
      # output times top_logprobs (16K tokens with 20 each: ~350K objects, seconds of CPU).
      message, _ = assistant_message(out.text, tools, parser=tool_call_parser,
                                     separate_reasoning=request.separate_reasoning)
      logprobs = None
      if want_logprobs:
        logprobs = token_logprobs(engine.tokenizer, out.output_ids, out.output_logprobs,
                                  out.meta_info.output_top_logprobs, request.top_logprobs or 0)
      finish = out.meta_info.finish_reason
      response = chat_completion(
        request, message=message, finish_type=finish.type if finish else None,
        matched=finish.matched if finish else None, prompt_tokens=out.meta_info.prompt_tokens,
        completion_tokens=out.meta_info.completion_tokens, logprobs=logprobs,
        model=request.model or served_model_name)
      if request.stream:
        return response, None
      return response, response.model_dump_json(exclude_none=True)

    response, body = await off_loop(answer_bytes(out, request.top_logprobs or 0, want_logprobs),
                                     answer)
    if request.stream:
      return StreamingResponse(stream_chat_chunks(response), media_type="text/event-stream")
    return fastapi.Response(body, media_type="application/json")

  @app.post("/v1/completions")
  async def completions(request: CompletionRequest, raw: fastapi.Request):
    note_ignored(request)
    if request.stream:
      raise RequestError("stream=true is not supported on /v1/completions; use /generate")
    try:
      prompts = request.prompts()
    except ValueError as e:
      raise RequestError(str(e)) from e
    params = sampling_params_of(request, request.max_tokens)
    want = request.logprobs is not None
    singles = [SingleGenerateRequest(
      text=p if isinstance(p, str) else None, input_ids=None if isinstance(p, str) else p,
      sampling_params=params, return_logprob=want, top_logprobs_num=request.logprobs or 0)
      for p in prompts]
    results = await until_disconnect(raw, asyncio.gather(*[run(s) for s in singles]))

    def answer() -> str:   # detokenising echoes and log-probs: off the loop when long
      choices, prompt_tokens, completion_tokens = [], 0, 0
      for i, (p, out) in enumerate(zip(prompts, results)):
        text = out.text
        if request.echo:
          text = (p if isinstance(p, str) else engine.tokenizer.decode(p)) + text
        logprobs = None
        if want:
          logprobs = CompletionLogprobs()
          offset = 0
          tops = out.meta_info.output_top_logprobs or [None] * len(out.output_ids)
          for token_id, lp, top in zip(out.output_ids, out.output_logprobs, tops):
            token = engine.tokenizer.decode([token_id])
            logprobs.tokens.append(token)
            logprobs.token_logprobs.append(lp)
            logprobs.text_offset.append(offset)
            logprobs.top_logprobs.append(
              {engine.tokenizer.decode([e[1]]): e[0] for e in top} if top else None)
            offset += len(token)
        finish = out.meta_info.finish_reason
        choices.append(CompletionChoice(
          index=i, text=text, logprobs=logprobs,
          finish_reason=openai_finish_reason(finish.type if finish else None, False),
          matched_stop=finish.matched if finish else None))
        prompt_tokens += out.meta_info.prompt_tokens
        completion_tokens += out.meta_info.completion_tokens
      return CompletionResponse(
        model=request.model or served_model_name, choices=choices,
        usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens)
      ).model_dump_json(exclude_none=True)

    size = sum(answer_bytes(out, request.logprobs or 0, want) for out in results)
    if request.echo:
      size += sum(len(p) * (1 if isinstance(p, str) else 8) for p in prompts)
    return fastapi.Response(await off_loop(size, answer), media_type="application/json")

  return app


def answer_bytes(out: GenerateResponse, top_logprobs: int, logprobs: bool) -> int:
  """About how many bytes of JSON an answer (chat or completion) to `out` takes
  (`offload.off_loop`'s size): its text, and ~100 per returned log-prob entry."""
  entries = len(out.output_ids) * (1 + top_logprobs) if logprobs else 0
  return len(out.text) + 100 * entries


async def _stream(future: asyncio.Future, updates: asyncio.Queue) -> AsyncIterator[str]:
  """SGLang's streaming format: one `data: {cumulative result}` event per engine step (the
  partial results put in `updates`), then the finished result of `future`."""
  try:
    while True:
      getter = asyncio.ensure_future(updates.get())
      done, _ = await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
      if getter in done:
        yield f"data: {json.dumps(getter.result().model_dump(mode='json'))}\n\n"
        continue
      getter.cancel()
      try:
        final = future.result()
      except RolloutError as e:
        yield f"data: {json.dumps({'error': {'message': str(e)}})}\n\n"
        break
      yield f"data: {json.dumps(final.model_dump(mode='json'))}\n\n"
      break
    yield "data: [DONE]\n\n"
  finally:
    future.cancel()   # the client went away mid-stream: abort the engine request


class InferenceServer:
  """The engine and its HTTP server, started and stopped together (a context manager).

  Args:
    engine: the `Engine` to serve (started on enter, stopped on exit unless it was already
      running).
    host, port: where to listen (port 0 picks a free port; read `.url`).
    served_model_name, tool_call_parser, max_request_bytes: see `create_app`.
  """

  def __init__(self, engine: Engine, *, host: str = "127.0.0.1", port: int = 0,
               served_model_name: str = "orchard", tool_call_parser: str = "qwen3",
               max_request_bytes: int = MAX_REQUEST_BYTES):
    self.engine = engine
    self.app = create_app(engine, served_model_name=served_model_name,
                          tool_call_parser=tool_call_parser, max_request_bytes=max_request_bytes)
    self._server = BackgroundServer(self.app, host=host, port=port)
    self._owns_engine = False

  @property
  def url(self) -> str:
    """Base URL of the native API (the OpenAI API is under url + "/v1")."""
    return self._server.url

  def __enter__(self) -> "InferenceServer":
    if not self.engine.is_running:
      self.engine.start()
      self._owns_engine = True
    try:
      self._server.start()
    except Exception:
      if self._owns_engine:
        self.engine.stop()
      raise
    return self

  def __exit__(self, *exc: Any) -> None:
    self._server.stop()
    if self._owns_engine:
      self.engine.stop()
