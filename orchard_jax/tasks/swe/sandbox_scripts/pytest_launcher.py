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
   must fail: a run in which it passes, or silently does not run, was tampered with. Two more
   records catch code that reaches into the runner: framework (pytest's, pluggy's and
   unittest's functions and class members replaced by code from the workspace, and builtins
   rebound, since a snapshot taken before any workspace code ran; checked after collection and
   at the end) and plugins (the workspace files pytest plugins were registered from).
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


_FRAMEWORK = ("pytest", "_pytest", "pluggy", "unittest")


def framework_snapshot(modules=None):
  """What code under test would have to change to bend results from inside the process:
  {(module, name, member or None): (id of the object, id of its code)} for the functions and
  classes (and their members) of pytest's, pluggy's and unittest's modules, and builtins.

  Args:
    modules: the module names to read (those of an earlier snapshot), or None for every
      loaded module of the runner and unittest.
  Returns:
    (snapshot, module names read).
  """
  import builtins
  import types
  if modules is None:
    modules = sorted(name for name, module in list(sys.modules.items()) if module is not None
                     and name.split(".")[0] in _FRAMEWORK)
  snapshot = {}
  for name, value in list(vars(builtins).items()):
    if not name.startswith("__"):
      snapshot[("builtins", name, None)] = (id(value), None)
  for module_name in modules:
    module = sys.modules.get(module_name)
    if module is None:
      continue
    for name, value in list(vars(module).items()):
      if name.startswith("__") or isinstance(value, types.ModuleType):
        continue
      if isinstance(value, type):
        snapshot[(module_name, name, None)] = (id(value), None)
        if getattr(value, "__module__", None) != module_name:
          continue
        for attr, member in list(vars(value).items()):
          if attr in ("__dict__", "__weakref__", "__doc__") or not (
              callable(member) or isinstance(member, (staticmethod, classmethod, property))):
            continue
          function = getattr(member, "__func__", member)
          snapshot[(module_name, name, attr)] = (id(member),
                                                 id(getattr(function, "__code__", None)))
      elif callable(value):
        snapshot[(module_name, name, None)] = (id(value), id(getattr(value, "__code__", None)))
  return snapshot, modules


def _origin(value):
  """The file that defines a function, property, method or class; None for built-in ones."""
  function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
  code = getattr(function, "__code__", None)
  if code is not None:
    return code.co_filename
  if isinstance(value, type):
    return getattr(sys.modules.get(value.__module__), "__file__", None)
  return None


def framework_changes(before, modules, relative):
  """The changes since snapshot `before` that code outside the runner made: a builtin rebound or
  removed, a member removed, or a function, member or class replaced or added by code defined
  in the workspace (`relative` gives its path there, "" outside). pytest and its plugins patch
  their own classes as they configure (pytest's legacypath plugin adds Config.inifile, ...):
  those changes come from outside the workspace and are left out.

  Returns:
    [{"name", "change": "rebound" | "removed" | "replaced" | "added", "origin": path}].
  """
  after, _ = framework_snapshot(modules)
  classes = {(m, n) for (m, n, a), v in before.items() if a is None and v[1] is None}
  out = []
  keys = [k for k in before if after.get(k) != before[k]]
  keys += [k for k in after if k not in before and k[2] is not None and k[:2] in classes]
  for module_name, name, attr in sorted(keys, key=str):
    label = ".".join(p for p in (module_name, name, attr) if p)
    if (module_name, name, attr) not in after:
      out.append({"name": label, "change": "removed", "origin": ""})
      continue
    owner = sys.modules.get(module_name) if module_name != "builtins" else None
    if module_name == "builtins":
      import builtins
      value = vars(builtins).get(name)
    else:
      value = vars(owner).get(name)
      value = vars(value).get(attr) if attr is not None else value
    if module_name == "builtins":
      out.append({"name": label, "change": "rebound", "origin": relative(_origin(value))})
      continue
    origin = relative(_origin(value))
    if origin:
      out.append({"name": label, "change": "added" if (module_name, name, attr) not in before
                  else "replaced", "origin": origin})
  return out


def make_recorder(fd, workdir, framework=None):
  """The pytest plugin that writes records to file descriptor `fd` (module docstring, step 4).

  Args:
    fd: the record pipe's write end.
    workdir: the repository root (paths in records are relative to it).
    framework: a `framework_snapshot()` taken before any workspace code ran, checked once the
      tests are collected and again at the end of the session.
  """
  import inspect
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

    def check_framework(self, stage):
      if framework is not None:
        changed = framework_changes(framework[0], framework[1], relative)
        if changed:
          self.emit(e="framework", stage=stage, changed=changed[:20], count=len(changed))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
      self.check_framework("collected")
      files = []
      for _, plugin in session.config.pluginmanager.list_name_plugin():
        try:
          path = getattr(plugin, "__file__", None) or inspect.getsourcefile(type(plugin))
        except TypeError:
          path = None
        path = relative(path)
        if path and path not in files:
          files.append(path)
      self.emit(e="plugins", files=files)

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
      self.check_framework("finish")
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
  import unittest  # noqa: F401 - in the snapshot below, as imported from the environment
  framework = framework_snapshot()
  fd = int(os.environ.pop("ORCHARD_REPORT_FD"))
  os.set_inheritable(fd, False)
  recorder = make_recorder(fd, workdir, framework)
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
