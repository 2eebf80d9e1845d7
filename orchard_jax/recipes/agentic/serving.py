"""One engine stack for every model a job serves: the policy, the OPD teacher, the distillation
teacher. `ModelService` is a context manager over one of three upstreams:

  embedded        Engine(model) -> InferenceServer      (token ids and log-probs recorded)
  sglang          SGLang servers at `urls`               (token ids and log-probs recorded)
  openai          any OpenAI-compatible endpoint         (messages recorded, marked text_only)

with the recording proxy in front when a trajectory store is given. A harness only ever sees
`service.session_url(session_id)` (the proxy), which records every model call into the store.
`service.score(ids)` gives the model's log-probs of given ids (the OPD teacher).
`service.sync_weights(model, version)` serves new weights: in process for the embedded engine,
and for SGLang by writing a Hugging Face folder under `weights_dir` (shared storage) and calling
`/update_weights_from_disk` on every server. Switching between them is configuration only.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional, Sequence

from orchard_jax.recipes import ConfigError

_log = logging.getLogger(__name__)

APIS = ("sglang", "openai")


class ServingError(ConfigError):
  """A serving setting cannot be used (the message names it, what was expected and seen)."""


class ModelService:
  """A model behind the recording proxy (module docstring).

  Args:
    tokenizer: the model's `data.Tokenizer` (the proxy renders prompts with it); None for an
      OpenAI-compatible upstream.
    model: the model to serve in process (embedded), or None for a remote upstream.
    engine_config: the embedded engine's `rollout.EngineConfig`.
    urls: remote server URLs (empty: embedded).
    api: "sglang" (native /generate, token-level) or "openai" (text-level) for `urls`.
    upstream_model: the `model` an OpenAI-compatible upstream is asked for.
    api_key: a remote upstream's key (never from a config file); None or "" sends none.
    timeout_s, max_retries: a remote upstream's per-call timeout and retries.
    store: the `data.TrajectoryStore` the proxy records into; None serves without a proxy
      (scoring only).
    served_model_name: the model id harnesses see.
    tool_call_parser: data.TOOL_CALL_PARSERS name of the model family.
    model_path: what the embedded engine reports as its model path.
    sampling_defaults: SamplingParams fields the proxy uses when a request sets none.
    weights_dir: where remote SGLang servers load new weights from (shared storage).
    wait_until_ready: wait for every remote SGLang server's /health on entering.
    description: what `description` says ("" describes the upstream).
    image_processor: a vision-language policy's `data.images.ImageProcessor`: chats may show
      images, which the proxy stores once by digest and the engine reads (None: text only).
  """

  def __init__(self, tokenizer, *, model=None, engine_config=None, urls: Sequence[str] = (),
               api: str = "sglang", upstream_model: str = "", api_key: Optional[str] = None,
               timeout_s: float = 600.0, max_retries: int = 3, store=None,
               served_model_name: str = "policy", tool_call_parser: str = "hermes",
               model_path: str = "orchard_jax", sampling_defaults: Optional[dict] = None,
               weights_dir: str = "", wait_until_ready: bool = False, description: str = "",
               image_processor: Any = None):
    self.urls = [u.strip() for u in urls if u.strip()]
    if self.urls and api not in APIS:
      raise ServingError(f"api is {api!r}; expected one of {APIS}")
    if not self.urls and model is None:
      raise ServingError("no model to serve: give a model (embedded engine) or server URLs")
    self.tokenizer = tokenizer
    self.model = model
    self.engine_config = engine_config
    self.api = api
    self.upstream_model = upstream_model
    self.api_key = api_key
    self.timeout_s = float(timeout_s)
    self.max_retries = int(max_retries)
    self.store = store
    self.served_model_name = served_model_name
    self.tool_call_parser = tool_call_parser
    self.model_path = model_path
    self.sampling_defaults = sampling_defaults
    self.weights_dir = weights_dir
    self.wait_until_ready = wait_until_ready
    self._description = description
    self.image_processor = image_processor
    self.version = 0
    self.engine = None
    self.proxy = None
    self._server = None
    self._client = None

  @property
  def remote(self) -> bool:
    return bool(self.urls)

  @property
  def text_only(self) -> bool:
    """The records carry no token ids (an OpenAI-compatible upstream): SFT data, never RL."""
    return self.remote and self.api == "openai"

  @property
  def description(self) -> str:
    """One line saying what is served where."""
    if self._description:
      return self._description
    if not self.remote:
      return f"embedded engine serving {self.model_path}"
    if self.text_only:
      return (f"OpenAI-compatible endpoint {','.join(self.urls)} serving "
              f"{self.upstream_model!r} (records are text-only)")
    return f"SGLang server {','.join(self.urls)} (token ids recorded)"

  def __enter__(self) -> "ModelService":
    from orchard_jax import rollout
    try:
      if self.text_only:
        upstream = rollout.OpenAIUpstream(self.urls[0], self.upstream_model,
                                          api_key=self.api_key or "",
                                          timeout_s=self.timeout_s, max_retries=self.max_retries)
      else:
        if not self.remote:
          self.engine = rollout.Engine(self.model, self.tokenizer, config=self.engine_config,
                                       model_path=self.model_path, weight_version="0",
                                       image_processor=self.image_processor)
          self._server = rollout.InferenceServer(self.engine,
                                                 served_model_name=self.served_model_name,
                                                 tool_call_parser=self.tool_call_parser)
          self._server.__enter__()
          urls = [self._server.url]
        else:
          urls = self.urls
        self._client = rollout.SGLangClient(urls, api_key=self.api_key, timeout_s=self.timeout_s,
                                            max_retries=self.max_retries)
        if self.remote and self.wait_until_ready:
          self._client.wait_until_ready()
        upstream = rollout.SGLangUpstream(urls, api_key=self.api_key, timeout_s=self.timeout_s,
                                          max_retries=self.max_retries)
      if self.store is not None:
        self.proxy = rollout.RecordingProxy(
            upstream, tokenizer=None if self.text_only else self.tokenizer, store=self.store,
            tool_call_parser=self.tool_call_parser, served_model_name=self.served_model_name,
            sampling_defaults=self.sampling_defaults, image_processor=self.image_processor)
        self.proxy.__enter__()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def __exit__(self, *exc) -> None:
    if self.proxy is not None:
      self.proxy.__exit__(None, None, None)
      self.proxy = None
    if self._client is not None:
      self._client.close()
      self._client = None
    if self._server is not None:
      self._server.__exit__(None, None, None)
      self._server = None
    self.engine = None

  def session_url(self, session_id: str) -> str:
    """The OpenAI base URL a harness uses for one rollout (the proxy's per-session URL)."""
    return self.proxy.session_url(session_id)

  def end_session(self, session_id: str) -> None:
    """Flushes the session's records into the store."""
    self.proxy.end_session(session_id)

  def score(self, ids: Sequence[int], temperature: float = 1.0) -> list[Optional[float]]:
    """log p(ids[i] | ids[:i]) under the served model at `temperature` (log_softmax(logits /
    temperature), the distribution a request at that temperature samples from); entry 0 is
    None (no context).

    Raises:
      ServingError: a text-only upstream (it cannot score token ids).
    """
    if self._client is None:
      raise ServingError("a text-only (OpenAI-compatible) upstream cannot score token ids")
    return self._client.score([int(t) for t in ids], temperature=float(temperature))

  def sync_weights(self, model, version: int) -> None:
    """Serves `model`'s weights from now on, labelled `version` (in process or from disk).

    Raises:
      ServingError: remote servers without weights_dir, or a text-only upstream.
    """
    if not self.remote:
      self.engine.update_params(model, weight_version=str(version))
    else:
      if self.text_only:
        raise ServingError("an OpenAI-compatible upstream takes no new weights")
      if not self.weights_dir:
        raise ServingError("remote engines load new weights from disk: set engine.weights_dir "
                           "to a folder every SGLang server can read")
      import jax
      from orchard_jax.models import hf
      folder = os.path.join(self.weights_dir, f"v{version:06d}")
      # Every process takes part in gathering parameters sharded across hosts; process 0
      # writes the folder and then asks the servers to load it; other hosts of a multi-host
      # run must not ask before it is complete (nor make every server reload once per host),
      # so they wait at a barrier.
      if jax.process_count() > 1 or not os.path.exists(os.path.join(folder, "config.json")):
        hf.save_pretrained(model, model.config, folder)
      if jax.process_index() == 0:
        self._client.update_weights_from_disk(folder, weight_version=str(version))
      if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"orchard_sync_weights_{version}")
    self.version = version


def engine_config(engine: Any, seed: int = 0):
  """The embedded engine's `rollout.EngineConfig` from a config's `engine` block.

  Args:
    engine: the block (max_batch_size, max_seq_len, decode_steps, prefix_cache,
      data_parallel; optional batch_buckets, cache_len_buckets, prefill_chunk_buckets);
      batch buckets are the given ones below max_batch_size (default: the powers of two below
      it), then max_batch_size.
    seed: the engine's seed for requests without one.
  Raises:
    ConfigError: sizes the engine refuses, e.g. a data_parallel that does not divide
      max_batch_size.
  """
  from orchard_jax import rollout
  max_batch = int(engine.max_batch_size)
  extra = {}
  for key in ("cache_len_buckets", "prefill_chunk_buckets"):
    if tuple(engine.get(key, ()) or ()):
      extra[key] = tuple(int(v) for v in engine[key])
  if "batch_buckets" in engine:       # given ones below max_batch_size (may be none)
    buckets = tuple(int(b) for b in engine.batch_buckets if int(b) < max_batch)
  else:
    buckets = _powers_below(max_batch)
  try:
    return rollout.EngineConfig(
        max_batch_size=max_batch, batch_buckets=buckets + (max_batch,),
        max_seq_len=int(engine.max_seq_len),
        decode_steps=int(engine.get("decode_steps", 16)),
        prefix_cache=bool(engine.get("prefix_cache", True)), seed=seed,
        data_parallel=int(engine.get("data_parallel", 1)), **extra)
  except rollout.RequestError as e:
    raise ConfigError(f"engine: {e}") from e


def _powers_below(max_batch: int) -> tuple[int, ...]:
  out, size = [], 1
  while size < max_batch:
    out.append(size)
    size *= 2
  return tuple(out)


def policy_service(config, model, tokenizer, store, *, engine_seed: int = 0) -> ModelService:
  """The run's policy behind the proxy: the embedded engine serving `model`, or the SGLang
  servers of `engine.urls` (with new weights from `engine.weights_dir`). A vision-language
  policy's chats may show images (images.image_processor)."""
  from orchard_jax.recipes.agentic.images import image_processor
  e = config.engine
  urls = [u for u in str(e.urls).split(",") if u.strip()]
  return ModelService(
      tokenizer, model=None if urls else model,
      engine_config=None if urls else engine_config(e, seed=engine_seed), urls=urls,
      store=store, served_model_name=e.served_model_name,
      tool_call_parser=config.policy.tool_call_parser,
      model_path=config.policy.init or "orchard_jax",
      sampling_defaults={"max_new_tokens": int(config.sampling.max_tokens)},
      weights_dir=e.weights_dir, wait_until_ready=True,
      image_processor=image_processor(getattr(model, "config", None)))
