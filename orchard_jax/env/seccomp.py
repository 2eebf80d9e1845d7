"""The sandboxes' default seccomp profile: the system calls a sandboxed command may not make.

In the spirit of Docker's and containerd's default profiles (which refuse these to any process
without CAP_SYS_ADMIN): no new namespaces (so no `unshare -Ur` to become uid 0 in a user
namespace), no mounts, no BPF programs or perf events, no kernel keyrings, no ptrace attach to
a process it did not start and no reading or writing another process's memory or descriptors,
no kernel modules, reboot, clock, swap, accounting or quota changes, no io_uring (its own
syscall surface that seccomp cannot see into), no file handles (open_by_handle_at escapes a
bind mount). Everything else is allowed: this is a deny-list over a default of "allow", and
system calls of any other ABI (32-bit x86 on x86_64, x32) are killed outright by libseccomp's
architecture check, so the list cannot be sidestepped through another ABI.

Refused calls fail with EPERM, as in Docker, except clone3, which fails with ENOSYS so that
the C library falls back to clone, whose flags the filter can inspect.

Two renderings of one profile:
- `compile_bpf()`: the classic-BPF program (libseccomp, through pyseccomp) that bubblewrap
  installs on a local sandbox (`--seccomp FD`) and the spawner installs on every command;
- `oci_profile()`: the same rules as an OCI / Kubernetes seccomp profile (JSON), for nodes
  that run sandbox pods with `seccompProfile: {type: Localhost}`.
"""
import errno
import json
import os
from typing import Optional

NAME = "orchard-env-default"
# Namespace flags of clone(2) and unshare(2): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
# NEWPID, NEWNET; unshare also takes CLONE_NEWTIME (0x80, an exit-signal bit for clone).
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                         0x20000000, 0x40000000)
CLONE_NEWTIME = 0x00000080
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206

DENIED = (
    # namespaces and mounts
    "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig",
    "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    # kernel programs, tracing and memory of other processes
    "bpf", "perf_event_open", "userfaultfd", "process_vm_readv", "process_vm_writev",
    "pidfd_getfd", "kcmp",
    # keyrings
    "keyctl", "add_key", "request_key",
    # the machine
    "kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module", "delete_module",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "settimeofday", "clock_settime",
    "clock_adjtime", "iopl", "ioperm", "syslog", "lookup_dcookie", "nfsservctl", "uselib",
    "ustat", "sysfs", "_sysctl", "vhangup",
    # file handles and io_uring
    "open_by_handle_at", "name_to_handle_at", "io_uring_setup", "io_uring_enter",
    "io_uring_register",
)


def rules() -> list:
  """The profile as data: [{"syscall", "errno", "args": [(index, mask, value), ...] or []}]
  where a rule with args matches when every (arg & mask) == value."""
  out = [{"syscall": name, "errno": errno.EPERM, "args": []} for name in DENIED]
  for flag in CLONE_NAMESPACE_FLAGS:
    out.append({"syscall": "clone", "errno": errno.EPERM, "args": [(0, flag, flag)]})
  for flag in CLONE_NAMESPACE_FLAGS + (CLONE_NEWTIME,):
    out.append({"syscall": "unshare", "errno": errno.EPERM, "args": [(0, flag, flag)]})
  for request in (PTRACE_ATTACH, PTRACE_SEIZE):
    out.append({"syscall": "ptrace", "errno": errno.EPERM,
                "args": [(0, 0xFFFFFFFFFFFFFFFF, request)]})
  out.append({"syscall": "clone3", "errno": errno.ENOSYS, "args": []})
  return out


def describe() -> dict:
  """What /health shows: the profile's name, default action and refused calls."""
  conditional = {"clone": "with a CLONE_NEW* namespace flag",
                 "unshare": "with a CLONE_NEW* namespace flag",
                 "ptrace": "PTRACE_ATTACH and PTRACE_SEIZE (a process it did not start)",
                 "clone3": "ENOSYS (the C library falls back to clone)"}
  return {"name": NAME, "default": "allow", "other_architectures": "killed",
          "denied": sorted(DENIED), "denied_when": conditional}


_cache = {}


def compile_bpf() -> bytes:
  """The profile as a classic-BPF program for this machine's architecture (bytes of
  struct sock_filter, 8 bytes per instruction), as bubblewrap's --seccomp reads it.

  Raises:
    RuntimeError: pyseccomp or libseccomp is missing (install: `pip install pyseccomp` and
      Debian's libseccomp2).
  """
  if "bpf" in _cache:
    return _cache["bpf"]
  try:
    import pyseccomp as sc
  except (ImportError, OSError) as e:
    raise RuntimeError(f"the seccomp filter needs pyseccomp and libseccomp2: {e}") from None
  flt = sc.SyscallFilter(sc.ALLOW)
  for rule in rules():
    try:
      args = [sc.Arg(i, sc.MASKED_EQ, mask, value) for i, mask, value in rule["args"]]
      flt.add_rule(sc.ERRNO(rule["errno"]), rule["syscall"], *args)
    except (RuntimeError, ValueError, OSError) as e:
      if _known(sc, rule["syscall"]):
        raise RuntimeError(f"seccomp rule for {rule['syscall']} failed: {e}") from None
      # a system call this architecture does not have: nothing to refuse
  read_end, write_end = os.pipe()
  try:
    with os.fdopen(write_end, "wb") as f:
      flt.export_bpf(f)
    chunks = []
    while True:
      chunk = os.read(read_end, 1 << 16)
      if not chunk:
        break
      chunks.append(chunk)
  finally:
    os.close(read_end)
  _cache["bpf"] = b"".join(chunks)
  return _cache["bpf"]


def _known(sc, name: str) -> bool:
  try:
    return sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0
  except Exception:  # noqa: BLE001 - an unknown name
    return False


_OCI_ARCHES = {"x86_64": ["SCMP_ARCH_X86_64"], "aarch64": ["SCMP_ARCH_AARCH64"]}


def oci_profile(errno_ret: Optional[int] = None) -> dict:
  """The profile in the OCI runtime-spec seccomp format (what a Kubernetes node reads from
  /var/lib/kubelet/seccomp/<localhostProfile>). For SCMP_CMP_MASKED_EQ, `value` is the mask
  and `valueTwo` the value, as runc and Docker's default profile write it."""
  syscalls = []
  for rule in rules():
    entry = {"names": [rule["syscall"]], "action": "SCMP_ACT_ERRNO",
             "errnoRet": errno_ret or rule["errno"]}
    if rule["args"]:
      entry["args"] = [{"index": i, "value": mask, "valueTwo": value,
                        "op": "SCMP_CMP_MASKED_EQ"} for i, mask, value in rule["args"]]
    syscalls.append(entry)
  return {"defaultAction": "SCMP_ACT_ALLOW",
          "architectures": _OCI_ARCHES.get(os.uname().machine, ["SCMP_ARCH_X86_64"]),
          "syscalls": syscalls}


def oci_profile_json() -> str:
  return json.dumps(oci_profile(), indent=2, sort_keys=True)
