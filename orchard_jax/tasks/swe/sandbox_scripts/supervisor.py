"""Runs one test command for the SWE evaluator and prints one signed report.

Standard library only, Python 3.5 syntax: it runs inside arbitrary task images, started as
`python -I -S supervisor.py ...` so that nothing in the workspace (PYTHONPATH, a .pth or
sitecustomize reached through an editable install) runs in it.

    python -I -S supervisor.py --key-file K --run-id R --timeout S [--records] -- ARGV...

1. Reads the run's secret key from K and deletes the file, before any code under test runs,
   then marks itself non-dumpable, so a process of the same user can read neither its memory
   nor its open files through /proc.
2. Prints `ORCHARD_GRADER_START <run id> <mac>`.
3. Starts ARGV in a session of its own with stdout and stderr going into a pipe it copies to its
   own stdout. With --records it also opens a record pipe: the child finds the write end's
   number in ORCHARD_REPORT_FD (and its PYTHONPATH in ORCHARD_PYTHONPATH, so the interpreter
   does not put the workspace on sys.path before the launcher has imported the runner).
4. When the child exits, or at the time limit, kills the child's process group (the helpers it
   forked) and reads what is left in the pipes for at most DRAIN_S seconds; a process that left
   the group and holds a pipe open cannot delay the report longer than that.
5. Prints `ORCHARD_GRADER_REPORT <payload> <mac>` and exits 0. The payload is base64 of a JSON
   object: run_id, exit_code (negative: killed by that signal), timed_out, records (base64 of
   the zlib-compressed record stream), records_truncated, non_dumpable, seconds. The mac is
   HMAC-SHA256(key, label + b" " + payload) as hex, label b"start" or b"report".
   The test output is copied to stdout as it comes up to LOG_KEEP bytes; past that only its
   last LOG_KEEP bytes follow, after a line saying how many were left out.

Code under test can print anything, write into the record pipe, kill this process or write into
the sandbox's output pipe through another process's /proc/PID/fd: none of it yields a report
line whose mac checks without the key, which never left this process.
"""
import argparse
import base64
import hashlib
import hmac
import json
import os
import select
import signal
import subprocess
import sys
import time
import zlib

START = "ORCHARD_GRADER_START"
REPORT = "ORCHARD_GRADER_REPORT"
MAX_RECORD_BYTES = 64 << 20
DRAIN_S = 2.0
# The test output copied to stdout: its first and last LOG_KEEP bytes, so that with a report of
# up to ~480 KiB the whole stdout stays under the 1 MiB an exec keeps by default (its head and
# tail halves), and the report line, last, is never cut.
LOG_KEEP = 256 << 10


def sign(key, label, payload):
  """HMAC-SHA256 of `label + b" " + payload` under `key`, as hex."""
  return hmac.new(key, label + b" " + payload, hashlib.sha256).hexdigest()


def _write_all(fd, data):
  while data:
    try:
      written = os.write(fd, data)
    except InterruptedError:
      continue
    except OSError:
      return  # nobody reads our stdout any more; the report is lost either way
    data = data[written:]


def _non_dumpable():
  try:
    import ctypes
    return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
  except Exception:  # noqa: BLE001 - no ctypes or no prctl: report it, run anyway
    return False


def _kill_group(pgid):
  try:
    os.killpg(pgid, signal.SIGKILL)
  except OSError:
    pass


class _Log:
  """Copies the test output to stdout: the first `keep` bytes as they come, then the last
  `keep` bytes at close (with a note of how many bytes were left out between)."""

  def __init__(self, keep):
    self.keep, self.written, self.tail, self.dropped = keep, 0, bytearray(), 0

  def add(self, data):
    if self.written < self.keep:
      head = data[:self.keep - self.written]
      _write_all(1, head)
      self.written += len(head)
      data = data[len(head):]
    self.tail += data
    if len(self.tail) > self.keep:
      self.dropped += len(self.tail) - self.keep
      del self.tail[:len(self.tail) - self.keep]

  def close(self):
    if self.dropped:
      _write_all(1, "\n[... supervisor: {} bytes of test output left out ...]\n".format(
          self.dropped).encode())
    _write_all(1, bytes(self.tail))


def run(argv, key, run_id, timeout_s, records):
  """Runs argv; returns the report dict (see the module docstring)."""
  env = dict(os.environ)
  pass_fds = ()
  read_records = write_records = None
  if records:
    read_records, write_records = os.pipe()
    env["ORCHARD_REPORT_FD"] = str(write_records)
    if "PYTHONPATH" in env:
      env["ORCHARD_PYTHONPATH"] = env.pop("PYTHONPATH")
    pass_fds = (write_records,)
  started = time.monotonic()
  try:
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env, pass_fds=pass_fds,
                             start_new_session=True)
  except OSError as error:
    message = "supervisor: could not start {}: {}\n".format(argv[0], error)
    _write_all(1, message.encode())
    return {"run_id": run_id, "exit_code": 127, "timed_out": False, "records": "",
            "records_truncated": False, "start_error": str(error)}
  finally:
    if write_records is not None:
      os.close(write_records)
  streams = {child.stdout.fileno(): "log"}
  if read_records is not None:
    streams[read_records] = "records"
  for fd in streams:
    os.set_blocking(fd, False)
  buffer = bytearray()
  log = _Log(LOG_KEEP)
  truncated = False
  timed_out = False
  ended = None
  while streams:
    now = time.monotonic()
    if ended is None and child.poll() is not None:
      ended = now
      _kill_group(child.pid)
    if ended is None and now - started > timeout_s:
      timed_out = True
      _kill_group(child.pid)
      child.wait()
      ended = now
    if ended is not None and now - ended > DRAIN_S:
      break
    ready = select.select(list(streams), [], [], 0.1)[0]
    for fd in ready:
      try:
        data = os.read(fd, 1 << 16)
      except BlockingIOError:
        continue
      except OSError:
        data = b""
      if not data:
        del streams[fd]
      elif streams[fd] == "log":
        log.add(data)
      elif len(buffer) + len(data) <= MAX_RECORD_BYTES:
        buffer += data
      else:
        truncated = True
  if child.poll() is None:
    _kill_group(child.pid)
  child.wait()
  log.close()
  return {"run_id": run_id, "exit_code": child.returncode, "timed_out": timed_out,
          "records": base64.b64encode(zlib.compress(bytes(buffer), 6)).decode("ascii"),
          "records_truncated": truncated, "seconds": round(time.monotonic() - started, 3)}


def main(arguments):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--key-file", required=True)
  parser.add_argument("--run-id", required=True)
  parser.add_argument("--timeout", type=float, required=True)
  parser.add_argument("--records", action="store_true")
  parser.add_argument("argv", nargs=argparse.REMAINDER)
  args = parser.parse_args(arguments)
  argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
  with open(args.key_file) as f:
    key = bytes.fromhex(f.read().strip())
  os.unlink(args.key_file)
  non_dumpable = _non_dumpable()
  run_id = args.run_id.encode("ascii")
  _write_all(1, "{} {} {}\n".format(START, args.run_id, sign(key, b"start", run_id)).encode())
  report = run(argv, key, args.run_id, args.timeout, args.records)
  report["non_dumpable"] = non_dumpable
  payload = base64.b64encode(json.dumps(report, sort_keys=True).encode("utf-8"))
  line = "\n{} {} {}\n".format(REPORT, payload.decode("ascii"), sign(key, b"report", payload))
  _write_all(1, line.encode("ascii"))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
