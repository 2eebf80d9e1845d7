"""The engine's HTTP server: SGLang's native endpoints and the OpenAI-compatible ones, driven by
the project's SGLangClient, plain HTTP and the official `openai` client."""
import json

import httpx
import numpy as np
import openai
import pytest

from orchard_jax.rollout import InferenceServer, SGLangClient, UpstreamError

BASH_TOOL = {"type": "function", "function": {
  "name": "bash", "description": "Run a bash command",
  "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                 "required": ["command"]}}}


@pytest.fixture(scope="module")
def server(engine):
  with InferenceServer(engine, served_model_name="tiny-policy") as running:
    yield running


def test_generate_native_api(server, engine, tokenizer):
  with SGLangClient(server.url) as client:
    out = client.generate(input_ids=[5, 6, 7], return_logprob=True, top_logprobs_num=3,
                          sampling_params={"max_new_tokens": 6, "temperature": 0,
                                           "ignore_eos": True})
    assert len(out.output_ids) == 6 and out.meta_info.completion_tokens == 6
    assert out.meta_info.prompt_tokens == 3
    assert [e[1] for e in out.meta_info.output_token_logprobs] == out.output_ids
    tops = out.meta_info.output_top_logprobs
    assert len(tops) == 6 and all(len(t) == 3 for t in tops)
    for entry, top in zip(out.meta_info.output_token_logprobs, tops):
      assert top[0][1] == entry[1]  # greedy: the sampled token is the most likely one
      assert top[0][0] == pytest.approx(entry[0], abs=1e-5)
      assert top[0][0] >= top[1][0] >= top[2][0]
    assert out.text == tokenizer.decode(out.output_ids, skip_special_tokens=True)
    by_text = client.generate(text=tokenizer.decode([5, 6, 7]),
                              sampling_params={"max_new_tokens": 6, "temperature": 0,
                                               "ignore_eos": True})
    assert by_text.meta_info.prompt_tokens == len(tokenizer.encode(tokenizer.decode([5, 6, 7])))
    batch = client.generate_batch([[5, 6, 7], [8, 9]], sampling_params={
      "max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
    assert batch[0].output_ids == out.output_ids and len(batch[1].output_ids) == 6
    scores = client.score([5, 6, 7] + out.output_ids)
    assert scores[0] is None
    np.testing.assert_allclose(scores[3:], [e[0] for e in out.meta_info.output_token_logprobs],
                               atol=1e-4)
    info = client.model_info()
    assert info.model_path == engine.model_path and info.model_extra["compile_count"] > 0
    assert all(client.health().values())


def test_generate_raw_http_shape_and_errors(server):
  body = {"input_ids": [[1, 2], [3, 4, 5]], "return_logprob": True, "logprob_start_len": 0,
          "sampling_params": [{"max_new_tokens": 2, "temperature": 0, "ignore_eos": True},
                              {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}]}
  r = httpx.post(server.url + "/generate", json=body, timeout=120)
  assert r.status_code == 200
  data = r.json()
  assert isinstance(data, list) and [len(d["output_ids"]) for d in data] == [2, 3]
  meta = data[1]["meta_info"]
  assert meta["finish_reason"] == {"type": "length", "length": 3, "matched": None,
                                   "message": None} or meta["finish_reason"]["type"] == "length"
  assert meta["input_token_logprobs"][0][0] is None and len(meta["input_token_logprobs"]) == 3
  assert all(len(e) == 3 for e in meta["output_token_logprobs"])
  bad = httpx.post(server.url + "/generate",
                   json={"input_ids": [1], "sampling_params": {"max_tokens": 3}})
  assert bad.status_code == 400 and "max_tokens" in bad.json()["message"]
  assert "max_new_tokens" in bad.json()["message"]        # names the field SGLang uses
  bad = httpx.post(server.url + "/generate",
                   json={"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}})
  assert bad.status_code == 400 and "not implemented" in bad.json()["message"]
  bad = httpx.post(server.url + "/generate", json={"text": "a", "input_ids": [1]})
  assert bad.status_code == 400
  with SGLangClient(server.url, max_retries=0) as client:
    with pytest.raises(UpstreamError, match="does not exist"):
      client.update_weights_from_disk("/no/such/folder")
  assert httpx.get(server.url + "/get_weight_version").json()["weight_version"]



def test_chat_refuses_what_the_text_template_would_drop(server):
  """An image part or a tool without a function schema was answered with HTTP 200, the part or
  tool silently left out of the prompt (found by a new-user walkthrough); text parts still
  work."""
  url = server.url + "/v1/chat/completions"
  image = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
      {"type": "text", "text": "what is this?"},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
  bad = httpx.post(url, json=image, timeout=120)
  assert bad.status_code == 400
  assert ("messages[0].content[1] has type 'image_url'; this model reads text only"
          in bad.json()["message"])
  tool = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
          "tools": [BASH_TOOL, {"type": "function", "function": {"description": "no name"}}]}
  bad = httpx.post(url, json=tool, timeout=120)
  assert bad.status_code == 400 and "tools[1] is" in bad.json()["message"]
  text_parts = dict(image, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
  ok = httpx.post(url, json=dict(text_parts, tools=[BASH_TOOL]), timeout=120)
  assert ok.status_code == 200, ok.text


def test_generate_errors_name_the_field_in_one_line(server):
  """/generate returned pydantic's multi-line text ("1 validation error for SamplingParams",
  the input echoed, a documentation URL); now `field: problem`, as the OpenAI routes do."""
  cases = [
      ({"text": "x", "sampling_params": {"temperature": -1}},
       "sampling_params.temperature: Input should be greater than or equal to 0"),
      ({"text": "x", "sampling_params": {"max_new_tokens": "four"}},
       "sampling_params.max_new_tokens: Input should be a valid integer"),
      ({"txt": "x"}, "txt: Extra inputs are not permitted"),
  ]
  for body, expected in cases:
    bad = httpx.post(server.url + "/generate", json=body, timeout=120)
    assert bad.status_code == 400
    message = bad.json()["message"]
    assert message.startswith(expected), message
    assert "\n" not in message and "errors.pydantic.dev" not in message

def test_generate_streaming(server):
  body = {"input_ids": [4, 5, 6], "stream": True,
          "sampling_params": {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}}
  events = []
  with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as response:
    for line in response.iter_lines():
      if line.startswith("data:"):
        events.append(line[5:].strip())
  assert events[-1] == "[DONE]"
  results = [json.loads(e) for e in events[:-1]]
  assert len(results) >= 2  # partial results per engine step, then the final one
  lengths = [len(r["output_ids"]) for r in results]
  assert lengths == sorted(lengths) and lengths[-1] == 20
  assert results[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_openai_chat_and_completions(server, tokenizer):
  client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
  messages = [{"role": "system", "content": "You run commands."},
              {"role": "user", "content": "List the files.\n"}]
  chat = client.chat.completions.create(
    model="tiny-policy", messages=messages, tools=[BASH_TOOL], max_tokens=12, temperature=0,
    logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
  choice = chat.choices[0]
  assert choice.finish_reason == "length" and chat.usage.completion_tokens == 12
  prompt = tokenizer.render_chat(messages, [BASH_TOOL], add_generation_prompt=True)
  assert chat.usage.prompt_tokens == len(prompt)
  assert len(choice.logprobs.content) == 12
  assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
  # The same prompt through the native API gives the same tokens.
  with SGLangClient(server.url) as native:
    same = native.generate(input_ids=prompt, sampling_params={
      "max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
  assert [t.token for t in choice.logprobs.content] == [tokenizer.decode([i])
                                                        for i in same.output_ids]
  models = client.models.list()
  assert models.data[0].id == "tiny-policy"
  completion = client.completions.create(model="tiny-policy", prompt="def main():", max_tokens=5,
                                         temperature=0, logprobs=1, echo=True)
  assert completion.choices[0].text.startswith("def main():")
  assert len(completion.choices[0].logprobs.token_logprobs) == 5
  stream = client.chat.completions.create(model="tiny-policy", messages=messages, max_tokens=4,
                                          temperature=0, stream=True)
  chunks = list(stream)
  assert chunks[-1].choices[0].finish_reason in ("length", "stop")
  with pytest.raises(openai.BadRequestError):
    client.chat.completions.create(model="tiny-policy", messages=messages, n=2)


def test_flush_cache_drops_the_prefix_cache(server, engine):
  """POST /flush_cache empties the engine's prefix cache (SGLang's /flush_cache), so the same
  prompt sent again reuses nothing."""
  body = {"input_ids": [31, 32, 33, 34, 35, 36], "sampling_params": {
    "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}
  assert httpx.post(server.url + "/generate", json=body, timeout=120).status_code == 200
  again = httpx.post(server.url + "/generate", json=body, timeout=120).json()
  assert again["meta_info"]["cached_tokens"] == 5      # all but the last prompt token
  assert httpx.get(server.url + "/get_model_info").json()["prefix_cache"]["resident_rows"] >= 1
  r = httpx.post(server.url + "/flush_cache", timeout=60)
  assert r.status_code == 200
  assert httpx.get(server.url + "/get_model_info").json()["prefix_cache"]["resident_rows"] == 0
  after = httpx.post(server.url + "/generate", json=body, timeout=120).json()
  assert after["meta_info"]["cached_tokens"] == 0
