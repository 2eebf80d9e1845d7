"""`python -m orchard_jax.harness install codex claude_code` (see harness/install.py)."""
import sys

from orchard_jax.harness.install import main

if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
