"""`python launch/bench.py --suite sglang`: SGLang serving a checkpoint of this project, end to end.

On a machine with an NVIDIA GPU the suite
1. finds SGLang's Python: $ORCHARD_SGLANG_PYTHON, else the virtual environment
   ~/.cache/orchard_jax/sglang-venv, which it creates and fills from requirements-gpu.txt when
   missing (SGLang pins its own torch and CUDA kernels, so it never shares the trainer's
   environment; a machine without a package index needs it pre-installed, see
   requirements-gpu.txt);
2. exports a random-initialised `tiny` qwen3_moe with `models.hf.save_pretrained` and the tiny
   tokenizer, and serves it with `sglang.launch_server` (bf16);
3. sends a chat completion through the recording proxy (`rollout.RecordingProxy` over
   `SGLangUpstream`, the project's client) and checks the recorded log-probs against the
   trainer's forward pass (float32, teacher forcing over the recorded prompt + output ids);
4. pushes one weight update (`SGLangClient.update_weights_from_disk` with another exported
   checkpoint) and checks that the next answer's log-probs follow the new weights and not the
   old ones.
It prints each check with its measured number (max |log-prob difference|, nats) and fails
(non-zero exit) when one misses its tolerance.

Without a GPU, SGLang cannot serve; the suite then runs in CPU mode: every step but 1 and 2's
launch, with the embedded engine's server (`rollout.InferenceServer`, the same HTTP API) in
SGLang's place, every row labelled "CPU mode". That checks the driver, not SGLang.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from launch.benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(os.path.expanduser("~"), ".cache", "orchard_jax", "sglang-venv")
# |log p(SGLang) - log p(trainer)| allowed: bf16 serving vs the float32 forward (GPU), and the
# embedded engine in float32 (CPU mode).
TOLERANCE = {"sglang": 0.05, "cpu": 1e-3}
_PROMPT = [{"role": "user", "content": "Write one short sentence about orchards."}]
_NEW = 24


def run() -> list[common.Row]:
  gpu = shutil.which("nvidia-smi") is not None and _has_cuda()
  mode = "sglang" if gpu else "cpu"
  label = "" if gpu else "[CPU mode: the embedded engine stands in for SGLang] "
  if not gpu:
    print("bench --suite sglang: no NVIDIA GPU here; running in CPU mode against the embedded "
          "engine's server (SGLang itself is not run).", file=sys.stderr)
  with tempfile.TemporaryDirectory(prefix="orchard_sglang_") as work:
    old_dir, new_dir = os.path.join(work, "step_0"), os.path.join(work, "step_1")
    old_model = _export(old_dir, seed=0)
    new_model = _export(new_dir, seed=1)
    with _server(mode, old_dir) as url:
      return _checks(url, old_model, new_model, new_dir, work, mode, label)


def _has_cuda() -> bool:
  out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
  return out.returncode == 0 and "GPU" in out.stdout


def _export(folder: str, seed: int):
  """A random `tiny` qwen3_moe saved as a Hugging Face folder with its tokenizer."""
  from flax import nnx

  from orchard_jax import models
  from orchard_jax.data import tiny_tokenizer
  from orchard_jax.models import hf
  config = dataclasses.replace(models.get_preset("tiny"), dtype="float32",
                               param_dtype="float32")
  model = models.CausalLM(config, rngs=nnx.Rngs(seed))
  hf.save_pretrained(model, config, folder)
  tiny_tokenizer().save(folder)
  return model


@contextlib.contextmanager
def _server(mode: str, checkpoint: str):
  """The URL of a server of `checkpoint`: SGLang (mode "sglang") or the embedded engine."""
  if mode == "cpu":
    from orchard_jax.data import tiny_tokenizer
    from orchard_jax.models import hf
    from orchard_jax.rollout import Engine, EngineConfig, InferenceServer
    _, model = hf.load_pretrained(checkpoint)
    engine = Engine(model, tiny_tokenizer(), config=EngineConfig(max_seq_len=512, seed=0))
    with engine, InferenceServer(engine) as server:
      yield server.url
    return
  python = sglang_python()
  port = _free_port()
  with open(os.path.join(os.path.dirname(checkpoint), "sglang.log"), "w") as log:
    process = subprocess.Popen(
        [python, "-m", "sglang.launch_server", "--model-path", checkpoint, "--port", str(port),
         "--host", "127.0.0.1", "--tp", "1", "--dtype", "bfloat16", "--mem-fraction-static",
         "0.3", "--random-seed", "0"], stdout=log, stderr=subprocess.STDOUT)
    try:
      yield f"http://127.0.0.1:{port}"
    finally:
      process.terminate()
      try:
        process.wait(timeout=60)
      except subprocess.TimeoutExpired:
        process.kill()


def sglang_python() -> str:
  """SGLang's interpreter: $ORCHARD_SGLANG_PYTHON, else VENV's (created and filled from
  requirements-gpu.txt when missing). Raises SystemExit with one line when it cannot be had."""
  configured = os.environ.get("ORCHARD_SGLANG_PYTHON")
  if configured:
    return configured
  python = os.path.join(VENV, "bin", "python")
  if not os.path.exists(python):
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
  check = subprocess.run([python, "-c", "import sglang"], capture_output=True, check=False)
  if check.returncode != 0:
    install = subprocess.run([python, "-m", "pip", "install", "-q", "-r",
                              os.path.join(ROOT, "requirements-gpu.txt")],
                             capture_output=True, text=True, check=False)
    if install.returncode != 0:
      last = (install.stderr.strip().splitlines() or ["no output"])[-1]
      raise SystemExit(f"bench --suite sglang: installing SGLang into {VENV} failed ({last}); "
                       "install it there by hand or set ORCHARD_SGLANG_PYTHON")
  return python


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _checks(url: str, old_model, new_model, new_dir: str, work: str, mode: str,
            label: str) -> list[common.Row]:
  import openai

  from orchard_jax.data import TrajectoryStore, tiny_tokenizer
  from orchard_jax.rollout import RecordingProxy, SGLangClient, SGLangUpstream

  tolerance = TOLERANCE[mode]
  rows = []
  start = time.perf_counter()
  with SGLangClient(url) as client:
    client.wait_until_ready(timeout_s=900)
    rows.append(common.Row(case=f"{label}server ready", metric="s after launch",
                           ours=time.perf_counter() - start, higher_is_better=False))
    with TrajectoryStore(os.path.join(work, "store")) as store, RecordingProxy(
        SGLangUpstream(url), tokenizer=tiny_tokenizer(), store=store) as proxy:
      records = []
      for session in ("before-update", "after-update"):
        if session == "after-update":
          client.update_weights_from_disk(new_dir, weight_version="1")
        chat = openai.OpenAI(base_url=proxy.session_url(session), api_key="none", max_retries=0)
        chat.chat.completions.create(model="policy", messages=_PROMPT, temperature=1.0,
                                     top_p=1.0, max_tokens=_NEW, seed=0)
        proxy.end_session(session)
        records.append(store.model_calls(session)[-1])
  before, after = records
  checks = [("recorded log-probs vs the trainer's forward (same weights)", before, old_model,
             True),
            ("after one weight update: log-probs vs the new weights' forward", after, new_model,
             True),
            ("after one weight update: log-probs vs the old weights' forward", after, old_model,
             False)]
  failures = []
  for name, record, model, should_match in checks:
    diff = max_logprob_difference(model, record.prompt_ids, record.output_ids,
                                  record.output_logprobs)
    bound = tolerance if should_match else 10 * tolerance
    ok = diff <= bound if should_match else diff > bound
    verdict = f"{'<=' if should_match else '>'} {bound:g}: {'ok' if ok else 'FAILED'}"
    rows.append(common.Row(case=f"{label}{name}",
                           metric=f"max |d log p| nats ({len(record.output_ids)} tokens; "
                                  f"{verdict})", ours=diff, higher_is_better=False))
    if not ok:
      failures.append(name)
  if failures:
    common.print_table("sglang", rows)
    raise SystemExit(f"bench --suite sglang: failed: {'; '.join(failures)}")
  return rows


def max_logprob_difference(model, prompt_ids, output_ids, output_logprobs) -> float:
  """max_j |output_logprobs[j] - log p_model(output_ids[j] | prompt + output[:j])|.

  Args:
    model: a CausalLM (run in its own dtype).
    prompt_ids, output_ids: the recorded call's ids; output_logprobs: one float per output id.
  Raises:
    ValueError: no output, or log-probs not one per output id.
  """
  import jax
  import jax.numpy as jnp
  if not output_ids or len(output_logprobs) != len(output_ids):
    raise ValueError(f"need one log-prob per output id; got {len(output_logprobs)} for "
                     f"{len(output_ids)} ids")
  ids = np.asarray(list(prompt_ids) + list(output_ids), np.int32)[None]
  positions = np.arange(ids.shape[1], dtype=np.int32)[None]
  logits = model(jnp.asarray(ids), jnp.asarray(positions), jnp.ones_like(jnp.asarray(ids)))[0]
  logp = np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1))
  n = len(prompt_ids)
  ours = logp[np.arange(n - 1, ids.shape[1] - 1), np.asarray(output_ids)]
  return float(np.max(np.abs(ours - np.asarray(output_logprobs, np.float64))))
