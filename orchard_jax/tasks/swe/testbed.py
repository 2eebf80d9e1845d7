"""Shell snippets that bring a sandbox's workspace to an instance's state, and the sandbox seam.

A package image's workspace seed is a git repository holding the clean sdist and one root
commit per instance. `setup_script` checks out the instance's `base_commit`, then replaces the
repository with a fresh one whose single commit is that same tree: the agent sees one
"Initial commit" and no other instance (no `git log --all` leak of the fix), and the commit
hash equals `base_commit` again because the tree, identity, date and message are fixed, which
the script checks. Images that are already at their base commit (SWE-bench's per-instance
container images) are only checked.

`Sandbox` is the small surface the evaluator, the harness and the replay expert use: run a
bash command with a time limit, write a file. `open_sandbox` adapts the Orchard Env SDK to it.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import shlex
from typing import Iterator, Protocol

from orchard_jax.tasks.swe.environment import COMMIT_MESSAGE, GIT_IDENTITY, IGNORED
from orchard_jax.tasks.swe.instance import SWEInstance

SETUP_FAILED_EXIT = 3


@dataclasses.dataclass
class CommandResult:
  """The outcome of one command: exit code (124 = killed at its time limit), combined output;
  `failed` when the sandbox itself failed (the command's result is unknown)."""
  exit_code: int
  output: str
  timed_out: bool = False
  failed: bool = False


class Sandbox(Protocol):
  """What a task needs from a sandbox (see `open_sandbox`)."""

  def run(self, command: str, *, timeout_s: float) -> CommandResult:
    """Runs `command` with bash in the workspace; stdout and stderr interleaved."""

  def write_file(self, path: str, data: bytes) -> None:
    """Writes `data` to the absolute `path` inside the sandbox (parents created)."""


def setup_script(instance: SWEInstance, *, workdir: str = "/testbed",
                 hide_history: bool = True) -> str:
  """Bash that puts `workdir` at the instance's base_commit (see the module docstring).

  Exits SETUP_FAILED_EXIT with a message when the commit is missing or the rebuilt history does
  not reproduce `base_commit`.
  """
  base = shlex.quote(instance.base_commit)
  identity = " ".join(f"{k}={shlex.quote(v)}" for k, v in GIT_IDENTITY.items())
  excludes = "\\n".join(IGNORED)
  lines = [
      "set -u",
      f"cd {shlex.quote(workdir)} || exit {SETUP_FAILED_EXIT}",
      f"if [ \"$(git rev-parse HEAD 2>/dev/null)\" != {base} ]; then",
      f"  git -c advice.detachedHead=false checkout -q -f {base} 2>&1 || "
      f"{{ echo 'base_commit {instance.base_commit} is not in the workspace repository'; "
      f"exit {SETUP_FAILED_EXIT}; }}",
      "  git clean -fdxq",
      "fi",
  ]
  if hide_history:
    lines += [
        "rm -rf .git && git init -q -b main . >/dev/null",
        f"printf '{excludes}\\n' >> .git/info/exclude",
        "git add -A",
        f"env {identity} git -c commit.gpgsign=false commit -q -m {shlex.quote(COMMIT_MESSAGE)}",
        f"if [ \"$(git rev-parse HEAD)\" != {base} ]; then echo \"rebuilt workspace is at "
        f"$(git rev-parse HEAD), expected {instance.base_commit}\"; exit {SETUP_FAILED_EXIT}; fi",
    ]
  lines.append("echo ORCHARD_WORKSPACE_READY")
  return "\n".join(lines) + "\n"


def write_file_via_shell(path: str, data: bytes) -> str:
  """A command that writes `data` to `path` (for sandboxes with no file API)."""
  encoded = base64.b64encode(data).decode()
  return (f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')} && "
          f"printf %s {shlex.quote(encoded)} | base64 -d > {shlex.quote(path)}")


class EnvSandbox:
  """`Sandbox` over an Orchard Env SDK sandbox (`orchard_jax.env.client.Sandbox`)."""

  def __init__(self, box):
    self._box = box

  @property
  def box(self):
    """The SDK sandbox handle."""
    return self._box

  def run(self, command: str, *, timeout_s: float) -> CommandResult:
    result = self._box.exec(command, timeout=timeout_s, merge_stderr=True)
    timed_out = bool(result.timed_out)
    output = result.stdout + result.stderr
    failed = not timed_out and (result.status != "finished" or result.exit_code is None)
    if failed:
      output += f"\n[sandbox: {result.status}: {result.error or 'no exit status'}]"
    code = 124 if timed_out else (-1 if failed else int(result.exit_code))
    return CommandResult(code, output, timed_out, failed)

  def write_file(self, path: str, data: bytes) -> None:
    self._box.upload(path, data)


@contextlib.contextmanager
def open_sandbox(client, image: str, **create_kwargs) -> Iterator[EnvSandbox]:
  """Creates a sandbox from `image` with an Orchard Env SDK client; deletes it on exit."""
  with client.create_sandbox(image=image, **create_kwargs) as box:
    yield EnvSandbox(box)
