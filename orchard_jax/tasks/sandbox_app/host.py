"""The host side: a rollout's world whose processes run in its own Orchard Env sandbox.

`SandboxApp` owns the sandbox's lifecycle: entering creates the sandbox (with the subclass's
`sandbox_kwargs`), runs the subclass's `_start` (which calls `start_app` to copy the zip
application in and run its start command, then publishes ports), and records `startup_s`;
leaving, an error while starting included, deletes the sandbox and every process in it.
"""
from __future__ import annotations

import json
import time
from typing import Optional, Sequence

import httpx


class SandboxApp:
  """Base class of a world living in one sandbox (ClawWorld, BrowserSandbox).

  Subclasses set `error` (the exception raised when the world cannot start) and `noun` (how
  messages name the world, e.g. "the browser"), fill `sandbox_kwargs` (create_sandbox's
  arguments) in their __init__, and implement `_start`.

  Attributes:
    env_client: the Orchard Env `SandboxClient`.
    box: the sandbox while the world runs, else None.
    startup_s: seconds from creating the sandbox to a started world.
  """

  error: type = RuntimeError
  noun: str = "the application"

  def __init__(self, env_client, sandbox_kwargs: dict):
    self.env_client = env_client
    self.sandbox_kwargs = dict(sandbox_kwargs)
    self.box = None
    self.startup_s = 0.0
    self._http: Optional[httpx.Client] = None

  def __enter__(self):
    t0 = time.perf_counter()
    try:
      self.box = self.env_client.create_sandbox(**self.sandbox_kwargs)
    except Exception as e:  # noqa: BLE001 - any SDK failure becomes one `error`
      raise self.error(f"could not create {_possessive(self.noun)} sandbox: "
                       f"{type(e).__name__}: {e}") from e
    try:
      self._start()
    except BaseException:
      self.close()
      raise
    self.startup_s = time.perf_counter() - t0
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Deletes the sandbox, and with it every process of the world."""
    if self._http is not None:
      self._http.close()
      self._http = None
    if self.box is not None:
      box, self.box = self.box, None
      box.delete()

  def _start(self) -> None:
    raise NotImplementedError

  def start_app(self, path: str, app: bytes, command: Sequence[str], config: dict, *,
                timeout_s: float) -> dict:
    """Copies the zip application `app` to `path` in the sandbox, runs `command` with `config`
    as JSON on its standard input, and returns the start command's answer (its last line:
    {"ready": true, ...}; see supervisor.start).

    Raises:
      error: the command failed or did not answer ready (the message has its reason).
    """
    self.box.upload(path, app)
    result = self.box.exec(list(command), stdin=json.dumps(config), timeout=timeout_s)
    try:
      answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
      answer = {}
    if result.exit_code != 0 or not isinstance(answer, dict) or not answer.get("ready"):
      answer = answer if isinstance(answer, dict) else {}
      reason = answer.get("error") or (result.stderr or result.stdout).strip()[-2000:] or \
          f"status {result.status}, exit {result.exit_code}"
      raise self.error(f"{self.noun} did not start in sandbox {self.box.id}: {reason}")
    return answer


def _possessive(noun: str) -> str:
  return noun + ("'" if noun.endswith("s") else "'s")
