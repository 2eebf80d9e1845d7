"""Wire format of SGLang's native HTTP API (`/generate`, `/update_weights_from_disk`, ...).

Field names and shapes follow SGLang's documentation (docs.sglang.io, "Sampling Parameters" and
"SGLang Native APIs") and its request structs (`io_struct.py::GenerateReqInput`,
`sampling_params.py::SamplingParams`, `UpdateWeightFromDiskReqInput`): the embedded engine's
server parses requests with these models, and `SGLangClient` builds its requests with them, so
both speak to a real SGLang server unchanged.

Requests are strict: a field SGLang does not define is refused (a typo such as `max_tokens` in
sampling_params would otherwise be ignored silently), and a field SGLang defines but the
embedded engine does not implement (grammars, penalties, LoRA, video and audio input) is
refused when set to anything but its default. `image_data` is served by vision-language
policies (rollout.multimodal) and refused by text-only ones. Responses accept extra fields, since SGLang adds
meta_info keys from release to release.

Response shapes (SGLang's `TokenizerManager`):
  {"text": str, "output_ids": [int], "meta_info": {
     "id": str, "finish_reason": {"type": "stop", "matched": int | str} | {"type": "length",
     "length": int} | {"type": "abort", "message": str} | None, "prompt_tokens": int,
     "completion_tokens": int, "cached_tokens": int, "weight_version": str, "e2e_latency": float,
     "input_token_logprobs": [[logprob | None, token_id, text | None], ...],
     "output_token_logprobs": [[logprob, token_id, text | None], ...],
     "input_top_logprobs" / "output_top_logprobs": [[[logprob, token_id, text | None], ...] | None]}}
A batched request (a list of texts or of id lists) answers with a list of such objects.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

# SamplingParams fields SGLang documents that the embedded engine does not implement, with the
# default value a request may still carry.
_UNSUPPORTED_SAMPLING = {
  "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
  "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
  "structural_tag": None, "stop_regex": None, "custom_params": None, "logit_bias": None,
  "spaces_between_special_tokens": True, "stream_interval": None,
}
# GenerateReqInput fields SGLang documents that the embedded engine does not implement.
_UNSUPPORTED_GENERATE = {
  "input_embeds": None, "video_data": None, "audio_data": None,
  "token_ids_logprob": None, "return_hidden_states": False, "return_routed_experts": False,
  "modalities": None, "session_params": None, "lora_path": None, "lora_id": None,
  "custom_logit_processor": None, "bootstrap_host": None, "bootstrap_port": None,
  "bootstrap_room": None, "return_entropy": False, "return_bytes": False,
  "positional_embed_overrides": None, "return_sampling_mask": None,
}
# GenerateReqInput fields SGLang documents that only steer its own scheduling, logging or
# routing; accepted and ignored.
_IGNORED_GENERATE = (
  "log_metrics", "data_parallel_rank", "routed_dp_rank", "background", "priority", "extra_key",
  "no_logs", "custom_labels", "conversation_id", "routing_key", "received_time",
  "external_trace_header", "http_worker_ipc", "cache_salt", "return_prompt_token_ids",
)


# Every field name SGLang documents for SamplingParams and GenerateReqInput: the client checks
# request keys against these (a real SGLang server implements all of them).
SGLANG_SAMPLING_FIELDS = frozenset({
  "max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
  "ignore_eos", "skip_special_tokens", "no_stop_trim", "sampling_seed", *_UNSUPPORTED_SAMPLING})
SGLANG_GENERATE_FIELDS = frozenset({
  "text", "input_ids", "image_data", "sampling_params", "rid", "session_id", "return_logprob",
  "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "stream",
  *_UNSUPPORTED_GENERATE, *_IGNORED_GENERATE})


# The integers a /generate call can carry: the clients' JSON encoder (orjson) takes signed and
# unsigned 64-bit integers and refuses larger ones (a proxied request with such a seed or
# max_tokens was a 500 when the upstream call was encoded), so sampling fields are refused
# outside this range where they are parsed. Seeds drawn as unsigned 64-bit values still fit.
JSON_INT_MIN, JSON_INT_MAX = -(2**63), 2**64 - 1
JSONInt = Annotated[int, Field(ge=JSON_INT_MIN, le=JSON_INT_MAX)]


# OpenAI-style names a /generate caller may send by mistake -> SGLang's native field.
_OPENAI_NAMES = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                 "seed": "sampling_seed"}


def _refuse_unsupported(values: Any, unsupported: dict[str, Any], what: str) -> Any:
  if not isinstance(values, dict):
    return values
  for key, default in unsupported.items():
    if key in values and values[key] != default and values[key] is not None:
      raise ValueError(
        f"{what} field {key!r}={values[key]!r} is part of SGLang's API but not implemented by "
        f"the embedded engine; send the default ({default!r}) or use an SGLang server")
  return {k: v for k, v in values.items() if k not in unsupported}


class SamplingParams(BaseModel):
  """SGLang's sampling parameters (`sampling_params` of `/generate`).

  Attributes:
    max_new_tokens: most tokens to generate; 0 scores the prompt without sampling.
    stop: stop string(s); generation ends when the decoded output contains one. The output
      text is cut before it unless no_stop_trim; output ids keep every sampled token.
    stop_token_ids: ids that end generation (in addition to the tokenizer's end-of-turn ids
      unless ignore_eos); the stop id is kept in output_ids.
    temperature: softmax temperature; below 1e-6 (0 included) means greedy (argmax). Log-probs
      returned for the request (output, prompt and top log-probs) are of logits / temperature,
      of the raw logits for a greedy request (`logprob_temperature`; rollout/sampling.py).
    top_p: nucleus sampling mass in (0, 1].
    top_k: keep the k most likely tokens; -1 keeps all.
    min_p: keep tokens with probability >= min_p * the most likely token's probability.
    ignore_eos: do not stop at the tokenizer's end-of-turn ids.
    skip_special_tokens: drop special tokens from the returned text.
    no_stop_trim: keep the matched stop string in the returned text.
    sampling_seed: seed of this request's random stream; same seed, prompt and weights give
      the same tokens whatever else shares the batch. None draws a fresh seed.
  Integer fields take what 64-bit JSON integers hold (JSON_INT_MIN..JSON_INT_MAX).
  """
  model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

  max_new_tokens: Optional[int] = Field(128, ge=0, le=JSON_INT_MAX)
  stop: Optional[Union[str, list[str]]] = None
  stop_token_ids: Optional[list[JSONInt]] = None
  temperature: float = Field(1.0, ge=0.0)
  top_p: float = Field(1.0, gt=0.0, le=1.0)
  top_k: JSONInt = -1
  min_p: float = Field(0.0, ge=0.0, le=1.0)
  ignore_eos: bool = False
  skip_special_tokens: bool = True
  no_stop_trim: bool = False
  sampling_seed: Optional[JSONInt] = None

  @pydantic.model_validator(mode="before")
  @classmethod
  def _check_unsupported(cls, values: Any) -> Any:
    if isinstance(values, dict):
      # SGLang treats null as "use the default" for its non-optional fields.
      values = {k: v for k, v in values.items()
                if not (v is None and k in ("temperature", "top_p", "top_k", "min_p",
                                            "ignore_eos", "skip_special_tokens", "no_stop_trim"))}
      for key in sorted(set(values) & set(_OPENAI_NAMES)):
        raise ValueError(f"sampling_params has {key!r}, the OpenAI API's name; SGLang's "
                         f"/generate calls it {_OPENAI_NAMES[key]!r}")
    return _refuse_unsupported(values, _UNSUPPORTED_SAMPLING, "sampling_params")

  @pydantic.field_validator("top_k")
  @classmethod
  def _check_top_k(cls, value: int) -> int:
    if value == 0 or value < -1:
      raise ValueError(f"top_k must be -1 (all tokens) or at least 1, got {value}")
    return value

  @pydantic.field_validator("stop")
  @classmethod
  def _check_stop(cls, value: Any) -> Any:
    for text in [value] if isinstance(value, str) else value or ():
      if not text:
        raise ValueError("a stop string is empty; it would end every output at its first token")
    return value

  @property
  def logprob_temperature(self) -> float:
    """The temperature the request's log-probs are of: `temperature`, or 1.0 when greedy."""
    return self.temperature if self.temperature >= 1e-6 else 1.0

  @property
  def stop_strings(self) -> list[str]:
    """`stop` as a list (empty when None)."""
    if self.stop is None:
      return []
    return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class GenerateRequest(BaseModel):
  """SGLang's `/generate` request (`GenerateReqInput`): one prompt or a batch of prompts.

  Give exactly one of `text` and `input_ids`. A batch is a list of texts or a list of id lists;
  then `sampling_params`, `rid`, `return_logprob`, `logprob_start_len` and `top_logprobs_num`
  may each be one value for all or a list with one value per prompt.

  Attributes:
    text: prompt text(s), tokenised by the server without special-token handling changes.
    input_ids: prompt token ids ([seq] or [batch][seq]).
    sampling_params: `SamplingParams` fields as a dict (or a list of dicts).
    rid: request id(s); generated when absent.
    session_id: identity shared by a session's requests (used by routers; ignored here).
    return_logprob: return per-token log-probs in meta_info.
    logprob_start_len: first prompt position to report input log-probs for; -1 (default)
      reports output tokens only.
    top_logprobs_num: how many top alternatives to report per position.
    return_text_in_logprobs: fill the third element of each log-prob entry with token text.
    stream: answer with server-sent events, one cumulative result per chunk.
    image_data: the prompt's images (vision-language policies): one image or a list for one
      prompt, one such entry per prompt for a batch. An image is a data URL
      ("data:image/png;base64,..."), a file path on the server, a bare base64 string, or
      {"url": ...}. The prompt holds <|vision_start|><|image_pad|><|vision_end|> per image (the
      <|image_pad|> run may already be widened to the image's token count).
  """
  model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

  text: Optional[Union[str, list[str]]] = None
  input_ids: Optional[Union[list[int], list[list[int]]]] = None
  image_data: Optional[Any] = None
  sampling_params: Optional[Union[dict[str, Any], list[dict[str, Any]]]] = None
  rid: Optional[Union[str, list[str]]] = None
  session_id: Optional[str] = None
  return_logprob: Optional[Union[bool, list[bool]]] = None
  logprob_start_len: Optional[Union[int, list[int]]] = None
  top_logprobs_num: Optional[Union[int, list[int]]] = None
  return_text_in_logprobs: bool = False
  stream: bool = False

  @pydantic.model_validator(mode="before")
  @classmethod
  def _check_fields(cls, values: Any) -> Any:
    values = _refuse_unsupported(values, _UNSUPPORTED_GENERATE, "/generate")
    if isinstance(values, dict):
      values = {k: v for k, v in values.items() if k not in _IGNORED_GENERATE}
    return values

  @pydantic.model_validator(mode="after")
  def _check_prompt(self) -> "GenerateRequest":
    if (self.text is None) == (self.input_ids is None):
      raise ValueError("give exactly one of 'text' and 'input_ids'")
    return self

  @property
  def is_batch(self) -> bool:
    """True when the request holds a list of prompts."""
    if self.text is not None:
      return isinstance(self.text, list)
    return bool(self.input_ids) and isinstance(self.input_ids[0], list)

  @property
  def batch_size(self) -> int:
    if not self.is_batch:
      return 1
    return len(self.text if self.text is not None else self.input_ids)

  def split(self) -> list["SingleGenerateRequest"]:
    """One `SingleGenerateRequest` per prompt, per-prompt fields picked from lists.

    Raises:
      ValueError: a per-prompt list has the wrong length, or sampling_params are invalid.
    """
    n = self.batch_size

    def pick(value: Any, i: int, name: str, default: Any) -> Any:
      if value is None:
        return default
      if isinstance(value, list):
        if not self.is_batch:
          raise ValueError(f"{name} is a list of {len(value)} but the request has one prompt; "
                           "give one value (a list gives one per prompt of a batch)")
        if len(value) != n:
          raise ValueError(f"{name} has {len(value)} entries for a batch of {n} prompts")
        return value[i]
      return value

    out = []
    for i in range(n):
      prompt_text = (self.text[i] if self.is_batch else self.text) if self.text is not None else None
      prompt_ids = ((self.input_ids[i] if self.is_batch else self.input_ids)
                    if self.input_ids is not None else None)
      rid = pick(self.rid, i, "rid", None)
      if isinstance(self.rid, str) and self.is_batch:
        rid = f"{self.rid}-{i}"
      out.append(SingleGenerateRequest(
        text=prompt_text, input_ids=prompt_ids, image_data=_images_of(self.image_data, i, n,
                                                                      self.is_batch),
        sampling_params=SamplingParams(**(pick(self.sampling_params, i, "sampling_params", None)
                                          or {})),
        rid=rid,
        return_logprob=bool(pick(self.return_logprob, i, "return_logprob", False)),
        logprob_start_len=int(pick(self.logprob_start_len, i, "logprob_start_len", -1)),
        top_logprobs_num=int(pick(self.top_logprobs_num, i, "top_logprobs_num", 0)),
        return_text_in_logprobs=self.return_text_in_logprobs))
    return out


def _images_of(value: Any, i: int, n: int, batch: bool) -> Optional[list[str]]:
  """Prompt i's images from a request's image_data (see GenerateRequest), as a list of
  sources."""
  if value is None:
    return None
  if batch:
    if not isinstance(value, list) or len(value) != n:
      raise ValueError(f"image_data has {len(value) if isinstance(value, list) else 1} "
                       f"entries for a batch of {n} prompts; give one (an image, a list of "
                       "images, or null) per prompt")
    value = value[i]
  if value is None:
    return None
  items = value if isinstance(value, list) else [value]
  out = []
  for k, item in enumerate(items):
    if isinstance(item, dict) and isinstance(item.get("url"), str):
      item = item["url"]
    if not isinstance(item, str) or not item:
      raise ValueError(f"image_data[{k}] is {type(item).__name__}; expected a data URL, a file "
                       "path, base64 text or {'url': ...}")
    out.append(item)
  return out


class SingleGenerateRequest(BaseModel):
  """One prompt of a `GenerateRequest`, with its fields resolved (see there)."""
  text: Optional[str] = None
  input_ids: Optional[list[int]] = None
  image_data: Optional[list[str]] = None
  sampling_params: SamplingParams = Field(default_factory=SamplingParams)
  rid: Optional[str] = None
  return_logprob: bool = False
  logprob_start_len: int = -1
  top_logprobs_num: int = Field(0, ge=0)
  return_text_in_logprobs: bool = False


# One log-prob entry, SGLang style: (logprob or None for the first prompt token, id, text).
LogprobEntry = tuple[Optional[float], int, Optional[str]]


class FinishReason(BaseModel):
  """Why generation ended: {"type": "stop", "matched": id or string} when a stop id or string
  was produced, {"type": "length", "length": n} at max_new_tokens, {"type": "abort", ...}."""
  model_config = ConfigDict(extra="allow")

  type: Literal["stop", "length", "abort"]
  matched: Optional[Union[int, str]] = None
  length: Optional[int] = None
  message: Optional[str] = None


class MetaInfo(BaseModel):
  """`meta_info` of a `/generate` response (see the module docstring for the entry shapes)."""
  model_config = ConfigDict(extra="allow")

  id: str
  finish_reason: Optional[FinishReason] = None
  prompt_tokens: int
  completion_tokens: int = 0
  cached_tokens: int = 0
  weight_version: Optional[str] = None
  e2e_latency: Optional[float] = None
  input_token_logprobs: Optional[list[LogprobEntry]] = None
  output_token_logprobs: Optional[list[LogprobEntry]] = None
  input_top_logprobs: Optional[list[Optional[list[LogprobEntry]]]] = None
  output_top_logprobs: Optional[list[Optional[list[LogprobEntry]]]] = None


class GenerateResponse(BaseModel):
  """One prompt's `/generate` result: text, output ids, meta_info."""
  model_config = ConfigDict(extra="allow")

  text: str
  output_ids: list[int] = Field(default_factory=list)
  meta_info: MetaInfo

  @property
  def output_logprobs(self) -> list[float]:
    """Log-probs of output_ids in order (requires return_logprob)."""
    entries = self.meta_info.output_token_logprobs
    if entries is None:
      raise ValueError(f"response {self.meta_info.id!r} carries no output_token_logprobs; "
                       "request them with return_logprob=True")
    return [float(e[0]) for e in entries]


class UpdateWeightsFromDiskRequest(BaseModel):
  """`/update_weights_from_disk` request (SGLang's `UpdateWeightFromDiskReqInput`).

  Attributes:
    model_path: folder with the new weights: a Hugging Face folder (config.json +
      *.safetensors) or, for the embedded engine, an orbax checkpoint folder.
    load_format: "auto" (detect), "safetensors"/"hf", or "orbax".
    weight_version: label reported as meta_info.weight_version afterwards.
  """
  model_config = ConfigDict(extra="forbid")

  model_path: str
  load_format: Optional[str] = None
  abort_all_requests: bool = False
  weight_version: Optional[str] = None
  is_async: bool = False
  torch_empty_cache: bool = False
  keep_pause: bool = False
  recapture_cuda_graph: bool = False
  token_step: int = 0
  flush_cache: bool = True
  rid: Optional[str] = None


class UpdateWeightsFromDiskResponse(BaseModel):
  """`/update_weights_from_disk` response: success flag, message, paused request count."""
  model_config = ConfigDict(extra="allow")

  success: bool
  message: str = ""
  num_paused_requests: Optional[int] = 0


class ModelInfo(BaseModel):
  """`/get_model_info` (alias `/model_info`) response. SGLang's fields plus, for the embedded
  engine, `compile_count` (jit compilations of the sampler so far) and `num_requests_served`."""
  model_config = ConfigDict(extra="allow")

  model_path: str
  tokenizer_path: Optional[str] = None
  is_generation: bool = True
  preferred_sampling_params: Optional[str] = None
  weight_version: Optional[str] = None
  has_image_understanding: bool = False
  has_audio_understanding: bool = False
  model_type: Optional[str] = None
  architectures: Optional[list[str]] = None
