"""The policy side of the Orchard-SWE recipe: building or loading the policy, and serving it.

`build_policy(config, mesh)` makes the policy a config names: a fresh `models.CausalLM` of a
preset (then warm-started by SFT), a Hugging Face folder, or the parameters of a checkpoint the
recipe wrote (a run folder, a trainer folder or its `checkpoints/`). `PolicyService` is the
inference side of a run, as a context manager:

  embedded (engine.urls == "")   Engine(policy) -> InferenceServer -> RecordingProxy
  remote   (engine.urls set)     SGLang servers -> RecordingProxy

The harness only ever sees `service.session_url(session_id)` (the proxy), which records every
model call into the trajectory store. `service.sync_weights(model, version)` puts new weights
into the engine: in process for the embedded engine, and for SGLang by writing a Hugging Face
folder under `engine.weights_dir` (shared storage) and calling `/update_weights_from_disk` on
every server. Switching between the two is configuration only.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import os
from typing import Any, Optional

from flax import nnx

from orchard_jax import data, models, parallel, train
from orchard_jax.recipes import ConfigError, load_tokenizer as _load_tokenizer
from orchard_jax.models import hf  # a submodule: `models.hf` exists only once imported

_log = logging.getLogger(__name__)

_POLICY_FIELDS = ("preset", "init", "tokenizer", "tool_call_parser")


class PolicyError(ConfigError):
  """The policy config names something that cannot be built or loaded."""


def model_overrides(policy_config) -> dict[str, Any]:
  """ModelConfig fields the policy block sets over its preset: every key other than preset,
  init, tokenizer and tool_call_parser (dtype, max_position_embeddings, moe_dispatch, ...).

  Raises:
    PolicyError: a key that is not a ModelConfig field.
  """
  fields = {f.name for f in dataclasses.fields(models.ModelConfig)}
  out = {}
  for name, value in policy_config.items():
    if name in _POLICY_FIELDS:
      continue
    if name not in fields:
      raise PolicyError(f"policy.{name} is neither a policy setting {_POLICY_FIELDS} nor a "
                        f"ModelConfig field")
    out[name] = tuple(value) if isinstance(value, list) else value
  return out


def load_tokenizer(policy_config) -> data.Tokenizer:
  """The tokenizer `policy.tokenizer` names.

  Raises:
    ConfigError: nothing loadable there (the message names policy.tokenizer).
  """
  return _load_tokenizer(policy_config.tokenizer, field="policy.tokenizer")


def find_checkpoint_dir(path: str) -> Optional[str]:
  """The orbax CheckpointManager folder under `path`, or None when `path` holds none.

  Accepts a run folder (prefers `rl/checkpoints`, then `sft/checkpoints`), a trainer workdir
  (`checkpoints/`), or a checkpoints folder itself (step subfolders).
  """
  for sub in ("rl/checkpoints", "sft/checkpoints", "checkpoints", ""):
    folder = os.path.join(path, sub) if sub else path
    if os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder)):
      return folder
  return None


def is_hf_folder(path: str) -> bool:
  return os.path.isfile(os.path.join(path, "config.json")) and bool(
      glob.glob(os.path.join(path, "*.safetensors")))


def check_checkpoint(path: str, *, field: str) -> None:
  """Checks, before anything is built, that `path` (the config field `field`) is a Hugging
  Face folder or holds an orbax checkpoint (a run folder, trainer folder or checkpoints/).

  Raises:
    PolicyError: it is neither (the message names the field and the path).
  """
  if not (is_hf_folder(path) or find_checkpoint_dir(path)):
    raise PolicyError(f"{field}: {_no_checkpoint(path)}")


def _no_checkpoint(path: str) -> str:
  if not os.path.exists(path):
    return (f"{path!r} does not exist; expected a Hugging Face model folder or an orbax "
            "checkpoint (a run folder, trainer folder or checkpoints/)")
  return (f"{path!r} holds neither a Hugging Face model (config.json + safetensors) nor an "
          "orbax checkpoint (a run folder, trainer folder or checkpoints/)")


def build_policy(policy_config, mesh, *, vocab_size: int, seed: int = 0,
                 init: Optional[str] = None) -> models.CausalLM:
  """The policy model, its parameters laid out on `mesh`.

  Args:
    policy_config: the config's `policy` block (preset, init, model field overrides).
    mesh: the device mesh.
    vocab_size: the tokenizer's vocabulary size (the model's must be at least this).
    seed: initialisation seed of a fresh model.
    init: overrides policy_config.init: "" fresh, an HF folder, or a checkpoint folder.
  Raises:
    PolicyError: an init path that is neither an HF folder nor holds a checkpoint, or a model
      vocabulary smaller than the tokenizer's.
  """
  init = policy_config.init if init is None else init
  overrides = model_overrides(policy_config)
  if init and is_hf_folder(init):
    _, model = hf.load_pretrained(init, mesh=mesh, **overrides)
    _check_vocab(model.config, vocab_size)
    return model
  config = dataclasses.replace(models.get_preset(policy_config.preset), **overrides)
  _check_vocab(config, vocab_size)
  model = parallel.create_sharded(lambda: models.CausalLM(config, rngs=nnx.Rngs(seed)), mesh)
  if init:
    load_checkpoint_params(model, init, mesh)
  return model


def _check_vocab(config, vocab_size: int) -> None:
  if config.vocab_size < vocab_size:
    raise PolicyError(f"the model's vocab_size is {config.vocab_size}; the tokenizer needs "
                      f"{vocab_size}")


def load_checkpoint_params(model, path: str, mesh) -> int:
  """Fills `model`'s parameters from the latest checkpoint under `path` (any mesh; docs/cases.md 5).

  Returns:
    The checkpoint's step.
  Raises:
    PolicyError: no checkpoint under `path`.
  """
  folder = find_checkpoint_dir(path)
  if folder is None:
    raise PolicyError(_no_checkpoint(path))
  parts = train.ModelParts.of(model)
  abstract = train.abstract_like(parts.pure_params(), parts.param_shardings(mesh))
  with train.Checkpointer(folder, async_save=False) as checkpointer:
    step = checkpointer.latest_step()
  params = train.restore_params(folder, abstract, step=step)
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  _log.info("policy parameters from %s step %s", folder, step)
  return int(step)


@dataclasses.dataclass
class _Embedded:
  engine: Any
  server: Any


class PolicyService:
  """Engine (embedded or remote SGLang) + recording proxy, with weight sync (module docstring).

  Args:
    config: the recipe config (engine, sampling, policy blocks are read).
    model: the policy to serve when embedded (ignored for remote engines).
    tokenizer: the policy's tokenizer (the proxy renders prompts with it).
    store: the `data.TrajectoryStore` the proxy records model calls into.
    engine_seed: seed of the embedded engine's draws for requests without a seed.
  """

  def __init__(self, config, model, tokenizer, store, *, engine_seed: int = 0):
    self.config = config
    self.model = model
    self.tokenizer = tokenizer
    self.store = store
    self.engine_seed = engine_seed
    self.version = 0
    self._embedded: Optional[_Embedded] = None
    self._client = None
    self.proxy = None

  @property
  def remote(self) -> bool:
    return bool(self.config.engine.urls)

  @property
  def engine(self):
    """The embedded Engine, or None for remote servers."""
    return self._embedded.engine if self._embedded else None

  def _urls(self) -> list[str]:
    return [u.strip() for u in str(self.config.engine.urls).split(",") if u.strip()]

  def __enter__(self) -> "PolicyService":
    from orchard_jax import rollout
    ec = self.config.engine
    try:
      if self.remote:
        self._client = rollout.SGLangClient(self._urls())
        self._client.wait_until_ready()
        upstream = rollout.SGLangUpstream(self._urls())
      else:
        engine = rollout.Engine(self.model, self.tokenizer,
                                config=engine_config(ec, seed=self.engine_seed),
                                model_path=self.config.policy.init or "orchard_jax",
                                weight_version="0")
        server = rollout.InferenceServer(engine, served_model_name=ec.served_model_name,
                                         tool_call_parser=self.config.policy.tool_call_parser)
        server.__enter__()
        self._embedded = _Embedded(engine, server)
        upstream = rollout.SGLangUpstream(server.url)
      self.proxy = rollout.RecordingProxy(
          upstream, tokenizer=self.tokenizer, store=self.store,
          tool_call_parser=self.config.policy.tool_call_parser,
          served_model_name=ec.served_model_name,
          sampling_defaults={"max_new_tokens": int(self.config.sampling.max_tokens)})
      self.proxy.__enter__()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def __exit__(self, *exc) -> None:
    if self.proxy is not None:
      self.proxy.__exit__(None, None, None)
      self.proxy = None
    if self._embedded is not None:
      self._embedded.server.__exit__(None, None, None)
      self._embedded = None
    if self._client is not None:
      self._client.close()
      self._client = None

  def session_url(self, session_id: str) -> str:
    """The OpenAI base URL a harness uses for one rollout (the proxy's per-session URL)."""
    return self.proxy.session_url(session_id)

  def end_session(self, session_id: str) -> None:
    self.proxy.end_session(session_id)

  def sync_weights(self, model, version: int) -> None:
    """Serves `model`'s weights from now on, labelled `version` (in process or from disk).

    Raises:
      PolicyError: remote engines without engine.weights_dir.
    """
    if not self.remote:
      self._embedded.engine.update_params(model, weight_version=str(version))
    else:
      if not self.config.engine.weights_dir:
        raise PolicyError("remote engines load new weights from disk: set engine.weights_dir "
                          "to a folder every SGLang server can read")
      import jax
      folder = os.path.join(self.config.engine.weights_dir, f"v{version:06d}")
      # Every process takes part in gathering parameters sharded across hosts; process 0
      # writes the folder and then asks the servers to load it; other hosts of a multi-host
      # run must not ask before it is complete (nor make every server reload once per host),
      # so they wait at a barrier.
      if jax.process_count() > 1 or not os.path.exists(os.path.join(folder, "config.json")):
        hf.save_pretrained(model, model.config, folder)
      if jax.process_index() == 0:
        self._client.update_weights_from_disk(folder, weight_version=str(version))
      if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"orchard_sync_weights_{version}")
    self.version = version


def engine_config(engine: Any, seed: int = 0) -> Any:
  """The embedded engine's `rollout.EngineConfig` from a config's `engine` block.

  Args:
    engine: the block (max_batch_size, max_seq_len, decode_steps, prefix_cache,
      data_parallel); batch buckets are the powers of two below max_batch_size, and it.
    seed: the engine's seed for requests without one.
  Raises:
    ConfigError: sizes the engine refuses, e.g. a data_parallel that does not divide
      max_batch_size.
  """
  from orchard_jax import rollout
  try:
    return rollout.EngineConfig(
        max_batch_size=int(engine.max_batch_size),
        batch_buckets=_batch_buckets(int(engine.max_batch_size)),
        max_seq_len=int(engine.max_seq_len), decode_steps=int(engine.decode_steps),
        prefix_cache=bool(engine.get("prefix_cache", True)), seed=seed,
        data_parallel=int(engine.get("data_parallel", 1)))
  except rollout.RequestError as e:
    raise ConfigError(f"engine: {e}") from e


def _batch_buckets(max_batch: int) -> tuple[int, ...]:
  out, size = [], 1
  while size < max_batch:
    out.append(size)
    size *= 2
  return tuple(out) + (max_batch,)
