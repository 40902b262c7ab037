"""How a sandbox is started: the bubblewrap command line (built once per server), or no isolation at all.

`bwrap` mode gives every run:

- no network (`--unshare-net`: a fresh network namespace with only a loopback of its own), its own PID, IPC, UTS,
  cgroup and user namespaces (`--unshare-all --unshare-user`), no way to create more (`--disable-userns`), a new
  terminal session, and death with the service (`--die-with-parent`; when its init dies the kernel kills every
  process of the PID namespace);
- a read-only system: `/usr` (and the `/bin`, `/lib*` links into it); an `/etc` of its own (generated `passwd`,
  `group`, `hosts`; copies of the dynamic-linker cache, the time zone and Debian's alternatives links; nothing
  else of the host's `/etc`); a private `/proc`; `/dev` with only null, zero, random, urandom and a small
  `/dev/shm`; a size-capped tmpfs workspace (`/workspace`, also `/tmp`); the root itself remounted read-only;
- an environment of `PATH`, `HOME`, `LANG` only: bwrap itself starts with an empty environment (its init keeps
  the environment bwrap was started with, readable at `/proc/1/environ`) and `--clearenv` clears the rest;
- a non-root identity: when the service runs as root, bwrap is started through `chroot --userspec` (to `/`, so
  only the identity changes) as `sandbox_uid`, so the kernel enforces the per-run process limit (it exempts uid
  0) and nothing maps back to root.

The argument list is fixed per server (limits travel in the request, not on the command line), which keeps
starting a sandbox to one `vfork`+`exec`.

`none` mode runs the same launcher as a plain child process in a temporary folder with only the rlimits: it exists
for development on machines without bubblewrap and is logged loudly.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gymfleet.errors import ConfigError
from sandbox.launcher import STUB

log = logging.getLogger(__name__)

WORKDIR = "/workspace"
TOP_LEVEL_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
HOST_ETC_FILES = ("ld.so.cache", "localtime")
DEVICES = ("null", "zero", "random", "urandom")
SHM_MB = 64  # /dev/shm, for multiprocessing's semaphores and shared memory
TMPFS_MOUNTS = ("/dev/shm", WORKDIR)
"""The sandbox's writable mounts: size-capped tmpfs, whose contents the memory watch counts (`sandbox.memory`)."""
FORKSERVER_CAPS = [arg for cap in ("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SETPCAP") for arg in ("--cap-add", cap)]
"""What the fork server needs inside its user namespace: mounts and namespaces (its runs drop every capability)."""
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
RUNTIME = Path(__file__).resolve().parent
INSTALL_HINT = (
    "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) and allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04+ also "
    "kernel.apparmor_restrict_unprivileged_userns=0), or - for development only - set `isolation: none`."
)


@dataclass
class Isolation:
    """A ready way to start sandboxes: the command, where the workspace is, and the compiled runtime."""

    mode: str
    argv: list[str]
    python: str
    launcher_code: bytes
    """The launcher compiled by `python` (empty until `finish`: `prepare(finished=False)`)."""
    kernel_code: bytes
    pidns: bool
    workdir: str = WORKDIR
    env: dict[str, str] = field(default_factory=dict)
    forkserver_code: bytes = b""
    forkserver_argv: list[str] = field(default_factory=list)
    """The fork server's sandbox (`sandbox.forkserver`): `argv` with the capabilities it needs to make a sandbox per
    run inside its own user namespace, started by `env -i` (its runs' init shows no environment, as bwrap's does: each
    program sets `program_env` itself); empty without bubblewrap."""
    program_env: dict[str, str] = field(default_factory=dict)
    """The environment a program starts with (bwrap's `--setenv`s, and `PWD` as bwrap sets it)."""
    _etc: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    _etc_uid: int | None = field(default=None, repr=False)
    """The uid the sandbox's /etc is still to be filled for (`finish`); None once it is (or without bubblewrap)."""

    def finish(self) -> None:
        """What takes time, done once before the first sandbox starts (`prepare(finished=False)` leaves it to here):
        compile the launcher, the session kernel and the fork server with the sandbox's interpreter (one run of it for
        the three) and fill the sandbox's /etc (hundreds of links, tens of milliseconds and more on a busy disk).

        Raises:
            ConfigError: the interpreter cannot compile them (its error).
        """
        if not self.launcher_code:
            self.launcher_code, self.kernel_code, self.forkserver_code = _compile(self.python, RUNTIME_SOURCES)
        if self._etc is not None and self._etc_uid is not None:
            _fill_etc(Path(self._etc.name), self._etc_uid)
            self._etc_uid = None

    def close(self) -> None:
        if self._etc is not None:
            self._etc.cleanup()
            self._etc = None


def prepare(
    mode: str,
    *,
    python: str | None,
    bwrap: str,
    workspace_mb: int,
    sandbox_uid: int,
    site_packages: bool,
    finished: bool = True,
) -> Isolation:
    """Resolve binaries, build the command line and (unless `finished` is False: then `Isolation.finish` before the
    first sandbox starts) compile the runtime with the sandbox's interpreter and fill the sandbox's /etc.

    Raises:
        ConfigError: bubblewrap, setpriv or the interpreter is missing (the message says what to install).
    """
    isolation = _prepare(mode, python=python, bwrap=bwrap, workspace_mb=workspace_mb, sandbox_uid=sandbox_uid,
                         site_packages=site_packages)
    if finished:
        try:
            isolation.finish()
        except BaseException:
            isolation.close()
            raise
    return isolation


def _prepare(mode: str, *, python: str | None, bwrap: str, workspace_mb: int, sandbox_uid: int,
             site_packages: bool) -> Isolation:
    interpreter = _interpreter(python)
    flags = ["-I"] if site_packages else ["-I", "-S"]
    launcher_code = kernel_code = b""
    if mode == "none":
        log.warning(
            "SANDBOX ISOLATION IS DISABLED (isolation: none): model code runs as uid %d on this host with only "
            "rlimits - no namespaces, no filesystem or network isolation. Use this for development only.",
            os.geteuid(),
        )
        argv = [interpreter, *flags, "-c", STUB]
        return Isolation("none", argv, interpreter, launcher_code, kernel_code, pidns=False, workdir="", env=ENV)
    binary = shutil.which(bwrap)
    if binary is None:
        raise ConfigError(f"isolation: bwrap, but the bubblewrap binary {bwrap!r} is not on PATH.", hint=INSTALL_HINT)
    prefix: list[str] = []
    if os.geteuid() == 0:  # coreutils' chroot to "/" is the cheapest way to exec as another uid (setpriv: +1 ms)
        chroot = shutil.which("chroot") or shutil.which("chroot", path="/usr/sbin:/sbin")
        if chroot is None:
            raise ConfigError("running as root needs coreutils' `chroot` to drop privileges for sandboxes.")
        prefix = [chroot, f"--userspec=+{sandbox_uid}:+{sandbox_uid}", f"--groups=+{sandbox_uid}", "/"]
    uid = sandbox_uid if prefix else os.geteuid()
    etc = tempfile.TemporaryDirectory(prefix="gymfleet-sandbox-etc-")
    argv = [*prefix, binary, *_bwrap_args(interpreter, Path(etc.name), workspace_mb, uid)]
    command = ["--", interpreter, *flags, "-c", STUB]
    empty_env = ["--", shutil.which("env", path="/usr/bin:/bin") or "/usr/bin/env", "-i", *command[1:]]
    return Isolation("bwrap", argv + command, interpreter, launcher_code, kernel_code, pidns=True, _etc=etc,
                     _etc_uid=uid, forkserver_argv=argv + FORKSERVER_CAPS + empty_env,
                     program_env={**ENV, "HOME": WORKDIR, "PWD": WORKDIR})


def _interpreter(python: str | None) -> str:
    candidates = [python] if python else ["/usr/bin/python3", sys.executable]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return os.path.realpath(found)
    raise ConfigError(f"no Python interpreter for the sandbox: tried {candidates}; set `python:` to one.")


RUNTIME_SOURCES = tuple(RUNTIME / name for name in ("launcher.py", "kernel.py", "forkserver.py"))
_COMPILE_SCRIPT = (
    "import marshal,sys\n"
    "for name in sys.argv[1:]:\n"
    " size=int.from_bytes(sys.stdin.buffer.read(8),'little')\n"
    " code=marshal.dumps(compile(sys.stdin.buffer.read(size),name,'exec'))\n"
    " sys.stdout.buffer.write(len(code).to_bytes(8,'little')+code)\n"
)


def _compile(interpreter: str, sources: tuple[Path, ...]) -> list[bytes]:
    """Each source compiled by the sandbox's own interpreter (code objects are interpreter-version specific), all in
    one run of it; the marshalled code objects, in order (this interpreter never unmarshals them).

    Raises:
        ConfigError: the interpreter cannot compile one of them (its error).
    """
    names = [f"<gymfleet-{source.stem}>" for source in sources]
    data = b"".join(len(text).to_bytes(8, "little") + text for text in (source.read_bytes() for source in sources))
    done = subprocess.run([interpreter, "-I", "-S", "-c", _COMPILE_SCRIPT, *names], input=data, capture_output=True,
                          env={}, timeout=60, check=False)
    if done.returncode != 0:
        detail = done.stderr[-2000:].decode("utf-8", "replace")
        files = ", ".join(source.name for source in sources)
        raise ConfigError(f"the sandbox interpreter {interpreter} cannot compile {files}: {detail}")
    codes, out = [], done.stdout
    for _ in sources:
        size = int.from_bytes(out[:8], "little")
        codes.append(out[8:8 + size])
        out = out[8 + size:]
    return codes


def _bwrap_args(interpreter: str, etc: Path, workspace_mb: int, uid: int) -> list[str]:
    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    args += ["--clearenv", "--hostname", "sandbox"]
    for name, value in {**ENV, "HOME": WORKDIR}.items():
        args += ["--setenv", name, value]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in TOP_LEVEL_LINKS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind", str(etc), "/etc"]  # filled by `Isolation.finish` (`_fill_etc`)
    prefix = Path(interpreter).parent.parent
    if not interpreter.startswith("/usr/"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    args += ["--proc", "/proc"]
    for device in DEVICES:
        args += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        args += ["--symlink", f"/proc/self/fd/{number}", f"/dev/{name}"]
    args += ["--symlink", "/proc/self/fd", "/dev/fd", "--size", str(SHM_MB << 20), "--tmpfs", "/dev/shm"]
    args += ["--size", str(workspace_mb << 20), "--tmpfs", WORKDIR, "--symlink", WORKDIR, "/tmp"]
    args += ["--remount-ro", "/", "--chdir", WORKDIR]
    return args


def _fill_etc(etc: Path, uid: int) -> None:
    """The sandbox's whole /etc, bound with one mount (each mount costs ~0.15 ms per run): generated account and
    host files, and copies of the few host files programs need."""
    files = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:{WORKDIR}:/bin/sh\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    }
    for name, text in files.items():
        (etc / name).write_text(text)
    for name in HOST_ETC_FILES:
        if os.path.isfile(f"/etc/{name}"):
            shutil.copyfile(f"/etc/{name}", etc / name)
    if os.path.isdir("/etc/alternatives"):  # Debian's command links (awk, ...): same targets, under /usr
        (etc / "alternatives").mkdir()
        with os.scandir("/etc/alternatives") as entries:  # closed even when a link fails midway
            for entry in entries:
                if entry.is_symlink():
                    (etc / "alternatives" / entry.name).symlink_to(os.readlink(entry.path))
    for path in [etc, *etc.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
