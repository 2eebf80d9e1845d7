"""`python -m orchard_jax.env serve`: bad arguments are usage errors before anything starts."""
import pytest

from orchard_jax.env import __main__ as cli


@pytest.mark.parametrize("argv, expected", [
    (["--port", "99999"], "expected a port number 0-65535; saw 99999"),
    (["--port", "http"], "expected a port number 0-65535; saw 'http'"),
    (["--api-keys-file", "/nonexistent/keys.txt"], "--api-keys-file '/nonexistent/keys.txt' does "
                                                    "not exist"),
    (["--config-json", "{bad"], "--config-json: not valid JSON"),
    (["--config-json", "[1]"], "--config-json: expected a JSON object"),
    (["--config-json", '{"default_timeot": 5}'], "unknown ServiceConfig field(s) "
                                                  "['default_timeot']"),
    (["--kubernetes-config-json", "{x"], "--kubernetes-config-json: not valid JSON"),
    # Walkthrough: a misspelt field was a TypeError traceback from KubernetesConfig(**...).
    (["--backend", "kubernetes", "--kubernetes-config-json", '{"creation_qsp": 5}'],
     "unknown KubernetesConfig field(s) ['creation_qsp']"),
    # Walkthrough: a value of the wrong type started a service that failed its first request,
    # and an unknown log level was a ValueError traceback from logging.
    (["--config-json", '{"default_timeout": "soon"}'],
     "--config-json: default_timeout: Input should be a valid number"),
    (["--config-json", '{"max_sandboxes": 1.5}'], "max_sandboxes: Input should be a valid integer"),
    (["--config-json", '{"tenant_quotas": [1]}'], "tenant_quotas: Input should be a valid dict"),
    (["--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),
])
def test_bad_serve_arguments_are_usage_errors(argv, expected, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["serve", *argv])
  assert exit_info.value.code == 2
  assert expected in capsys.readouterr().err


def test_good_arguments_pass_the_checks():
  parser = cli._parser()
  args = parser.parse_args(["serve", "--port", "0", "--config-json",
                            '{"default_timeout": "60", "default_exec_timeout": null}',
                            "--log-level", "WARNING"])
  cli._check_args(parser, args)          # returns without a usage error
  assert args.port == 0 and args.log_level == "warning"
  config = cli._service_config(parser, args.config_json)
  assert config.default_timeout == 60.0 and config.default_exec_timeout is None


def _keys(tmp_path):
  path = tmp_path / "keys.txt"
  path.write_text("secret\n")
  return str(path)


def test_image_root_and_public_url_are_checked(tmp_path, capsys):
  for argv, expected in ((["--image-root", str(tmp_path / "missing")], "is not a folder"),
                         (["--public-url", "example.org"], "must start with http")):
    with pytest.raises(SystemExit) as exit_info:
      cli.main(["serve", *argv])
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err


def _serve(tmp_path, *argv, timeout=60):
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=root, ORCHARD_ENV_API_KEYS="secret")
  return subprocess.Popen([sys.executable, "-m", "orchard_jax.env", "serve", *argv], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_startup_failure_is_one_line_without_a_traceback(tmp_path):
  process = _serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(tmp_path / "nope"),
                   "--port", "0")
  out, err = process.communicate(timeout=120)
  assert process.returncode == 1
  assert "Traceback" not in out + err and " on http://" not in out
  assert err.strip().splitlines()[-1].startswith(
      "Orchard Env did not start: cannot load the Kubernetes configuration")


def test_a_port_in_use_is_one_line(tmp_path):
  import socket
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    process = _serve(tmp_path, "--port", str(port), "--state-dir", str(tmp_path / "state"))
    out, err = process.communicate(timeout=120)
  assert process.returncode == 1 and "Traceback" not in err
  assert err.strip() == f"Orchard Env cannot listen on 127.0.0.1:{port}: Address already in use"


def test_the_url_is_printed_once_the_port_answers(tmp_path):
  import httpx
  process = _serve(tmp_path, "--port", "0", "--state-dir", str(tmp_path / "state"),
                   "--log-level", "warning")
  try:
    line = process.stdout.readline()
    assert line.startswith("Orchard Env (local) on http://127.0.0.1:"), line
    url = line.split(" on ", 1)[1].strip()
    assert not url.endswith(":0")
    assert httpx.get(url + "/health", timeout=5).json()["status"] == "ok"   # no retry needed
  finally:
    process.terminate()
    out, err = process.communicate(timeout=60)
  # uvicorn ends with the signal it handled (after the sandboxes were deleted)
  assert process.returncode in (0, -15) and "Traceback" not in err, err
