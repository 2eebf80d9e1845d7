"""JAX sampler, SGLang-compatible inference server, SGLang client, recording proxy.

Public API (see README, section "Inference engine and recording proxy"):

  Engine(model, tokenizer, *, config=EngineConfig(...), model_path="", weight_version="0")
    .start() / .stop() / `with engine:`; .submit(SingleGenerateRequest) -> Future;
    .generate([SingleGenerateRequest]) -> [GenerateResponse]; .update_params(params | model,
    weight_version=None); .update_weights_from_disk(path, load_format=None, weight_version=None);
    .model_info(); .compile_count
  InferenceServer(engine, *, host, port, served_model_name, tool_call_parser,
    max_request_bytes)  context manager;
    .url (SGLang native API; OpenAI API under url + "/v1"); create_app(engine) for uvicorn
  SGLangClient(urls, ...) / AsyncSGLangClient(urls, ...): generate, generate_batch, score,
    update_weights_from_disk, model_info, health, wait_until_ready
  RecordingProxy(upstream, *, tokenizer, store, tool_call_parser, served_model_name,
    sampling_defaults, sampling_overrides, max_request_bytes)  context manager; .session_url(id), .end_session(id),
    .flush(); upstreams SGLangUpstream(urls) and OpenAIUpstream(base_url, model, api_key_env=)
  BackgroundServer(app) runs any ASGI app in a thread; save_params / load_params_from_disk.
"""
from orchard_jax.rollout.background import BackgroundServer
from orchard_jax.rollout.client import AsyncSGLangClient, SGLangClient, build_generate_payload
from orchard_jax.rollout.engine import Engine, EngineConfig
from orchard_jax.rollout.errors import (
  EngineError, RequestError, RolloutError, SessionError, UpstreamError, WeightUpdateError)
from orchard_jax.rollout.protocol import (
  FinishReason, GenerateRequest, GenerateResponse, MetaInfo, ModelInfo, SamplingParams,
  SingleGenerateRequest, UpdateWeightsFromDiskRequest, UpdateWeightsFromDiskResponse)
from orchard_jax.rollout.proxy import (PromptBuilder, RecordingProxy, message_key,
                                       new_session_id)
from orchard_jax.rollout.runner import ModelRunner
from orchard_jax.rollout.sampling import SamplingMode, sample_next, truncate_logits
from orchard_jax.rollout.server import InferenceServer, create_app
from orchard_jax.rollout.upstream import OpenAIUpstream, SGLangUpstream
from orchard_jax.rollout.weights import load_params_from_disk, save_params

__all__ = [
  "AsyncSGLangClient", "BackgroundServer", "Engine", "EngineConfig", "EngineError",
  "FinishReason", "GenerateRequest", "GenerateResponse", "InferenceServer", "MetaInfo",
  "ModelInfo", "ModelRunner", "OpenAIUpstream", "PromptBuilder", "RecordingProxy",
  "RequestError", "RolloutError", "SGLangClient", "SGLangUpstream", "SamplingMode",
  "SamplingParams", "SessionError", "SingleGenerateRequest", "UpdateWeightsFromDiskRequest",
  "UpdateWeightsFromDiskResponse", "UpstreamError", "WeightUpdateError",
  "build_generate_payload", "create_app", "load_params_from_disk", "message_key",
  "new_session_id",
  "sample_next", "save_params", "truncate_logits",
]
