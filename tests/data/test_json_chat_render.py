"""`Tokenizer.render_json_chat_text` renders exactly what transformers' apply_chat_template
(`render_chat_text`) renders, for any chat of JSON values, on each of the project's templates."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_jax.data import ChatTemplateError, tiny_tokenizer
from orchard_jax.data.tokenizer import tiny_vl_tokenizer

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | \
  st.sampled_from(["", " ", "\n", "<think>", "</think>", "<tool_call>", "<|im_end|>"])
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10, 10) | _TEXT,
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6)
_CONTENT = st.none() | _TEXT | st.lists(
  st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=2)
_CALL = st.fixed_dictionaries(
  {"function": st.fixed_dictionaries(
    {"name": _TEXT, "arguments": _TEXT | st.dictionaries(_TEXT, _JSON, max_size=2)})},
  optional={"id": _TEXT, "type": st.just("function")})
_MESSAGE = st.fixed_dictionaries(
  {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _CONTENT},
  optional={"reasoning_content": st.none() | _TEXT, "reasoning": st.none() | _TEXT,
            "thinking": st.none() | _TEXT, "tool_calls": st.none() | st.lists(_CALL, max_size=2),
            "tool_call_id": st.none() | _TEXT, "name": st.none() | _TEXT, "extra": _JSON})
_TOOL = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
  {"name": _TEXT, "parameters": st.dictionaries(_TEXT, _JSON, max_size=2)},
  optional={"description": _TEXT})})
_KWARGS = st.fixed_dictionaries({}, optional={"enable_thinking": st.booleans(),
                                              "custom": _JSON})


@pytest.fixture(scope="module", params=["tiny", "tiny_vl"])
def tokenizer(request):
  return tiny_tokenizer() if request.param == "tiny" else tiny_vl_tokenizer()


def _outcome(render, *args, **kwargs):
  try:
    return "ok", render(*args, **kwargs)
  except ChatTemplateError:
    return "error", None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(_MESSAGE, max_size=5), tools=st.none() | st.lists(_TOOL, max_size=2),
       generation=st.booleans(), kwargs=_KWARGS)
def test_json_render_matches_apply_chat_template(tokenizer, messages, tools, generation, kwargs):
  reference = _outcome(tokenizer.render_chat_text, messages, tools,
                       add_generation_prompt=generation, **kwargs)
  assert _outcome(tokenizer.render_json_chat_text, messages, tools,
                  add_generation_prompt=generation, **kwargs) == reference


def test_json_render_keeps_caller_messages_and_names_bad_input(tok):
  messages = [{"role": "user", "content": "hi", "reasoning": "r", "name": None}]
  text = tok.render_json_chat_text(messages, None)
  assert messages == [{"role": "user", "content": "hi", "reasoning": "r", "name": None}]
  assert text == tok.render_chat_text(messages, None)
  with pytest.raises(ChatTemplateError, match="empty conversation"):
    tok.render_json_chat_text([])
  with pytest.raises(ChatTemplateError, match="2 messages"):
    tok.render_json_chat_text([{"role": "user", "content": "x"}, "not a message"])
