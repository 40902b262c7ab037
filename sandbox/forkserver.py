"""The fork server: a warm interpreter inside a sandbox that forks one fresh, isolated sandbox per one-shot Python run.

Started by `launcher.main` (mode "forkserver", this file compiled and sent with the request) in a bubblewrap sandbox
like any other (`sandbox.isolation`), plus the capabilities it needs to make namespaces inside it (CAP_SYS_ADMIN,
CAP_NET_ADMIN, CAP_SETPCAP, within the sandbox's own user namespace only). It runs no model code. The service
(`sandbox.forked`) asks it for a run by sending 8 bytes with four descriptors on its stdin (a unix socket): the
request pipe's read end, the program's stdout and stderr pipes, and the status pipe; it answers
`@@GF-FORKED <token> <pid>` on stdout. Per run, two processes:

- the init (pid 1 of the run's PID namespace: the fork server forks it straight into a new one, `clone3` with
  CLONE_NEWPID, so no leader process sits between them) makes new mount, network and IPC namespaces (`unshare`),
  marks every mount private, mounts a fresh size-capped tmpfs on `/workspace` (also `/tmp`, a link to it) and on
  `/dev/shm`, mounts that namespace's own `/proc` (no process of another run or of the fork server can be seen),
  brings the loopback of the run's network namespace up (no other interface: no network), drops every capability
  (bounding set, ambient, effective, permitted, inheritable) and forks the program; it then holds only /dev/null
  (as bwrap's init, it is dumpable and the environment it shows, `/proc/1/environ`, is empty: the fork server was
  started with none, then set the sandbox's own, `Isolation.program_env`, once, which each program inherits); when
  the program ends it kills every process left in the namespace, reaps them and exits with the program's status
  (128 + the signal that ended it, as bwrap reports it);
- the fork server waits for each init (its pidfd, from the clone, polled beside the socket) and writes its status
  (`@@GF-EXIT <code>`) on the run's status pipe;
- the program (pid 2) waits for its request on the request pipe (the service first moves the init and the program
  into the run's memory and pids cgroups, so nothing of the run escapes its accounting), finds the interpreter's
  module table as the launcher's (the fork server set it back before forking, and built the compiler's state a cold
  run has built by then), and runs the request as a direct run does (`launcher.run_direct`: files written, limits
  set, every descriptor but stdin, stdout and stderr closed, the program run in this process).

So every run starts from the same state, a fork of a fork server that has never run model code: nothing one run
does (files, environment, imported or patched modules, descriptors, signal handlers, working directory, processes,
SysV IPC, sockets) exists in the next one's processes or namespaces.
"""

import _signal
import ctypes
import gc
import posix
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC = 0x20000, 0x20000000, 0x40000000, 0x08000000
CLONE_PIDFD = 0x1000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_DUMPABLE, PR_SET_NAME, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 4, 15, 24, 47, 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
CAP_LAST = 63
LAST_CAP = [CAP_LAST]
"""The kernel's highest capability (`serve` reads it once; none above it exists to be dropped)."""
LINUX_CAPABILITY_VERSION_3 = 0x20080522
TOKEN_BYTES = 8
FDS = 4
SIGKILL = 9
SYS_CLONE3 = 435  # the same number on every architecture
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(posix.uname().machine, 0)
"""`clone`, where `clone3` is refused with ENOSYS (0: unknown here)."""
ENOSYS = 38

libc = ctypes.CDLL(None, use_errno=True)
python = ctypes.PyDLL(None, use_errno=True)
"""The same symbols, called with the GIL held (a fork must not happen with the GIL released)."""


def serve(request, proto_in, proto_out, launcher, modules):
    """Fork an init for each request on the socket until the service closes it, and report each init's status on
    its status pipe. `modules`: the launcher's module table, before this file's imports (each run gets it back)."""
    import _socket
    import select

    request["comm"] = open("/proc/self/comm", "rb").read().strip()
    for name in list(posix.environ):  # the interpreter's own (LC_CTYPE, from its C locale coercion)
        posix.unsetenv(name)
        del posix.environ[name]
    for name, value in request["env"].items():  # each run's program inherits it (the module's docstring)
        posix.putenv(name, value)
        posix.environ[name.encode()] = value.encode()
    request["tmpfs"] = [(path if isinstance(path, bytes) else path.encode(), b"size=%d,mode=1777" % size)
                        for path, size in ((request["workdir"], request["workspace_bytes"]),
                                           (b"/dev/shm", request["shm_bytes"]))]
    try:
        LAST_CAP[0] = min(int(open("/proc/sys/kernel/cap_last_cap", "rb").read()), CAP_LAST)
    except (OSError, ValueError):
        pass
    rename(b"gf-forkserver")
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # inits are waited for: their status goes on their pipe
    channel = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, proto_in)
    space = _socket.CMSG_SPACE(FDS * 4)
    poller = select.poll()
    poller.register(proto_in, select.POLLIN)
    runs = {}  # pidfd -> (pid, status pipe)
    # The compiler's first use builds the interpreter's AST types (no module is imported): done here once, as a
    # cold run has done it before its program starts, instead of in every run (~1.5 ms and ~120 page faults each).
    compile("pass", "<fork server>", "exec", dont_inherit=True)
    # Each run's program finds the launcher's module table, without this file's imports: set here once (this file's
    # functions hold what they imported), so a program need not rebuild it (~60 page faults each).
    sys.modules.clear()
    sys.modules.update(modules)
    gc.collect()
    gc.freeze()  # a run's collections leave the fork server's objects alone: fewer pages copied per fork
    while True:
        for fd, _ in poller.poll():
            if fd in runs:
                poller.unregister(fd)
                finish(fd, *runs.pop(fd), launcher)
                continue
            token, ancillary, _, _ = channel.recvmsg(TOKEN_BYTES, space)
            fds = [int.from_bytes(data[i:i + 4], sys.byteorder) for level, kind, data in ancillary
                   if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS for i in range(0, len(data) - 3, 4)]
            if not token:
                return
            pid = 0
            if len(token) == TOKEN_BYTES and len(fds) == FDS:
                try:
                    private = [proto_in, proto_out, *runs, *(status for _, status in runs.values())]
                    pid, pidfd = fork_init(request, fds, private, launcher, modules)
                    runs[pidfd] = (pid, fds[-1])
                    poller.register(pidfd, select.POLLIN)
                except OSError as exc:
                    launcher._write_all(2, f"sandbox fork server: cannot fork a run: {launcher.describe(exc)}\n"
                                        .encode())
            for fd in fds[:-1] if pid else fds:
                posix.close(fd)
            launcher._write_all(proto_out, b"@@GF-FORKED %s %d\n" % (token.hex().encode(), pid))


def fork_init(request, fds, private, launcher, modules):
    """Fork the run's init as pid 1 of a new PID namespace (`clone3` with CLONE_NEWPID: the fork server itself stays
    where it is, and can fork the next run's init the same way). `private`: the fork server's descriptors (its
    socket and output, the other runs' pidfds and status pipes), closed in the init. Returns the init's pid and a
    pidfd of it (CLONE_PIDFD).

    Raises:
        OSError: the kernel refused the clone (or, after `clone`, the pidfd).
    """
    pidfd = ctypes.c_int(-1)
    # struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls
    args = (ctypes.c_uint64 * 8)(CLONE_NEWPID | CLONE_PIDFD, ctypes.addressof(pidfd), 0, 0, _signal.SIGCHLD)
    python.PyOS_BeforeFork()  # what os.fork does around its fork(), in the same order
    pid = python.syscall(SYS_CLONE3, args, ctypes.sizeof(args))
    if pid < 0 and ctypes.get_errno() == ENOSYS and SYS_CLONE:  # clone3 filtered out (some seccomp profiles)
        pid = python.syscall(SYS_CLONE, CLONE_NEWPID | _signal.SIGCHLD, 0, 0, 0, 0)  # as fork: no new stack
    if pid == 0:
        try:
            python.PyOS_AfterFork_Child()
            for fd in private:
                posix.close(fd)
            init(request, fds, launcher, modules)
        finally:  # never back into the fork server's loop
            posix._exit(255)
    errno = ctypes.get_errno()
    python.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(errno, f"clone3(CLONE_NEWPID): {posix.strerror(errno)}")
    if pidfd.value >= 0:
        return pid, pidfd.value
    try:
        return pid, posix.pidfd_open(pid)
    except OSError:  # an init nobody would wait for: end it now
        posix.kill(pid, SIGKILL)
        posix.waitpid(pid, 0)
        raise


def finish(pidfd, pid, status_fd, launcher):
    """Reap an init and write its status on its run's status pipe (see the module's docstring)."""
    status = posix.waitpid(pid, 0)[1]
    posix.close(pidfd)
    code = posix.WEXITSTATUS(status) if posix.WIFEXITED(status) else 128 + posix.WTERMSIG(status)
    try:
        posix.set_blocking(status_fd, False)  # the service may have stopped reading: never stall the fork server
        launcher._write_all(status_fd, b"@@GF-EXIT %d\n" % code)
    except OSError:
        pass
    finally:
        posix.close(status_fd)


def rename(name):
    """The process's name (`comm`): the fork server's processes say what they are (tests tell them from a run's)."""
    libc.prctl(PR_SET_NAME, name, 0, 0, 0)


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {posix.strerror(errno)}")


def init(request, fds, launcher, modules):
    """The run's init, pid 1 of its PID namespace (see the module's docstring); never returns."""
    code = 255
    rename(b"gf-run-init")
    try:
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC), "unshare")
        check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
        for path, options in request["tmpfs"]:
            check(libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, options), f"mounting {path!r}")
        check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mounting /proc")
        loopback_up()
        drop_capabilities()
        # Dumpable, as bwrap's init: it holds nothing the program may not see.
        check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "making the init dumpable")
        pid = posix.fork()
        if pid == 0:
            program(fds, launcher, modules, request["comm"])
        for fd in fds:
            posix.close(fd)
        posix.dup2(0, 2)  # the fork server's stderr: /dev/null from here on, like stdin and stdout
        code = reap(pid)
    except BaseException as exc:
        launcher._write_all(2, f"sandbox fork server: cannot start a run: {launcher.describe(exc)}\n".encode())
    posix._exit(code)


def reap(pid):
    """Wait for the program; then kill and reap whatever is left. Returns the program's status as bwrap gives it."""
    code = None
    while True:
        try:
            child, status = posix.waitpid(-1, 0)
        except ChildProcessError:
            return 255 if code is None else code
        if child == pid:
            code = posix.WEXITSTATUS(status) if posix.WIFEXITED(status) else 128 + posix.WTERMSIG(status)
            try:
                posix.kill(-1, SIGKILL)  # every process of the run but this one
            except OSError:
                pass


def loopback_up():
    """Bring `lo` up in the run's network namespace (as bwrap does), so local sockets work; nothing else exists."""
    sock = libc.socket(2, 2, 0)  # AF_INET, SOCK_DGRAM
    if sock < 0:
        raise OSError(ctypes.get_errno(), "socket for the loopback")
    try:
        request = ctypes.create_string_buffer(b"lo", 40)
        check(0 if libc.ioctl(sock, SIOCGIFFLAGS, request) >= 0 else -1, "reading the loopback's flags")
        flags = int.from_bytes(request.raw[16:18], sys.byteorder) | IFF_UP
        request.raw = request.raw[:16] + flags.to_bytes(2, sys.byteorder) + request.raw[18:]
        check(0 if libc.ioctl(sock, SIOCSIFFLAGS, request) >= 0 else -1, "bringing the loopback up")
    finally:
        posix.close(sock)


def drop_capabilities():
    """No capability left, and none to be had again: bounding set, ambient set, effective/permitted/inheritable."""
    for cap in range(LAST_CAP[0] + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            raise OSError(ctypes.get_errno(), f"dropping capability {cap} from the bounding set")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing the ambient capabilities")
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    check(libc.capset(header, (ctypes.c_uint32 * 6)()), "dropping capabilities")


def program(fds, launcher, modules, comm):
    """The program's process, pid 2: wait for the request, then run it as a direct run; never returns. A request
    that cannot be set up (a bad file name, a broken archive) is reported on the status pipe, as the launcher does."""
    request_fd, out_fd, err_fd, status_fd = fds
    try:
        posix.setsid()
        check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "making the program dumpable")  # as a cold run's program
        rename(b"gf-run-idle")  # until its request comes
        request = launcher.read_frame(request_fd)
        posix.close(request_fd)
        rename(comm)
        if request is None:  # the service gave this run up before sending it
            posix._exit(0)
        request.update(mode="direct", stdout_fd=out_fd, stderr_fd=err_fd, pidns=True)
        if len(sys.modules) != len(modules):  # `serve` left the launcher's table before forking: a backstop
            sys.modules.clear()
            sys.modules.update(modules)
        posix.chdir(request["workdir"])
        if request.get("archive"):
            launcher.extract_archive(request["workdir"], request["archive"])
        for name, content in request.get("files", {}).items():
            launcher.write_file(request["workdir"], name, content)
        compiled = launcher.Program(request)
    except BaseException as exc:
        message = launcher.describe(exc).encode()
        launcher.send_result(status_fd, launcher.SETUP_FAILED, 0, 0, 0, b"", message, 0)
        posix._exit(0)
    posix.close(status_fd)
    launcher.run_direct(request, compiled, request["cases"][0])

