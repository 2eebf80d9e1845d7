"""Teacher models, served by the one engine stack (`serving.ModelService`).

- The distillation teacher (config.teacher of experiments/swe_distill.py) runs a domain's
  harness behind the recording proxy:
    url ""     the embedded JAX engine serving `checkpoint` (an orbax checkpoint folder as the
               trainer writes it, a run folder, or a Hugging Face folder); with no checkpoint, a
               freshly initialised policy of `preset`. Prompt ids, sampled ids and log-probs
               are recorded.
    url set    api "openai": any OpenAI-compatible endpoint (a hosted API, vLLM, SGLang's /v1),
               `model` sent upstream, the key read from the environment variable `api_key_env`
               (never from the config); records are messages only, marked text_only (SFT
               tokenises them with the student's template, RL refuses them). api "sglang": an
               SGLang server's native /generate (token-level) with the teacher's `tokenizer`;
               `url` may list several servers, comma-separated.
- The on-policy-distillation teacher (config.opd) scores the student's sampled tokens: SGLang
  servers (`opd.teacher_urls`) or a second embedded engine serving `opd.teacher_init`.
"""
from __future__ import annotations

import os
from typing import Any

from ml_collections import ConfigDict

from orchard_jax.recipes import ConfigError, load_tokenizer
from orchard_jax.recipes.agentic import policy as policy_lib
from orchard_jax.recipes.agentic.serving import ModelService, engine_config

TEXT_ONLY_APIS = ("openai",)
TOKEN_APIS = ("sglang",)


class TeacherError(ConfigError):
  """A teacher setting is invalid (the message names the field, what was expected and seen)."""


def teacher_policy(teacher: ConfigDict, mesh=None) -> tuple[Any, Any, str]:
  """The embedded distillation teacher's (model, tokenizer, description) from
  `teacher.checkpoint` (module docstring); the parameters are read by `policy.build_policy`.

  The tokenizer is the checkpoint's own when a "tokenizer" folder sits beside it (the recipes
  save one in their run folder), else `teacher.tokenizer`.

  Raises:
    TeacherError: the checkpoint folder does not exist.
    rollout.WeightUpdateError: the checkpoint does not fit the preset.
  """
  from orchard_jax import parallel
  checkpoint = teacher.checkpoint
  tokenizer_name = teacher.tokenizer
  if checkpoint:
    if not os.path.isdir(checkpoint):
      raise TeacherError(f"teacher.checkpoint {checkpoint!r} is not a folder; expected an "
                         "orbax checkpoint folder, a run folder or a Hugging Face folder")
    tokenizer_name = policy_lib.tokenizer_near(checkpoint) or tokenizer_name
  tokenizer = load_tokenizer(tokenizer_name, field="teacher.tokenizer")
  block = ConfigDict(dict(preset=teacher.preset, init=checkpoint, tokenizer=tokenizer_name,
                          tool_call_parser=teacher.tool_call_parser,
                          **dict(teacher.get("model_overrides", {}) or {})))
  mesh = mesh if mesh is not None else parallel.make_mesh({"data": -1})
  try:
    model = policy_lib.build_policy(block, mesh, vocab_size=tokenizer.vocab_size,
                                    seed=int(teacher.seed))
  except policy_lib.PolicyError as error:
    raise TeacherError(f"teacher: {error}") from error
  if not checkpoint:
    return model, tokenizer, (f"a freshly initialised {teacher.preset} policy (seed "
                              f"{teacher.seed}; no teacher.checkpoint given: it exercises the "
                              "pipeline and is not expected to resolve anything)")
  if policy_lib.is_hf_folder(checkpoint):
    return model, tokenizer, (f"checkpoint {checkpoint} (Hugging Face folder, "
                              f"{model.config.architecture}; tokenizer {tokenizer_name})")
  folder = policy_lib.find_checkpoint_dir(checkpoint) or checkpoint
  return model, tokenizer, (f"checkpoint {folder} (orbax, preset {teacher.preset}; tokenizer "
                            f"{tokenizer_name})")


def distillation_teacher(teacher: ConfigDict, store, *, max_batch_size: int = 2) -> ModelService:
  """The distillation teacher behind a recording proxy writing to `store` (module docstring);
  enter it to start it. An embedded vision-language teacher reads the chats' images; an
  OpenAI-compatible endpoint is sent them as image parts, as the harness wrote them.

  Args:
    teacher: the `teacher` block of experiments/swe_distill.py.
    store: where the proxy appends every model call.
    max_batch_size: the embedded engine's most concurrent requests (the run's parallelism).
  Raises:
    TeacherError: an unknown teacher.api, api "openai" without a model, or api "sglang"
      without a tokenizer.
  """
  common = dict(store=store, tool_call_parser=teacher.tool_call_parser,
                served_model_name=teacher.model or "teacher")
  if teacher.url:
    api = teacher.api
    remote = dict(urls=[u for u in str(teacher.url).split(",")], api=api,
                  api_key=os.environ.get(teacher.api_key_env, "") if teacher.api_key_env else "",
                  timeout_s=float(teacher.timeout_s), max_retries=int(teacher.max_retries))
    if api in TEXT_ONLY_APIS:
      if not teacher.model:
        raise TeacherError("teacher.model is empty; an OpenAI-compatible endpoint needs the "
                           "model name to request (e.g. --config.teacher.model=gpt-4.1)")
      return ModelService(None, upstream_model=teacher.model, **remote, **common)
    if api in TOKEN_APIS:
      if not teacher.tokenizer:
        raise TeacherError("teacher.api 'sglang' records token ids; set teacher.tokenizer to "
                           "the teacher's tokenizer (a Hugging Face name or folder)")
      tokenizer = load_tokenizer(teacher.tokenizer, field="teacher.tokenizer")
      return ModelService(tokenizer, **remote, **common)
    raise TeacherError(f"teacher.api must be one of {TEXT_ONLY_APIS + TOKEN_APIS}, got {api!r}")
  from orchard_jax.recipes.agentic.images import image_processor
  model, tokenizer, description = teacher_policy(teacher)
  engine = ConfigDict(dict(teacher.engine))
  engine.max_batch_size = max_batch_size
  return ModelService(tokenizer, model=model,
                      engine_config=engine_config(engine, seed=int(engine.get("seed", 0))),
                      model_path=teacher.checkpoint or f"init:{teacher.preset}",
                      description=f"embedded engine serving {description}",
                      image_processor=image_processor(getattr(model, "config", None)), **common)


def opd_teacher(config: ConfigDict, tokenizer, mesh) -> ModelService:
  """The on-policy-distillation teacher: a scoring service (no proxy) over `opd.teacher_urls`,
  or a second embedded engine serving `opd.teacher_init` with the policy block's settings and
  `opd.teacher_preset`. Enter it to start it.

  Raises:
    ConfigError: neither opd.teacher_urls nor opd.teacher_init is set.
  """
  o = config.opd
  urls = [u for u in str(o.teacher_urls).split(",") if u.strip()]
  if urls:
    return ModelService(tokenizer, urls=urls)
  if not o.teacher_init:
    raise ConfigError("opd.mode is set but neither opd.teacher_urls nor opd.teacher_init is")
  block = ConfigDict(dict(config.policy.to_dict(), init=o.teacher_init,
                          preset=o.teacher_preset or config.policy.preset))
  model = policy_lib.build_policy(block, mesh, vocab_size=tokenizer.vocab_size)
  engine = ConfigDict(dict(max_batch_size=2, max_seq_len=int(config.engine.max_seq_len) + 1,
                           prefix_cache=True))
  return ModelService(tokenizer, model=model, engine_config=engine_config(engine),
                      model_path=o.teacher_init)
