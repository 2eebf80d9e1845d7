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
])
def test_bad_serve_arguments_are_usage_errors(argv, expected, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["serve", *argv])
  assert exit_info.value.code == 2
  assert expected in capsys.readouterr().err


def test_good_arguments_pass_the_checks():
  parser = cli._parser()
  args = parser.parse_args(["serve", "--port", "0", "--config-json", '{"default_timeout": 60}'])
  cli._check_args(parser, args)          # returns without a usage error
  assert args.port == 0


def test_a_backend_that_cannot_start_ends_with_one_line_naming_the_cause(tmp_path, capsys):
  """uvicorn exits with status 3 when the lifespan fails, so the closing 'did not start' line
  never came; the last line was uvicorn's 'Application startup failed. Exiting.' (walkthrough:
  serve --backend kubernetes without a kubeconfig)."""
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["serve", "--backend", "kubernetes", "--kubeconfig", str(tmp_path / "nope"),
              "--port", "0", "--api-keys-file", _keys(tmp_path)])
  assert str(exit_info.value.code).startswith(
      "Orchard Env did not start: cannot load the Kubernetes configuration")


def _keys(tmp_path):
  path = tmp_path / "keys.txt"
  path.write_text("secret\n")
  return str(path)
