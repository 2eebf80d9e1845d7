"""The wires the recording proxy serves beside OpenAI chat completions, mapped onto chat turns.

- `responses_api`: the OpenAI Responses API (`/v1/responses`; Codex CLI).
- `anthropic_messages`: the Anthropic Messages API (`/v1/messages`; Claude Code).
- `turn_stream`: a generated turn's text split into reasoning and content while it streams.

Each wire module is pure: request -> `ChatCompletionRequest` (raising `RequestError` for what
cannot be served), parsed turn -> the wire's response body or events. The proxy does the rest
(history matching, generation, records) once for every wire.
"""
