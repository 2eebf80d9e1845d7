"""Installs the external harness CLIs from npm at pinned versions, into a folder sandboxes read.

Codex CLI (`@openai/codex`) and Claude Code (`@anthropic-ai/claude-code`) run inside each task's
sandbox, so they are installed once on the host into one npm prefix, which the local sandbox
backend shows read-only in every sandbox at the same path (`LocalBackend(shared_paths=...)`).
Node.js comes from npm as well (the `node` package, pinned): Claude Code declares Node >= 22
and Codex's launcher is a Node script, and a machine's own Node may be older or absent.
Both CLIs ship their native programs as per-platform npm packages, installed alongside.

The prefix is `$ORCHARD_HARNESS_DIR`, else `<orchard_jax cache>/harness`
(`~/.cache/orchard_jax/harness`); its `bin/` folder (`node_modules/.bin`) holds `codex`,
`claude` and `node`.

  python -m orchard_jax.harness install codex claude_code

Nothing is installed when the pinned versions are already there.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Iterable, Optional, Sequence

from orchard_jax.harness.errors import HarnessError

# name -> (npm package, pinned version, executable in node_modules/.bin)
HARNESS_PACKAGES = {
  "codex": ("@openai/codex", "0.171.0", "codex"),
  "claude_code": ("@anthropic-ai/claude-code", "2.1.332", "claude"),
}
NODE_PACKAGE = ("node", "22.23.3")


def harness_dir(path: Optional[str] = None) -> str:
  """The npm prefix the CLIs are installed into (module docstring), absolute."""
  if path:
    return os.path.abspath(path)
  if os.environ.get("ORCHARD_HARNESS_DIR"):
    return os.path.abspath(os.environ["ORCHARD_HARNESS_DIR"])
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "orchard_jax", "harness")


def bin_dir(path: Optional[str] = None) -> str:
  """The folder of the installed executables (codex, claude, node)."""
  return os.path.join(harness_dir(path), "node_modules", ".bin")


def installed_version(package: str, path: Optional[str] = None) -> Optional[str]:
  """The version of `package` installed in the prefix, or None."""
  manifest = os.path.join(harness_dir(path), "node_modules", *package.split("/"), "package.json")
  try:
    with open(manifest) as f:
      return json.load(f).get("version")
  except (OSError, ValueError):
    return None


def executable(name: str, path: Optional[str] = None) -> str:
  """Path of harness `name`'s executable.

  Raises:
    HarnessError: unknown name, or not installed at its pinned version (with the command
      that installs it).
  """
  package, version, program = _spec(name)
  found = installed_version(package, path)
  if found != version:
    state = "not installed" if found is None else f"at {found}, not the pinned {version}"
    raise HarnessError(
      f"harness {name!r} ({package}) is {state} in {harness_dir(path)}; install it with "
      f"`python -m orchard_jax.harness install {name}`")
  return os.path.join(bin_dir(path), program)


def install(names: Iterable[str], path: Optional[str] = None, *,
            npm: str = "npm", quiet: bool = False) -> list[str]:
  """npm-installs the named harnesses (and Node.js) at their pinned versions into the prefix.

  Returns the package specs that were installed ([] when all were already there).

  Raises:
    HarnessError: an unknown name, npm missing, or npm failing (its output's tail).
  """
  names = list(names)
  for name in names:
    _spec(name)
  prefix = harness_dir(path)
  wanted = [(package, version) for package, version, _ in
            (HARNESS_PACKAGES[n] for n in names)] + [NODE_PACKAGE]
  specs = [f"{p}@{v}" for p, v in wanted if installed_version(p, prefix) != v]
  if not specs:
    return []
  if shutil.which(npm) is None:
    raise HarnessError(f"npm is not installed; it installs the harness CLIs ({', '.join(specs)})."
                       " Install Node.js and npm (Debian: `apt-get install npm`)")
  os.makedirs(prefix, exist_ok=True)
  # The pinned versions are exact; --no-save keeps no package.json edits to merge between
  # installs of different harnesses; the prefix's folders stay readable by the sandbox user.
  argv = [npm, "install", "--prefix", prefix, "--no-audit", "--no-fund", "--no-save",
          "--omit=dev", "--loglevel=error", *specs]
  old_umask = os.umask(0o022)
  try:
    proc = subprocess.run(argv, capture_output=True, text=True)
  finally:
    os.umask(old_umask)
  if proc.returncode != 0:
    raise HarnessError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): "
                       f"{(proc.stdout + proc.stderr)[-2000:]}")
  for package, version in wanted:
    if installed_version(package, prefix) != version:
      raise HarnessError(f"npm finished but {package}@{version} is not in {prefix}")
  if not quiet:
    print(f"installed {', '.join(specs)} into {prefix}")
  return specs


def _spec(name: str) -> tuple[str, str, str]:
  try:
    return HARNESS_PACKAGES[name]
  except KeyError:
    raise HarnessError(f"unknown harness {name!r}; expected one of "
                       f"{sorted(HARNESS_PACKAGES)}") from None


def main(argv: Sequence[str]) -> int:
  """`python -m orchard_jax.harness install NAME...` (see the module docstring)."""
  import argparse
  parser = argparse.ArgumentParser(prog="python -m orchard_jax.harness",
                                   description="Install the external harness CLIs from npm.")
  commands = parser.add_subparsers(dest="command", required=True)
  cmd = commands.add_parser("install", help="install harness CLIs at their pinned versions")
  cmd.add_argument("names", nargs="+", choices=sorted(HARNESS_PACKAGES))
  cmd.add_argument("--dir", default=None, help="npm prefix (default: the cache folder's harness/)")
  where = commands.add_parser("where", help="print the folder of the installed executables")
  where.add_argument("--dir", default=None)
  args = parser.parse_args(list(argv))
  if args.command == "where":
    print(bin_dir(args.dir))
    return 0
  try:
    done = install(args.names, args.dir)
  except HarnessError as e:
    print(f"error: {e}")
    return 1
  if not done:
    print(f"already installed in {harness_dir(args.dir)}: "
          + ", ".join(f"{HARNESS_PACKAGES[n][0]}@{HARNESS_PACKAGES[n][1]}" for n in args.names))
  return 0
