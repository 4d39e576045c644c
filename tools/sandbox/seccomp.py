"""The seccomp filter of the bubblewrap sandbox, written as a classic BPF program in pure Python.

Why: namespaces do not cover everything. Kernel keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``,
``io_uring`` and the module/kexec/mount families are either global kernel state (a key added in one
sandbox is visible to the next one and to the host user that owns it) or large attack surface that
untrusted Python, pytest, git, gcc and java never need. Docker applies such a filter by default; bwrap
applies none unless given one with ``--seccomp FD``, which takes exactly the bytes this module builds (an
array of ``struct sock_filter``, see seccomp(2) and the BPF section of filter(2)/bpf(4)).

Policy: allow by default, deny a fixed list with ``EPERM`` (or ``ENOSYS`` where libc then falls back,
e.g. ``clone3`` -> ``clone``, ``io_uring`` -> plain I/O), and check arguments for four calls:

* ``clone``: no ``CLONE_NEW*`` flag (new namespaces are how sandbox escapes start);
* ``personality``: only the default persona, ``PER_LINUX32``, ``UNAME26`` and the query ``0xffffffff``
  (the rest switch off ASLR or change how the kernel treats the process);
* ``prlimit64``: only on the caller itself (pid 0), so an episode cannot lower the warm parent's limits
  and hand them to the next episode.

Any architecture other than the one the program was built for (e.g. the i386 ABI on x86_64 via ``int
0x80``) and, on x86_64, every x32-ABI call (``nr >= 0x40000000``) is refused with ``ENOSYS``.
"""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ARCHES", "DENY_EPERM", "DENY_ENOSYS", "build_filter", "syscall_numbers"]

# struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;} in host byte order (linux/filter.h).
_INSN = struct.Struct("=HBBI")
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
# struct seccomp_data {int nr; u32 arch; u64 instruction_pointer; u64 args[6];}: offsets of what we read.
_NR, _ARCH = 0, 4


def _arg_low(index: int) -> int:
    """Offset of the low 32 bits of syscall argument ``index`` (both supported arches are little-endian)."""
    return 16 + 8 * index


RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
PERSONALITIES_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)


@dataclass(frozen=True)
class Arch:
    """One ABI: its ``AUDIT_ARCH_*`` value and the numbers of the syscalls this filter names."""

    name: str
    audit_arch: int
    numbers: dict[str, int]


# Numbers from the kernel's syscall tables: arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h (arm64). A test checks them against the installed headers.
_COMMON_NEW = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
               "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
               "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443}
X86_64 = Arch("x86_64", 0xC000003E, {
    "clone": 56, "ptrace": 101, "syslog": 103, "uselib": 134, "personality": 135, "ustat": 136, "sysfs": 139,
    "vhangup": 153, "pivot_root": 155, "_sysctl": 156, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "create_module": 174, "init_module": 175, "delete_module": 176,
    "get_kernel_syms": 177, "query_module": 178, "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212,
    "clock_settime": 227, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
    "mq_notify": 244, "mq_getsetattr": 245, "kexec_load": 246, "add_key": 248, "request_key": 249,
    "keyctl": 250, "unshare": 272, "perf_event_open": 298, "fanotify_init": 300, "prlimit64": 302,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, **_COMMON_NEW})
AARCH64 = Arch("aarch64", 0xC00000B7, {
    "lookup_dcookie": 18, "umount2": 39, "mount": 40, "pivot_root": 41, "nfsservctl": 42, "vhangup": 58,
    "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104, "init_module": 105,
    "delete_module": 106, "clock_settime": 112, "syslog": 116, "ptrace": 117, "reboot": 142,
    "sethostname": 161, "setdomainname": 162, "settimeofday": 170, "mq_open": 180, "mq_unlink": 181,
    "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "add_key": 217,
    "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225, "perf_event_open": 241,
    "prlimit64": 261, "fanotify_init": 262, "name_to_handle_at": 264, "open_by_handle_at": 265,
    "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
    "finit_module": 273, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294, **_COMMON_NEW})
ARCHES = {"x86_64": X86_64, "amd64": X86_64, "aarch64": AARCH64, "arm64": AARCH64}

#: Refused with EPERM: kernel-global state (keyrings, modules, clocks, swap, quotas, accounting, hostname),
#: filesystem and namespace surgery, reading or writing other processes, and big unprivileged attack surface.
DENY_EPERM = (
    "add_key", "request_key", "keyctl",
    "bpf", "userfaultfd", "perf_event_open", "fanotify_init", "lookup_dcookie",
    "unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
    "query_module", "get_kernel_syms", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
    "syslog", "vhangup", "settimeofday", "clock_settime", "clock_adjtime", "sethostname", "setdomainname",
    "iopl", "ioperm", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl",
    # POSIX message queues outlive every process in the sandbox's ipc namespace and no dir the host empties
    # holds them; none of the sandbox's tools use them.
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)
#: Refused with ENOSYS: callers treat "not implemented" as "use the older way" (glibc's clone3 -> clone).
DENY_ENOSYS = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")


def _ret_errno(code: int) -> int:
    return _RET_ERRNO | code


class _Program:
    """A tiny assembler: instructions with symbolic jump targets, resolved to 8-bit forward offsets."""

    def __init__(self) -> None:
        self.insns: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.insns)

    def load(self, offset: int) -> None:
        self.insns.append((_LD_W_ABS, 0, 0, offset))

    def jump(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.insns.append((code, jt, jf, k))

    def ret(self, value: int) -> None:
        self.insns.append((_RET, 0, 0, value))

    def assemble(self) -> bytes:
        out = []
        for index, (code, jt, jf, k) in enumerate(self.insns):
            offsets = []
            for target in (jt, jf):
                offset = target if isinstance(target, int) else self.labels[target] - index - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f"seccomp jump of {offset} at instruction {index} does not fit in 8 bits")
                offsets.append(offset)
            out.append(_INSN.pack(code, offsets[0], offsets[1], k))
        return b"".join(out)


def syscall_numbers(arch: str | None = None) -> dict[str, int]:
    """The syscall numbers this filter names on ``arch`` (default: this machine's)."""
    return dict(_arch(arch).numbers)


def _arch(name: str | None) -> Arch:
    machine = (name or platform.machine()).lower()
    if machine not in ARCHES:
        raise OSError(f"no seccomp syscall table for {machine!r} (supported: x86_64, aarch64)")
    return ARCHES[machine]


def build_filter(arch: str | None = None, *, eperm: Iterable[str] = DENY_EPERM,
                 enosys: Iterable[str] = DENY_ENOSYS) -> bytes:
    """The filter for ``arch`` (default: this machine's) as bytes for ``bwrap --seccomp FD``.

    Raises ``OSError`` for an architecture without a table: the caller must then refuse to start a sandbox
    rather than run one without the filter.
    """
    table = _arch(arch)
    names = table.numbers
    eperm_nrs = sorted({names[n] for n in eperm if n in names})
    enosys_nrs = sorted({names[n] for n in enosys if n in names})
    p = _Program()
    p.load(_ARCH)
    p.jump(_JEQ, table.audit_arch, jt=0, jf="enosys")
    p.load(_NR)
    if table is X86_64:
        p.jump(_JGE, X32_SYSCALL_BIT, jt="enosys", jf=0)
    # Each test jumps forward to a shared return, so the list stays well within 8-bit jump offsets.
    for nr in eperm_nrs:
        p.jump(_JEQ, nr, jt="eperm")
    for nr in enosys_nrs:
        p.jump(_JEQ, nr, jt="enosys")
    p.jump(_JEQ, names["clone"], jt="clone")
    p.jump(_JEQ, names["personality"], jt="personality")
    p.jump(_JEQ, names["prlimit64"], jt="prlimit64")
    p.ret(RET_ALLOW)
    # Classic BPF only jumps forward: the argument checks come first, the shared returns last.
    p.label("clone")
    p.load(_arg_low(0))
    p.jump(_JSET, CLONE_NEW_FLAGS, jt="eperm", jf="allow")
    p.label("personality")
    p.load(_arg_low(0))
    for value in PERSONALITIES_ALLOWED[:-1]:
        p.jump(_JEQ, value, jt="allow")
    p.jump(_JEQ, PERSONALITIES_ALLOWED[-1], jt="allow", jf="eperm")
    p.label("prlimit64")
    p.load(_arg_low(0))
    p.jump(_JEQ, 0, jt="allow", jf="eperm")
    p.label("allow")
    p.ret(RET_ALLOW)
    p.label("eperm")
    p.ret(_ret_errno(errno.EPERM))
    p.label("enosys")
    p.ret(_ret_errno(errno.ENOSYS))
    return p.assemble()
