"""Orchard-Claw benchmark: `python launch/bench.py --suite claw`.

Measured in one run (Orchard Env in its own process, local backend, full isolation), with
`uptime`'s load printed beside:
- services up: from the sandbox create request until every service of the rollout answers
  (`ClawWorld.__enter__`: create, copy the zip application, start, expose the ports), for one
  service and for all six, p50 and p99 over 20 rollouts, against the 1 s budget of the issue
  and beside the floor of the same sandbox with `python3 -S -c pass` run in it;
- one tool call through Orchard Env's exposed port (p50), beside the same call answered by the
  services in-process (`LocalWorld`: the service logic alone);
- every evaluation task x 3 trials played by its scripted reference through the ReAct harness
  in fresh sandboxes (`recipes.claw.play_scripted`: the environment's share of `claw_eval`,
  model time excluded), against the issue's 30-minute budget for the whole evaluation.
"""
import json
import os
import subprocess
import tempfile
import time

from launch.benchmarks import common

_ROLLOUTS = 20


def _world_up(client, resets, repeats):
  from orchard_jax.tasks.claw.world import ClawWorld
  durations = []
  for _ in range(repeats):
    started = time.perf_counter()
    with ClawWorld(client, resets) as world:
      durations.append(time.perf_counter() - started)
      assert world.call(next(iter(_first_tools(resets))), "{}").status in (200, 400)
  return durations


def _first_tools(resets):
  from orchard_jax.tasks.claw.tools import tools_of
  return [tools_of([name])[0].name for name in resets]


def _floor(client, repeats):
  durations = []
  for _ in range(repeats):
    started = time.perf_counter()
    with client.create_sandbox(image="host", cpu=1, memory="512Mi", disk="128Mi") as box:
      box.exec(["python3", "-S", "-c", "pass"])
      durations.append(time.perf_counter() - started)
  return durations


def run() -> list:
  import logging
  from orchard_jax.env import SandboxClient, ServiceProcess
  from orchard_jax.recipes.claw import play_scripted
  from orchard_jax.tasks.claw import eval_tasks
  from orchard_jax.tasks.claw.local_world import LocalWorld
  from orchard_jax.tasks.claw.services import SERVICES
  from orchard_jax.tasks.claw.world import ClawWorld
  logging.getLogger("httpx").setLevel(logging.WARNING)
  print("load before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        flush=True)
  rows = []
  one = {"mail": {}}
  every = {name: {} for name in SERVICES}
  state = tempfile.mkdtemp(prefix="orchard-claw-bench-")
  with ServiceProcess(["--state-dir", state, "--log-level", "warning"],
                      env={"PYTHONWARNINGS": "ignore"}) as service, \
       SandboxClient(service.url, service.api_key) as client:
    _world_up(client, one, 2)
    floor = _floor(client, _ROLLOUTS)
    for label, resets in (("1 service (mail)", one), ("all 6 services", every)):
      durations = _world_up(client, resets, _ROLLOUTS)
      for q in (50, 99):
        rows.append(common.Row(f"services up, {label}", f"p{q} s",
                               common.percentile(durations, q), 1.0, "budget",
                               higher_is_better=False, target=1.0))
      rows.append(common.Row(f"services up, {label}", "p50 s", common.percentile(durations, 50),
                             common.percentile(floor, 50), "floor: sandbox + python3 -S -c pass",
                             higher_is_better=False))
    args = json.dumps({"query": "invoice"})
    with ClawWorld(client, one) as world:
      remote = common.time_calls(lambda: world.call("mail_search", args), warmup=5, repeats=200)
    with LocalWorld(one) as local:
      inproc = common.time_calls(lambda: local.call("mail_search", args), warmup=5, repeats=200)
    rows.append(common.Row("tool call mail_search (HTTP via exposed port)", "p50 ms",
                           common.percentile(remote, 50) * 1000,
                           common.percentile(inproc, 50) * 1000,
                           "same call in-process (LocalWorld)", higher_is_better=False))

    tasks = eval_tasks()
    started = time.perf_counter()
    passed = 0
    for trial in range(3):
      for task in tasks:
        passed += play_scripted(task, client, seed=trial).outcome.passed
    elapsed = time.perf_counter() - started
    rows.append(common.Row(f"{len(tasks)} eval tasks x 3 trials, scripted ({passed} passed)",
                           "minutes", elapsed / 60, 30.0, "claw_eval budget",
                           higher_is_better=False, target=1.0))
  print("load after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        f"({os.cpu_count()} cores)", flush=True)
  return rows
