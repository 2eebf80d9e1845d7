"""One continuous-batching scheduler of the embedded engine: a thread, a cache, its requests.

The `Engine` (engine.py) validates requests and routes each one to one of its schedulers; with
`EngineConfig.data_parallel` > 1 it runs several, each on its own thread with its own
`DecodeCache` rows, sharing one `ModelRunner` (the same weights and compiled programs). This
is data parallelism as SGLang's `--dp-size` does it, inside one process.

Each loop iteration a scheduler (1) runs pending control functions (weight updates, cache
flushes), (2) admits queued requests into free cache rows, prefilling their prompts in chunks
while running rows wait, and (3) runs `decode_steps` decode steps for every running row in one
compiled call, then checks stop ids, stop strings and length limits on the host and completes
the requests that finished. The prefix cache (engine.py's module docstring) is per scheduler:
its resident rows live in that scheduler's cache, and the engine routes a request to the
scheduler holding its longest reusable prefix.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from orchard_jax.rollout.errors import EngineError
from orchard_jax.rollout.protocol import (
  FinishReason, GenerateResponse, MetaInfo, SamplingParams, SingleGenerateRequest)
from orchard_jax.rollout.multimodal import chunk_visual
from orchard_jax.rollout.runner import ModelRunner, bucket
from orchard_jax.rollout.sampling import MIN_TEMPERATURE, SamplingMode

_log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class RequestState:
  """A request in flight: its validated settings and the host-side state of its cache row."""
  request: SingleGenerateRequest
  rid: str
  prompt: np.ndarray
  max_new: int
  seed: int
  stop_ids: frozenset
  future: concurrent.futures.Future
  on_update: Optional[Callable[[GenerateResponse], None]]
  submitted_at: float
  output_ids: list = dataclasses.field(default_factory=list)
  output_logprobs: list = dataclasses.field(default_factory=list)
  output_top: list = dataclasses.field(default_factory=list)
  input_logprobs: list = dataclasses.field(default_factory=list)
  input_top: list = dataclasses.field(default_factory=list)
  prefilled: int = 0
  finish: Optional[FinishReason] = None
  stop_text_checked: int = 0
  weight_version: str = ""
  cached_tokens: int = 0
  epoch: int = 0
  images: Any = None       # rollout.multimodal.RequestImages of a request with images

  @property
  def params(self) -> SamplingParams:
    return self.request.sampling_params

  @property
  def top_k_num(self) -> int:
    return self.request.top_logprobs_num if self.request.return_logprob else 0

  @property
  def key(self) -> np.ndarray:
    """The prompt as the prefix cache compares it: its ids, image tokens replaced by their
    image's key (rollout.multimodal), so a resident row matches only the same images."""
    return self.prompt if self.images is None else self.images.key


@dataclasses.dataclass(eq=False)
class _Resident:
  """A cache row kept after its request finished: the tokens its state holds."""
  tokens: np.ndarray
  last_used: int


class Scheduler:
  """Continuous batching over one cache (see the module docstring).

  Args:
    runner: the shared `ModelRunner`.
    tokenizer: a `data.Tokenizer` (stop strings and output text).
    config: this scheduler's `EngineConfig` (its own max_batch_size and batch_buckets; see
      `EngineConfig.scheduler_config`).
    recurrent: the model has recurrent (Gated DeltaNet) state, so a resident row is reusable
      only when all its tokens are a prefix of the new prompt.
    name: thread name.
    weight_version: label stamped on admitted requests (meta_info.weight_version).
    image_processor: a vision-language model's image processor (for an image whose
      preprocessing was skipped at submission because its features were cached, and that was
      evicted since).
  """

  # stop() warns after each this many seconds it waits for the thread's current step.
  stop_warn_s: float = 60.0

  def __init__(self, runner: ModelRunner, tokenizer: Any, config: Any, *, recurrent: bool,
               name: str, weight_version: str = "0", image_processor: Any = None):
    self.runner = runner
    self.tokenizer = tokenizer
    self.config = config
    self.name = name
    self.weight_version = weight_version
    self.num_requests_served = 0
    self.num_requests_aborted = 0
    self._recurrent = recurrent
    self._mrope = bool(getattr(getattr(runner, "config", None), "mrope_section", ()))
    self.image_processor = image_processor
    self._queue: "queue.Queue[RequestState]" = queue.Queue()
    self._control: "queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future]]" = (
      queue.Queue())
    self._slots: list[Optional[RequestState]] = []
    self._admitting: list[RequestState] = []          # taken from the queue, not yet in a row
    self._resident: list[Optional[_Resident]] = []    # parallel to _slots
    self._epoch = 0                                      # bumped by every weight update
    self._clock = 0                                      # LRU order of resident rows
    self._stats = dict(requests=0, hits=0, prompt_tokens=0, cached_tokens=0, evictions=0,
                       invalidations=0)
    self._cache = None
    self._cache_len = 0
    self._thread: Optional[threading.Thread] = None
    self._stopping = threading.Event()
    self._wake = threading.Event()
    # Between start() and stop() the queues accept work; stop() closes them under this lock
    # before it drains them, so nothing posted from another thread is left behind.
    self._lock = threading.Lock()
    self._accepting = False

  # ----------------------------------------------------------------- lifecycle

  def start(self) -> None:
    """Start the scheduling thread (idempotent)."""
    with self._lock:
      if self._thread is None or not self._thread.is_alive():
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
      self._accepting = True

  def stop(self) -> None:
    """Stop the thread; queued and running requests fail with EngineError. Control functions
    posted before the stop that the thread did not run (it leaves its loop between two
    iterations) run here, so their callers get an answer.

    Waits for the thread to finish its current iteration however long that takes (a compile
    of a new shape or a long prefill can take minutes on a loaded machine), warning every
    `stop_warn_s` seconds: a daemon thread still inside a JAX computation when the interpreter
    exits is cancelled there, and glibc aborts the process ("FATAL: exception not rethrown",
    signal 6) after a job has already reported its results."""
    with self._lock:
      self._accepting = False
    self._stopping.set()
    self._wake.set()
    thread = self._thread
    if thread is not None and thread is not threading.current_thread():
      waited = 0.0
      thread.join(timeout=self.stop_warn_s)
      while thread.is_alive():
        waited += self.stop_warn_s
        _log.warning("engine scheduler %s is still in a step after %.0f s of stop(); waiting "
                     "for it to end", self.name, waited)
        thread.join(timeout=self.stop_warn_s)
    self._thread = None
    self._apply_control()
    self._fail_all(EngineError("the engine stopped before the request finished"))

  @property
  def is_running(self) -> bool:
    """True from start() until stop() while the scheduling thread lives."""
    return self._accepting and self._thread is not None and self._thread.is_alive()

  # ----------------------------------------------------------------- requests and state

  def enqueue(self, seq: RequestState) -> None:
    """Queue a validated request; it is admitted at the next loop iteration with room. On a
    stopped scheduler (a submit that raced stop()) its future fails with EngineError."""
    with self._lock:
      if self._accepting:
        self._queue.put(seq)
        self._wake.set()
        return
    _resolve(seq.future, error=EngineError("the engine stopped before the request finished"))

  @property
  def load(self) -> int:
    """Requests queued, being admitted or running here (the engine's least-load routing)."""
    return self._queue.qsize() + len(self._admitting) + self.running_requests

  @property
  def running_requests(self) -> int:
    return sum(s is not None for s in list(self._slots))

  @property
  def queued_requests(self) -> int:
    return self._queue.qsize()

  def reusable_prefix(self, seq: RequestState) -> int:
    """Prompt tokens of seq a resident row here could skip (routing; read from the caller's
    thread on a snapshot of the rows, so it can be stale by one admission, never wrong about
    what admission does: `_layout` matches again)."""
    residents = {r: res for r, res in enumerate(list(self._resident)) if res is not None}
    return self._match(seq, residents)[1]

  @property
  def stats(self) -> dict[str, int]:
    """Prefix cache counters (Engine.prefix_cache_stats) of this scheduler."""
    return dict(self._stats, resident_rows=sum(r is not None for r in list(self._resident)))

  def new_weights(self, weight_version: str) -> None:
    """Called while this scheduler is paused, after the runner's weights were swapped: drop
    resident rows (their states came from the old weights) and mark rows running now as
    mixed (not kept when they finish)."""
    self.drop_residents()
    self._epoch += 1
    self.weight_version = weight_version

  def post_control(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
    """Queue fn for the scheduling thread (on a stopped scheduler, run it now on the caller's
    thread); the future holds its result."""
    future = self.try_post_control(fn)
    if future is None:
      future = concurrent.futures.Future()
      try:
        future.set_result(fn())
      except Exception as e:  # noqa: BLE001 - handed to the caller
        future.set_exception(e)
    return future

  def try_post_control(self, fn: Callable[[], Any]) -> Optional[concurrent.futures.Future]:
    """Queue fn for the scheduling thread and return its future, or None when the scheduler
    is stopped. A queued fn always runs: on the thread, or in stop() if the thread left its
    loop first."""
    with self._lock:
      if not self._accepting:
        return None
      future: concurrent.futures.Future = concurrent.futures.Future()
      self._control.put((fn, future))
      self._wake.set()
      return future

  # ----------------------------------------------------------------- the loop

  def _loop(self) -> None:
    while not self._stopping.is_set():
      try:
        self._apply_control()
        self._abort_cancelled()
        admitted = self._admit()
        if admitted:
          self._prefill(admitted)
        if any(s is not None and s.finish is None and s.prefilled == s.prompt.size
               for s in self._slots):
          self._decode()
        elif not admitted:
          self._wake.wait(timeout=0.05)
          self._wake.clear()
      except Exception as e:  # noqa: BLE001 - a model fault fails the requests, not the thread
        _log.exception("engine step failed")
        self._fail_rows(EngineError(f"engine step failed: {type(e).__name__}: {e}"))

  def _apply_control(self) -> None:
    while True:
      try:
        fn, future = self._control.get_nowait()
      except queue.Empty:
        return
      try:
        future.set_result(fn())
      except Exception as e:  # noqa: BLE001 - handed to the caller
        future.set_exception(e)

  def _abort_cancelled(self) -> None:
    """End the running requests whose futures were cancelled (their HTTP client went away):
    finish reason abort, row freed (its tokens stay reusable as a resident row). Queued ones
    are skipped at admission."""
    if any(s is not None and s.finish is None and s.future.cancelled() for s in self._slots):
      for s in self._slots:
        if s is not None and s.finish is None and s.future.cancelled():
          s.finish = FinishReason(type="abort", message="the request was cancelled")
          self.num_requests_aborted += 1
      self._finish_done()

  def _running(self) -> list[RequestState]:
    return [s for s in self._slots if s is not None]

  def _admit(self) -> list[RequestState]:
    running = self._running()
    room = self.config.max_batch_size - len(running)
    if room <= 0:
      return []
    if not running and self._queue.empty():
      return []
    new: list[RequestState] = []
    if not running and self.config.admission_wait_s > 0:
      time.sleep(self.config.admission_wait_s)
    # Out of the queue and in no row until _layout returns (which may compile a new shape):
    # `load` counts them here meanwhile.
    self._admitting = new
    while len(new) < room:
      try:
        seq = self._queue.get_nowait()
      except queue.Empty:
        break
      if seq.future.cancelled():
        continue
      seq.weight_version = self.weight_version
      seq.epoch = self._epoch
      new.append(seq)
    self._layout(running, new)
    self._admitting = []
    return new

  def _layout(self, running: list[RequestState], new: list[RequestState]) -> None:
    """Give every request a row of a cache sized for them (re-laid out if needed).

    A new request takes the resident row sharing its longest prefix (then prefills from
    there), else a free row, else the least recently used resident row. Resident rows hold
    the cache's current shape (it does not shrink under them) but never make it grow.
    """
    residents = {r: res for r, res in enumerate(self._resident) if res is not None}
    held = self._cache is not None and bool(residents)
    matches: dict[int, tuple[int, int]] = {}    # id(seq) -> (row, tokens reused)
    for seq in new:
      row, length = self._match(seq, residents)
      seq.cached_tokens = seq.prefilled = length
      self._stats["requests"] += 1
      self._stats["prompt_tokens"] += int(seq.prompt.size)
      if length:
        matches[id(seq)] = (row, length)
        del residents[row]
        self._stats["hits"] += 1
        self._stats["cached_tokens"] += length
    sequences = running + new
    n = len(sequences)
    batch = bucket(max(n, 1), self.config.batch_buckets)
    need = max([self._slots_needed(s) for s in sequences] or [1])
    cache_len = bucket(need, self.config.cache_buckets) or self.config.max_seq_len
    if held:
      batch, cache_len = max(batch, len(self._slots)), max(cache_len, self._cache_len)
    keep = np.full(batch, _KEEP_ALL, np.int64)   # tokens each row keeps (0: emptied)
    if self._cache is not None and len(self._slots) == batch and cache_len == self._cache_len:
      # Same shapes: matched requests take their rows, the others free or evicted ones.
      free = [r for r in range(batch) if self._slots[r] is None and self._resident[r] is None]
      for seq in new:
        if id(seq) in matches:
          row, keep_len = matches[id(seq)]
        else:
          if not free:
            free.append(self._evict_lru(residents))
          row, keep_len = free.pop(0), 0
        self._resident[row] = None
        self._slots[row] = seq
        keep[row] = keep_len
      if (keep < _KEEP_ALL).any():
        self._cache = self.runner.truncate_rows(self._cache, keep)
      return
    old_rows = {id(s): i for i, s in enumerate(self._slots) if s is not None}
    rows = [old_rows.get(id(s), matches.get(id(s), (-1, 0))[0]) for s in sequences]
    for i, seq in enumerate(new, start=len(running)):
      if id(seq) in matches:
        keep[i] = matches[id(seq)][1]
    kept = sorted(residents, key=lambda r: -residents[r].last_used)[:batch - n]
    for row in set(residents) - set(kept):
      self._evict(residents, row)
    kept_residents = [self._resident[r] for r in kept]
    rows = np.array(rows + kept + [-1] * (batch - n - len(kept)))
    if self._cache is None or not (rows >= 0).any():
      self._cache = self.runner.init_cache(batch, cache_len)
    else:
      self._cache = self.runner.relayout(self._cache, rows, batch, cache_len)
      if (keep < _KEEP_ALL).any():
        self._cache = self.runner.truncate_rows(self._cache, keep)
    self._cache_len = cache_len
    self._slots = list(sequences) + [None] * (batch - n)
    self._resident = [None] * n + kept_residents + [None] * (batch - n - len(kept))

  def _slots_needed(self, s: RequestState) -> int:
    """Cache positions row s needs until the end of the next decode call: the tokens it holds
    (or will hold once prefilled) plus one call's decode_steps, at most prompt + max_new.

    The cache grows on demand (`_grow`), so a long request does not make every row read a
    cache sized for its final length from its first step: attention reads the whole cache
    each step, and at SWE lengths that is most of a decode step (tiny preset, batch 4: 5.6,
    7.5 and 16.5 ms per step at 1,024, 2,048 and 4,096 positions).
    """
    held = int(s.prompt.size) + max(len(s.output_ids) - 1, 0)
    return min(int(s.prompt.size) + s.max_new, held + self.config.decode_steps + 1)

  def _grow(self, active: list[RequestState]) -> None:
    """Re-lay the cache out at the next length bucket when a running row would outgrow it
    during the next decode call (every row, resident ones included, keeps its place)."""
    need = max(self._slots_needed(s) for s in active)
    if need <= self._cache_len:
      return
    cache_len = bucket(need, self.config.cache_buckets) or self.config.max_seq_len
    batch = len(self._slots)
    self._cache = self.runner.relayout(self._cache, np.arange(batch), batch, cache_len)
    self._cache_len = cache_len

  def _match(self, seq: RequestState, residents: dict[int, _Resident]) -> tuple[int, int]:
    """(row, tokens) of the resident row sharing the longest usable prefix with seq's prompt.

    At least one prompt token is always prefilled (its logits give the first output token),
    and prompt log-probs from logprob_start_len on are computed, not reused (as SGLang does).
    A row with a recurrent state is usable only when all its tokens are a prefix.
    """
    if not self.config.prefix_cache or not residents:
      return -1, 0
    limit = int(seq.prompt.size) - 1
    if seq.request.return_logprob and seq.request.logprob_start_len >= 0:
      limit = min(limit, max(seq.request.logprob_start_len - 1, 0))
    best = (-1, 0, -1)   # row, length, last_used
    for row, res in residents.items():
      length = _common_prefix(res.tokens, seq.key, limit)
      if self._recurrent and length < res.tokens.size:
        length = 0
      if (length, res.last_used) > best[1:]:
        best = (row, length, res.last_used)
    return best[0], best[1]

  def _evict_lru(self, residents: dict[int, _Resident]) -> int:
    row = min(residents, key=lambda r: residents[r].last_used)
    self._evict(residents, row)
    return row

  def _evict(self, residents: dict[int, _Resident], row: int) -> None:
    del residents[row]
    self._resident[row] = None
    self._stats["evictions"] += 1

  def drop_residents(self) -> int:
    """Drop every resident row; returns how many. Runs on the scheduling thread (post it with
    `post_control`) or while the scheduler is paused."""
    dropped = sum(r is not None for r in self._resident)
    self._resident = [None] * len(self._resident)
    self._stats["invalidations"] += dropped
    return dropped

  def _retain(self, s: RequestState, device_len: int) -> Optional[_Resident]:
    """The resident record of s's row once s finished, or None when it cannot be reused."""
    if not self.config.prefix_cache or s.epoch != self._epoch:
      return None
    fed = np.concatenate([s.key, np.asarray(s.output_ids[:-1], np.int64)])
    # The device may have fed more (a stop string is found on the host after the call): an
    # attention row keeps the host's prefix, a recurrent state is only valid at its exact end.
    if device_len < fed.size or (self._recurrent and device_len != fed.size):
      return None
    self._clock += 1
    return _Resident(tokens=fed, last_used=self._clock)

  def _prefill(self, admitted: list[RequestState]) -> None:
    batch = len(self._slots)
    rows = {id(s): i for i, s in enumerate(self._slots) if s is not None}
    pending = list(admitted)
    top_k_num = _top_bucket(max([s.top_k_num for s in admitted] or [0]))
    last_logits = None
    while pending:
      longest = max(int(s.prompt.size) - s.prefilled for s in pending)
      chunk = bucket(longest, self.config.prefill_chunk_buckets) or (
        self.config.prefill_chunk_buckets[-1])
      ids = np.zeros((batch, chunk), np.int32)
      # A vision-language model takes 3-D M-RoPE positions (all three equal for text).
      pos = np.zeros((batch, chunk) + ((3,) if self._mrope else ()), np.int32)
      seg = np.zeros((batch, chunk), np.int32)
      nxt = np.zeros((batch, chunk), np.int32)
      last = np.zeros((batch,), np.int32)
      spans = {}
      image_rows: list = [None] * batch
      for s in pending:
        r = rows[id(s)]
        start = s.prefilled
        take = min(chunk, int(s.prompt.size) - start)
        ids[r, :take] = s.prompt[start:start + take]
        if s.images is not None:
          pos[r, :take] = s.images.positions[start:start + take]
          image_rows[r] = self._image_chunk(s, start, take)
        else:
          pos[r, :take] = (np.arange(start, start + take)[:, None] if self._mrope
                           else np.arange(start, start + take))
        seg[r, :take] = 1
        follow = s.prompt[start + 1:start + take + 1]
        nxt[r, :len(follow)] = follow
        last[r] = take - 1
        spans[id(s)] = (r, start, take)
      want_inputs = any(s.request.return_logprob and s.request.logprob_start_len >= 0
                        for s in pending)
      visual = chunk_visual(image_rows, batch, chunk) if any(image_rows) else None
      self._cache, out = self.runner.prefill(self._cache, ids, pos, seg, nxt, last,
                                             top_k_num=top_k_num, prompt_logprobs=want_inputs,
                                             visual=visual,
                                             temperature=self._sampling_arrays()["temperature"])
      next_lp = np.asarray(out["next_logprobs"]) if want_inputs else None
      tops = ((np.asarray(out["top_values"]), np.asarray(out["top_ids"]))
              if want_inputs and top_k_num else None)
      done_now = []
      for s in pending:
        r, start, take = spans[id(s)]
        if want_inputs:
          self._record_input_logprobs(s, next_lp[r], tops, r, start, take)
        s.prefilled += take
        if s.prefilled == s.prompt.size:
          done_now.append(s)
      if done_now:
        logits = out["last_logits"]
        last_logits = logits if last_logits is None else _merge_rows(
          last_logits, logits, [rows[id(s)] for s in done_now])
      pending = [s for s in pending if s.prefilled < s.prompt.size]
    self._sample_first(admitted, last_logits, rows)

  def _image_chunk(self, s: RequestState, start: int, take: int):
    """(s.images, start, take) for chunk_visual, once the images whose tokens fall in
    [start, start + take) are encoded (ImageEncoder: each digest once; images wholly inside
    the reused prefix are never encoded); None when the chunk holds no image token."""
    images = s.images
    first = images.first_image_token(start)
    if first is None or first >= start + take:
      return None
    if images.features is None:
      images.features = [None] * len(images.images)
    for k, (lo, hi) in enumerate(images.spans):
      if images.features[k] is None and hi > start and lo < start + take:
        images.features[k] = self.runner.vision.features(images.images[k],
                                                         self.image_processor)
    return images, start, take

  def _record_input_logprobs(self, s: RequestState, next_lp, tops, r, start, take) -> None:
    if not (s.request.return_logprob and s.request.logprob_start_len >= 0):
      return
    first = s.request.logprob_start_len
    k = s.top_k_num
    # Column c of this chunk predicts prompt position start + c + 1.
    for c in range(take):
      target = start + c + 1
      if target == 1 and first == 0:
        s.input_logprobs.append(None)
        if k:
          s.input_top.append(None)
      if target < s.prompt.size and target >= max(first, 1):
        s.input_logprobs.append(float(next_lp[c]))
        if k:
          s.input_top.append(list(zip(tops[0][r, c, :k].tolist(), tops[1][r, c, :k].tolist())))

  def _sample_first(self, admitted: list[RequestState], last_logits, rows: dict) -> None:
    sampling = [s for s in admitted if s.max_new > 0]
    for s in admitted:
      if s.max_new == 0:
        s.finish = FinishReason(type="length", length=0)
    if sampling:
      arrays = self._sampling_arrays()
      positions = np.zeros(len(self._slots), np.int32)
      for s in sampling:
        positions[rows[id(s)]] = s.prompt.size
      top_k_num = _top_bucket(max(s.top_k_num for s in sampling))
      out = self.runner.sample(last_logits, arrays["seeds"], positions, arrays["temperature"],
                               arrays["top_k"], arrays["top_p"], arrays["min_p"],
                               mode=_mode(sampling), top_k_num=top_k_num)
      tokens = np.asarray(out["tokens"])[:, None]
      lps = np.asarray(out["logprobs"])[:, None]
      tops = ((np.asarray(out["top_values"])[:, None], np.asarray(out["top_ids"])[:, None])
              if top_k_num else None)
      for s in sampling:
        self._extend(s, rows[id(s)], tokens, lps, tops)
    self._finish_done()

  def _sampling_arrays(self) -> dict[str, np.ndarray]:
    n = len(self._slots)
    out = {"seeds": np.zeros(n, np.uint32), "temperature": np.zeros(n, np.float32),
           "top_k": np.zeros(n, np.int32), "top_p": np.ones(n, np.float32),
           "min_p": np.zeros(n, np.float32)}
    for r, s in enumerate(self._slots):
      if s is None:
        continue
      p = s.params
      out["seeds"][r] = s.seed
      out["temperature"][r] = p.temperature
      out["top_k"][r] = p.top_k if p.top_k > 0 else 0
      out["top_p"][r] = p.top_p
      out["min_p"][r] = p.min_p
    return out

  def _decode(self) -> None:
    n = len(self._slots)
    tokens = np.zeros(n, np.int32)
    positions = np.zeros(n, np.int32)
    rope_offset = np.zeros(n, np.int32)
    remaining = np.zeros(n, np.int32)
    active = []
    for r, s in enumerate(self._slots):
      if s is None or s.finish is not None or s.prefilled < s.prompt.size:
        continue
      tokens[r] = s.output_ids[-1]
      positions[r] = s.prompt.size + len(s.output_ids) - 1
      if s.images is not None:
        rope_offset[r] = s.images.rope_delta
      remaining[r] = s.max_new - len(s.output_ids)
      active.append(s)
    self._grow(active)
    arrays = self._sampling_arrays()
    top_k_num = _top_bucket(max(s.top_k_num for s in active))
    width = max(len(s.stop_ids) for s in active)
    stop_ids = np.full((n, _pow4_bucket(width)), -1, np.int32)
    for r, s in enumerate(self._slots):
      if s in active and s.stop_ids:
        stop_ids[r, :len(s.stop_ids)] = sorted(s.stop_ids)
    self._cache, out = self.runner.decode(
      self._cache, tokens, positions, remaining, arrays["seeds"], arrays["temperature"],
      arrays["top_k"], arrays["top_p"], arrays["min_p"], num_steps=self.config.decode_steps,
      mode=_mode(active), top_k_num=top_k_num, stop_ids=stop_ids, rope_offset=rope_offset)
    toks = np.asarray(out["tokens"])
    lps = np.asarray(out["logprobs"])
    tops = (np.asarray(out["top_values"]), np.asarray(out["top_ids"])) if top_k_num else None
    for r, s in enumerate(self._slots):
      if s is not None and s in active:
        self._extend(s, r, toks, lps, tops)
    self._finish_done()

  def _extend(self, s: RequestState, r: int, toks, lps, tops) -> None:
    """Append this call's tokens of row r to s, stopping at the first stop condition."""
    steps = toks.shape[1]
    for j in range(steps):
      if len(s.output_ids) >= s.max_new:
        break
      token = int(toks[r, j])
      s.output_ids.append(token)
      s.output_logprobs.append(float(lps[r, j]))
      if s.top_k_num:
        k = s.top_k_num
        s.output_top.append(list(zip(tops[0][r, j, :k].tolist(), tops[1][r, j, :k].tolist())))
      if token in s.stop_ids:
        s.finish = FinishReason(type="stop", matched=token)
        return
      if len(s.output_ids) >= s.max_new:
        break
    if s.params.stop_strings and self._match_stop_string(s):
      return
    if len(s.output_ids) >= s.max_new:
      s.finish = FinishReason(type="length", length=len(s.output_ids))

  def _match_stop_string(self, s: RequestState) -> bool:
    """Cut s's output after the token that completes a stop string; True when one did."""
    stops = s.params.stop_strings
    text = self.tokenizer.decode(s.output_ids, skip_special_tokens=s.params.skip_special_tokens)
    horizon = max(0, s.stop_text_checked - max(len(x) for x in stops))
    hits = [(text.find(x, horizon), x) for x in stops]
    hits = [(i, x) for i, x in hits if i >= 0]
    s.stop_text_checked = len(text)
    if not hits:
      return False
    index, matched = min(hits)
    # The first prefix of the output whose text holds the stop string ends with the token
    # that completed it.
    for n in range(1, len(s.output_ids) + 1):
      prefix = self.tokenizer.decode(s.output_ids[:n],
                                     skip_special_tokens=s.params.skip_special_tokens)
      if matched in prefix:
        break
    del s.output_ids[n:], s.output_logprobs[n:]
    if s.output_top:
      del s.output_top[n:]
    s.finish = FinishReason(type="stop", matched=matched)
    return True

  def _finish_done(self) -> None:
    lengths = None
    if self.config.prefix_cache and any(s is not None and s.finish is not None
                                        for s in self._slots):
      lengths = np.asarray(self._cache.lengths)
    for r, s in enumerate(self._slots):
      if s is None:
        continue
      if s.finish is not None:
        self._slots[r] = None
        if lengths is not None:
          self._resident[r] = self._retain(s, int(lengths[r]))
        self.num_requests_served += 1
        if not s.future.cancelled():
          _resolve(s.future, self._response(s))
      elif s.on_update is not None:
        try:
          s.on_update(self._response(s))
        except Exception:  # noqa: BLE001 - a broken stream consumer must not stop the engine
          _log.exception("stream callback of request %s failed", s.rid)

  def _response(self, s: RequestState) -> GenerateResponse:
    p = s.params
    text = self.tokenizer.decode(s.output_ids, skip_special_tokens=p.skip_special_tokens)
    if s.finish is not None and isinstance(s.finish.matched, str) and not p.no_stop_trim:
      cut = text.find(s.finish.matched)
      if cut >= 0:
        text = text[:cut]
    req = s.request
    with_text = req.return_text_in_logprobs

    def entries(ids, lps):
      return [(lp, int(t), self._token_text(t) if with_text else None) for t, lp in zip(ids, lps)]

    def top_entries(tops):
      return [None if t is None else [(v, int(i), self._token_text(i) if with_text else None)
                                      for v, i in t] for t in tops]

    meta = MetaInfo(
      id=s.rid, finish_reason=s.finish, prompt_tokens=int(s.prompt.size),
      completion_tokens=len(s.output_ids), cached_tokens=s.cached_tokens,
      weight_version=s.weight_version,
      e2e_latency=time.perf_counter() - s.submitted_at)
    if req.return_logprob:
      meta.output_token_logprobs = entries(s.output_ids, s.output_logprobs)
      if req.logprob_start_len >= 0:
        first = req.logprob_start_len
        meta.input_token_logprobs = entries(s.prompt[first:].tolist(), s.input_logprobs)
      if s.top_k_num:
        meta.output_top_logprobs = top_entries(s.output_top)
        if req.logprob_start_len >= 0:
          meta.input_top_logprobs = top_entries(s.input_top)
    return GenerateResponse(text=text, output_ids=list(s.output_ids), meta_info=meta)

  def _token_text(self, token_id: int) -> str:
    return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

  def _fail_rows(self, error: Exception) -> None:
    """Fail every request in a row or being admitted (taken from the queue, in no row yet)
    and drop the cache with its rows and resident rows."""
    for s in self._running() + self._admitting:
      _resolve(s.future, error=error)
    self._admitting = []
    self._slots = []
    self._resident = []
    self._cache = None

  def _fail_all(self, error: Exception) -> None:
    self._fail_rows(error)
    while True:
      try:
        seq = self._queue.get_nowait()
      except queue.Empty:
        break
      _resolve(seq.future, error=error)


def _resolve(future: concurrent.futures.Future, result: Any = None,
             error: Optional[BaseException] = None) -> None:
  """Set a request's result or exception unless it is already done: its client may cancel it
  from another thread at any moment, and setting a cancelled future raises, which would fail
  the step (and every other request in it)."""
  try:
    if error is not None:
      future.set_exception(error)
    else:
      future.set_result(result)
  except concurrent.futures.InvalidStateError:
    pass


_KEEP_ALL = np.iinfo(np.int32).max   # truncate_rows: leave the row as it is


def _common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
  """Length of the common prefix of a and b, at most limit."""
  m = max(min(a.size, b.size, limit), 0)
  differ = np.flatnonzero(a[:m] != b[:m])
  return int(differ[0]) if differ.size else m



def _mode(sequences: Sequence[RequestState]) -> SamplingMode:
  sampled = [s.params for s in sequences if s.params.temperature >= MIN_TEMPERATURE]
  if not sampled:
    return SamplingMode.GREEDY
  if any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 for p in sampled):
    return SamplingMode.FILTERED
  return SamplingMode.SAMPLE



def _top_bucket(k: int) -> int:
  """Static top-logprob count compiled for a request asking for k: 0, 1, 5, 20, then powers
  of two (at most one program per bucket, whatever k requests ask for; the engine caps k at
  the vocabulary)."""
  if k <= 0:
    return 0
  return bucket(k, (1, 5, 20)) or 1 << (k - 1).bit_length()


def _pow4_bucket(width: int) -> int:
  """Columns of the stop-id array compiled for a batch whose longest stop list has `width`
  ids: 4, 16, 64, 256, ... (few programs whatever the lists)."""
  size = 4
  while size < width:
    size *= 4
  return size


def _merge_rows(old, new, rows: list[int]):
  import jax.numpy as jnp

  mask = np.zeros(old.shape[0], bool)
  mask[rows] = True
  return jnp.where(jnp.asarray(mask)[:, None], new, old)

