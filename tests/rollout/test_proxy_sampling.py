"""The proxy's sampling settings (`RecordingProxy._sampling`): the request's, with the proxy's
defaults for what it left unset and its overrides, equal to validating the merged settings
whole (the reference below, the proxy's former code) for any request, defaults and overrides,
valid or not."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from orchard_jax.rollout import RecordingProxy, SGLangUpstream
from orchard_jax.rollout.errors import RequestError
from orchard_jax.rollout.openai_chat import sampling_params_of
from orchard_jax.rollout.openai_protocol import ChatCompletionRequest
from orchard_jax.rollout.protocol import SamplingParams


def reference(request, defaults, overrides):
  params = sampling_params_of(request, request.max_new_tokens)
  fields = params.model_dump()
  for name, value in defaults.items():
    if name not in request.model_fields_set and not (
        name == "max_new_tokens" and request.max_new_tokens is not None):
      fields[name] = value
  fields.update(overrides)
  try:
    return SamplingParams(**fields)
  except ValueError as e:
    raise RequestError(str(e)) from e


def outcome(fn):
  try:
    return fn().model_dump()
  except RequestError:
    return "refused"


numbers = st.one_of(st.none(), st.integers(-3, 300), st.floats(-1.0, 3.0), st.booleans())
stops = st.one_of(st.none(), st.text(max_size=3), st.lists(st.text(max_size=3), max_size=2))
sampling_keys = {"max_new_tokens": numbers, "temperature": numbers, "top_p": numbers,
                 "top_k": numbers, "min_p": numbers, "stop": stops, "ignore_eos": numbers,
                 "sampling_seed": numbers, "n": numbers, "max_tokens": numbers,
                 "no_stop_trim": numbers, "bogus": numbers}
changes = st.dictionaries(st.sampled_from(sorted(sampling_keys)), numbers, max_size=3)
request_fields = st.fixed_dictionaries({}, optional={
  "max_tokens": st.integers(0, 500), "max_completion_tokens": st.integers(0, 500),
  "temperature": st.floats(0.0, 2.0), "top_p": st.floats(0.01, 1.0),
  "top_k": st.integers(-2, 50), "min_p": st.floats(0.0, 1.0), "stop": stops,
  "seed": st.integers(0, 2**40), "ignore_eos": st.booleans()})


@pytest.fixture(scope="module")
def proxy(tokenizer):
  return RecordingProxy(SGLangUpstream("http://127.0.0.1:9"), tokenizer=tokenizer,
                        freeze_gc=False)   # never started: _sampling alone is called


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=request_fields, defaults=changes, overrides=changes)
def test_sampling_settings_equal_the_merged_validation(proxy, fields, defaults, overrides):
  request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)
  proxy.sampling_defaults, proxy.sampling_overrides = dict(defaults), dict(overrides)
  assert outcome(lambda: proxy._sampling(request)) == outcome(
    lambda: reference(request, defaults, overrides))
