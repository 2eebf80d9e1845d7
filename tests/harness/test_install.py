"""The harness installer's bookkeeping and the SWE domain's harness choice (no npm here: the
real install is launch/install.sh's, and tests/harness/test_cli_harness.py runs what it put
in place)."""
import json
import os

import pytest

from orchard_jax.harness import HarnessError, install


def _fake_package(prefix, package, version):
  folder = os.path.join(prefix, "node_modules", *package.split("/"))
  os.makedirs(folder)
  with open(os.path.join(folder, "package.json"), "w") as f:
    json.dump({"name": package, "version": version}, f)


def test_executable_names_the_install_command_when_missing(tmp_path):
  with pytest.raises(HarnessError, match="python -m orchard_jax.harness install codex"):
    install.executable("codex", str(tmp_path))
  _fake_package(str(tmp_path), "@openai/codex", "0.0.1")
  with pytest.raises(HarnessError, match="at 0.0.1, not the pinned"):
    install.executable("codex", str(tmp_path))
  package, version, program = install.HARNESS_PACKAGES["codex"]
  os.rename(os.path.join(tmp_path, "node_modules", "@openai", "codex"), tmp_path / "old")
  _fake_package(str(tmp_path), package, version)
  assert install.executable("codex", str(tmp_path)) == os.path.join(
    tmp_path, "node_modules", ".bin", program)


def test_unknown_harness_and_default_folder(monkeypatch, tmp_path):
  with pytest.raises(HarnessError, match="unknown harness 'aider'"):
    install.install(["aider"], str(tmp_path))
  monkeypatch.setenv("ORCHARD_HARNESS_DIR", str(tmp_path / "h"))
  assert install.harness_dir() == str(tmp_path / "h")
  monkeypatch.delenv("ORCHARD_HARNESS_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  assert install.harness_dir() == str(tmp_path / "cache" / "orchard_jax" / "harness")


def test_install_is_a_no_op_when_the_pinned_versions_are_there(tmp_path):
  for package, version, _ in install.HARNESS_PACKAGES.values():
    _fake_package(str(tmp_path), package, version)
  _fake_package(str(tmp_path), *install.NODE_PACKAGE)
  assert install.install(["codex", "claude_code"], str(tmp_path), npm="no-such-npm") == []
  with pytest.raises(HarnessError, match="npm is not installed"):
    install.install(["codex"], str(tmp_path / "empty"), npm="no-such-npm")


def test_swe_harness_choice_is_checked_before_any_work(tmp_path, monkeypatch, capsys):
  from experiments import swe_rpr
  from orchard_jax.recipes import ConfigError
  from orchard_jax.recipes.swe import harness as swe_harness
  config = swe_rpr.get_config("tiny")
  assert config.agent.harness == "bash"
  swe_harness.check_harness_config(config)              # the default needs nothing
  config.agent.harness = "aider"
  with pytest.raises(ConfigError, match="expected one of bash, mini_swe_agent, codex"):
    swe_harness.check_harness_config(config)
  monkeypatch.setenv("ORCHARD_HARNESS_DIR", str(tmp_path))   # nothing installed there
  config.agent.harness = "claude_code"
  with pytest.raises(ConfigError, match="install claude_code"):
    swe_harness.check_harness_config(config)
  package, version, _ = install.HARNESS_PACKAGES["claude_code"]
  _fake_package(str(tmp_path), package, version)
  swe_harness.check_harness_config(config)
  assert config.engine.max_seq_len == config.rl.seq_len == swe_harness.CLI_CONTEXT_TOKENS
  out = capsys.readouterr().out
  assert "raised from 4096 to 24576" in out
  assert config.rl.iterations == 1 and "rl.iterations set from 6 to 1" in out   # cli_overrides
  assert swe_harness.proxy_origin("http://127.0.0.1:812/sessions/a/v1") == "http://127.0.0.1:812"


def test_judge_evidence_reads_external_harness_shell_calls():
  """The judge's evidence reads the shell commands of Codex's exec_command and Claude Code's
  Bash tool calls (their observations are the tool messages), as it reads the bash agent's
  blocks."""
  from orchard_jax.recipes.swe.evidence import read_steps

  def call(name, arguments):
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
             "function": {"name": name, "arguments": arguments}}]}

  steps = read_steps([
    {"role": "user", "content": "fix it"},
    call("exec_command", '{"cmd": "sed -i s/a/b/ pkg/core.py"}'),
    {"role": "tool", "tool_call_id": "c", "content": ""},
    call("Bash", '{"command": "python -m pytest -q tests", "description": "run tests"}'),
    {"role": "tool", "tool_call_id": "c", "content": "3 passed in 0.1s"},
    call("exec_command", '{"cmd": ["git", "status"]}'),
    call("Read", '{"file_path": "pkg/core.py"}'),
    call("exec_command", "not json")])
  assert [s.command for s in steps] == ["sed -i s/a/b/ pkg/core.py", "python -m pytest -q tests",
                                        "git status", "", ""]
  assert steps[0].edits_source and steps[0].written_files == ("pkg/core.py",)
  assert steps[1].runs_tests and steps[1].output == "3 passed in 0.1s"
  assert [s.format_error for s in steps] == [False, False, False, True, True]
