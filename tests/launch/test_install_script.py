"""launch/install.sh refuses a Python it cannot install into before installing anything, with
one line saying what to do (a new user on plain Debian has no `python`, and Debian's python3
refuses pip installs). The apt and npm steps are skipped: each case stops before pip runs."""
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _install(python: str):
  env = dict(os.environ, PYTHON=python, ORCHARD_INSTALL_SKIP="apt,npm")
  env.pop("PIP_BREAK_SYSTEM_PACKAGES", None)
  return subprocess.run(["bash", os.path.join(ROOT, "launch", "install.sh")], env=env,
                        capture_output=True, text=True, timeout=120)


def test_no_python_is_one_line_naming_the_virtual_environment_to_make(tmp_path):
  result = _install(str(tmp_path / "no_python"))
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "on PATH: orchard_jax needs Python >= 3.11" in lines[0]
  assert "python3 -m venv .venv" in lines[0] and "Python packages" not in result.stdout


def test_an_old_python_is_refused_with_its_version(tmp_path):
  # Stands in for a Python 3.8 interpreter, which this machine does not have: it answers the
  # script's version check as 3.8 would.
  old = tmp_path / "python3.8"
  old.write_text("#!/bin/sh\ncase \"$2\" in *version_info*) exit 1;; *python_version*) "
                 "echo 3.8.18;; esac\n")
  old.chmod(0o755)
  result = _install(str(old))
  assert result.returncode == 1
  assert "is Python 3.8.18; orchard_jax needs >= 3.11" in result.stderr


def test_the_systems_python_is_refused_and_a_virtual_environment_from_it_is_not(tmp_path):
  system = "/usr/bin/python3"
  venv = tmp_path / "venv"          # no pip inside: the script passes its checks, then pip fails
  subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
  result = _install(str(venv / "bin" / "python"))
  assert f"Python packages (requirements.txt) into {venv}" in result.stdout, result.stderr
  assert "refuses pip installs" not in result.stderr
  code = ("import os, sysconfig; print(os.path.isfile(os.path.join("
          "sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))")
  managed = subprocess.run([system, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip() == "True"
  if managed:      # Debian 12+, Ubuntu 23.04+ (elsewhere the script would install into it)
    result = _install(system)
    assert result.returncode == 1 and "Python packages" not in result.stdout
    assert "is the system's Python, which refuses pip installs (PEP 668)" in result.stderr
