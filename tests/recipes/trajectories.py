"""Hand-written bash-agent trajectories whose evidence a reader can check by eye."""
from orchard_jax.harness.prompts import SUBMIT_COMMAND


def action(thought: str, command: str) -> dict:
  return {"role": "assistant", "content": f"THOUGHT: {thought}\n\n```bash\n{command}\n```"}


def observation(code: int, output: str) -> dict:
  return {"role": "user",
          "content": f"<returncode>{code}</returncode>\n<output>\n{output}</output>",
          "extra": {"returncode": code, "raw_output": output}}


def header(task: str = "Fix the bug in mod.add.") -> list[dict]:
  return [{"role": "system", "content": "You are a careful engineer."},
          {"role": "user", "content": f"<issue>\n{task}\n</issue>"}]


PATCH = ("diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
         "@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n")
EDIT = "sed -i 's/a - b/a + b/' pkg/mod.py"
REPRO = ("cat > test_repro.py <<'EOF'\nfrom pkg.mod import add\n\ndef test_add_numbers():\n"
         "    assert add(1, 2) == 3\nEOF\npython -m pytest -q test_repro.py")


def careful() -> list[dict]:
  """Reads, reproduces (fails), edits, re-runs the reproduction (passes), runs the existing
  tests (pass), removes the scratch file and submits: the textbook process.
  Steps: 0 read, 1 reproduce, 2 edit, 3 verify, 4 existing tests, 5 clean up, 6 submit."""
  return header() + [
      action("Look at the code.", "cat pkg/mod.py"),
      observation(0, "def add(a, b):\n    return a - b\n"),
      action("Reproduce the bug first.", REPRO),
      observation(1, "F\n1 failed in 0.1s\n"),
      action("The operator is wrong; fix it.", EDIT),
      observation(0, ""),
      action("Run the reproduction again.", "python -m pytest -q test_repro.py"),
      observation(0, ".\n1 passed in 0.1s\n"),
      action("Now the existing tests.", "python -m pytest -q tests"),
      observation(0, "....\n4 passed in 0.2s\n"),
      action("Remove my scratch test.", "rm test_repro.py"),
      observation(0, ""),
      action("The fix works and all tests pass; submitting.", SUBMIT_COMMAND),
      {"role": "exit", "content": PATCH, "extra": {"exit_status": "Submitted"}},
  ]


def careless() -> list[dict]:
  """Reproduces (fails), edits the wrong thing, re-runs (still fails), claims success and
  submits anyway. Steps: 0 reproduce, 1 edit, 2 verify (fails), 3 submit."""
  return header() + [
      action("Reproduce.", REPRO),
      observation(1, "F\n1 failed in 0.1s\n"),
      action("Change the sign handling.", "sed -i 's/return a/return -a/' pkg/mod.py"),
      observation(0, ""),
      action("Check it.", "python -m pytest -q test_repro.py"),
      observation(1, "F\nAssertionError\n1 failed in 0.1s\n"),
      action("Fixed; all tests pass now.", SUBMIT_COMMAND),
      {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
  ]
