"""Ctrl-C in a program using the SDK: leaving the `with` blocks deletes what they created."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from orchard_jax import env as orchard_env
from tests.env.conftest import make_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def local_service(tmp_path_factory):
  backend = orchard_env.LocalBackend(state_dir=str(tmp_path_factory.mktemp("state")))
  with orchard_env.Orchestrator(backend, config=make_config()) as service:
    yield service


def test_ctrl_c_deletes_the_sandboxes_a_client_created(local_service, tmp_path):
  script = tmp_path / "user.py"
  # A user's shell starts Python with Ctrl-C unblocked and handled by default. A child inherits
  # the signal mask and ignored signals of the process that starts it, and the full suite's
  # pytest process can carry a blocked SIGINT from an earlier test's library: reset both, or
  # the Ctrl-C below never arrives (that was this test's full-suite-only timeout).
  script.write_text(textwrap.dedent(f"""
      import signal, sys, time
      signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
      signal.signal(signal.SIGINT, signal.default_int_handler)
      from orchard_jax.env import SandboxClient
      with SandboxClient({local_service.url!r}, {local_service.api_key!r}) as env:
        kept = env.create_sandbox()            # owned by the client
        with env.create_sandbox() as inner:   # owned by its own block too
          print(kept.id, inner.id, flush=True)
          inner.exec("sleep 600", timeout=900)   # interrupted here
      """))
  process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT), stderr=subprocess.PIPE)
  ids = process.stdout.readline().split()
  assert len(ids) == 2
  time.sleep(0.5)
  process.send_signal(signal.SIGINT)
  _, err = process.communicate(timeout=60)
  assert process.returncode != 0 and "KeyboardInterrupt" in err
  with orchard_env.SandboxClient(local_service.url, local_service.api_key) as client:
    for sandbox_id in ids:
      with pytest.raises(orchard_env.SandboxNotFound, match="deleted by a client"):
        client.sandbox(sandbox_id)
