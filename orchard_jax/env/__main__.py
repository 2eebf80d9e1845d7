"""Command line: `python -m orchard_jax.env serve --backend local --port 8080`.

API keys come from --api-keys-file (one per line) and/or $ORCHARD_ENV_API_KEYS
(comma-separated); with neither, a key is generated and printed once.
"""
import argparse
import asyncio
import json
import logging
import secrets
import sys

from orchard_jax.env.errors import EnvError
from orchard_jax.env.manager import ServiceConfig
from orchard_jax.env.orchestrator import (ADMIN_KEYS_ENV, Orchestrator, load_api_keys,
                                          new_event_loop)


def _port(text: str) -> int:
  """argparse type: a TCP port number, 0-65535 (0: any free port)."""
  try:
    port = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a port number 0-65535; saw {text!r}") from None
  if not 0 <= port <= 65535:
    raise argparse.ArgumentTypeError(f"expected a port number 0-65535; saw {port}")
  return port


def _json_object(parser, flag: str, text: str) -> dict:
  """The JSON object given to `flag`, or a usage error naming the flag."""
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    parser.error(f"{flag}: not valid JSON ({e}): {text!r}")
  if not isinstance(value, dict):
    parser.error(f"{flag}: expected a JSON object; saw {text!r}")
  return value


def _service_config(parser, text: str) -> ServiceConfig:
  """The ServiceConfig --config-json gives, each value checked against its field's type (a
  string where seconds go would otherwise start a service that fails its first request)."""
  import pydantic
  try:
    return pydantic.TypeAdapter(ServiceConfig).validate_python(
        _json_object(parser, "--config-json", text))
  except pydantic.ValidationError as e:
    problems = "; ".join(f"{'.'.join(map(str, error['loc']))}: {error['msg']} (saw "
                         f"{error['input']!r})" for error in e.errors())
    parser.error(f"--config-json: {problems}")


def _check_args(parser, args) -> None:
  """Usage errors for arguments argparse cannot check itself (files, JSON, field names)."""
  import dataclasses
  import os
  for flag, path in (("--api-keys-file", args.api_keys_file),
                     ("--admin-keys-file", args.admin_keys_file)):
    if path and not os.path.isfile(path):
      parser.error(f"{flag} {path!r} does not exist")
  for root in args.image_root or ():
    if not os.path.isdir(root):
      parser.error(f"--image-root {root!r} is not a folder (image directories must lie "
                   f"under an existing folder)")
  if args.public_url and not args.public_url.startswith(("http://", "https://")):
    parser.error(f"--public-url must start with http:// or https://; saw {args.public_url!r}")
  fields = {f.name for f in dataclasses.fields(ServiceConfig)}
  unknown = sorted(set(_json_object(parser, "--config-json", args.config_json)) - fields)
  if unknown:
    parser.error(f"--config-json: unknown ServiceConfig field(s) {unknown}; expected some of "
                 f"{sorted(fields)}")
  _service_config(parser, args.config_json)
  from orchard_jax.env.backends.k8s_manifests import KubernetesConfig   # no kubernetes import
  k8s_fields = {f.name for f in dataclasses.fields(KubernetesConfig)}
  unknown = sorted(set(_json_object(parser, "--kubernetes-config-json",
                                    args.kubernetes_config_json)) - k8s_fields)
  if unknown:
    parser.error(f"--kubernetes-config-json: unknown KubernetesConfig field(s) {unknown}; "
                 f"expected some of {sorted(k8s_fields)}")


def _parser():
  parser = argparse.ArgumentParser(prog="python -m orchard_jax.env")
  sub = parser.add_subparsers(dest="command", required=True)
  serve = sub.add_parser("serve", help="run the Orchard Env service")
  serve.add_argument("--backend", choices=("local", "kubernetes"), default="local")
  serve.add_argument("--host", default="127.0.0.1")
  serve.add_argument("--port", type=_port, default=8080)
  serve.add_argument("--api-keys-file", default=None,
                     help="tenants' keys, one '[tenant:]key' per line (also "
                          "$ORCHARD_ENV_API_KEYS, comma-separated)")
  serve.add_argument("--admin-keys-file", default=None,
                     help="admin keys (see every tenant's sandboxes), one per line (also "
                          "$ORCHARD_ENV_ADMIN_KEYS)")
  serve.add_argument("--public-url", default=None, help="base URL used in exposed-port URLs")
  serve.add_argument("--log-level", default="info", type=str.lower,
                     choices=("critical", "error", "warning", "info", "debug"))
  serve.add_argument("--config-json", default="{}",
                     help='ServiceConfig overrides as JSON, e.g. \'{"default_timeout": 600}\'')
  serve.add_argument("--store", default="memory",
                     help='where records live: "memory" (one replica) or a Redis URL '
                          '(redis://HOST:6379/0) shared by several replicas')
  local = serve.add_argument_group("local backend")
  local.add_argument("--state-dir", default=None)
  local.add_argument("--image-root", action="append", default=None,
                     help="folder under which image directories may be used (repeatable)")
  local.add_argument("--no-strict-limits", action="store_true",
                     help="accept limits that cannot be enforced here instead of refusing them")
  k8s = serve.add_argument_group("kubernetes backend")
  k8s.add_argument("--namespace", default="orchard-sandboxes")
  k8s.add_argument("--agent-image", default=None)
  k8s.add_argument("--kubeconfig", default=None)
  k8s.add_argument("--in-cluster", action="store_true")
  k8s.add_argument("--kubernetes-config-json", default="{}",
                   help='KubernetesConfig overrides as JSON, e.g. \'{"creation_qps": 50, '
                        '"node_selector": {"pool": "sandboxes"}}\'')
  return parser


def _backend(args):
  if args.backend == "local":
    from orchard_jax.env.backends.local import LocalBackend
    return LocalBackend(state_dir=args.state_dir, image_roots=args.image_root,
                        strict_limits=not args.no_strict_limits)
  from orchard_jax.env.backends.kubernetes import KubernetesBackend, KubernetesConfig
  config = KubernetesConfig(namespace=args.namespace, **json.loads(args.kubernetes_config_json))
  if args.agent_image:
    config.agent_image = args.agent_image
  return KubernetesBackend(config, kubeconfig=args.kubeconfig, in_cluster=args.in_cluster)


def _store(url):
  if url == "memory":
    return None
  if url.startswith(("redis://", "rediss://", "unix://")):
    from orchard_jax.env.state_redis import RedisStore
    return RedisStore(url)
  raise SystemExit(f"--store is {url!r}; expected 'memory' or a Redis URL (redis://HOST:PORT/DB)")


def main(argv=None):
  parser = _parser()
  args = parser.parse_args(argv)
  _check_args(parser, args)
  logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
  keys = load_api_keys(args.api_keys_file)
  admin_keys = load_api_keys(args.admin_keys_file, ADMIN_KEYS_ENV)
  if not keys:
    keys = [secrets.token_urlsafe(24)]
    print(f"No API key configured; generated one for this run: {keys[0]}", flush=True)
  config = _service_config(parser, args.config_json)
  try:
    service = Orchestrator(_backend(args), api_keys=keys, admin_keys=admin_keys or None,
                           host=args.host, port=args.port, config=config,
                           public_url=args.public_url, log_level=args.log_level,
                           store=_store(args.store))
  except ValueError as e:   # keys: a bad tenant name, a key given twice
    sys.exit(f"Orchard Env: {e}")
  try:
    sock = service.bind()
  except OSError as e:
    sys.exit(f"Orchard Env cannot listen on {args.host}:{args.port}: {e.strerror or e}")

  def ready():   # printed once the port is bound and requests are served
    print(f"Orchard Env ({args.backend}) on http://{args.host}:{service.port}", flush=True)
  try:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
      runner.run(service.serve(sock, ready))
  except EnvError as e:              # the backend cannot start here: one line, no traceback
    sys.exit(f"Orchard Env did not start: {e.message}")
  except KeyboardInterrupt:
    pass
  finally:
    sock.close()


if __name__ == "__main__":
  main()
