"""The agentic RL loop, written once for every domain (SWE, Claw, GUI, ...); it imports none.

The loop owns rollout groups, BAR, records, packing, updates, weight sync, checkpoints and
evaluation; a domain owns what its tasks are and how they are judged (docs/design.md, "The
agentic loop and its domains").

  domain.py      the seam: `Domain`, `Outcome`, `Judgement`, `Annotation`
  run.py         `RunContext`: run folder, tokenizer, mesh, store, the domain's tasks and split
  policy.py      the policy a config names: fresh, a checkpoint, a Hugging Face folder (the one
                 checkpoint lookup and parameter reader)
  serving.py     `ModelService`: embedded engine / SGLang / OpenAI-compatible upstream behind
                 the recording proxy (the one engine stack), weight sync, scoring
  teachers.py    the distillation and OPD teachers on that stack
  rollouts.py    `RolloutRunner`: a domain's episodes through the proxy, graded, judged, stored
  groups.py      BAR groups over the runner (`rl.balanced_adaptive_rollout`, the one driver)
  grpo.py        group filter, advantages, packing, updates of one RL iteration
  sft.py         credit-assignment SFT     evaluation.py  pass@k with intervals, comparison
  value.py       the value model           jobs.py        train_sft / train_rl / train_value /
                                                          evaluate_checkpoint
  distill.py, trajectory_data.py           teacher trajectories into the store, and its data

Writing a domain
----------------
A domain is a class built from the run's config (it reads its own blocks: tasks, env, agent,
judge, annotator) that satisfies `Domain`:

    class ArithmeticDomain:
      name = "arith"
      rubrics = None                          # or rl.RubricSet(((name, weight), ...)) for RPR
      aborted_statuses = frozenset({"ModelError"})     # infrastructure, never the policy's fault
      truncated_statuses = frozenset({"LimitsExceeded"})
      submitted_statuses = frozenset({"Submitted"})

      def __init__(self, config): self.config = config
      def check_config(self, job): ...        # one-line ConfigErrors for its own settings
      def load_tasks(self): ...               # every task, stable order
      def task_id(self, task): return task.id
      def environment(self): return sandbox_client(self.config.env)   # what episodes act in
      def training_subset(self, run, env): return run.train_all[:4]
      def run_episode(self, task, env, base_url, *, model, session_id, attempt, sampling,
                      log_dir):
        ...   # run a harness in a fresh sandbox with its model at base_url (the proxy's
              # per-session URL: every call is recorded with token ids and log-probs);
              # return data.Trajectory(messages, exit_status, submission)
      def grade(self, task, trajectory, env, *, log_dir):
        return Outcome(resolved=..., status="resolved" | "unresolved" | "grader_error")
      def make_judge(self): return None       # or an object with judge(trajectory, task)
      def make_annotator(self): ...           # annotate(trajectory, task) -> Annotation
      def seed_trajectories(self, run, tasks, env): ...   # graded trajectories for SFT

    def rl(config):                           # the job function: one line of wiring
      return agentic.train_rl(config, ArithmeticDomain(config))

Rules the loop applies: an episode or grading that raises, or a status in aborted_statuses
(the trajectory's exit status or the outcome's status, e.g. "grader_error"), aborts the rollout
(BAR backfill; its group is not trained). A truncated rollout is never resolved. Rewards are
R_bin = +1 resolved / -1 otherwise, or the outcome's own `reward`, plus alpha J with a judge on
the domain's rubric set. Any harness works, built-in or external (running inside the sandbox),
as long as its model calls go to `base_url`: the trainer reads the proxy's records and never
needs to know which harness produced them. The SWE domain (recipes/swe/domain.py) is a
complete one.
"""
from orchard_jax.recipes.agentic.domain import (ABORTED, Annotation, Annotator, Domain, Judge,
                                                Judgement, Outcome, StatusRules)
from orchard_jax.recipes.agentic.jobs import evaluate_checkpoint, train_rl, train_sft, train_value
from orchard_jax.recipes.agentic.run import RunContext, run_dir
from orchard_jax.recipes.agentic.sandboxes import sandbox_client

__all__ = ["ABORTED", "Annotation", "Annotator", "Domain", "Judge", "Judgement", "Outcome",
           "RunContext", "StatusRules", "evaluate_checkpoint", "run_dir", "sandbox_client",
           "train_rl", "train_sft", "train_value"]
