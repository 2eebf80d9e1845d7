"""The project's chat template: Qwen3's chat markup, written as a prefix-stable Jinja template.

Rendered through transformers' `apply_chat_template`, like any Hugging Face template.

Markup (Qwen3, as its tokenizer renders it):
  <|im_start|>system\n{system}<|im_end|>\n
  <|im_start|>user\n{text}<|im_end|>\n
  <|im_start|>assistant\n[<think>\n{reasoning}\n</think>\n\n]{text}
      [\n]<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>...<|im_end|>\n
  <|im_start|>user\n<tool_response>\n{result}\n</tool_response>...<|im_end|>\n
      (consecutive tool messages share one user turn)
With tools, the system turn ends with a "# Tools" section listing each tool's JSON schema
inside <tools></tools> and the <tool_call> format; without a system message, the tools
section alone forms the system turn. add_generation_prompt appends "<|im_start|>assistant\n"
(and an empty think block when enable_thinking=False).

One deliberate difference from Qwen3's official template: every assistant turn is rendered the
same way wherever it sits in the chat (reasoning kept, no empty think block inserted into the
last turn). So rendering a chat, then the chat plus its next turns, gives a string that starts
with the first rendering, and training sequences built from text-only records extend turn by
turn instead of restarting. Content given as a list of parts keeps the text parts.
"""

QWEN3_CHAT_TEMPLATE = r"""
{%- macro text_of(content) -%}
  {%- if content is string -%}
    {{- content -}}
  {%- elif content is iterable and content is not mapping -%}
    {%- for part in content -%}
      {%- if part is string -%}
        {{- part -}}
      {%- elif part is mapping and part.get('type') == 'text' -%}
        {{- part.get('text', '') -}}
      {%- endif -%}
    {%- endfor -%}
  {%- elif content is not none -%}
    {{- raise_exception('message content must be a string or a list of parts') -}}
  {%- endif -%}
{%- endmacro -%}

{%- set first_is_system = messages | length > 0 and messages[0]['role'] == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if first_is_system -%}
    {{- text_of(messages[0].get('content')) + '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}
    {{- '\n' + (tool | tojson) -}}
  {%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' -}}
  {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif first_is_system -%}
  {{- '<|im_start|>system\n' + text_of(messages[0].get('content')) + '<|im_end|>\n' -}}
{%- endif -%}

{%- for message in messages -%}
  {%- set role = message['role'] -%}
  {%- if role == 'system' and loop.first -%}
    {#- already rendered above -#}
  {%- elif role == 'user' or role == 'system' -%}
    {{- '<|im_start|>' + role + '\n' + text_of(message.get('content')) + '<|im_end|>\n' -}}
  {%- elif role == 'assistant' -%}
    {%- set text = text_of(message.get('content')) -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if message.get('reasoning_content') -%}
      {{- '<think>\n' + message['reasoning_content'].strip('\n') + '\n</think>\n\n' -}}
      {%- set text = text.lstrip('\n') -%}
    {%- endif -%}
    {{- text -}}
    {%- for call in message.get('tool_calls') or [] -%}
      {%- if text or not loop.first -%}
        {{- '\n' -}}
      {%- endif -%}
      {%- set fn = call['function'] if call.get('function') else call -%}
      {{- '<tool_call>\n{"name": "' + fn['name'] + '", "arguments": ' -}}
      {%- if fn.get('arguments') is string -%}
        {{- fn['arguments'] -}}
      {%- else -%}
        {{- (fn.get('arguments') or {}) | tojson -}}
      {%- endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + text_of(message.get('content')) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- raise_exception('unsupported message role ' + role
                        + '; expected system, user, assistant or tool') -}}
  {%- endif -%}
{%- endfor -%}

{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
""".strip()


_TEXT_PART = """      {%- elif part is mapping and part.get('type') == 'text' -%}
        {{- part.get('text', '') -}}
"""
_IMAGE_PART = """      {%- elif part is mapping and part.get('type') in ('image_url', 'image') -%}
        {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
"""
assert _TEXT_PART in QWEN3_CHAT_TEMPLATE
QWEN3_VL_CHAT_TEMPLATE = QWEN3_CHAT_TEMPLATE.replace(_TEXT_PART, _TEXT_PART + _IMAGE_PART)
