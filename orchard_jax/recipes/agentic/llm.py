"""LLM endpoints for a domain's graders (the RPR judge, the credit annotator).

A grader talks to any OpenAI-compatible endpoint (a hosted API, SGLang or vLLM serving an
open-weight model, the embedded engine) through the harness's `ChatModel`, with its API key
read from an environment variable (never from the config file). Prompts are text files in the
domain's prompt folder (e.g. `orchard_jax/recipes/swe/prompts/`) with `$name` placeholders
(string.Template, so JSON braces in the prompt need no escaping); replies are parsed by
`extract_json_object`.
"""
from __future__ import annotations

import json
import os
import re
import string
from typing import Any, Mapping, Optional

class GraderError(Exception):
  """A grader's reply could not be used (no JSON object, wrong fields, values out of range)."""


def load_prompt(name_or_path: str, prompts_dir: str = "") -> string.Template:
  """A prompt template: a path, or a file in `prompts_dir` (a domain's prompt folder) by name
  ("swe_judge.txt").

  Raises:
    FileNotFoundError: neither exists (the message names the places looked at).
  """
  candidates = [name_or_path] + ([os.path.join(prompts_dir, name_or_path)] if prompts_dir
                                 else [])
  for path in candidates:
    if os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        return string.Template(f.read())
  raise FileNotFoundError(f"prompt {name_or_path!r} not found; looked at {candidates}")


def render_prompt(template: string.Template, values: Mapping[str, Any]) -> str:
  """Fills the template's $placeholders (a missing value raises KeyError naming it)."""
  return template.substitute({k: str(v) for k, v in values.items()})


def extract_json_object(text: str) -> dict:
  """The JSON object in a model reply: a ```json fenced block, else the first balanced {...}.

  Raises:
    GraderError: no parsable JSON object (the message quotes the reply's start).
  """
  fenced = re.findall(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.DOTALL)
  candidates = fenced + _balanced_objects(text)
  for candidate in candidates:
    try:
      value = json.loads(candidate)
    except ValueError:
      continue
    if isinstance(value, dict):
      return value
  raise GraderError(f"expected a JSON object in the reply; got {text[:300]!r}")


def _balanced_objects(text: str) -> list[str]:
  """Substrings from each '{' to its matching '}' (string-aware), outermost first."""
  out = []
  start = text.find("{")
  while start != -1:
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
      ch = text[i]
      if in_string:
        if escaped:
          escaped = False
        elif ch == "\\":
          escaped = True
        elif ch == '"':
          in_string = False
        continue
      if ch == '"':
        in_string = True
      elif ch == "{":
        depth += 1
      elif ch == "}":
        depth -= 1
        if depth == 0:
          out.append(text[start:i + 1])
          break
    start = text.find("{", start + 1)
  return out


def chat_model(endpoint, *, temperature: float, max_tokens: int):
  """A harness `ChatModel` for an endpoint config (url, model, api_key_env, timeout_s, retries).

  Raises:
    GraderError: no url, or api_key_env names a variable that is not set.
  """
  from orchard_jax.harness import ChatModel
  if not endpoint.url:
    raise GraderError("the grader endpoint has no url; set judge.url / annotator.url or use "
                      "the offline 'evidence' kind")
  api_key: Optional[str] = None
  if endpoint.get("api_key_env"):
    api_key = os.environ.get(endpoint.api_key_env)
    if not api_key:
      raise GraderError(f"environment variable {endpoint.api_key_env} (the grader's API key) "
                        "is not set")
  return ChatModel(endpoint.url, endpoint.model or "default", api_key=api_key,
                   temperature=float(temperature), max_tokens=int(max_tokens),
                   timeout_s=float(endpoint.get("timeout_s", 120.0)),
                   retries=int(endpoint.get("retries", 2)))
