"""Scripts the evaluator copies into a task sandbox to run the tests (see `trusted_runner`).

They run inside arbitrary task images, so they use the standard library only (the launcher also
pytest, from the image's environment) and the Python syntax of 3.5 (supervisor) and 3.6
(launcher), the oldest interpreters SWE-bench's images carry:

  supervisor.py      holds the per-run key, runs the test command in a session of its own under
                     a time limit, collects the structured records, and prints one signed report.
  pytest_launcher.py imports pytest from the image's environment before any workspace folder is
                     on sys.path, then runs it with the recording plugin.
"""
import os

DIRECTORY = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ("supervisor.py", "pytest_launcher.py")


def read(name: str) -> bytes:
  """The bytes of one script (a name in SCRIPTS)."""
  if name not in SCRIPTS:
    raise KeyError(f"no sandbox script {name!r}; expected one of {SCRIPTS}")
  with open(os.path.join(DIRECTORY, name), "rb") as f:
    return f.read()
