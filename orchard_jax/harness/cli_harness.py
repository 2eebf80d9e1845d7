"""External harness CLIs (Codex CLI, Claude Code) run inside a task's sandbox.

These harnesses run their own tools (shell commands, file edits), so they run where the
repository is: inside the task's sandbox, with the repository as working folder and the
recording proxy's per-session URL as their model endpoint (the sandbox's egress allow-list
lets them reach that endpoint and nothing else). Each is driven non-interactively and fully
offline: no sign-in, no telemetry, no update checks, no hosted tools.

| harness       | wire (proxy path)                 | configured by                                        |
|---------------|-----------------------------------|------------------------------------------------------|
| `codex`       | OpenAI Responses (`/v1/responses`) | `$CODEX_HOME/config.toml`: a `model_providers` entry with `wire_api = "responses"`; `codex exec` |
| `claude_code` | Anthropic Messages (`/v1/messages`) | `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, `ANTHROPIC_MODEL`; `claude -p` |
| `mini_swe_agent` | OpenAI chat completions | litellm's `api_base`; its default agent, run by the trainer's interpreter |

`run_cli_harness` writes the harness's configuration into a private folder of the sandbox
(`/tmp/orchard-harness`, outside the repository so it never shows in the diff), runs the CLI
until it exits or its time is up, then reads back the workspace diff (the command the caller
gives, e.g. the SWE domain's `diff_script`) and the harness's own logs: its stdout/stderr
event stream and its trajectory files (Codex's `sessions/**/rollout-*.jsonl`, Claude Code's
`projects/**/*.jsonl`).

The CLIs come from `harness/install.py` (pinned npm versions in a folder the sandbox shows
read-only: pass `install.harness_dir()` to `LocalBackend(shared_paths=...)`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from typing import Any, Callable, Optional

from orchard_jax.harness import install as _install
from orchard_jax.harness.errors import HarnessError

PRIVATE_DIR = "/tmp/orchard-harness"
API_KEY = "orchard-proxy"      # sent to the proxy, which reads no key
_LOG_LIMIT_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class CLIHarness:
  """How one CLI harness is configured and run (see the module docstring's table).

  Attributes:
    name: "codex" or "claude_code" (`install.HARNESS_PACKAGES`).
    wire: the proxy wire it speaks ("responses" or "messages").
    setup: (base_url, model, workdir, limits) -> {path in the sandbox: file text} to write.
    environment: (base_url, model, limits) -> environment variables of the run.
    command: (executable, task, workdir, limits) -> the shell command that runs it.
    log_globs: shell globs (under PRIVATE_DIR) of the harness's own trajectory files.
    shell_tool: (command, purpose) -> (tool name, arguments) of a call of the harness's own
      shell tool that runs `command` (purpose: a short description of why); None for a
      harness that offers the model no shell function tool (mini-swe-agent reads commands
      from the text).
  """
  name: str
  wire: str
  setup: Callable[..., dict[str, str]]
  environment: Callable[..., dict[str, str]]
  command: Callable[..., str]
  log_globs: tuple[str, ...]
  shell_tool: Optional[Callable[[str, str], tuple[str, dict[str, Any]]]] = None


@dataclasses.dataclass(frozen=True)
class HarnessLimits:
  """Limits of one harness run.

  Attributes:
    timeout_s: wall-clock seconds before the CLI is killed (status "timed_out").
    max_turns: model turns the CLI may take (Claude Code's --max-turns; Codex has no such
      option and is bounded by timeout_s).
    context_window: tokens the engine holds (told to the CLI so it compacts, or stops,
      before overflowing).
    request_timeout_s: seconds one model call may take (a long first prefill on CPU).
    max_output_tokens: most tokens one call may generate (Claude Code asks for 32000 by
      default; Codex sends no limit, so the proxy's default applies).
  """
  timeout_s: float = 1800.0
  max_turns: int = 50
  context_window: int = 32768
  request_timeout_s: float = 3600.0
  max_output_tokens: int = 4096


@dataclasses.dataclass
class HarnessRun:
  """The outcome of one harness run.

  Attributes:
    harness: its name.
    exit_code: the CLI's exit status (124 when it was killed at timeout_s).
    timed_out: killed at the time limit.
    output: the CLI's stdout and stderr (its event stream; head and tail kept when long).
    patch: the workspace diff read after the run ("" when there is none).
    logs: {file name: text} of the harness's own trajectory files and its output.
    wall_s: seconds the CLI ran.
  """
  harness: str
  exit_code: int
  timed_out: bool
  output: str
  patch: str
  logs: dict[str, str]
  wall_s: float


def _toml_string(value: str) -> str:
  return json.dumps(value)   # a JSON string is a valid TOML basic string


def _codex_setup(base_url: str, model: str, workdir: str, limits: HarnessLimits
                 ) -> dict[str, str]:
  # Hosted tools (web search) and sub-agents are off: the proxy serves function tools only.
  # Analytics, feedback, OpenTelemetry and update checks are off: the run is offline.
  # Commands run in a plain shell, not a login shell, whose profile would reset PATH and
  # lose the task's Python environment.
  idle_ms = int(limits.request_timeout_s * 1000)
  config = f"""model = {_toml_string(model)}
model_provider = "orchard"
model_context_window = {int(limits.context_window)}
approval_policy = "never"
sandbox_mode = "danger-full-access"
allow_login_shell = false
web_search = "disabled"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[agents]
enabled = false

[otel]
exporter = "none"

[projects.{_toml_string(workdir)}]
trust_level = "trusted"

[model_providers.orchard]
name = "orchard recording proxy"
base_url = {_toml_string(base_url)}
env_key = "ORCHARD_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = {idle_ms}
"""
  return {f"{PRIVATE_DIR}/codex/config.toml": config}


def _codex_environment(base_url: str, model: str, limits: HarnessLimits) -> dict[str, str]:
  return {"CODEX_HOME": f"{PRIVATE_DIR}/codex", "ORCHARD_API_KEY": API_KEY,
          "NO_UPDATE_NOTIFIER": "1"}


def _codex_command(program: str, task: str, workdir: str, limits: HarnessLimits) -> str:
  # `codex exec` runs one task to its end; --json prints its events (kept as a log);
  # Orchard's sandbox is the isolation, so Codex's own is off (danger-full-access).
  return (f"{shlex.quote(program)} exec --json --skip-git-repo-check "
          f"--sandbox danger-full-access -C {shlex.quote(workdir)} {shlex.quote(task)} "
          "</dev/null")


def _claude_setup(base_url: str, model: str, workdir: str, limits: HarnessLimits
                  ) -> dict[str, str]:
  return {f"{PRIVATE_DIR}/claude/settings.json": json.dumps({
    "permissions": {"defaultMode": "bypassPermissions"}, "autoUpdates": False,
    "includeCoAuthoredBy": False})}


def _claude_environment(base_url: str, model: str, limits: HarnessLimits) -> dict[str, str]:
  # The Messages client appends /v1/messages to the base URL.
  anthropic_base = base_url[:-len("/v1")] if base_url.endswith("/v1") else base_url
  return {
    "ANTHROPIC_BASE_URL": anthropic_base, "ANTHROPIC_API_KEY": API_KEY,
    "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
    "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
    "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
    "CLAUDE_CONFIG_DIR": f"{PRIVATE_DIR}/claude",
    # Offline: no telemetry, error reports, update checks or other non-essential traffic.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "API_TIMEOUT_MS": str(int(limits.request_timeout_s * 1000)),
    "CLAUDE_CODE_MAX_RETRIES": "0",
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(int(limits.max_output_tokens)),
    # bypassPermissions is refused as root unless the CLI is told it runs in a sandbox.
    "IS_SANDBOX": "1"}


def _claude_command(program: str, task: str, workdir: str, limits: HarnessLimits) -> str:
  return (f"cd {shlex.quote(workdir)} && {shlex.quote(program)} -p {shlex.quote(task)} "
          "--output-format stream-json --verbose --dangerously-skip-permissions "
          f"--max-turns {int(limits.max_turns)} </dev/null")


# mini-swe-agent (PyPI) run by the interpreter the sandbox shows (the trainer's, read-only):
# its default agent and templates, litellm's OpenAI client pointed at the proxy, commands run
# in the sandbox by its LocalEnvironment. Its trajectory file is written where the logs are.
_MINI_DRIVER = """
import json, os, sys, yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel
from pathlib import Path
config = yaml.safe_load(open(os.path.join(builtin_config_dir, "default.yaml")))
agent_config = dict(config["agent"], step_limit=int(os.environ["ORCHARD_MAX_TURNS"]),
                    cost_limit=0.0)
model = LitellmModel(model_name="openai/" + os.environ["ORCHARD_MODEL"],
                     cost_tracking="ignore_errors",
                     **{k: v for k, v in config["model"].items() if k != "model_kwargs"},
                     model_kwargs={"api_base": os.environ["ORCHARD_BASE_URL"],
                                   "api_key": os.environ["ORCHARD_API_KEY"],
                                   "max_tokens": int(os.environ["ORCHARD_MAX_TOKENS"]),
                                   "timeout": float(os.environ["ORCHARD_REQUEST_TIMEOUT_S"])})
agent = DefaultAgent(model, LocalEnvironment(cwd=os.getcwd()), **agent_config)
result = agent.run(sys.argv[1])
agent.save(Path(os.environ["ORCHARD_PRIVATE_DIR"]) / "mini" / "run.traj.json")
print(json.dumps({"exit_status": result.get("exit_status")}))
sys.exit(0 if result.get("exit_status") == "Submitted" else 1)
"""


def _mini_setup(base_url: str, model: str, workdir: str, limits: HarnessLimits
                ) -> dict[str, str]:
  return {f"{PRIVATE_DIR}/mini/driver.py": _MINI_DRIVER}


def _mini_environment(base_url: str, model: str, limits: HarnessLimits) -> dict[str, str]:
  return {"ORCHARD_BASE_URL": base_url, "ORCHARD_MODEL": model, "ORCHARD_API_KEY": API_KEY,
          "ORCHARD_MAX_TURNS": str(int(limits.max_turns)),
          "ORCHARD_MAX_TOKENS": str(int(limits.max_output_tokens)),
          "ORCHARD_REQUEST_TIMEOUT_S": str(float(limits.request_timeout_s)),
          "ORCHARD_PRIVATE_DIR": PRIVATE_DIR,
          "MSWEA_GLOBAL_CONFIG_DIR": f"{PRIVATE_DIR}/mini/config", "MSWEA_SILENT_STARTUP": "1",
          "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _mini_command(program: str, task: str, workdir: str, limits: HarnessLimits) -> str:
  return (f"cd {shlex.quote(workdir)} && {shlex.quote(program)} {PRIVATE_DIR}/mini/driver.py "
          f"{shlex.quote(task)} </dev/null")


def _codex_shell(command: str, purpose: str) -> tuple[str, dict[str, Any]]:
  return "exec_command", {"cmd": command}


def _claude_shell(command: str, purpose: str) -> tuple[str, dict[str, Any]]:
  return "Bash", {"command": command, "description": purpose}


CODEX = CLIHarness("codex", "responses", _codex_setup, _codex_environment, _codex_command,
                   ("codex/sessions/*/*/*/*.jsonl",), _codex_shell)
CLAUDE_CODE = CLIHarness("claude_code", "messages", _claude_setup, _claude_environment,
                         _claude_command, ("claude/projects/*/*.jsonl",), _claude_shell)
MINI_SWE_AGENT = CLIHarness("mini_swe_agent", "chat_completions", _mini_setup,
                            _mini_environment, _mini_command, ("mini/*.traj.json",))
CLI_HARNESSES = {h.name: h for h in (CODEX, CLAUDE_CODE, MINI_SWE_AGENT)}


def get_cli_harness(name: str) -> CLIHarness:
  """The CLI harness by name.

  Raises:
    HarnessError: unknown name.
  """
  try:
    return CLI_HARNESSES[name]
  except KeyError:
    raise HarnessError(f"unknown CLI harness {name!r}; expected one of "
                       f"{sorted(CLI_HARNESSES)}") from None


def run_cli_harness(harness: CLIHarness, box: Any, task: str, *, base_url: str,
                    workdir: str, model: str = "orchard", limits: HarnessLimits = HarnessLimits(),
                    diff_command: Optional[str] = None,
                    install_dir: Optional[str] = None) -> HarnessRun:
  """Runs `harness` on `task` inside sandbox `box` (an Orchard Env SDK `Sandbox`).

  Args:
    harness: `CODEX` or `CLAUDE_CODE`.
    box: the task's sandbox; its egress allow-list must hold the proxy, and the harness
      folder must be visible in it (module docstring).
    task: the task text given to the CLI as its prompt.
    base_url: the proxy's per-session OpenAI base URL as seen inside the sandbox
      (`box.egress_url(proxy.session_url(session_id))`).
    workdir: the repository folder (the CLI's working folder).
    model: the model name the CLI sends (the proxy's served model name).
    limits: `HarnessLimits`.
    diff_command: a shell command printing the workspace diff after the run (None: no patch).
    install_dir: the npm prefix of the CLIs (default `install.harness_dir()`).
  Returns:
    `HarnessRun` with the exit code, output, patch and logs.
  Raises:
    HarnessError: the CLI is not installed, or its configuration could not be written.
  """
  if harness.name == "mini_swe_agent":   # a Python package of this interpreter, not npm
    program, bin_dir = sys.executable, os.path.dirname(sys.executable)
  else:
    program = _install.executable(harness.name, install_dir)
    bin_dir = _install.bin_dir(install_dir)
  files = harness.setup(base_url, model, workdir, limits)
  for path, text in files.items():
    try:
      box.upload(path, text)
    except Exception as e:  # noqa: BLE001 - an env error of any kind, named
      raise HarnessError(f"could not write {path} into sandbox {box.id}: {e}") from e
  env = {"HOME": f"{PRIVATE_DIR}/home", "TERM": "dumb", "NO_COLOR": "1", "CI": "1",
         **harness.environment(base_url, model, limits)}
  # The CLIs' folder goes in front of the sandbox's own PATH (a task image's puts its Python
  # environment first): the commands the harness runs see the task's tools.
  command = (f"export PATH={shlex.quote(bin_dir)}:\"${{PATH:-/usr/local/bin:/usr/bin:/bin}}\" && "
             f"mkdir -p {PRIVATE_DIR}/home && " + harness.command(program, task, workdir, limits))
  started = time.monotonic()
  result = box.exec(command, env=env, timeout=limits.timeout_s,
                    max_output_bytes=_LOG_LIMIT_BYTES)
  wall_s = time.monotonic() - started
  output = (result.stdout or "") + (("\n[stderr]\n" + result.stderr) if result.stderr else "")
  timed_out = bool(result.timed_out)
  exit_code = 124 if timed_out else (result.exit_code if result.exit_code is not None else -1)
  patch = ""
  if diff_command:
    diff = box.exec(diff_command, timeout=300)
    patch = diff.stdout if diff.exit_code == 0 else ""
  logs = {f"{harness.name}.output.log": output}
  logs.update(_read_logs(box, harness.log_globs))
  return HarnessRun(harness.name, exit_code, timed_out, output, patch, logs, wall_s)


def _read_logs(box: Any, globs: tuple[str, ...]) -> dict[str, str]:
  """{path under PRIVATE_DIR: text} of the files matching `globs` in the sandbox."""
  listing = box.exec(f"cd {PRIVATE_DIR} && for f in {' '.join(globs)}; do "
                     "[ -f \"$f\" ] && echo \"$f\"; done; true", timeout=60)
  logs = {}
  for path in (listing.stdout or "").split("\n"):
    if path.strip():
      try:
        logs[path] = box.download(f"{PRIVATE_DIR}/{path}").decode("utf-8", "replace")
      except Exception as e:  # noqa: BLE001 - a log that cannot be read is named, not fatal
        logs[path] = f"[could not read: {e}]"
  return logs
