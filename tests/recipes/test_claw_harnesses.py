"""The Claw domain with the built-in ReAct harness and with the real Codex CLI (from npm, run
inside the task's sandbox with the `claw` command beside it and the recording proxy as its only
egress), against the embedded engine serving a small random policy. Both episodes are graded
by the same grader, every model call of both is recorded by the proxy (chat completions and
the Responses wire), and the two rollouts' records become RL training sequences through the
one code path the loop uses (`grpo.group_sequences`: every call of a rollout gets the rollout's
advantage). A random policy solves nothing; what is checked is the path, not the skill."""
import dataclasses

import numpy as np
import pytest
from flax import nnx

from experiments import common
from orchard_jax import rl
from orchard_jax.data import TrajectoryStore, tiny_tokenizer
from orchard_jax.env.backends.local import LocalBackend
from orchard_jax.env.client import SandboxClient
from orchard_jax.env.orchestrator import Orchestrator
from orchard_jax.harness import install
from orchard_jax.models import CausalLM, get_preset
from orchard_jax.recipes.agentic import grpo
from orchard_jax.recipes.agentic.groups import PromptGroup
from orchard_jax.recipes.agentic.rollouts import Rollout, RolloutRequest
from orchard_jax.recipes.claw import ClawDomain
from orchard_jax.rollout import (Engine, EngineConfig, InferenceServer, RecordingProxy,
                                 SGLangUpstream)
from orchard_jax.tasks import claw as claw_tasks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
             num_experts_per_tok=2)
# Codex's first prompt is ~8.4k tokens of the tiny tokenizer; the task's adds a few hundred.
ENGINE = EngineConfig(max_batch_size=1, batch_buckets=(1,), max_seq_len=12288,
                      cache_len_buckets=(12288,), prefill_chunk_buckets=(1024,), decode_steps=8,
                      seed=0)


def config(harness):
  c = common.claw_base("tiny")
  c.agent.harness = harness
  c.agent.step_limit = 2
  c.agent.wall_time_limit_s = 600.0
  c.engine.max_seq_len = 12288
  return c


def test_react_and_codex_rollouts_train_through_the_same_path(tmp_path):
  task = next(t for t in claw_tasks.eval_tasks() if t.id == "todos_mark_done")
  tokenizer = tiny_tokenizer()
  model = CausalLM(dataclasses.replace(get_preset("tiny"), **SMALL), rngs=nnx.Rngs(0))
  with Engine(model, tokenizer, config=ENGINE) as engine, InferenceServer(engine) as server, \
       TrajectoryStore(str(tmp_path / "store")) as store, \
       RecordingProxy(SGLangUpstream(server.url), tokenizer=tokenizer, store=store,
                      served_model_name="policy",
                      sampling_defaults={"max_new_tokens": 24}) as proxy, \
       Orchestrator(LocalBackend(shared_paths=[install.harness_dir()])) as service, \
       SandboxClient(service.url, service.api_key) as env:
    rollouts = []
    for i, harness in enumerate(("react", "codex")):
      domain = ClawDomain(config(harness))
      domain.check_config("evaluate")
      session = f"{harness}-0"
      trajectory = domain.run_episode(task, env, proxy.session_url(session), model="policy",
                                      session_id=session, attempt=0,
                                      sampling={"temperature": 1.0, "max_tokens": 24, "seed": i},
                                      log_dir=None)
      proxy.end_session(session)
      outcome = domain.grade(task, trajectory, env, log_dir=None)
      assert outcome.status in ("passed", "failed")            # graded, not aborted
      assert trajectory.metadata["harness"] == harness
      calls = store.model_calls(session)
      assert calls, f"no model call of the {harness} episode was recorded"
      assert {c.metadata.get("wire", "chat_completions") for c in calls} == (
          {"chat_completions"} if harness == "react" else {"responses"})
      reward = 1.0 if i == 0 else -1.0       # a mixed group, as BAR would assemble one
      rollouts.append(Rollout(RolloutRequest(task, i, i), session, trajectory, aborted=False,
                              seconds=0.0, reward=reward))
  scored = tuple(rl.ScoredRollout(reward=r.reward, resolved=r.reward > 0, rollout_id=k)
                 for k, r in enumerate(rollouts))
  group = PromptGroup(task, rollouts, rl.Assembly(scored, "target", 1, (1,), 2, 1, 1, 0),
                      stride=2, group_size=2)
  with TrajectoryStore(str(tmp_path / "store")) as store:
    data = grpo.group_sequences([group], store, num_groups=1)
  assert data.stats["groups/trained"] == 1 and data.stats["groups/unusable_records"] == 0
  # the iteration's printout names where its rows came from: two sessions, one per wire
  assert data.stats["train/sessions"] == 2
  assert {k for k in data.stats if k.startswith("train/calls/")} == {
      "train/calls/chat_completions", "train/calls/responses"}
  assert "from 2 sessions' recorded calls: chat_completions" in grpo._sources(data.stats)
  by_session = {}
  for s in data.sequences:
    by_session.setdefault(s.metadata["session_id"], []).append(s)
  assert set(by_session) == {"react-0", "codex-0"}
  # Every recorded call of a rollout trains with that rollout's advantage: the group's rewards
  # +1 / -1 normalised, (r - mean) / std = +1 / -1 (up to the normaliser's epsilon).
  for sid, sign in (("react-0", 1.0), ("codex-0", -1.0)):
    values = np.concatenate([np.asarray(s.advantages)[np.asarray(s.loss_weights) > 0]
                             for s in by_session[sid]])
    np.testing.assert_allclose(values, sign, atol=1e-5)
  assert all(s.num_loss_tokens > 0 for seqs in by_session.values() for s in seqs)
