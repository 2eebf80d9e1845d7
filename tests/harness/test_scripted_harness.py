"""The real Codex CLI and Claude Code inside a local sandbox, driven by a scripted plan
(`harness.scripted_model`) behind the recording proxy: how SFT seed data in a harness's own
format is recorded (the SWE domain's `harness_expert_trajectory`). No engine runs here, so
this is the cheap end-to-end check of both CLIs' wires through the proxy.

Each plan's shell commands must run in the sandbox through the harness's own shell tool, every
call must be recorded on the harness's wire with the tool's real output in the next call's
history, and the records must tokenise into SFT sequences that teach exactly the scripted
turns.
"""
import pytest

from orchard_jax import data
from orchard_jax.data import TrajectoryStore, tiny_tokenizer
from orchard_jax.env.backends.local import LocalBackend
from orchard_jax.env.client import SandboxClient
from orchard_jax.env.orchestrator import Orchestrator
from orchard_jax.harness import install
from orchard_jax.harness.cli_harness import CLAUDE_CODE, CODEX, HarnessLimits, run_cli_harness
from orchard_jax.harness.errors import HarnessError
from orchard_jax.harness.scripted_model import ScriptedHarnessModel, ScriptStep
from orchard_jax.rollout import RecordingProxy

WORKDIR = "/work/repo"
DIFF = f"cd {WORKDIR} && git add -A >/dev/null && git diff --cached"
FINAL = "Both files are in place."
STEPS = [ScriptStep("First the greeting file.", "printf 'hi\\n' > hello.txt"),
         ScriptStep("Now a second file from the first, by the task's own tool.",
                    "task-tool < hello.txt > shout.txt && echo marker-$((6*7))")]
# A task image puts its tools (its Python environment) first on the sandbox's PATH; the
# harness's shell commands must find them.
TOOLS = "/tmp/task-tools"


@pytest.fixture(scope="module")
def client():
  with Orchestrator(LocalBackend(shared_paths=[install.harness_dir()])) as service, \
       SandboxClient(service.url, service.api_key) as c:
    yield c


@pytest.mark.parametrize("harness", [CODEX, CLAUDE_CODE], ids=lambda h: h.name)
def test_scripted_plan_runs_through_the_real_cli(client, harness, tmp_path):
  install.executable(harness.name)   # a clear error naming the install command when missing
  model = ScriptedHarnessModel(harness, STEPS, final_answer=FINAL)
  with TrajectoryStore(tmp_path / "store") as store, \
       RecordingProxy(model, store=store, freeze_gc=False) as proxy:
    with client.create_sandbox(image="host", workdir=WORKDIR, egress=[proxy.url],
                               env={"PATH": f"{TOOLS}:/usr/local/bin:/usr/bin:/bin"}) as box:
      box.exec("git init -q . && echo base > README && git add -A && "
               "git -c user.email=t@t -c user.name=t commit -qm base && "
               f"mkdir -p {TOOLS} && printf '#!/bin/sh\\ntr a-z A-Z\\n' > {TOOLS}/task-tool && "
               f"chmod +x {TOOLS}/task-tool", check=True)
      run = run_cli_harness(harness, box, "Create hello.txt and shout.txt.",
                            base_url=box.egress_url(proxy.session_url("s")), workdir=WORKDIR,
                            model=model.model, diff_command=DIFF,
                            limits=HarnessLimits(timeout_s=300, max_turns=6))
    proxy.end_session("s")
    calls = store.model_calls("s")
  assert run.exit_code == 0, run.output[-3000:]
  # The commands ran in the sandbox, by the harness's own shell tool.
  assert "+hi" in run.patch and "+HI" in run.patch, run.patch
  assert FINAL in run.output
  # Every call recorded on the harness's wire; each next call shows the tool's real output.
  assert [c.metadata["wire"] for c in calls] == [harness.wire] * 3
  assert all(c.text_only and c.delivered for c in calls)
  name = harness.shell_tool("", "")[0]
  assert [(c.response.get("tool_calls") or [{}])[0].get("function", {}).get("name")
          for c in calls] == [name, name, None]
  assert calls[-1].response["content"] == FINAL
  outputs = [m for m in calls[2].messages if m["role"] == "tool"]
  assert len(outputs) == 2 and "marker-42" in str(outputs[1]["content"])
  # SFT from the records: one sequence whose trained tokens are exactly the three answers.
  tokenizer = tiny_tokenizer()
  sequences = data.sequences_from_model_calls(calls, mode="sft", tokenizer=tokenizer)
  assert len(sequences) == 1
  trained = tokenizer.decode([t for t, w in zip(sequences[0].input_ids,
                                                sequences[0].loss_weights) if w > 0])
  for step in STEPS:
    assert step.thought in trained
  assert "hello.txt" in trained and "marker-$((6*7))" in trained and FINAL in trained
  assert "marker-42" not in trained          # the tool's output is context, not a target


def test_a_harness_without_a_shell_tool_is_refused():
  from orchard_jax.harness.cli_harness import MINI_SWE_AGENT
  with pytest.raises(HarnessError, match="no shell function tool"):
    ScriptedHarnessModel(MINI_SWE_AGENT, STEPS)
  model = ScriptedHarnessModel(CODEX, STEPS)
  with pytest.raises(HarnessError, match="offers no 'exec_command' tool"):
    model.answer([{"role": "user", "content": "hi"}], [{"type": "function",
                                                         "function": {"name": "shell"}}])
  # Past the plan, every call gets the final answer (a harness's retry included).
  history = [{"role": "assistant", "content": "x"}] * len(STEPS)
  assert model.answer(history, None) == {"role": "assistant", "content": model.final_answer}
