"""The project's chat template against a Qwen-style reference template written here.

The reference is rendered by transformers' own apply_chat_template (a second, independent
renderer of the same Qwen3 markup), plus one chat whose expected text is spelled out by hand.
"""
import json

import pytest

from orchard_jax.data import ChatTemplateError

# Qwen3 chat markup, written independently of orchard_jax/data/chat.py: tools section in the
# system turn, <tool_call> JSON blocks in assistant turns, tool results grouped into one user
# turn, reasoning in a <think> block, every assistant turn rendered alike.
REFERENCE_TEMPLATE = (
  "{%- set nl = '\\n' -%}"
  "{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}"
  "{%- if tools -%}"
  "{{ '<|im_start|>system' ~ nl }}{% if sys is not none %}{{ sys ~ nl ~ nl }}{% endif %}"
  "{{ '# Tools' ~ nl ~ nl ~ 'You may call one or more functions to assist with the user query.' }}"
  "{{ nl ~ nl ~ 'You are provided with function signatures within <tools></tools> XML tags:' }}"
  "{{ nl ~ '<tools>' }}{% for t in tools %}{{ nl ~ (t | tojson) }}{% endfor %}"
  "{{ nl ~ '</tools>' ~ nl ~ nl ~ 'For each function call, return a json object with'"
  " ~ ' function name and arguments within <tool_call></tool_call> XML tags:' ~ nl }}"
  "{{ '<tool_call>' ~ nl ~ '{\"name\": <function-name>, \"arguments\": <args-json-object>}' }}"
  "{{ nl ~ '</tool_call><|im_end|>' ~ nl }}"
  "{%- elif sys is not none -%}"
  "{{ '<|im_start|>system' ~ nl ~ sys ~ '<|im_end|>' ~ nl }}"
  "{%- endif -%}"
  "{%- for m in messages -%}"
  "{%- if m.content is string -%}{%- set c = m.content -%}"
  "{%- elif m.content -%}{%- set c = m.content | map(attribute='text') | join('') -%}"
  "{%- else -%}{%- set c = '' -%}{%- endif -%}"
  "{%- if m.role == 'system' and loop.index0 == 0 -%}"
  "{%- elif m.role in ['user', 'system'] -%}"
  "{{ '<|im_start|>' ~ m.role ~ nl ~ c ~ '<|im_end|>' ~ nl }}"
  "{%- elif m.role == 'assistant' -%}{{ '<|im_start|>assistant' ~ nl }}"
  "{%- if m.reasoning_content -%}"
  "{{ '<think>' ~ nl ~ m.reasoning_content.strip(nl) ~ nl ~ '</think>' ~ nl ~ nl ~ c.lstrip(nl) }}"
  "{%- else -%}{{ c }}{%- endif -%}"
  "{%- for tc in m.tool_calls or [] -%}"
  "{%- set f = tc.function if tc.function else tc -%}"
  "{%- if not loop.first or c -%}{{ nl }}{%- endif -%}"
  "{{ '<tool_call>' ~ nl ~ '{\"name\": \"' ~ f.name ~ '\", \"arguments\": ' }}"
  "{{ f.arguments if f.arguments is string else (f.arguments | tojson) }}"
  "{{ '}' ~ nl ~ '</tool_call>' }}"
  "{%- endfor -%}{{ '<|im_end|>' ~ nl }}"
  "{%- elif m.role == 'tool' -%}"
  "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' -%}"
  "{{ '<|im_start|>user' }}{%- endif -%}"
  "{{ nl ~ '<tool_response>' ~ nl ~ c ~ nl ~ '</tool_response>' }}"
  "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}"
  "{{ '<|im_end|>' ~ nl }}{%- endif -%}"
  "{%- endif -%}"
  "{%- endfor -%}"
  "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant' ~ nl }}"
  "{%- if enable_thinking is defined and not enable_thinking -%}"
  "{{ '<think>' ~ nl ~ nl ~ '</think>' ~ nl ~ nl }}{%- endif -%}"
  "{%- endif -%}"
)

BASH = {"type": "function", "function": {
  "name": "bash", "description": "Run a command; returns stdout, stderr and exit code.",
  "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                 "required": ["command"]}}}
EDIT = {"type": "function", "function": {
  "name": "str_replace", "description": "Edit a file ✎",
  "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}}}}


def _call(name, args, as_string=False, call_id="call_1"):
  return {"id": call_id, "type": "function",
          "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


AGENT_CHAT = [
  {"role": "system", "content": "You are a software engineer.\nUse the tools."},
  {"role": "user", "content": "Fix the failing test in repo/.\n"},
  {"role": "assistant", "content": "I will look around first.",
   "tool_calls": [_call("bash", {"command": "ls -la\ncat setup.py"})]},
  {"role": "tool", "tool_call_id": "call_1", "content": "total 8\nsetup.py\n"},
  {"role": "assistant", "content": None, "reasoning_content": "\nThe bug is in utils.\n",
   "tool_calls": [_call("str_replace", {"path": "u.py", "old": "a", "new": "b ü"}, True),
                  _call("bash", {"command": "pytest -q"}, call_id="call_2")]},
  {"role": "tool", "tool_call_id": "call_1", "content": "edited"},
  {"role": "tool", "tool_call_id": "call_2", "content": "1 passed\n\n"},
  {"role": "assistant", "content": "\nDone: the test passes."},
]
CHATS = {
  "single_user": ([{"role": "user", "content": "hi"}], None),
  "system_user": ([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}], None),
  "tools_no_system": ([{"role": "user", "content": "list"}], [BASH]),
  "agent": (AGENT_CHAT, [BASH, EDIT]),
  "agent_no_tools_listed": (AGENT_CHAT[1:], None),
  "content_parts": ([{"role": "user", "content": [{"type": "text", "text": "part one, "},
                                                  {"type": "text", "text": "part two"}]},
                     {"role": "assistant", "content": "ok"}], None),
  "later_system": ([{"role": "user", "content": "a"}, {"role": "system", "content": "note"},
                    {"role": "user", "content": "b"}], None),
  "tool_first": ([{"role": "tool", "content": "x"}, {"role": "tool", "content": "y"}], None),
}


@pytest.mark.parametrize("name", sorted(CHATS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_reference_template(tok, name, add_generation_prompt):
  messages, tools = CHATS[name]
  expected = tok.hf.apply_chat_template(
    messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
    chat_template=REFERENCE_TEMPLATE)
  got = tok.render_chat_text(messages, tools, add_generation_prompt=add_generation_prompt)
  assert got == expected


def test_enable_thinking_false_matches_reference(tok):
  messages = [{"role": "user", "content": "hi"}]
  expected = tok.hf.apply_chat_template(
    messages, tokenize=False, add_generation_prompt=True, enable_thinking=False,
    chat_template=REFERENCE_TEMPLATE)
  assert tok.render_chat_text(messages, enable_thinking=False) == expected
  assert expected.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_hand_written_rendering(tok):
  messages = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A", "tool_calls": [_call("bash", {"command": "ls"})]},
    {"role": "tool", "content": "out\n"},
  ]
  expected = (
    "<|im_start|>system\nS<|im_end|>\n"
    "<|im_start|>user\nU<|im_end|>\n"
    "<|im_start|>assistant\nA\n<tool_call>\n{\"name\": \"bash\", \"arguments\": "
    "{\"command\": \"ls\"}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nout\n\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n")
  assert tok.render_chat_text(messages) == expected
  ids = tok.render_chat(messages)
  assert ids == tok.encode(expected)
  im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
  assert ids.count(im_start) == 5 and ids.count(im_end) == 4
  assert ids.count(tok.token_to_id("<tool_call>")) == 1
  assert ids.count(tok.token_to_id("<tool_response>")) == 1


def test_rendering_is_prefix_stable(tok):
  """Rendering a chat, then the chat plus more turns, extends the first rendering."""
  tools = [BASH, EDIT]
  full = tok.render_chat_text(AGENT_CHAT, tools, add_generation_prompt=False)
  for k in range(1, len(AGENT_CHAT)):
    if AGENT_CHAT[k - 1]["role"] == "tool" and AGENT_CHAT[k]["role"] == "tool":
      continue  # consecutive tool results share one turn, closed by the last one
    part = tok.render_chat_text(AGENT_CHAT[:k], tools, add_generation_prompt=False)
    assert full.startswith(part), k
    if AGENT_CHAT[k]["role"] == "assistant":
      prompt = tok.render_chat_text(AGENT_CHAT[:k], tools, add_generation_prompt=True)
      assert full.startswith(prompt), k


def test_empty_chat_is_a_clear_error(tok):
  with pytest.raises(ChatTemplateError, match="0 messages"):
    tok.render_chat_text([])


def test_unknown_role_is_a_clear_error(tok):
  with pytest.raises(ChatTemplateError, match="unsupported message role exit"):
    tok.render_chat_text([{"role": "user", "content": "x"}, {"role": "exit", "content": "bye"}])


def test_continuation_extends_recorded_ids_without_re_rendering(tok):
  """docs/cases.md 1: the next prompt is the recorded ids + the new turns' text, whatever the
  template would do to the history (here: a tool result ending in a newline, and a sampled
  answer whose ids are not the ones encode() would give)."""
  tools = [BASH]
  history = [{"role": "user", "content": "Run it."}]
  prompt = tok.render_chat(history, tools)
  sampled_text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
  sampled = [i for ch in sampled_text for i in tok.encode(ch)] + [tok.eos_id]  # odd split
  assert sampled[:-1] != tok.encode(sampled_text)
  assistant = {"role": "assistant", "content": None,
               "tool_calls": [_call("bash", {"command": "ls"})]}
  chat = history + [assistant, {"role": "tool", "content": "a.py\n"}]
  continuation = tok.render_continuation(chat, num_recorded=2, tools=tools)
  assert continuation == ("\n<|im_start|>user\n<tool_response>\na.py\n\n</tool_response>"
                          "<|im_end|>\n<|im_start|>assistant\n")
  next_prompt = prompt + sampled + tok.encode(continuation)
  assert tok.decode(next_prompt) == tok.render_chat_text(chat, tools)  # same text ...
  assert next_prompt[:len(prompt) + len(sampled)] == prompt + sampled  # ... sampled ids kept
  assert next_prompt != tok.render_chat(chat, tools)  # a re-rendering would change them
  with pytest.raises(ChatTemplateError, match="assistant message"):
    tok.render_continuation(chat, num_recorded=3, tools=tools)


# Like Qwen3's official template: the last assistant turn gets an empty think block, earlier
# turns lose their reasoning, so a rendering changes once more turns follow.
HISTORY_REWRITING_TEMPLATE = (
  "{%- for m in messages -%}"
  "{%- if m.role == 'assistant' -%}"
  "{{ '<|im_start|>assistant\\n' }}"
  "{%- if loop.last -%}{{ '<think>\\n' ~ (m.reasoning_content or '') ~ '\\n</think>\\n\\n' }}"
  "{%- endif -%}"
  "{{ m.content ~ '<|im_end|>\\n' }}"
  "{%- elif m.role == 'tool' -%}"
  "{{ '<|im_start|>user\\n<tool_response>\\n' ~ m.content ~ '\\n</tool_response><|im_end|>\\n' }}"
  "{%- else -%}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}{%- endif -%}"
  "{%- endfor -%}"
  "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


def test_continuation_with_a_template_that_rewrites_history(tok):
  import copy

  from orchard_jax.data import Tokenizer

  hf = copy.deepcopy(tok.hf)
  hf.chat_template = HISTORY_REWRITING_TEMPLATE
  rewriting = Tokenizer(hf, name="rewriting")
  chat = [{"role": "user", "content": "q"},
          {"role": "assistant", "content": "a1", "reasoning_content": "r"},
          {"role": "tool", "content": "out\n"}]
  recorded = rewriting.render_chat_text(chat[:2], add_generation_prompt=False)
  assert not rewriting.render_chat_text(chat).startswith(recorded.removesuffix("\n"))
  assert rewriting.render_continuation(chat, num_recorded=2) == (
    "\n<|im_start|>user\n<tool_response>\nout\n\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n")
