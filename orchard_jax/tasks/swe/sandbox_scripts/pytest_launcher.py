"""Runs pytest for the SWE evaluator so that nothing in the workspace replaces or reconfigures it.

Started by supervisor.py as `python -s -S pytest_launcher.py --workdir W --mode module|script
-- PYTEST_ARGS...` with the record pipe's number in ORCHARD_REPORT_FD and the test run's
PYTHONPATH in ORCHARD_PYTHONPATH. Python 3.6 syntax, standard library plus pytest.

1. `site` runs here (it was held back by -S) with sitecustomize and usercustomize blocked; a
   sitecustomize outside the workspace (the image's own) is then imported as usual. A
   sitecustomize in the workspace, reached through an editable install's .pth, never runs.
2. pytest, its built-in plugins and the libraries it imports at start are imported with every
   workspace folder off sys.path: a `pytest.py`, `pytest/`, `_pytest/` or `pluggy.py` in the
   workspace cannot stand in for them. (A package's submodules load through the package's
   __path__, so nothing later can either.)
3. sys.path is then what the original command would have had (the working folder first for
   `python -m pytest`, the PYTHONPATH entries, the environment's folders) and PYTHONPATH is put
   back for the tests' own subprocesses.
4. pytest.main runs with the recording plugin, which writes one JSON line per event to the
   record pipe: start; collect_error; collected (count, and the canary's node id); test (node
   id, phase, outcome, xfail, the file of the test function that ran when it is not the test's
   own, and where an imperative xfail was raised; set-up and tear-down only when they did not
   pass); finish (exit status, stopped early); exit (the launcher's exit code).
   The canary is a test added after every other collection hook, into the last test module, that
   must fail: a run in which it passes, or silently does not run, was tampered with.
"""
import argparse
import json
import os
import sys


def _inside(path, root):
  real = os.path.realpath(path or os.getcwd())
  return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _site_without_workspace_customize(workdir):
  import importlib.machinery
  import importlib.util
  names = ("sitecustomize", "usercustomize")
  for name in names:
    sys.modules[name] = None  # `import sitecustomize` in site.main() is a silent miss
  import site
  site.main()
  for name in names:
    if sys.modules.get(name, 0) is None:
      del sys.modules[name]
  trusted = [p for p in sys.path if not _inside(p, workdir)]
  wanted = ["sitecustomize"] + (["usercustomize"] if getattr(site, "ENABLE_USER_SITE", False)
                                else [])
  for name in wanted:
    spec = importlib.machinery.PathFinder.find_spec(name, trusted)
    if spec is not None and spec.loader is not None:
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module
      try:
        spec.loader.exec_module(module)
      except Exception as error:  # noqa: BLE001 - as site does: report and go on
        sys.stderr.write("Error in {}: {!r}\n".format(name, error))


def _import_runner():
  import importlib
  import pytest  # noqa: F401
  import _pytest.config
  names = list(getattr(_pytest.config, "essential_plugins", ()))
  names += list(getattr(_pytest.config, "default_plugins", ()))
  for name in names + ["_pytest.outcomes", "_pytest.python", "_pytest.runner", "_pytest.reports"]:
    try:
      importlib.import_module(name if name.startswith("_pytest.") else "_pytest." + name)
    except Exception:  # noqa: BLE001 - a plugin this pytest lacks
      pass
  for name in ("pluggy", "iniconfig", "packaging.version", "tomllib", "tomli", "exceptiongroup",
               "colorama", "pygments"):
    try:
      importlib.import_module(name)
    except Exception:  # noqa: BLE001 - optional
      pass


def make_recorder(fd, workdir):
  """The pytest plugin that writes records to file descriptor `fd` (module docstring, step 4)."""
  import pytest
  try:
    from _pytest.outcomes import XFailed
  except ImportError:  # very old pytest
    XFailed = getattr(getattr(pytest, "xfail", None), "Exception", ())
  write = os.write           # bound now: code under test rebinding os.write later changes nothing
  dumps = json.dumps
  runner_dirs = tuple(os.path.dirname(os.path.realpath(m.__file__)) for m in
                      (sys.modules.get("_pytest"), sys.modules.get("pluggy")) if m is not None)

  def relative(filename):
    """A path inside the workspace relative to it; "" for one outside (the environment's)."""
    if not filename:
      return ""
    real = os.path.realpath(filename)
    return os.path.relpath(real, workdir) if _inside(real, workdir) else ""

  class Recorder:
    def __init__(self):
      self.code = {}
      self.xfail_from = {}
      self.canary = None

    def emit(self, **record):
      data = (dumps(record, sort_keys=True) + "\n").encode("utf-8")
      while data:
        try:
          data = data[write(fd, data):]
        except InterruptedError:
          continue
        except OSError:
          return

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
      self.emit(e="start", pytest=getattr(pytest, "__version__", ""))

    def pytest_collectreport(self, report):
      if report.failed:
        self.emit(e="collect_error", id=report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
      module = None
      for item in reversed(items):
        module = item.getparent(pytest.Module)
        if module is not None:
          break
      if module is not None:
        name = "test_" + os.urandom(6).hex()

        def canary():
          raise AssertionError("orchard grader canary: this test must fail")
        canary.__name__ = canary.__qualname__ = name
        setattr(module.obj, name, canary)
        if hasattr(pytest.Function, "from_parent"):
          item = pytest.Function.from_parent(module, name=name)
        else:
          item = pytest.Function(name, parent=module)
        items.append(item)
        self.canary = item.nodeid
      self.emit(e="collected", count=len(items), canary=self.canary)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
      function = getattr(item, "obj", None)
      code = getattr(getattr(function, "__func__", function), "__code__", None)
      self.code[item.nodeid] = relative(getattr(code, "co_filename", ""))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
      yield
      excinfo = call.excinfo
      if call.when == "call" and excinfo is not None and XFailed and \
          excinfo.errisinstance(XFailed):
        frames = []
        tb = excinfo.tb
        while tb is not None:
          frames.append(tb.tb_frame.f_code.co_filename)
          tb = tb.tb_next
        outside = [f for f in frames
                   if not os.path.realpath(f).startswith(runner_dirs or ("\0",))]
        self.xfail_from[item.nodeid] = relative(outside[-1]) if outside else ""

    def pytest_runtest_logreport(self, report):
      # Set-up and tear-down are written only when they did not pass (a test with neither a
      # call nor a failed set-up counts as missing), and the test function's file only when it
      # is not the test's own: the report stays small for suites of thousands of tests.
      if report.when != "call" and report.outcome == "passed" and not hasattr(report, "wasxfail"):
        return
      record = {"e": "test", "id": report.nodeid, "when": report.when,
                "outcome": report.outcome}
      if hasattr(report, "wasxfail"):
        record["xfail"] = True
      if report.when == "call":
        code = self.code.pop(report.nodeid, "")
        if code != report.nodeid.split("::")[0]:
          record["code"] = code
        if report.nodeid in self.xfail_from:
          record["xfail_from"] = self.xfail_from.pop(report.nodeid)
      self.emit(**record)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
      self.emit(e="finish", exitstatus=int(exitstatus),
                stopped=bool(getattr(session, "shouldstop", False)
                             or getattr(session, "shouldfail", False)))

  return Recorder()


def main(arguments):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--mode", choices=("module", "script"), required=True)
  parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
  args = parser.parse_args(arguments)
  pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
  workdir = os.path.realpath(args.workdir)
  here = os.path.dirname(os.path.realpath(__file__))
  sys.path[:] = [p for p in sys.path if p and not _inside(p, here) and not _inside(p, workdir)]
  _site_without_workspace_customize(workdir)
  environment = list(sys.path)
  sys.path[:] = [p for p in environment if not _inside(p, workdir)]
  _import_runner()
  import pytest
  fd = int(os.environ.pop("ORCHARD_REPORT_FD"))
  os.set_inheritable(fd, False)
  recorder = make_recorder(fd, workdir)
  pythonpath = os.environ.pop("ORCHARD_PYTHONPATH", None)
  # What `python -m pytest` (the working folder) or the `pytest` script (its folder) puts first.
  if args.mode == "module":
    front, program = [os.getcwd()], os.path.join(os.path.dirname(pytest.__file__), "__main__.py")
  else:
    import shutil
    program = shutil.which("pytest") or "pytest"
    front = [os.path.dirname(os.path.abspath(program))]
  entries = [p for p in (pythonpath or "").split(os.pathsep) if p]
  sys.path[:] = front + entries + [p for p in environment if p not in entries]
  if pythonpath is not None:
    os.environ["PYTHONPATH"] = pythonpath
  sys.argv = [program] + pytest_args
  code = 3
  try:
    code = int(pytest.main(pytest_args, plugins=[recorder]))
  except SystemExit as stop:
    code = stop.code if isinstance(stop.code, int) else 1
  finally:
    recorder.emit(e="exit", code=code)
  return code


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
