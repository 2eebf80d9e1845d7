"""The embedded inference engine: continuous batching of generation and scoring requests.

The engine validates each request and routes it to one of its schedulers (scheduler.py): a
background thread that owns a `DecodeCache` whose rows are request slots. Each loop iteration
a scheduler (1) applies pending control work, (2) admits queued requests into free slots,
prefilling their prompts in chunks while running rows wait, and (3) runs `decode_steps` decode
steps for every running row in one compiled call, then checks stop ids, stop strings and
length limits on the host and completes the requests that finished. Batch rows, prefill chunk
and cache length are padded to buckets (`EngineConfig`), so a served mix of requests compiles a
handful of programs once (`compile_count`).

Data parallelism (`EngineConfig.data_parallel`, SGLang's `--dp-size`): N schedulers, each with
max_batch_size / N rows, share the weights and the compiled programs and run on their own
threads. On CPU this is how a decode batch uses two cores: XLA:CPU runs a decode step's small
matmuls on one core (about 1.1 cores busy for a batch of 8 on the tiny preset), while two
schedulers' steps run side by side (tiny preset, 8 requests of 128 + 128 tokens on 2 cores:
1,630 new tokens/s with one scheduler of 8 rows, 2,310 with two of 4). A request goes to the
scheduler whose prefix cache holds most of its prompt while the load stays balanced, else to
the least loaded one (`Engine._route`), so an agent session's turns stay where their cache is.

Prefix cache (`EngineConfig.prefix_cache`, on by default), the engine's form of SGLang's
RadixAttention / vLLM's automatic prefix caching, fitted to cache rows that are request slots:
when a request finishes, its row stays resident with the tokens it fed through the model
(prompt + output[:-1]). A new request takes the resident row whose tokens share the longest
prefix with its input_ids and prefills only the rest, so an agent's multi-turn session (each
prompt = previous prompt + output + a new suffix) re-prefills only the suffix. Attention-only
models reuse any shared prefix (positions beyond it are masked by the row's length and
overwritten); models with a recurrent state (Gated DeltaNet hybrids) reuse a row only when all
of its tokens are a prefix of the new prompt, since that state cannot be rolled back (decode
freezes a row on its stop id inside the compiled call, so the state is exactly that of the kept
tokens). Resident rows never take a row a new request needs (least recently used evicted
first) and never make the cache grow; while some are held the cache keeps its shape instead of
shrinking. A weight update or `flush_cache()` drops them all. meta_info.cached_tokens reports
the reused prompt tokens per request (SGLang's field); `prefix_cache_stats` the totals.

Output per request is SGLang's `/generate` result (protocol.GenerateResponse): text, output ids
and meta_info with finish_reason and, when asked, per-token log-probs of the sampled tokens
(raw model distribution in float32, see sampling.py) and of the prompt tokens (scoring).

Example:
  engine = Engine(model, tokenizer, config=EngineConfig(max_batch_size=8))
  with engine:
    [out] = engine.generate([SingleGenerateRequest(input_ids=ids, return_logprob=True,
                             sampling_params=SamplingParams(max_new_tokens=64))])
    engine.update_params(nnx.state(new_model))     # in-process weight sync
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import numpy as np
from flax import nnx

from orchard_jax.rollout.errors import EngineError, RequestError
from orchard_jax.rollout.protocol import GenerateResponse, SingleGenerateRequest
from orchard_jax.rollout.runner import ModelRunner
from orchard_jax.rollout.scheduler import RequestState, Scheduler


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Sizes and buckets of the engine. Every shape the engine compiles comes from here.

  Attributes:
    max_batch_size: most requests decoded together (rows of the cache).
    batch_buckets: row counts the cache takes; the smallest that fits the running requests
      is used. Must end with max_batch_size.
    max_seq_len: longest prompt + output a request may have, tokens.
    cache_len_buckets: cache capacities (tokens per row); the smallest that fits every running
      request's prompt + max_new_tokens is used. Empty: powers of two from 256 up to
      max_seq_len (and max_seq_len itself).
    prefill_chunk_buckets: prompt tokens processed per prefill call; longer prompts take
      several calls of the largest chunk.
    decode_steps: decode steps per compiled call (the host checks stops between calls; a row
      that stopped mid-call wastes at most decode_steps - 1 steps).
    admission_wait_s: after the first queued request arrives at an idle engine, wait this long
      for more to batch them.
    seed: seed of the engine's draw of per-request seeds (requests without sampling_seed);
      None draws from the OS.
    prefix_cache: keep finished requests' rows resident and reuse the longest shared prompt
      prefix (module docstring). Outputs equal the cache-off engine's up to float rounding of
      a different prefill chunking. False frees a row when its request finishes.
    decode_moe_dispatch: MoE dispatch for decode steps ("decode", "dense", "sort",
      "ragged"; ModelConfig.moe_dispatch), None to keep the model's, or "auto": "decode" on
      CPU for dropless models (one token per row: gathered top-k expert weights, or all
      experts in one batched matmul when the batch selects most of them; models.decode), the
      model's otherwise.
    data_parallel: schedulers (module docstring). Each has max_batch_size / data_parallel
      rows and the batch buckets divided likewise (`scheduler_config`); max_batch_size must
      be a multiple. 1 (the default, as SGLang's dp_size) runs one scheduler; on a CPU with
      at least 2 cores, 2 serves batches of 2 or more about 1.4x faster.
    image_cache_bytes: budget of a vision-language model's image feature cache (the vision
      front's output per image digest, rollout.multimodal; least recently used evicted).
  """
  max_batch_size: int = 8
  batch_buckets: tuple[int, ...] = (1, 2, 4, 8)
  max_seq_len: int = 4096
  cache_len_buckets: tuple[int, ...] = ()
  prefill_chunk_buckets: tuple[int, ...] = (32, 128, 512)
  decode_steps: int = 16
  admission_wait_s: float = 0.002
  seed: Optional[int] = None
  prefix_cache: bool = True
  decode_moe_dispatch: Optional[str] = "auto"
  data_parallel: int = 1
  image_cache_bytes: int = 1 << 30

  def __post_init__(self):
    if not self.batch_buckets or self.batch_buckets[-1] != self.max_batch_size:
      raise RequestError(f"batch_buckets {self.batch_buckets} must end with max_batch_size "
                         f"{self.max_batch_size}")
    if list(self.batch_buckets) != sorted(set(self.batch_buckets)):
      raise RequestError(f"batch_buckets {self.batch_buckets} must be strictly increasing")
    if self.decode_steps < 1:
      raise RequestError(f"decode_steps must be >= 1, got {self.decode_steps}")
    if self.data_parallel < 1 or self.max_batch_size % self.data_parallel:
      raise RequestError(f"data_parallel must be >= 1 and divide max_batch_size "
                         f"{self.max_batch_size}, got {self.data_parallel}")

  def scheduler_config(self) -> "EngineConfig":
    """The config of each of the data_parallel schedulers: max_batch_size / data_parallel rows
    and every batch bucket divided (rounded up), e.g. buckets (1, 2, 4, 8) at data_parallel 2
    become (1, 2, 4)."""
    n = self.data_parallel
    rows = self.max_batch_size // n
    buckets = tuple(sorted({-(-b // n) for b in self.batch_buckets}))
    return dataclasses.replace(self, max_batch_size=rows, batch_buckets=buckets, data_parallel=1)

  @property
  def cache_buckets(self) -> tuple[int, ...]:
    if self.cache_len_buckets:
      return tuple(sorted(set(self.cache_len_buckets) | {self.max_seq_len}))
    out, size = [], 256
    while size < self.max_seq_len:
      out.append(size)
      size *= 2
    return tuple(out) + (self.max_seq_len,)


class Engine:
  """The embedded JAX inference engine (see the module docstring).

  Args:
    model: the policy, a `models.CausalLM` (NNX module).
    tokenizer: a `data.Tokenizer` (text prompts, stop strings, end-of-turn ids, output text).
    config: `EngineConfig`.
    image_processor: a vision-language model's `data.images.ImageProcessor` (default: the
      model's patching with Qwen3-VL's published pixel bounds).
    model_path: reported by /get_model_info.
    weight_version: initial label reported in meta_info.weight_version.
  """

  def __init__(self, model: nnx.Module, tokenizer: Any, *, config: EngineConfig = EngineConfig(),
               model_path: str = "", weight_version: str = "0",
               image_processor: Any = None):
    self.config = config
    self.tokenizer = tokenizer
    self.model_config = getattr(model, "config", None)
    self.runner = ModelRunner(model, decode_moe_dispatch=_decode_dispatch(
      config.decode_moe_dispatch, self.model_config),
      image_cache_bytes=config.image_cache_bytes)
    self.vision_config = getattr(self.model_config, "vision", None)
    self.image_processor = image_processor
    if self.vision_config is not None and image_processor is None:
      from orchard_jax.data.images import ImageProcessor

      vc = self.vision_config
      self.image_processor = ImageProcessor(patch_size=vc.patch_size,
                                            temporal_patch_size=vc.temporal_patch_size,
                                            merge_size=vc.spatial_merge_size)
    self.model_path = model_path
    self.weight_version = weight_version
    self._rng = np.random.default_rng(config.seed)
    self._vocab = int(getattr(self.model_config, "vocab_size", 0) or 0)
    recurrent = _has_recurrent_state(self.model_config)
    self.schedulers = [
      Scheduler(self.runner, tokenizer, config.scheduler_config(), recurrent=recurrent,
                name=f"orchard-engine-{i}", weight_version=weight_version,
                image_processor=self.image_processor)
      for i in range(config.data_parallel)]
    self._started = False
    self._pause_lock = threading.Lock()

  # ----------------------------------------------------------------- lifecycle

  def start(self) -> "Engine":
    """Start the scheduling threads (idempotent)."""
    for s in self.schedulers:
      s.start()
    self._started = True
    return self

  def stop(self) -> None:
    """Stop the threads; queued and running requests fail with EngineError."""
    self._started = False
    for s in self.schedulers:
      s.stop()

  def __enter__(self) -> "Engine":
    return self.start()

  def __exit__(self, *exc: Any) -> None:
    self.stop()

  @property
  def is_running(self) -> bool:
    """True while every scheduling thread runs."""
    return self._started and all(s.is_running for s in self.schedulers)

  @property
  def compile_count(self) -> int:
    """Compilations (traces) of the engine's jitted functions so far."""
    return self.runner.compile_count

  @property
  def num_requests_served(self) -> int:
    """Requests completed since start."""
    return sum(s.num_requests_served for s in self.schedulers)

  @property
  def num_requests_aborted(self) -> int:
    """Running requests ended early since start because their future was cancelled (the
    HTTP client that made them disconnected)."""
    return sum(s.num_requests_aborted for s in self.schedulers)

  @property
  def prefix_cache_stats(self) -> dict[str, int]:
    """Prefix cache totals since start, over all schedulers: requests admitted, hits
    (requests that reused a prefix), prompt_tokens and cached_tokens (of which reused) of
    admitted requests, evictions (resident rows given to other requests or dropped on a
    re-layout), invalidations (resident rows dropped by weight updates and flush_cache),
    resident_rows now."""
    total: dict[str, int] = {}
    for s in self.schedulers:
      for key, value in s.stats.items():
        total[key] = total.get(key, 0) + value
    return total

  def flush_cache(self, timeout_s: Optional[float] = 60.0) -> int:
    """Drop every resident row of the prefix cache (SGLang's /flush_cache); returns how many.
    Running requests are not affected."""
    futures = [s.post_control(s.drop_residents) for s in self.schedulers]
    return sum(f.result(timeout=timeout_s) for f in futures)

  # ----------------------------------------------------------------- requests

  def submit(self, request: SingleGenerateRequest,
             on_update: Optional[Callable[[GenerateResponse], None]] = None
             ) -> concurrent.futures.Future:
    """Queue one request; the future resolves to its `GenerateResponse`.

    Args:
      request: the prompt (text or ids) and its settings.
      on_update: called from a scheduler thread with the cumulative partial response after
        each decode call (streaming), and not for the final one (the future has it).
    Raises:
      RequestError: empty prompt, prompt too long, token id out of range.
      EngineError: the engine is not running.
    """
    if not self.is_running:
      raise EngineError("the engine is not running; use it in a `with engine:` block or call "
                        "start()")
    seq = self._make_sequence(request, on_update)
    self._route(seq).enqueue(seq)
    return seq.future

  def generate(self, requests: Sequence[SingleGenerateRequest],
               timeout_s: Optional[float] = None) -> list[GenerateResponse]:
    """Submit requests and wait for all of them (results in request order)."""
    futures = [self.submit(r) for r in requests]
    return [f.result(timeout=timeout_s) for f in futures]

  def _route(self, seq: RequestState) -> Scheduler:
    """The scheduler for seq: the one whose prefix cache can skip the most of its prompt when
    that is at least _CACHE_SHARE of the prompt (an agent session's next turn) and that
    scheduler is within _BALANCE_SLACK requests of the least loaded one; else the least
    loaded one (first on ties). The rule of SGLang's cache-aware data-parallel router: cache
    affinity while the load stays balanced, so sessions that share a long system prompt do
    not all pile onto the scheduler holding it."""
    schedulers = self.schedulers
    if len(schedulers) == 1:
      return schedulers[0]
    loads = [s.load for s in schedulers]
    least = min(range(len(schedulers)), key=lambda i: (loads[i], i))
    if self.config.prefix_cache:
      reuse = [s.reusable_prefix(seq) for s in schedulers]
      best = max(range(len(schedulers)), key=lambda i: (reuse[i], -loads[i], -i))
      if (reuse[best] >= _CACHE_SHARE * seq.prompt.size
          and loads[best] - loads[least] <= _BALANCE_SLACK):
        return schedulers[best]
    return schedulers[least]

  def _make_sequence(self, request: SingleGenerateRequest,
                     on_update: Optional[Callable]) -> RequestState:
    """The request as a scheduler's RequestState, every field range-checked against the
    model (vocabulary) and the engine (context length) first: a value that would fail the
    batched step (an id beyond the vocabulary, more top log-probs than tokens) fails this
    request alone, with a RequestError naming the field."""
    if request.input_ids is not None:
      try:
        prompt = np.asarray(request.input_ids, dtype=np.int64)
      except (OverflowError, TypeError, ValueError):
        raise RequestError(f"input_ids must be token ids in [0, {self._vocab or 'vocab'}); one "
                           "does not fit an int64") from None
    else:
      prompt = np.asarray(self.tokenizer.encode(request.text or ""), dtype=np.int64)
    if prompt.ndim != 1 or prompt.size == 0:
      raise RequestError("the prompt is empty; expected at least one token")
    prompt, images = self._prepare_images(request, prompt)
    if self._vocab and (prompt.min() < 0 or prompt.max() >= self._vocab):
      bad = int(prompt[(prompt < 0) | (prompt >= self._vocab)][0])
      raise RequestError(f"prompt token id {bad} is outside the vocabulary [0, {self._vocab})")
    limit = self.config.max_seq_len
    if prompt.size >= limit:
      raise RequestError(f"the prompt has {prompt.size} tokens; the engine's max_seq_len is "
                         f"{limit}, leaving no room to generate")
    params = request.sampling_params
    requested = params.max_new_tokens if params.max_new_tokens is not None else limit
    max_new = min(requested, limit - int(prompt.size))
    vocab = self._vocab or np.iinfo(np.int32).max
    if params.top_k > vocab:
      raise RequestError(f"sampling_params.top_k={params.top_k} exceeds the vocabulary size "
                         f"{vocab}")
    for i, token in enumerate(params.stop_token_ids or ()):
      if not 0 <= token < vocab:
        raise RequestError(f"sampling_params.stop_token_ids[{i}]={token} is outside the "
                           f"vocabulary [0, {vocab})")
    if request.return_logprob and request.top_logprobs_num > vocab:
      raise RequestError(f"top_logprobs_num={request.top_logprobs_num} exceeds the vocabulary "
                         f"size {vocab}")
    if request.logprob_start_len < -1:
      raise RequestError(f"logprob_start_len={request.logprob_start_len}; expected -1 (output "
                         "tokens only) or a prompt position >= 0")
    stops = set(params.stop_token_ids or [])
    if not params.ignore_eos:
      stops |= set(getattr(self.tokenizer, "stop_ids", ()))
    seed = params.sampling_seed
    if seed is None:
      seed = int(self._rng.integers(0, 2**31 - 1))
    return RequestState(
      images=images,
      request=request, rid=request.rid or uuid.uuid4().hex, prompt=prompt, max_new=max_new,
      seed=int(seed) % (2**32), stop_ids=frozenset(int(s) for s in stops),
      future=concurrent.futures.Future(), on_update=on_update, submitted_at=time.perf_counter())

  def _prepare_images(self, request: SingleGenerateRequest, prompt: np.ndarray):
    """(prompt, RequestImages or None): a request's images read, preprocessed and their
    placeholders widened (rollout.multimodal.prepare_images).

    Raises:
      RequestError: images for a text-only model, image placeholders without images, or an
        image that cannot be read.
    """
    sources = request.image_data or []
    if self.vision_config is None:
      if sources:
        raise RequestError(f"image_data holds {len(sources)} image(s) but the served model "
                           "reads text only")
      return prompt, None
    if not sources:
      if np.any(prompt == self.vision_config.image_token_id):
        raise RequestError("the prompt holds image placeholders (<|image_pad|>) but the "
                           "request has no image_data")
      return prompt, None
    from orchard_jax.rollout.multimodal import prepare_images

    return prepare_images(prompt, sources, processor=self.image_processor,
                          vision_config=self.vision_config, encoder=self.runner.vision)

  # ----------------------------------------------------------------- weights

  def update_params(self, params: Any, weight_version: Optional[str] = None,
                    timeout_s: Optional[float] = 600.0) -> None:
    """Swap in new weights between two engine steps (in-process weight sync).

    Every scheduler pauses between two of its loop iterations, the weights are swapped once,
    then all resume. Requests in flight continue with the new weights from their next step on
    (as SGLang does without abort_all_requests). Blocks until applied. No recompilation
    happens: the new weights must have the served model's shapes.

    Args:
      params: the new parameters: a pure dict as the trainer holds them
        (`nnx.to_pure_dict(nnx.state(model, nnx.Param))`), an `nnx.State` of nnx.Param
        variables, or a model of the same architecture.
      weight_version: new label for meta_info.weight_version (default: previous + 1 when
        numeric).
    Raises:
      WeightUpdateError: the weights do not fit the served model.
      EngineError: a scheduler did not pause within timeout_s (nothing was swapped).
    """
    if isinstance(params, nnx.Module):
      params = nnx.state(params, nnx.Param)

    def apply():
      # Inside the pause, so concurrent updates number their versions one after the other.
      version = weight_version if weight_version is not None else _next_version(
        self.weight_version)
      self.runner.swap_params(params)
      for s in self.schedulers:
        s.new_weights(version)   # drops resident rows; running rows are not kept at the end
      self.weight_version = version

    self._while_paused(apply, timeout_s)

  def update_weights_from_disk(self, model_path: str, load_format: Optional[str] = None,
                               weight_version: Optional[str] = None) -> None:
    """Load weights from a folder and swap them in (see `weights.load_params_from_disk`).

    Raises:
      WeightUpdateError: missing folder, unknown format, or weights that do not fit.
    """
    from orchard_jax.rollout.weights import load_params_from_disk  # deferred: orbax import

    params = load_params_from_disk(model_path, self.runner.params, load_format=load_format)
    self.update_params(params, weight_version=weight_version)
    self.model_path = model_path

  def _while_paused(self, fn: Callable[[], Any], timeout_s: Optional[float]) -> Any:
    """Run fn on the caller's thread while every running scheduler waits between two loop
    iterations (each parks in a control function until fn returned; a scheduler stopped
    meanwhile parks in its stop()). One pause at a time: two callers posting their parks in
    different orders to two schedulers would each hold one scheduler the other waits for.

    Raises:
      EngineError: another pause or a scheduler did not let this one start within timeout_s
        (fn is not run).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if not self._pause_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
      raise EngineError(f"another weight update held the engine for {timeout_s} s")
    try:
      resume = threading.Event()
      waits = []
      for s in self.schedulers:
        arrived = threading.Event()
        future = s.try_post_control(functools.partial(_park, arrived, resume))
        if future is not None:
          waits.append((arrived, future))
      try:
        for arrived, _ in waits:
          left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
          if not arrived.wait(left):
            raise EngineError(f"the engine's schedulers did not pause within {timeout_s} s")
        return fn()
      finally:
        resume.set()
        concurrent.futures.wait([f for _, f in waits], timeout=timeout_s)
    finally:
      self._pause_lock.release()

  def model_info(self) -> dict[str, Any]:
    """SGLang's /get_model_info fields plus compile_count and num_requests_served."""
    arch = getattr(self.model_config, "architecture", None)
    return {
      "model_path": self.model_path, "tokenizer_path": getattr(self.tokenizer, "name", None),
      "is_generation": True, "preferred_sampling_params": None,
      "weight_version": self.weight_version,
      "has_image_understanding": self.vision_config is not None,
      "has_audio_understanding": False, "model_type": arch,
      "architectures": [arch] if arch else None, "compile_count": self.compile_count,
      "num_requests_served": self.num_requests_served,
      "num_requests_aborted": self.num_requests_aborted,
      "max_batch_size": self.config.max_batch_size, "max_seq_len": self.config.max_seq_len,
      "data_parallel": self.config.data_parallel,
      "running_requests": sum(s.running_requests for s in self.schedulers),
      "queued_requests": sum(s.queued_requests for s in self.schedulers),
      "prefix_cache": dict(self.prefix_cache_stats, enabled=self.config.prefix_cache),
    }


_CACHE_SHARE = 0.5    # Engine._route: least share of a prompt a cached prefix must cover
_BALANCE_SLACK = 1    # Engine._route: most extra requests queued for the sake of a cached prefix


def _park(arrived: threading.Event, resume: threading.Event) -> None:
  """Engine._while_paused's control function: report the scheduler paused, wait to resume."""
  arrived.set()
  resume.wait()


def _has_recurrent_state(model_config: Any) -> bool:
  """True unless the model is known to be attention-only (no Gated DeltaNet layer)."""
  layer_type = getattr(model_config, "layer_type", None)
  if model_config is None or not callable(layer_type):
    return True
  return any(layer_type(i) == "linear_attention"
             for i in range(model_config.num_hidden_layers))


def _decode_dispatch(choice: Optional[str], model_config: Any) -> Optional[str]:
  if choice != "auto":
    return choice
  import jax

  experts = getattr(model_config, "num_experts", 0) or 0
  dropless = (getattr(model_config, "moe_dropless", True)
              or getattr(model_config, "moe_capacity_factor", None) is None)
  # With capacity drops the paths would differ beyond rounding; keep the model's then.
  return "decode" if jax.default_backend() == "cpu" and experts > 0 and dropless else None


def _next_version(version: str) -> str:
  try:
    return str(int(version) + 1)
  except ValueError:
    return f"{version}+1"

