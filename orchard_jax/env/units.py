"""Quantities and text checks of the service's requests, shared by the service, the SDK and
the test cluster.

Sizes are Kubernetes quantities, read strictly: a plain integer is bytes; the suffixes are
`k M G T P E` (powers of 1000) and `Ki Mi Gi Ti Pi Ei` (powers of 1024), nothing else.
Everything people write that could mean two things is refused with a message saying what to
write instead: `1GB`, `1Gb`, `1gb` (bytes or bits? 10^9 or 2^30?), `512m` (Kubernetes reads it
as 0.512 bytes), `1K` (Kubernetes has only lower-case k). A fractional result is rounded up
to whole bytes, as Kubernetes does. Cpu is cores (`1.5`) or millicores (`"500m"`).
"""
import math
import re
from typing import Optional, Union

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)\Z")
MAX_BYTES = 2**60
MIN_CPU = 0.01                    # the smallest cpu.max quota the kernel takes (1 ms / 100 ms)
MAX_CPU = 4096.0


def parse_bytes(value: Union[int, float, str, None], what: str = "size") -> Optional[int]:
  """Bytes from an integer or a Kubernetes quantity string ("512Mi", "2G", "1.5Gi").

  Args:
    value: the value as sent; None passes through.
    what: the field's name, for the error message.
  Raises:
    ValueError: not a size, negative, ambiguous (e.g. "1Gb", "512m"), or over 2^60 bytes.
  """
  if value is None:
    return None
  if isinstance(value, bool):
    raise ValueError(f"{what} must be bytes or a quantity like '512Mi'; got {value!r}")
  if isinstance(value, float):
    if not math.isfinite(value) or value != int(value):
      raise ValueError(f"{what} must be a whole number of bytes or a quantity like '512Mi'; "
                       f"got {value!r}")
    value = int(value)
  if isinstance(value, int):
    if not 0 <= value <= MAX_BYTES:
      raise ValueError(f"{what} must be 0 to 2^60 bytes; got {value!r}")
    return value
  if not isinstance(value, str):
    raise ValueError(f"{what} must be bytes or a quantity like '512Mi'; got {value!r}")
  text = value.strip()
  match = _QUANTITY.match(text)
  if not match:
    raise ValueError(f"{what} must be bytes or a quantity like '512Mi' or '2G'; got {value!r}")
  number, suffix = match.groups()
  if suffix in _BINARY:
    scale = _BINARY[suffix]
  elif suffix in _DECIMAL:
    scale = _DECIMAL[suffix]
  else:
    hint = _suggest(suffix)
    raise ValueError(f"{what}: unit {suffix!r} in {value!r} is not a Kubernetes quantity "
                     f"suffix{hint}; use Ki/Mi/Gi/Ti (powers of 1024) or k/M/G/T (powers of "
                     f"1000), without B")
  whole, _, frac = number.partition(".")
  exact = int(whole) * scale + (-(-int(frac) * scale // 10**len(frac)) if frac else 0)
  if exact > MAX_BYTES:
    raise ValueError(f"{what} must be at most 2^60 bytes; got {value!r}")
  return exact


def _suggest(suffix: str) -> str:
  if suffix == "m":
    return " (Kubernetes reads 'm' as milli: '512m' is 0.512 bytes; did you mean 'Mi'?)"
  letter = suffix[:1].upper()
  if letter and letter in "KMGTPE":
    return (f" (bytes or bits? 1000 or 1024? write '{letter}i' for powers of 1024 or "
            f"'{'k' if letter == 'K' else letter}' for powers of 1000)")
  return ""


def parse_cpu(value: Union[int, float, str, None], what: str = "cpu") -> Optional[float]:
  """Cores from a number (1.5) or a Kubernetes cpu quantity ("500m" = 0.5 cores).

  Raises:
    ValueError: not a number of cores, not finite, below 0.01 (10m) or above 4096 cores.
  """
  if value is None:
    return None
  if isinstance(value, bool):
    raise ValueError(f"{what} must be cores (1.5) or millicores ('500m'); got {value!r}")
  if isinstance(value, str):
    text = value.strip()
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m?)", text)
    if not match:
      raise ValueError(f"{what} must be cores (1.5) or millicores ('500m'); got {value!r}")
    cores = float(match.group(1)) / (1000 if match.group(2) else 1)
  elif isinstance(value, (int, float)):
    cores = float(value)
  else:
    raise ValueError(f"{what} must be cores (1.5) or millicores ('500m'); got {value!r}")
  if not math.isfinite(cores) or not MIN_CPU <= cores <= MAX_CPU:
    raise ValueError(f"{what} must be {MIN_CPU:g} to {MAX_CPU:g} cores ('10m' at least); "
                     f"got {value!r}")
  return cores


def check_text(value: str, what: str, *, nul: bool = False, max_len: int = 1 << 20) -> str:
  """`value` if it can reach a process, a path or a JSON encoder safely.

  Args:
    nul: allow NUL characters (data such as stdin text); never in arguments, names or paths.
  Raises:
    ValueError: a NUL character, a lone surrogate (not encodable as UTF-8), or too long.
  """
  if not nul and "\x00" in value:
    raise ValueError(f"{what} contains a NUL character (at offset {value.index(chr(0))}), "
                     f"which no argument, name or path can hold")
  try:
    data = value.encode("utf-8")
  except UnicodeEncodeError as e:
    raise ValueError(f"{what} is not valid Unicode text (a lone surrogate at offset "
                     f"{e.start})") from None
  if len(data) > max_len:
    raise ValueError(f"{what} is {len(data)} bytes; at most {max_len} are allowed")
  return value


_ENV_NAME = re.compile(r"^[^=\x00]+\Z")


def check_env(env: dict, what: str = "env", *, max_total: int = 1 << 20) -> dict:
  """An environment mapping whose names and values a process can hold.

  Raises:
    ValueError: an empty name, a name with '=' or NUL, a value with NUL, or too large.
  """
  total = 0
  for name, value in env.items():
    if not isinstance(name, str) or not _ENV_NAME.match(name):
      raise ValueError(f"{what}: variable name {name!r} is not valid (it must be non-empty, "
                       f"without '=' or NUL)")
    check_text(name, f"{what} name {name!r}", max_len=4096)
    check_text(value, f"{what}[{name!r}]")
    total += len(name) + len(value) + 2
  if total > max_total:
    raise ValueError(f"{what} holds {total} bytes; at most {max_total} are allowed")
  return env


def check_path(path: str, what: str = "path") -> str:
  """A path (absolute or relative) that can reach a system call.

  Raises:
    ValueError: empty, with NUL, not valid Unicode, or longer than PATH_MAX (4096 bytes).
  """
  if not path:
    raise ValueError(f"{what} must not be empty")
  return check_text(path, what, max_len=4095)
