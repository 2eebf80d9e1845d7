"""Settings that several experiment configs share. Each function returns a fresh ConfigDict."""
import ml_collections


def swe_tasks():
  """The SWE task set (orchard_jax.tasks.swe.BuildSettings, plus where to read one from).

  `dataset` empty: build (or reuse from ~/.cache/orchard_jax/swe/tasksets) the default set of
  real tasks from PyPI packages; otherwise a SWE-bench-format JSONL/parquet/datasets path.
  """
  return ml_collections.ConfigDict(dict(
      dataset="",                 # path of instances to use instead of building
      packages=("toolz", "inflection", "parse", "boltons", "idna"),
      instances_per_package=14,   # stop a package once this many instances are kept
      max_candidates_per_package=60,
      seconds_per_package=120.0,  # wall-time budget per package while drawing candidates
      workers=2,                  # candidate bugs tested in parallel
      test_timeout_s=120.0,       # one test-suite run
      seed=0,
      python="",                  # base interpreter of the package venvs ("" = auto)
      output_dir="",              # "" = the cache folder, named by a hash of these settings
      rebuild=False,
      limit=0,                    # use only the first N instances (0 = all)
      # Bring your own dataset (README "Bring your own dataset"): instances of `dataset` without
      # a test_spec get an environment and an image built for them, their repositories cloned
      # from `mirrors` (a folder of git repositories, one per owner/name) or `url_template`.
      mirrors="",
      url_template="https://github.com/{repo}.git",
      specs="",                   # SWE-bench-style install specs per repo/version ("" = infer)
      build_dir="",               # where built instances and reports go ("" = runs/swe_tasks/<name>)
      rootfs="",                  # task images' root filesystem ("" = build the Debian one)
      # On Kubernetes: "" keeps each test_spec.image; "swebench" uses SWE-bench's published
      # evaluation images by their documented names; "registry/prefix" names images this
      # builder's instances were pushed under (<prefix>/sweb.eval.x86_64.<id>:latest).
      cluster_images="",
      push_registry="",           # swe.build_tasks: push built (validated) images there as OCI
      registry_tls_verify=True,   # images under SWE-bench's naming (skopeo)
  ))


def sandbox_env():
  """Where sandboxes come from: "" starts an in-process Orchard Env with the local backend."""
  return ml_collections.ConfigDict(dict(url="", api_key="", max_parallel=2))


def swe_agent():
  """The SWE harness and its limits (orchard_jax.harness.AgentConfig; for an external harness,
  step_limit and wall_time_limit_s bound its run)."""
  return ml_collections.ConfigDict(dict(
      harness="bash",                # bash (built-in) | mini_swe_agent | codex | claude_code
      step_limit=30, wall_time_limit_s=900.0, max_consecutive_format_errors=3,
      command_timeout_s=60.0, output_limit_chars=10000,
      # (field, value it has here, value with codex / claude_code): set at run start when
      # agent.harness is one of those CLIs and the field still holds the first value (one you
      # set yourself is kept). An experiment fills it (`cli_harness_overrides`).
      cli_overrides=()))


def cli_harness_overrides(config, changes):
  """`agent.cli_overrides` entries for `changes` ({"block.field": value with a CLI harness}):
  each records the field's value in `config` now, so a field set on the command line is left
  alone (recipes/swe/harness.py `check_harness_config` applies them)."""
  entries = []
  for path, value in changes.items():
    node = config
    for part in path.split("."):
      node = node[part]
    entries.append((path, node, value))
  return tuple(entries)


# ----------------------------------------------------------------------------- the agentic loop

PRESETS = ("tiny", "qwen3_5_35b_a3b", "cluster")
SWE_PRESETS = PRESETS


def _env_urls(name: str) -> str:
  """Comma-separated URLs from ORCHARD_<NAME>_URLS (one per replica) or ORCHARD_<NAME>_URL."""
  import os
  return os.environ.get(f"ORCHARD_{name}_URLS") or os.environ.get(f"ORCHARD_{name}_URL", "")


def _endpoint(kind: str, **extra):
  """An LLM grader endpoint (judge, annotator): the domain names its kinds ("evidence" is SWE's
  offline one); "llm" needs url."""
  return ml_collections.ConfigDict(dict(
      kind=kind, url="", model="", api_key_env="", timeout_s=120.0, retries=2,
      temperature=0.6, max_tokens=1024, observation_chars=1200, **extra))


def rl_base(preset="tiny"):
  """Everything the agentic loop reads (orchard_jax/recipes/agentic), for one preset, whatever
  the domain: policy, mesh, engine, sampling, store, SFT, RL (BAR, RPR, OPD), evaluation and the
  value model, plus the fields a domain shares (tasks.heldout_fraction, env, judge and
  annotator endpoints). A domain's base (`swe_base`) adds its own blocks and settings.

  Presets (every preset has the same fields, so any field can be overridden or swept):
    tiny             the embedded default: the tiny policy, in-process Orchard Env with local
                     bubblewrap sandboxes, the embedded JAX engine; sized for 2 CPU cores.
    qwen3_5_35b_a3b  the published setting (docs/algorithms.md sections 1-5) at its real size.
    cluster          qwen3_5_35b_a3b pointed at the fleet (launch/fleet.py): Orchard Env, SGLang
                     servers and the checkpoint volume from the ORCHARD_* environment variables
                     the training Job sets; only URLs and sizes differ, never code.
  """
  import os
  if preset not in PRESETS:
    raise ValueError(f"preset {preset!r} is not one of {PRESETS}")
  big = preset != "tiny"
  c = ml_collections.ConfigDict()
  c.job = ""
  c.name = "run"                     # experiment name: store records and run folder carry it
  c.preset = preset
  c.workdir = ""                     # "" = runs/<name>_<preset> (cluster: $ORCHARD_CHECKPOINT_DIR)
  c.resume = "auto"                  # resume only a run of the same identity from the folder;
                                     # "force": whatever it holds (agentic/run_config.py)
  c.seed = 0
  c.progress = True
  c.policy = ml_collections.ConfigDict(dict(
      preset="qwen3_5_35b_a3b" if big else "tiny",   # models.get_preset
      init="/models/qwen3_5_35b_a3b" if big else "",  # "" random init (then SFT), an HF folder,
                                                      # or a run/trainer/orbax checkpoint folder
      tokenizer="/models/qwen3_5_35b_a3b" if big else "tiny",   # data.load_tokenizer
      tool_call_parser="qwen3_xml" if big else "hermes",
      dtype="bfloat16" if big else "float32",
      max_position_embeddings=262144 if big else 8192,
      moe_dispatch="ragged" if big else "sort",
      remat=big))
  c.mesh = ml_collections.ConfigDict(
      dict(data=1, fsdp=-1, tensor=1, expert=8) if big else dict(data=-1, fsdp=1, tensor=1,
                                                                   expert=1))
  c.tasks = ml_collections.ConfigDict(dict(
      heldout_fraction=0.2))          # tasks kept out of training (by a hash of their id)
  c.env = sandbox_env()
  c.env.max_parallel = 64 if big else 2
  c.engine = ml_collections.ConfigDict(dict(
      urls="",                       # SGLang native URLs (comma-separated); "" = embedded engine
      max_batch_size=8, max_seq_len=65536 if big else 4096, decode_steps=16,
      prefix_cache=True,             # embedded engine: reuse the previous turn's cached prefix
      data_parallel=1 if big else 2, # embedded engine: schedulers (rollout.EngineConfig); 2 runs
                                     # two decode batches side by side on a 2+ core CPU (main
                                     # job's recorded sessions replayed: 46-55 s vs 64-71 s)
      weights_dir="",                # where remote engines load new weights from (shared disk)
      served_model_name="policy"))
  c.sampling = ml_collections.ConfigDict(dict(
      temperature=0.95 if big else 0.8, top_p=0.95 if big else 1.0,
      max_tokens=4096 if big else 512))  # per turn
  c.store = ml_collections.ConfigDict(dict(path=""))  # "" = <workdir>/store
  c.sft = ml_collections.ConfigDict(dict(
      enabled=True,                  # warm-start with SFT when policy.init is ""
      source="expert",               # "expert" (the domain's seed trajectories on the training
                                     # tasks), a trajectory store folder, or a mini-swe-agent
                                     # trajectory folder
      experiments=(),                # store source: only these experiments (empty: all)
      mode="credit",                 # "credit" (resolved + rise segments) or "resolved_only"
      eps=0.05,                      # rise threshold
      max_tokens=65536 if big else 2560,  # longer trajectories are dropped (never truncated)
      epochs=5 if big else 125,
      batch_size=128 if big else 2, seq_len=65536 if big else 2560,
      microbatches=1 if big else 2,  # rows per microbatch = batch_size / microbatches / devices
      lr=1e-5 if big else 3e-3, end_lr=1e-6 if big else 3e-4, warmup_steps=10 if big else 5,
      weight_decay=0.1 if big else 0.0, max_grad_norm=1.0, chunk_size=1024, save_every=200,
      train_last_layers=0,           # > 0: partial fine-tuning, only the top this many decoder
                                     # layers + final norm + LM head (train.OptimizerConfig)
      stop_loss=0.0,                 # > 0: stop at the first step whose loss is below it
      method="full",                 # "full": the Trainer over packed batches (every parameter,
                                     # or sft.train_last_layers / frozen); "cached_last_layer":
                                     # only the last layer's readout, exact, on cached
                                     # keys/values (train.cached_last_layer; text policies)
      min_target_prob=0.0))          # cached_last_layer: > 0 stops once every target token
                                     # has at least this probability (a margin, not a mean)
  c.annotator = _endpoint("")        # the domain's credit annotator (kind: the domain's names)
  c.rl = ml_collections.ConfigDict(dict(
      iterations=100 if big else 6,
      prompts_per_iteration=16 if big else 2,  # groups per batch
      oversample=4 if big else 0,    # extra prompts rolled out to replace dropped groups
      bar=ml_collections.ConfigDict(dict(
          group_size=8 if big else 4, max_rollouts=16 if big else 6, stride=16 if big else 2,
          positive_fraction=(0.375, 0.625) if big else (0.25, 0.75))),
      reward="binary",               # "binary" (R_bin) or "rpr" (R_bin + rpr_alpha * J)
      rpr_alpha=0.5,
      lr=1e-6 if big else 3e-5, end_lr=1e-7 if big else 3e-5,
      schedule="cosine" if big else "constant", warmup_steps=0, weight_decay=0.0,
      max_grad_norm=1.0, train_last_layers=0,  # as sft.train_last_layers
      eps_low=0.2, eps_high=0.28, aggregation="token_mean",
      entropy_coef=1e-4, kl_coef=0.0, tis_cap=0.0,   # 0 = off
      batch_size=64 if big else 4,   # rows per update
      seq_len=65536 if big else 2560, microbatches=1 if big else 4,
      max_updates_per_iteration=4 if big else 3,  # batches beyond are not trained (counted)
      chunk_size=1024, parallel_rollouts=64 if big else 4,
      rollout_timeout_s=0.0,         # a stride still running after this is abandoned (0 = off;
                                     # the harness's own limits end runs first)
      keep_checkpoints=3, final_eval=True))
  c.judge = _endpoint("", max_workers=4)   # the domain's RPR judge (kind: the domain's names)
  c.opd = ml_collections.ConfigDict(dict(
      mode="none",                   # "none", "loss" (GRPO + c OPD), "reward" (A += c r), "only"
      teacher_urls="",               # teacher SGLang native URLs; "" with teacher_init: embedded
      teacher_init="",               # an HF folder or checkpoint served by a second engine
      teacher_preset="",             # model preset of teacher_init ("" = the policy's)
      divergence="js_skew", coef=1.0, lam=0.5))
  c.eval = ml_collections.ConfigDict(dict(
      splits=("train", "heldout"),   # which tasks: the training subset and/or held-out ones
      max_instances=0 if big else 2, # per split (0 = all)
      k=4,                           # attempts per task (pass@k, best-of-k)
      temperature=0.95 if big else 0.8, seed=1234,
      parallel=0,                    # rollouts at a time (0 = rl.parallel_rollouts; 1 makes the
                                     # engine batch one request, bit-reproducible sampling)
      baseline=False,                # the RL job also evaluates its starting policy (after
                                     # SFT) under the same protocol and reports the gain
      value_checkpoint="",           # a value-model run folder for best-of-k ("" = none)
      output_dir=""))                # "" = <workdir>/eval (and <workdir>/eval_start)
  c.value = ml_collections.ConfigDict(dict(
      preset="qwen3_4b" if big else "tiny_dense",
      init_from_policy="",           # a policy checkpoint/HF folder to start the backbone from
      stores=(),                     # trajectory stores to learn from (empty: runs/*/store)
      experiments=(),                # only these experiments (empty: all)
      heldout_fraction=0.25, every_position=False, epochs=3 if big else 4,
      batch_size=32 if big else 2, seq_len=65536 if big else 2560, microbatches=1 if big else 2,
      lr=1e-5 if big else 1e-3, end_lr=1e-6 if big else 1e-4, warmup_steps=2, chunk_size=1024,
      ks=(1, 2, 4, 8)))
  if preset == "cluster":
    c.workdir = os.environ.get("ORCHARD_CHECKPOINT_DIR", "")
    c.env.url = os.environ.get("ORCHARD_ENV_URL", "")
    c.env.api_key = os.environ.get("ORCHARD_ENV_API_KEY", "")
    c.engine.urls = _env_urls("SGLANG_POLICY")
    c.engine.weights_dir = os.path.join(c.workdir or "/checkpoints", "weights")
    c.opd.teacher_urls = _env_urls("SGLANG_TEACHER")
  return c


# ----------------------------------------------------------------------------- Orchard-SWE recipe


def swe_base(preset="tiny"):
  """Everything the Orchard-SWE recipe reads (orchard_jax/recipes/swe), for one preset: the
  loop's `rl_base(preset)` plus the SWE task set, the bash agent's limits, the replay expert's
  variants, the evidence judge and annotator, and the tiny preset's SWE-tuned numbers (tiny:
  sized to finish `swe_rpr` in under 45 minutes on 2 CPU cores). Experiment files (swe_sft.py,
  swe_bar.py, ...) set `job` and what differs.
  """
  big = preset != "tiny"
  c = rl_base(preset)
  c.name = "swe"
  c.tasks.update(swe_tasks())
  c.tasks.train_tasks = 0 if big else 2  # RL/SFT training subset size (0 = every train task)
  c.tasks.selection = "all" if big else "shortest_expert"  # or "first": how the subset is chosen
  c.tasks.per_package = 0 if big else 1  # at most this many subset tasks per package (0 = any)
  c.agent = swe_agent()
  if big:
    c.agent.step_limit, c.agent.output_limit_chars = 100, 10000
  else:
    c.agent.step_limit, c.agent.output_limit_chars, c.agent.wall_time_limit_s = 14, 300, 600.0
  # Tiny: temperature 0.8, top_p 1.0. The tiny policy memorises its two SFT trajectories and
  # resolves only when it reproduces one closely, so the sampling temperature sets the SFT
  # start's resolved rate. Measured from the default run's SFT checkpoint (125 epochs, loss
  # 0.0022): temperature 1.0 resolved 1/10 and 0/12 (groups without a resolved rollout: BAR has
  # nothing to train on), 0.8 resolved 3/8 first rollouts (mixed groups). top_p stays 1.0:
  # top_p 0.95 turns every token with p > 0.95 into greedy decoding (115+ epochs then resolved
  # 12/12, all-resolved groups have zero reward spread). The recorded log-probs are the
  # untempered policy's, like the trainer's, so the first update's ratio is exactly 1.
  # With agent.harness codex / claude_code, the seed data is the expert's gold plan played
  # through that harness (recipes/swe/harness.py); these are the plan's steps it plays. Tiny:
  # the edits only (each played step adds its output to a prompt that starts at 8-16k tokens).
  c.sft.harness_expert_steps = (("explore", "reproduce", "edit", "verify", "test", "cleanup")
                                if big else ("edit",))
  c.sft.variants = ("gold", "give_up") if big else ("gold",)  # replay-expert variants
  # (tasks.swe.expert.VARIANTS); tiny: gold only, as each extra trajectory costs a 12 s step
  # per epoch on 2 cores. Tiny SFT: one step per epoch (see the sampling comment above).
  # Tiny SFT warm-up 25 steps: with 5, Adam's first steps at the 3e-3 peak threw the loss from
  # 5.4 back to 13-14 at step 11 in every run, and how fast a run recovered varied (loss at step
  # 60: 0.10 to 0.99, final 0.0017 to 0.0154; the 0.0154 policy resolved 0 of 32 attempts, every
  # one a RepeatedFormatError); with 25 the loss falls smoothly (0.03 at step 60).
  if not big:
    c.sft.warmup_steps = 25
  c.annotator = _endpoint("evidence")
  c.annotator.temperature = 0.2
  c.annotator.prompt = "swe_annotator.txt"
  # Tiny RL learning rate 3e-5: from the same SFT checkpoint at temperature 0.8, resolved rate
  # (first rollouts) per iteration was 0.50 -> 0.00 -> 0.00 at 3e-4 (approx. KL 0.04 after one
  # Adam step: every weight moves by ~lr at first, the memorised policy breaks), 0.38 -> 1.00
  # -> 0.50 -> 0.25 -> 0.62 at 1e-4, 0.38 -> 0.88 -> 0.62 -> 0.88 -> 0.62 at 3e-5.
  c.judge = _endpoint("evidence", prompt="swe_judge.txt", max_workers=4)
  return c


# ----------------------------------------------------------------------------- Orchard-Claw recipe


def claw_base(preset="tiny"):
  """Everything the Orchard-Claw recipe reads (orchard_jax/recipes/claw.py), for one preset: the
  loop's `rl_base(preset)` plus the Claw task sets, the ReAct agent's limits, the services'
  sandboxes and the optional LLM rubric judge (docs/algorithms.md section 8).

  The published setting (qwen3_5_35b_a3b): GRPO with 8 prompts x group 8, every model call of a
  rollout trained with its rollout's +-1 reward, a 10-minute wall-clock budget per task, 64
  sandboxes at a time of 2 vCPU / 2 GiB, about 200 synthetic training tasks, pass@3 / pass^3 on
  the evaluation set. tiny: the same pipeline sized for 2 CPU cores (a handful of training
  tasks the tiny policy can memorise by SFT, short episodes).
  """
  big = preset != "tiny"
  c = rl_base(preset)
  c.name = "claw"
  c.tasks.update(dict(
      synth_count=240,               # synthetic training tasks (validated, cached)
      synth_seed=0,
      distractor_tools=2 if big else 0,  # tools offered beyond those a solution uses (tiny: 0,
                                     # which keeps prompts to ~0.5k tiny tokens)
      train_file="",                 # a task folder / .jsonl to train on instead of synthesising
      eval_dir="",                   # "" = the 46 hand-written evaluation tasks
      train_tasks=0 if big else 2,   # RL/SFT training subset (0 = every training task)
      selection="spread" if big else "shortest"))   # spread, first, shortest
  c.agent = ml_collections.ConfigDict(dict(
      harness="react",               # react (built in), codex, claude_code (in the sandbox)
      step_limit=30 if big else 4,   # model calls per episode
      wall_time_limit_s=600.0,       # the 10-minute budget per task
      max_consecutive_format_errors=3 if big else 2, max_tool_calls_per_turn=8,
      output_limit_chars=8000 if big else 1500, model_timeout_s=600.0))
  c.sandbox = ml_collections.ConfigDict(dict(   # one per rollout; Orchard Env wants
      image="host", cpu=2.0 if big else 1.0,     # memory >= 2 x disk + 32Mi
      memory="2Gi" if big else "512Mi", disk="512Mi" if big else "128Mi", call_timeout_s=30.0))
  c.rubric_judge = _endpoint("none")  # "llm": judge the tasks' rubric items (url, model, ...)
  c.rubric_judge.temperature = 0.0
  c.annotator.kind = "outcome"
  c.env.max_parallel = 64 if big else 8
  c.engine.max_seq_len = 65536 if big else 8192   # multi-service evaluation prompts: ~5k
  c.policy.max_position_embeddings = 262144 if big else 8192
  c.sampling.max_tokens = 2048 if big else 64   # per turn; a tiny tool call is ~40 tokens
  c.sft.max_tokens = 65536 if big else 2048
  c.sft.seq_len = 65536 if big else 2048
  c.sft.batch_size, c.sft.microbatches = (128, 1) if big else (1, 1)
  # tiny: the two shortest training trajectories (~1.3k tokens, one row). Measured: 40 epochs
  # (3 tasks, faster decay) left loss 0.50 and every rollout failing; 100 reached 0.003 and every
  # rollout passing (zero-std groups, nothing to train); 50 reach ~0.013 with 5/6 first
  # evaluation attempts passing and mixed RL groups.
  c.sft.epochs = 5 if big else 50
  if not big:
    c.sft.lr, c.sft.end_lr = 3e-3, 1e-3
  c.sft.mode = "credit"
  c.rl.iterations = 100 if big else 4
  c.rl.prompts_per_iteration = 8 if big else 2
  c.rl.oversample = 2 if big else 0
  c.rl.bar = ml_collections.ConfigDict(dict(
      group_size=8 if big else 4, max_rollouts=16 if big else 6, stride=8 if big else 4,
      positive_fraction=(0.25, 0.75)))
  c.rl.seq_len = 65536 if big else 2048
  c.rl.batch_size, c.rl.microbatches = (64, 1) if big else (4, 2)
  c.rl.parallel_rollouts = 64 if big else 8
  c.rl.rollout_timeout_s = 660.0     # the 10-minute budget plus the grading
  c.eval.splits = ("train",)         # the RL job's protocol; claw_eval runs the evaluation set
  c.eval.k = 3
  c.eval.max_instances = 0 if big else 3
  c.eval.baseline = True
  return c


# ----------------------------------------------------------------------------- Orchard-GUI recipe

GUI_PRESETS = ("tiny", "qwen3_vl_4b", "cluster")


def gui_base(preset="tiny"):
  """Everything the Orchard-GUI recipe reads (orchard_jax/recipes/gui.py), for one preset: the
  loop's `rl_base` plus the GUI task set, the browser sandboxes, the browser agent and the
  optional WebJudge (docs/algorithms.md section 9).

  Presets:
    qwen3_vl_4b  the published setting: Qwen3-VL-4B, a 1280 x 1000 viewport, only the last
                 screenshot in context, the 13 tools; SFT 3 epochs, lr 1e-5 cosine with 10%
                 warm-up, batch 128, vision encoder and projector frozen; GRPO with 5 samples
                 per task, clip 0.2 / 0.28, no KL or entropy term, dynamic sampling (groups
                 whose rewards all agree are dropped and replaced), the step budget 15 then 30.
    cluster      qwen3_vl_4b on the fleet (Orchard Env, SGLang and the checkpoint volume from
                 the ORCHARD_* environment variables; browser sandboxes run the image of
                 launch/k8s/Dockerfile.browser, $ORCHARD_BROWSER_IMAGE).
    tiny         the same pipeline on 2 CPU cores: the tiny_vl policy, a 192 x 224 viewport
                 (MiniWoB++'s task area; 42 image tokens a screenshot), three tools, a few
                 MiniWoB++ tasks the scripted experts demonstrate.
  """
  import os
  if preset not in GUI_PRESETS:
    raise ValueError(f"preset {preset!r} is not one of {GUI_PRESETS}")
  big = preset != "tiny"
  c = rl_base("cluster" if preset == "cluster" else "qwen3_5_35b_a3b" if big else "tiny")
  c.preset = preset
  c.name = "gui"
  c.policy.update(dict(
      preset="qwen3_vl_4b" if big else "tiny_vl",
      init="/models/qwen3_vl_4b" if big else "",
      tokenizer="/models/qwen3_vl_4b" if big else "tiny_vl",
      tool_call_parser="hermes", moe_dispatch="sort"))
  if big:
    c.mesh.update(dict(data=-1, fsdp=1, tensor=1, expert=1))
  c.tasks.update(dict(
      # names are comma-separated ("click-test,click-button"), or a keyword
      miniwob="experts" if big else "click-test,click-button",   # names, "experts", "all"
      miniwob_seeds=64 if big else 2,        # training seeds per MiniWoB++ task
      miniwob_eval_seeds=8 if big else 1,    # evaluation seeds per task
      sites="all" if big else "",            # site families, "all", or "" for none
      open_file="",                          # open tasks (JSON lines), judged by gui_judge
      train_tasks=0 if big else 2,           # RL/SFT training subset (0 = every training task)
      selection="spread"))                   # spread (families in turn) or first
  c.browser = ml_collections.ConfigDict(dict(
      viewport=(1280, 1000) if big else (192, 224), device_scale=1.0,
      screenshot_format="png", screenshot_scale="css", settle_ms=0.0,
      action_timeout_s=5.0, navigation_timeout_s=15.0, screenshot_timeout_s=10.0,
      step_timeout_s=60.0, start_timeout_s=120.0,
      # cluster: the image of launch/k8s/Dockerfile.browser (Chromium, Playwright, miniwob)
      image=(os.environ.get("ORCHARD_BROWSER_IMAGE", "orchard-browser:0.1")
             if preset == "cluster" else "host"), python="",
      cpu=1.0, memory="1536Mi", disk="256Mi",
      # Kubernetes enforces pids per node (podPidsLimit), not per sandbox
      pids=None if preset == "cluster" else 1024))
  c.agent = ml_collections.ConfigDict(dict(
      observation="screenshot",              # screenshot | a11y (text-only policies) | both
      tools="all" if big else "click,write,done",   # "all" (the 13 tools), or a subset
      screenshots_in_context=1,              # k of the last-k-screenshots policy
      step_limits=(15, 30) if big else (4,),  # the step budget's curriculum ...
      curriculum_iterations=(50,) if big else (),   # ... and the RL iterations it changes at
      max_consecutive_format_errors=3,       # then the episode ends: reward -1
      wall_time_limit_s=900.0, model_timeout_s=600.0))
  c.gui_judge = _endpoint("none", max_screenshots=5, threshold=3, always=False)
  c.gui_judge.temperature = 0.0
  c.annotator.kind = "outcome"
  c.env.max_parallel = 64 if big else 4
  c.engine.max_seq_len = 32768 if big else 4096
  c.policy.max_position_embeddings = 262144 if big else 8192
  c.sampling.update(dict(temperature=1.0 if big else 0.8, top_p=1.0,
                         max_tokens=1024 if big else 48))
  # tiny: a turn is ~1,000 tiny_vl tokens (system prompt, three tool schemas, the task, one
  # 42-token screenshot, the call), so the two demonstrations share one 2,048-token row.
  c.sft.update(dict(
      epochs=3 if big else 30, lr=1e-5 if big else 2e-3, end_lr=0.0 if big else 5e-4,
      warmup_steps=0, batch_size=128 if big else 1, microbatches=1,
      seq_len=32768 if big else 2048, max_tokens=32768 if big else 2048,
      frozen=("visual",), images_per_row=4 if big else 2, mode="credit"))
  if big:   # 10% warm-up of 3 epochs over ~0.4K distilled trajectories' turns
    c.sft.warmup_steps = 5
  c.rl.update(dict(
      iterations=100 if big else 2, prompts_per_iteration=16 if big else 2,
      oversample=8 if big else 0, lr=1e-6 if big else 3e-5, end_lr=1e-6 if big else 3e-5,
      eps_low=0.2, eps_high=0.28, kl_coef=0.0, entropy_coef=0.0,
      seq_len=32768 if big else 2048, batch_size=64 if big else 2, microbatches=1,
      parallel_rollouts=64 if big else 2, rollout_timeout_s=1200.0, frozen=(),
      images_per_row=4 if big else 2))
  c.rl.bar = ml_collections.ConfigDict(dict(
      group_size=5 if big else 4, max_rollouts=5 if big else 4, stride=5 if big else 4,
      positive_fraction=(0.0, 1.0)))
  c.eval.splits = ("train",)
  c.eval.k = 2 if big else 1
  c.eval.max_instances = 0 if big else 2
  c.eval.baseline = False
  return c
