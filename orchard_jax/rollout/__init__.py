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
from orchard_jax.rollout.engine import Engine, EngineConfig
from orchard_jax.rollout.protocol import SingleGenerateRequest
from orchard_jax.rollout.runner import ModelRunner
from orchard_jax.rollout.sampling import SamplingMode, sample_next, truncate_logits
from orchard_jax.rollout.server import InferenceServer, create_app
from orchard_jax.rollout.upstream import OpenAIUpstream, SGLangUpstream
from orchard_jax.rollout.proxy import PromptBuilder, RecordingProxy, message_key
from orchard_jax.rollout.weights import load_params_from_disk, save_params
