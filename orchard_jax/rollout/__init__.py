"""JAX sampler, SGLang-compatible inference server, SGLang client, recording proxy.

See README, section "Inference engine and recording proxy".
"""
from orchard_jax.rollout.background import BackgroundServer
from orchard_jax.rollout.client import AsyncSGLangClient, SGLangClient, build_generate_payload
from orchard_jax.rollout.errors import (
  EngineError, RequestError, RolloutError, SessionError, UpstreamError, WeightUpdateError)
from orchard_jax.rollout.protocol import (
  FinishReason, GenerateRequest, GenerateResponse, MetaInfo, ModelInfo, SamplingParams,
  UpdateWeightsFromDiskRequest, UpdateWeightsFromDiskResponse)
