"""The engine's data parallelism (EngineConfig.data_parallel): schedulers sharing one runner.

References: an engine with one scheduler serving the same weights (test_engine.py checks that
one against the trainer's forward pass), and a fresh engine built from the new weights after a
weight update. Also checked: the per-scheduler sizes, that concurrent schedulers never compile
one program twice, that requests spread over the schedulers, and that an agent session's turns
are routed to the scheduler whose prefix cache holds them. Lifecycle: a fault in one scheduler,
stop() racing an update/flush/submit, concurrent updates, restart, a request arriving during
an update. Faults and delays are injected by wrapping the shared runner for one scheduler
(nothing here can make a real device fail or stall on purpose).
"""
import concurrent.futures
import dataclasses
import threading
import time

import numpy as np
import pytest
from flax import nnx

from orchard_jax.models import CausalLM
from orchard_jax.rollout import Engine, EngineConfig, EngineError, RequestError, SamplingParams
from orchard_jax.rollout import SingleGenerateRequest

BASE = EngineConfig(max_batch_size=4, batch_buckets=(2, 4), max_seq_len=256,
                    cache_len_buckets=(256,), prefill_chunk_buckets=(32,), decode_steps=4,
                    seed=0)
DP2 = dataclasses.replace(BASE, data_parallel=2)


def _request(ids, seed, greedy=True, max_new=12):
  return SingleGenerateRequest(
    input_ids=[int(i) for i in ids], return_logprob=True,
    sampling_params=SamplingParams(max_new_tokens=max_new, temperature=0.0 if greedy else 1.0,
                                   sampling_seed=seed, ignore_eos=True))


def _prompts(n, seed=0, length=20):
  rng = np.random.default_rng(seed)
  return [rng.integers(10, 8000, length + 3 * i) for i in range(n)]


def test_scheduler_config_divides_rows_and_buckets():
  config = EngineConfig(max_batch_size=8, batch_buckets=(1, 2, 4, 8), data_parallel=2)
  each = config.scheduler_config()
  assert (each.max_batch_size, each.batch_buckets, each.data_parallel) == (4, (1, 2, 4), 1)
  each = EngineConfig(max_batch_size=8, batch_buckets=(1, 8), data_parallel=4).scheduler_config()
  assert (each.max_batch_size, each.batch_buckets) == (2, (1, 2))
  assert EngineConfig(max_batch_size=8).scheduler_config().max_batch_size == 8
  for bad in (0, 3):
    with pytest.raises(RequestError, match="data_parallel must be >= 1 and divide"):
      EngineConfig(max_batch_size=8, data_parallel=bad)


def test_two_schedulers_give_the_one_scheduler_results(small_model, tokenizer):
  requests = [_request(p, seed=i, greedy=i % 2 == 0) for i, p in enumerate(_prompts(8))]
  with Engine(small_model, tokenizer, config=BASE) as one:
    want = one.generate(requests)
  with Engine(small_model, tokenizer, config=DP2) as two:
    got = two.generate(requests)
    served = [s.num_requests_served for s in two.schedulers]
    compiles = two.compile_count
    assert two.generate(requests)[0].output_ids == got[0].output_ids
    assert two.compile_count == compiles            # same shapes: nothing recompiled
    assert two.model_info()["data_parallel"] == 2
  assert all(n > 0 for n in served) and sum(served) == len(requests)
  for a, b in zip(got, want):
    assert a.output_ids == b.output_ids
    np.testing.assert_allclose(a.output_logprobs, b.output_logprobs, atol=2e-5, rtol=0)


def test_concurrent_schedulers_compile_each_program_once(small_model, tokenizer):
  # Two requests per scheduler, all of one shape: both schedulers need the same programs at
  # the same moment. A single scheduler serving two of them needs exactly those programs.
  requests = [_request(p, seed=i) for i, p in enumerate(_prompts(4, seed=1, length=24))]
  for r in requests:
    r.input_ids = r.input_ids[:24]
  with Engine(small_model, tokenizer, config=DP2.scheduler_config()) as single:
    single.generate(requests[:2])
    want = single.compile_count
  with Engine(small_model, tokenizer, config=DP2) as two:
    futures = [two.submit(r) for r in requests]
    [f.result() for f in futures]
    assert [s.num_requests_served for s in two.schedulers] == [2, 2]
    assert two.compile_count == want


def test_session_turns_follow_their_prefix_cache(small_model, tokenizer):
  rng = np.random.default_rng(5)
  sessions = [list(p) for p in _prompts(2, seed=2)]
  with Engine(small_model, tokenizer, config=DP2) as engine:
    for turn in range(3):
      futures = [engine.submit(_request(s, seed=turn)) for s in sessions]
      outs = [f.result() for f in futures]
      for i, out in enumerate(outs):
        if turn == 0:
          assert out.meta_info.cached_tokens == 0
        else:
          # Everything the session's row holds is reused: its last prompt and output but the
          # last output token (never fed), which is where this prompt diverges from nothing.
          assert out.meta_info.cached_tokens == len(sessions[i]) - 1 - 5
        sessions[i] = sessions[i] + out.output_ids + [int(t) for t in rng.integers(10, 8000, 5)]
      if turn == 0:
        # Two sessions on an idle engine: one per scheduler (least load).
        assert [s.num_requests_served for s in engine.schedulers] == [1, 1]
    stats = engine.prefix_cache_stats
    assert stats["hits"] == 4 and stats["resident_rows"] == 2
    assert engine.flush_cache() == 2
    assert engine.prefix_cache_stats["resident_rows"] == 0


def test_weight_update_reaches_every_scheduler(small_model, small_config, tokenizer):
  requests = [_request(p, seed=i) for i, p in enumerate(_prompts(4, seed=3))]
  new_model = CausalLM(small_config, rngs=nnx.Rngs(7))
  with Engine(new_model, tokenizer, config=BASE) as reference:
    want = reference.generate(requests)
  with Engine(small_model, tokenizer, config=DP2, weight_version="1") as engine:
    before = engine.generate(requests)
    assert engine.prefix_cache_stats["resident_rows"] == 4
    pool = concurrent.futures.ThreadPoolExecutor(1)
    # Requests in flight while the weights change: they finish (with either weights).
    running = [engine.submit(r) for r in requests]
    pool.submit(engine.update_params, nnx.state(new_model, nnx.Param)).result()
    [f.result() for f in running]
    assert engine.weight_version == "2"
    engine.flush_cache()
    after = engine.generate(requests)
  assert [o.output_ids for o in before] != [o.output_ids for o in want]
  for a, b in zip(after, want):
    assert a.output_ids == b.output_ids and a.meta_info.weight_version == "2"
    np.testing.assert_allclose(a.output_logprobs, b.output_logprobs, atol=2e-5, rtol=0)


def test_new_sessions_sharing_a_cached_system_prompt_still_spread(small_model, tokenizer):
  """Four new sessions whose prompts are mostly a system prompt one scheduler holds: cache
  affinity may put a first one there, but the load balance sends the rest to the other."""
  rng = np.random.default_rng(6)
  system = [int(t) for t in rng.integers(10, 8000, 60)]
  with Engine(small_model, tokenizer, config=DP2) as engine:
    engine.generate([_request(system + [11, 12], seed=0)])
    holder = [s.num_requests_served for s in engine.schedulers].index(1)
    prompts = [system + [int(t) for t in rng.integers(10, 8000, 4)] for _ in range(4)]
    futures = [engine.submit(_request(p, seed=i, max_new=24)) for i, p in enumerate(prompts)]
    outs = [f.result() for f in futures]
    served = [s.num_requests_served for s in engine.schedulers]
  assert served[holder] - 1 >= 1 and served[1 - holder] >= 1, served
  assert sum(served) == 5
  # The ones routed to the holder reused the system prompt.
  assert max(o.meta_info.cached_tokens for o in outs) == 60


class _FaultyRunner:
  """The shared ModelRunner seen by one scheduler, with `method` raising while armed: a
  stand-in for a device fault (out of memory, a lost accelerator) that cannot be caused on
  purpose here. Every other call goes to the real runner."""

  def __init__(self, runner, method):
    self._runner, self._method, self.armed = runner, method, True

  def __getattr__(self, name):
    real = getattr(self._runner, name)
    if name != self._method:
      return real

    def call(*args, **kwargs):
      if self.armed:
        raise MemoryError(f"injected fault in {name}")
      return real(*args, **kwargs)

    return call


@pytest.mark.parametrize("method", ["init_cache", "prefill"])
def test_a_failing_scheduler_fails_its_requests_and_the_other_keeps_serving(
    small_model, tokenizer, method):
  """A fault in one scheduler's step (while admitting: the cache allocation; or while
  prefilling) fails that scheduler's requests with EngineError and never leaves one waiting;
  the other scheduler serves its requests meanwhile, and the failed one serves again after."""
  requests = [_request(p, seed=i, max_new=8) for i, p in enumerate(_prompts(4, seed=7))]
  with Engine(small_model, tokenizer, config=BASE) as reference:
    want = [o.output_ids for o in reference.generate(requests)]
  with Engine(small_model, tokenizer, config=DP2) as engine:
    faulty = _FaultyRunner(engine.runner, method)
    engine.schedulers[0].runner = faulty
    futures = [engine.submit(r) for r in requests]   # the first goes to scheduler 0 (idle tie)
    failed = []
    for i, future in enumerate(futures):
      try:
        assert future.result(timeout=30).output_ids == want[i]
      except EngineError as e:
        assert "injected fault" in str(e)
        failed.append(i)
    assert 0 in failed and len(failed) < len(requests)
    assert engine.schedulers[1].num_requests_served == len(requests) - len(failed)
    assert engine.is_running
    faulty.armed = False
    assert [o.output_ids for o in engine.generate(requests, timeout_s=60)] == want
    assert all(s.num_requests_served > 0 for s in engine.schedulers)


class _SlowDecode:
  """The shared ModelRunner seen by one scheduler, with each decode call held for delay_s: a
  stand-in for a long decode step (a big batch on a slow device), so that the calls below
  reliably arrive while both schedulers are inside a step. Every call runs the real runner."""

  def __init__(self, runner, delay_s):
    self._runner, self._delay_s = runner, delay_s

  def __getattr__(self, name):
    return getattr(self._runner, name)

  def decode(self, *args, **kwargs):
    time.sleep(self._delay_s)
    return self._runner.decode(*args, **kwargs)


def test_stop_during_a_weight_update_or_flush_neither_hangs(small_model, tokenizer):
  """update_params and flush_cache posted while both schedulers are inside a step, then stop():
  the schedulers leave their loops, yet the update is applied and the flush answered, at once
  (not after their timeouts); the running requests fail with EngineError. A request that
  reaches a stopped scheduler (submit racing stop) fails too instead of waiting forever."""
  requests = [_request(p, seed=i, max_new=200) for i, p in enumerate(_prompts(2, seed=8))]
  new_params = nnx.state(small_model, nnx.Param)
  engine = Engine(small_model, tokenizer, config=DP2, weight_version="1").start()
  for s in engine.schedulers:
    s.runner = _SlowDecode(engine.runner, delay_s=0.5)
  futures = [engine.submit(r) for r in requests]
  deadline = time.monotonic() + 60
  while not all(s.running_requests for s in engine.schedulers):
    assert time.monotonic() < deadline
    time.sleep(0.01)
  pool = concurrent.futures.ThreadPoolExecutor(2)
  # Their own timeouts are long, so "answered at once" stays distinguishable from "answered
  # when they timed out" on a loaded machine (one step here can take seconds under load).
  update = pool.submit(engine.update_params, new_params, timeout_s=600)
  flush = pool.submit(engine.flush_cache, timeout_s=600)
  while not all(s._control.qsize() == 2 for s in engine.schedulers):   # both posted, not run
    assert time.monotonic() < deadline
    time.sleep(0.005)
  started = time.monotonic()
  engine.stop()
  update.result(timeout=600)
  assert flush.result(timeout=600) == 0
  assert time.monotonic() - started < 300   # well before the 600 s timeouts
  assert engine.weight_version == "2"
  for future in futures:
    with pytest.raises(EngineError):
      future.result(timeout=5)
  late = engine._make_sequence(requests[0], None)
  engine.schedulers[0].enqueue(late)
  with pytest.raises(EngineError, match="stopped"):
    late.future.result(timeout=5)


def test_concurrent_weight_updates_do_not_deadlock(small_model, tokenizer):
  """Two update_params calls at once (two trainers, or /update_weights_from_disk called twice)
  whose pause requests reach the two schedulers in opposite orders: each update would hold one
  scheduler paused while waiting for the other. Scheduler 1's first control post is held back
  (a thread switch at the worst moment, made certain) so that order happens."""
  params = nnx.state(small_model, nnx.Param)
  with Engine(small_model, tokenizer, config=DP2, weight_version="1") as engine:
    second = engine.schedulers[1]
    post, calls = second.try_post_control, []

    def held_back(fn):
      calls.append(fn)
      if len(calls) == 1:
        time.sleep(0.4)
      return post(fn)

    second.try_post_control = held_back
    pool = concurrent.futures.ThreadPoolExecutor(2)
    first = pool.submit(engine.update_params, params, timeout_s=10)
    time.sleep(0.1)
    started = time.monotonic()
    other = pool.submit(engine.update_params, params, timeout_s=10)
    first.result(timeout=30)
    other.result(timeout=30)
    assert time.monotonic() - started < 5
    assert engine.weight_version == "3"
    out = engine.generate([_request(_prompts(1)[0], seed=0, max_new=4)], timeout_s=30)
    assert len(out[0].output_ids) == 4


def test_a_weight_update_waiting_behind_another_honours_its_timeout(small_model, tokenizer):
  """While one update holds the engine (a slow weight swap), a second update with a short
  timeout fails with EngineError after about that timeout instead of waiting it out."""
  params = nnx.state(small_model, nnx.Param)
  with Engine(small_model, tokenizer, config=DP2) as engine:
    swap = engine.runner.swap_params

    def slow_swap(new):
      time.sleep(2.0)
      swap(new)

    engine.runner.swap_params = slow_swap
    pool = concurrent.futures.ThreadPoolExecutor(1)
    first = pool.submit(engine.update_params, params, timeout_s=30)
    time.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(EngineError, match="another weight update held the engine for 0.2 s"):
      engine.update_params(params, timeout_s=0.2)
    assert time.monotonic() - started < 1.5
    first.result(timeout=30)
    assert engine.weight_version == "1"


def test_restart_and_a_weight_update_while_stopped(small_model, small_config, tokenizer):
  """stop() then start() again with two schedulers, and update_params while stopped (applied at
  once, no scheduler to pause): the restarted engine serves the new weights, as a fresh engine
  built from them does, and refuses requests while stopped."""
  requests = [_request(p, seed=i, greedy=i % 2 == 0) for i, p in enumerate(_prompts(4, seed=9))]
  new_model = CausalLM(small_config, rngs=nnx.Rngs(11))
  with Engine(new_model, tokenizer, config=BASE) as reference:
    want = reference.generate(requests)
  engine = Engine(small_model, tokenizer, config=DP2, weight_version="4")
  with engine:
    engine.generate(requests)
  assert not engine.is_running
  with pytest.raises(EngineError, match="not running"):
    engine.submit(requests[0])
  engine.update_params(nnx.state(new_model, nnx.Param))
  assert engine.weight_version == "5" and engine.prefix_cache_stats["resident_rows"] == 0
  with engine:
    assert engine.is_running
    got = engine.generate(requests, timeout_s=60)
  for a, b in zip(got, want):
    assert a.output_ids == b.output_ids and a.meta_info.weight_version == "5"
    np.testing.assert_allclose(a.output_logprobs, b.output_logprobs, atol=2e-5, rtol=0)


class _SlowInitCache:
  """The shared ModelRunner seen by one scheduler, with each cache allocation held for delay_s:
  a stand-in for a slow admission (a re-layout or allocation that compiles a new shape).
  Every call runs the real runner."""

  def __init__(self, runner, delay_s):
    self._runner, self._delay_s = runner, delay_s

  def __getattr__(self, name):
    return getattr(self._runner, name)

  def init_cache(self, *args, **kwargs):
    time.sleep(self._delay_s)
    return self._runner.init_cache(*args, **kwargs)


def test_requests_being_admitted_count_toward_the_load(small_model, tokenizer):
  """A request taken from scheduler 0's queue but still being admitted (its cache is being
  allocated) is load there: the next request goes to the idle scheduler 1."""
  requests = [_request(p, seed=i, max_new=4) for i, p in enumerate(_prompts(2, seed=10))]
  with Engine(small_model, tokenizer, config=DP2) as engine:
    engine.schedulers[0].runner = _SlowInitCache(engine.runner, delay_s=1.0)
    first = engine.submit(requests[0])           # idle tie: scheduler 0
    deadline = time.monotonic() + 10
    while engine.schedulers[0].queued_requests:  # taken from the queue, now being admitted
      assert time.monotonic() < deadline
      time.sleep(0.005)
    assert engine.schedulers[0].load == 1
    second = engine.submit(requests[1])
    first.result(timeout=60), second.result(timeout=60)
    assert [s.num_requests_served for s in engine.schedulers] == [1, 1]


def test_a_request_submitted_during_a_weight_update_gets_the_new_weights(
    small_model, small_config, tokenizer):
  """While update_params holds both schedulers paused (the swap is held for 0.5 s, a stand-in
  for loading large weights), a new request is queued, not refused or lost; it is admitted
  after the swap and served by the new weights only."""
  request = _request(_prompts(1, seed=12)[0], seed=0, greedy=False)
  new_model = CausalLM(small_config, rngs=nnx.Rngs(13))
  with Engine(new_model, tokenizer, config=BASE) as reference:
    [want] = reference.generate([request])
  with Engine(small_model, tokenizer, config=DP2, weight_version="1") as engine:
    swap = engine.runner.swap_params
    swapping = threading.Event()

    def slow_swap(params):
      swapping.set()
      time.sleep(0.5)
      swap(params)

    engine.runner.swap_params = slow_swap
    pool = concurrent.futures.ThreadPoolExecutor(1)
    update = pool.submit(engine.update_params, nnx.state(new_model, nnx.Param), timeout_s=30)
    assert swapping.wait(timeout=30)
    future = engine.submit(request)
    update.result(timeout=30)
    got = future.result(timeout=60)
  assert got.meta_info.weight_version == "2" and got.output_ids == want.output_ids
  np.testing.assert_allclose(got.output_logprobs, want.output_logprobs, atol=2e-5, rtol=0)
