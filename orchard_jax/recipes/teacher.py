"""A teacher model behind the recording proxy: the embedded engine serving a checkpoint, or any
OpenAI-compatible or SGLang endpoint. Data distillation (recipes/swe_distill.py) runs harnesses
against it; every model call is recorded in the trajectory store.

The teacher config (experiments/swe_distill.py's `teacher`):
  url ""     the embedded JAX engine serving `checkpoint` (an orbax checkpoint folder as the
             trainer writes it, or a Hugging Face folder); with no checkpoint, a freshly
             initialised policy of `preset`. The proxy's token-level path records prompt ids,
             sampled ids and log-probs.
  url set    api "openai": any OpenAI-compatible endpoint (a hosted API, vLLM, SGLang's /v1),
             `model` sent upstream, the key read from the environment variable `api_key_env`
             (never from the config); the proxy records messages only, marked text_only (SFT
             tokenises them with the student's template, RL refuses them). api "sglang": an
             SGLang server's native /generate (token-level, like the embedded engine) with the
             teacher's `tokenizer`; `url` may list several servers, comma-separated (the
             client keeps each session on one server).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

from ml_collections import ConfigDict

from orchard_jax import data
from orchard_jax.recipes import ConfigError, load_tokenizer

TEXT_ONLY_APIS = ("openai",)
TOKEN_APIS = ("sglang",)


class TeacherError(ConfigError):
  """A teacher setting is invalid (the message names the field, what was expected and seen)."""


@dataclasses.dataclass
class Teacher:
  """A running teacher behind the recording proxy.

  Attributes:
    proxy: the `rollout.RecordingProxy`; harnesses use `proxy.session_url(session_id)`.
    model: the `model` field the harness sends.
    description: one line saying what the teacher is (printed and stored in metadata).
    text_only: True when its records carry no token ids (an OpenAI-compatible upstream).
    tokenizer: name or folder of the tokenizer its recorded ids belong to (None when
      text-only). A student with another tokenizer must re-tokenise the messages instead.
  """
  proxy: Any
  model: str
  description: str
  text_only: bool
  tokenizer: str | None = None


def load_teacher_policy(teacher: ConfigDict):
  """The embedded teacher's (model, tokenizer, description) from `teacher.checkpoint`.

  - a Hugging Face folder (config.json + *.safetensors): read with models.hf.load_pretrained;
  - any other folder: an orbax checkpoint of the parameters (a trainer checkpoint folder whose
    steps hold "state" -> "params", or one PyTree of them), restored into a policy of
    `teacher.preset` with `teacher.model_overrides`. A recipe's run folder works too: its
    "rl/checkpoints", else "sft/checkpoints", else "checkpoints" is read (latest step);
  - "": a freshly initialised policy of the preset (seed `teacher.seed`).
  The tokenizer is the checkpoint's own when a "tokenizer" folder sits in the given folder or
  up to two levels above the checkpoints (the recipes save one in their run folder), else
  `teacher.tokenizer`.

  Raises:
    TeacherError: the checkpoint folder does not exist.
    rollout.WeightUpdateError: the checkpoint does not fit the preset.
  """
  from flax import nnx

  from orchard_jax import models
  from orchard_jax.rollout.weights import load_params_from_disk

  checkpoint = teacher.checkpoint
  tokenizer_name = teacher.tokenizer
  if checkpoint:
    if not os.path.isdir(checkpoint):
      raise TeacherError(f"teacher.checkpoint {checkpoint!r} is not a folder; expected an "
                         "orbax checkpoint folder or a Hugging Face folder")
    if not os.path.isfile(os.path.join(checkpoint, "config.json")):
      checkpoint = _checkpoints_in(checkpoint)
    parent = os.path.dirname(os.path.abspath(checkpoint))
    for folder in (teacher.checkpoint, checkpoint, parent, os.path.dirname(parent)):
      if os.path.isfile(os.path.join(folder, "tokenizer", "tokenizer.json")):
        tokenizer_name = os.path.join(folder, "tokenizer")
        break
  tokenizer = load_tokenizer(tokenizer_name, field="teacher.tokenizer")
  if checkpoint and os.path.isfile(os.path.join(checkpoint, "config.json")):
    from orchard_jax.models import hf
    model_config, model = hf.load_pretrained(checkpoint)
    return model, tokenizer, (f"checkpoint {checkpoint} (Hugging Face folder, "
                              f"{model_config.architecture}; tokenizer {tokenizer_name})")
  model_config = dataclasses.replace(models.get_preset(teacher.preset),
                                     **dict(teacher.get("model_overrides", {}) or {}))
  if model_config.vocab_size < tokenizer.vocab_size:
    raise TeacherError(f"teacher.preset {teacher.preset!r} has vocab_size "
                       f"{model_config.vocab_size}; the tokenizer {tokenizer_name!r} needs "
                       f"{tokenizer.vocab_size}")
  model = models.CausalLM(model_config, rngs=nnx.Rngs(int(teacher.seed)))
  if not checkpoint:
    return model, tokenizer, (f"a freshly initialised {teacher.preset} policy (seed "
                              f"{teacher.seed}; no teacher.checkpoint given: it exercises the "
                              "pipeline and is not expected to resolve anything)")
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, load_params_from_disk(checkpoint, state, load_format="orbax"))
  nnx.update(model, state)
  return model, tokenizer, (f"checkpoint {checkpoint} (orbax, preset {teacher.preset}; "
                            f"tokenizer {tokenizer_name})")


def _checkpoints_in(path: str) -> str:
  """The checkpoints folder of a run folder (rl/, then sft/, then plain), else `path`."""
  for sub in ("rl/checkpoints", "sft/checkpoints", "checkpoints"):
    folder = os.path.join(path, sub)
    if os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder)):
      return folder
  return path


@contextlib.contextmanager
def open_teacher(teacher: ConfigDict, store: data.TrajectoryStore, *,
                 max_batch_size: int = 2) -> Iterator[Teacher]:
  """Starts the teacher (see the module docstring) behind a recording proxy writing to `store`.

  Args:
    teacher: the `teacher` ConfigDict of experiments/swe_distill.py.
    store: where the proxy appends every model call.
    max_batch_size: the embedded engine's most concurrent requests (the run's parallelism).
  Yields:
    A `Teacher`.
  Raises:
    TeacherError: an unknown teacher.api, or api "sglang" without a tokenizer.
  """
  from orchard_jax import rollout

  proxy_kwargs = dict(store=store, tool_call_parser=teacher.tool_call_parser,
                      served_model_name=teacher.model or "teacher")
  if teacher.url:
    api = teacher.api
    if api in TEXT_ONLY_APIS:
      if not teacher.model:
        raise TeacherError("teacher.model is empty; an OpenAI-compatible endpoint needs the "
                           "model name to request (e.g. --config.teacher.model=gpt-4.1)")
      upstream = rollout.OpenAIUpstream(teacher.url, teacher.model,
                                        api_key_env=teacher.api_key_env,
                                        timeout_s=float(teacher.timeout_s),
                                        max_retries=int(teacher.max_retries))
      tokenizer = None
      description = (f"OpenAI-compatible endpoint {teacher.url} serving {teacher.model!r} "
                     "(records are text-only)")
    elif api in TOKEN_APIS:
      if not teacher.tokenizer:
        raise TeacherError("teacher.api 'sglang' records token ids; set teacher.tokenizer to "
                           "the teacher's tokenizer (a Hugging Face name or folder)")
      tokenizer = load_tokenizer(teacher.tokenizer, field="teacher.tokenizer")
      urls = [u.strip() for u in teacher.url.split(",") if u.strip()]
      upstream = rollout.SGLangUpstream(urls, api_key=os.environ.get(teacher.api_key_env),
                                        timeout_s=float(teacher.timeout_s),
                                        max_retries=int(teacher.max_retries))
      description = f"SGLang server {teacher.url} (token ids recorded)"
    else:
      raise TeacherError(f"teacher.api must be one of {TEXT_ONLY_APIS + TOKEN_APIS}, got {api!r}")
    with rollout.RecordingProxy(upstream, tokenizer=tokenizer, **proxy_kwargs) as proxy:
      yield Teacher(proxy, teacher.model or "teacher", description, upstream.text_only,
                    None if tokenizer is None else tokenizer.name)
    return
  model, tokenizer, description = load_teacher_policy(teacher)
  engine_config = dict(teacher.engine)
  engine_config["max_batch_size"] = max_batch_size
  engine_config["batch_buckets"] = tuple(b for b in engine_config.get("batch_buckets", ())
                                         if b < max_batch_size) + (max_batch_size,)
  for key in ("cache_len_buckets", "prefill_chunk_buckets"):
    if key in engine_config:
      engine_config[key] = tuple(engine_config[key])
  engine = rollout.Engine(model, tokenizer, config=rollout.EngineConfig(**engine_config),
                          model_path=teacher.checkpoint or f"init:{teacher.preset}")
  with rollout.InferenceServer(engine, served_model_name=teacher.model or "teacher",
                               tool_call_parser=teacher.tool_call_parser) as server, \
      rollout.RecordingProxy(rollout.SGLangUpstream(server.url), tokenizer=tokenizer,
                             **proxy_kwargs) as proxy:
    yield Teacher(proxy, teacher.model or "teacher", f"embedded engine serving {description}",
                  False, tokenizer.name)

