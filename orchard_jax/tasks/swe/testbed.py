"""Shell snippets that bring a sandbox's workspace to an instance's state, and the sandbox seam.

The workspace is the repository at the instance's real `base_commit`, with its history hidden
from the agent (as SWE-bench's harness hides the fix) but the commit verifiable:
`git rev-parse HEAD` prints `base_commit` itself. A task image's workspace seed
(`task_images.py`) is already that: a shallow repository whose one commit is `base_commit`, so
`setup_script` only checks it. An image whose repository has more (SWE-bench's per-instance
container images keep the whole clone, whose branches and tags reach the fixing commit) is
brought to the same state: checked out at `base_commit`, then replaced by a shallow copy of that
one commit, so no later commit, tag, stash or reflog survives.

`Sandbox` is the small surface the evaluator, the harness and the replay expert use: run a
bash command with a time limit, write a file. `open_sandbox` adapts the Orchard Env SDK to it.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import shlex
from typing import Iterator, Protocol

from orchard_jax.tasks.swe.environment import IGNORED
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

  Exits SETUP_FAILED_EXIT with a message when the commit is missing, the workspace is not a
  repository, or the result is not exactly `base_commit` with one reachable commit.
  """
  base = shlex.quote(instance.base_commit)
  excludes = "\\n".join(IGNORED)
  fail = f"exit {SETUP_FAILED_EXIT}"
  lines = [
      "set -u",
      f"cd {shlex.quote(workdir)} || {{ echo 'no workspace at {workdir}'; {fail}; }}",
      f"git rev-parse --git-dir >/dev/null 2>&1 || {{ echo '{workdir} is not a git repository'; "
      f"{fail}; }}",
      f"if [ \"$(git rev-parse -q --verify 'HEAD^{{commit}}' 2>/dev/null)\" != {base} ]; then",
      f"  git cat-file -e {base}'^{{commit}}' 2>/dev/null || {{ echo 'base_commit "
      f"{instance.base_commit} is not in the workspace repository'; {fail}; }}",
      f"  git -c advice.detachedHead=false checkout -q -f {base} || {fail}",
      "  git clean -fdxq",
      "fi",
  ]
  if hide_history:
    # Anything but the one commit (parents, other refs, stashes, reflogs): keep a shallow copy.
    lines += [
        "if [ \"$(git rev-list --all --reflog --count 2>/dev/null)\" != 1 ] || "
        "[ \"$(git for-each-ref | wc -l)\" != 1 ]; then",
        "  tmp=$(mktemp -d) && git init -q \"$tmp\" && "
        f"git -C \"$tmp\" fetch -q --depth=1 --no-tags \"file://$PWD\" {base} || {fail}",
        "  rm -rf .git && mv \"$tmp/.git\" .git && rm -rf \"$tmp\"",
        f"  git update-ref refs/heads/main {base} && git symbolic-ref HEAD refs/heads/main",
        "  rm -f .git/FETCH_HEAD && git reset -q",
        f"  printf '{excludes}\\n' >> .git/info/exclude",
        "fi",
        f"if [ \"$(git rev-list --all --reflog --count)\" != 1 ]; then echo 'workspace history "
        f"still has more than base_commit'; {fail}; fi",
    ]
  lines += [
      f"if [ \"$(git rev-parse HEAD)\" != {base} ]; then echo \"workspace is at "
      f"$(git rev-parse HEAD), expected {instance.base_commit}\"; {fail}; fi",
      "echo ORCHARD_WORKSPACE_READY",
  ]
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
