"""Fleet configuration: what `launch/fleet.py` deploys, as an ml_collections ConfigDict.

`get_config("default")` is a small fleet for one GPU node (one orchestrator replica with the
in-process store, one SGLang server on one GPU, a one-host training job);
`get_config("cluster")` is the multi-node fleet (three orchestrator replicas sharing Redis,
SGLang servers with tensor parallelism on several nodes, a multi-host training job).

Every value a manifest carries comes from here, and any field can be overridden on the
command line: `python launch/fleet.py up --config launch/k8s/config.py:cluster
--config.sglang.servers.policy.replicas=8`.
"""
import ml_collections

PRESETS = ("default", "cluster")


def get_config(preset: str = "default") -> ml_collections.ConfigDict:
  """Returns the fleet config for `preset` ("default" or "cluster").

  Raises:
    ValueError: `preset` is not one of PRESETS.
  """
  if preset not in PRESETS:
    raise ValueError(f"fleet preset is {preset!r}; expected one of {PRESETS}")
  c = ml_collections.ConfigDict()
  c.preset = preset
  c.name = "orchard"                        # app.kubernetes.io/instance of every object
  c.namespace = "orchard"                   # orchestrator, Redis, SGLang, training
  c.sandbox_namespace = "orchard-sandboxes"  # one pod per sandbox, deny-egress by default
  c.create_namespaces = True                # `down` deletes only namespaces that `up` created
  # The project's image (launch/k8s/Dockerfile): orchestrator, in-sandbox agent, trainer.
  c.image = "orchard-jax:latest"
  c.image_pull_policy = "IfNotPresent"
  c.image_pull_secrets = ()                 # names of docker-registry Secrets, if private

  c.env = _env_config(preset)
  c.redis = _redis_config(preset)
  c.sglang = _sglang_config(preset)
  c.training = _training_config(preset)
  c.volumes = _volumes_config(preset)
  # `fleet.py weights REPO FOLDER`: a Job that downloads a model into the models volume.
  c.weights = ml_collections.ConfigDict(dict(
      image="",                 # default: sglang.image (it ships huggingface_hub)
      hf_token_secret="",       # Secret with key "token", for gated models
      cpu="4", memory="16Gi"))
  return c


def _env_config(preset: str) -> ml_collections.ConfigDict:
  """Orchard Env orchestrator: REST service in front of the Kubernetes sandbox backend."""
  cluster = preset == "cluster"
  return ml_collections.ConfigDict(dict(
      name="orchard-env",
      replicas=3 if cluster else 1,
      port=8080,
      # "memory" keeps records in the replica (single replica only); "redis" shares them.
      store="redis" if cluster else "memory",
      api_key_secret="orchard-env-api-keys",
      api_key="",                           # empty: `up` generates one unless the Secret exists
      cpu="2" if cluster else "500m",
      memory="4Gi" if cluster else "1Gi",
      cpu_limit="4" if cluster else "2",
      memory_limit="8Gi" if cluster else "2Gi",
      # Sandbox pods (created by the orchestrator's Kubernetes backend). Their init container
      # copies the in-sandbox agent from agent_image (orchard_jax/env/agent/Dockerfile).
      agent_image="orchard-agent:latest",
      default_sandbox_image="python:3.11-slim",  # the container image of image "host"
      sandbox_node_selector={},             # e.g. {"orchard.dev/pool": "sandboxes"}
      sandbox_tolerations=(),               # e.g. ({"key": "sandbox", "operator": "Exists"},)
      # Sandbox pods' seccomp profile: "RuntimeDefault", or "Localhost:orchard-env/sandbox.json"
      # for Orchard Env's own profile, which a DaemonSet then installs on every node.
      sandbox_seccomp_profile="RuntimeDefault",
      max_sandboxes=2000 if cluster else 64,
      creation_qps=50.0 if cluster else 5.0,  # pod creations per second (throttle)
      max_concurrent_creates=128 if cluster else 16,
      extra_args=(),
  ))


def _redis_config(preset: str) -> ml_collections.ConfigDict:
  """Redis, the orchestrator replicas' shared store (rendered when env.store is "redis")."""
  cluster = preset == "cluster"
  return ml_collections.ConfigDict(dict(
      name="orchard-redis",
      image="redis:7.4-alpine",
      port=6379,
      cpu="1" if cluster else "250m",
      memory="2Gi" if cluster else "512Mi",
      memory_limit="4Gi" if cluster else "1Gi",
      # Append-only file on a PersistentVolumeClaim so records survive a Redis restart;
      # an empty size keeps the data in an emptyDir (lost when the pod moves).
      persistence_size="10Gi" if cluster else "",
      storage_class="",
  ))


def _sglang_server(**overrides) -> ml_collections.ConfigDict:
  server = dict(
      enabled=True,
      model_path="/models/policy",           # a folder on the models volume (HF format)
      served_model_name="policy",
      replicas=1,
      tp=1,                                  # --tp: GPUs per server (tensor parallel)
      dp=1,                                  # --dp: data-parallel copies inside one server
      ep=1,                                  # --ep: expert parallel size (MoE)
      port=30000,
      mem_fraction_static=0.85,
      context_length=32768,
      cpu="8",
      memory="64Gi",
      shm_size="16Gi",                       # /dev/shm for NCCL and the scheduler processes
      startup_seconds=1800,                  # how long loading weights may take
      tool_call_parser="qwen25",
      reasoning_parser="qwen3",
      extra_args=(),
  )
  server.update(overrides)
  return ml_collections.ConfigDict(server)


def _sglang_config(preset: str) -> ml_collections.ConfigDict:
  """SGLang servers: one Deployment + Service per entry of `servers` (policy, teacher...)."""
  cluster = preset == "cluster"
  servers = ml_collections.ConfigDict()
  if cluster:
    servers.policy = _sglang_server(
        model_path="/models/qwen3_5_35b_a3b", replicas=4, tp=4, ep=4, cpu="32",
        memory="256Gi", shm_size="64Gi", context_length=65536)
    # Teacher for on-policy distillation (swe_opd.py); enable with
    # --config.sglang.servers.teacher.enabled=True.
    servers.teacher = _sglang_server(
        enabled=False, model_path="/models/teacher", served_model_name="teacher",
        replicas=1, tp=8, ep=8, cpu="64", memory="512Gi", shm_size="64Gi",
        context_length=65536)
  else:
    servers.policy = _sglang_server(cpu="4", memory="32Gi", shm_size="8Gi")
  return ml_collections.ConfigDict(dict(
      image="lmsysorg/sglang:latest",        # pin a release tag in production
      gpu_resource="nvidia.com/gpu",
      node_selector={},
      tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
      servers=servers,
  ))


def _training_config(preset: str) -> ml_collections.ConfigDict:
  """The training Job: an Indexed Job of `num_hosts` pods running launch/run.py under
  jax.distributed, with a headless Service that gives pod 0 (the coordinator) a DNS name."""
  cluster = preset == "cluster"
  return ml_collections.ConfigDict(dict(
      name="orchard-train",
      experiment="experiments/swe_rpr.py:cluster",
      overrides=(),                          # e.g. ["--config.rl.lr=3e-6"]
      num_hosts=4 if cluster else 1,
      accelerator_resource="nvidia.com/gpu",  # "google.com/tpu" on TPU node pools
      accelerators_per_host=8 if cluster else 1,
      coordinator_port=8476,
      cpu="64" if cluster else "8",
      memory="1000Gi" if cluster else "64Gi",
      shm_size="64Gi" if cluster else "8Gi",
      node_selector={},
      tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
      backoff_limit=0,                       # a lost host fails the step for every host
      ttl_seconds_after_finished=7 * 24 * 3600,
      extra_env={},
  ))


def _volumes_config(preset: str) -> ml_collections.ConfigDict:
  """PersistentVolumeClaims shared by SGLang and the trainer."""
  cluster = preset == "cluster"
  return ml_collections.ConfigDict(dict(
      # Model weights in Hugging Face format, read by SGLang and the trainer.
      models=dict(claim="orchard-models", mount_path="/models",
                  size="500Gi" if cluster else "100Gi", storage_class="",
                  access_mode="ReadWriteMany" if cluster else "ReadWriteOnce", create=True),
      # Checkpoints and exported weights: the trainer writes, SGLang reloads from here.
      checkpoints=dict(claim="orchard-checkpoints", mount_path="/checkpoints",
                       size="2Ti" if cluster else "200Gi", storage_class="",
                       access_mode="ReadWriteMany" if cluster else "ReadWriteOnce",
                       create=True),
  ))
