"""The supervisor that runs *inside* the sandbox: it receives one request, runs the program, reports the results.

The service compiles this file once with the sandbox's interpreter and sends the code object to a tiny stub
(`STUB`, run as `python -I -S -c STUB`), so no run pays for compiling it. It must start fast: it imports only
modules compiled into the interpreter (`posix`, `marshal`, `select`, ...) plus `resource`; never `os`, `signal` or
`json`, which cost milliseconds each.

Protocol (the service is trusted; the program under test is not):

- service -> launcher, on stdin: frames of `<10 ASCII digits: length><marshal blob>`: this code object, then the
  request (`mode` "run" or "session", `language`, `code`, `archive`, `files`, `cases`, limits); in session mode
  each further frame is one `exec`.
- launcher -> service, on stdout: `@@GF-READY` once it is up (before any model code runs, so anything odd after it
  is the program's doing, never the infrastructure's), then one result per case or exec (none in direct mode):
  `@@GF-RESULT <kind> <code> <duration_us> <cpu_us> <stdout_len> <stderr_len> <flags>\\n<stdout><stderr>`; kind
  0 = exited with `code`, 1 = killed by signal `code`, 2 = past its wall-clock limit, 3 = could not be set up
  (message in stderr); flags bit 0/1 = stdout/stderr truncated, bit 2 (`SESSION_ENDED`) = the session's kernel ended
  the session with this exec (`sandbox.kernel`).

The protocol descriptors are the supervisor's alone; the program under test never holds one, so it cannot write a
result frame of its own (a forged status or an extra frame that would shift every later result):

- a single Python run ("direct" mode) runs the program in this very process, so the launcher closes every descriptor
  but the program's stdin, stdout and stderr before it starts, and reports nothing afterwards: the service reads the
  outcome from the sandbox's exit status (bwrap exits with the program's status, or 128 + the signal that ended
  it) and measures the duration itself;
- batches fork each case with only its own three descriptors; sessions run their code in a worker process that has
  none (`sandbox.kernel`);
- the supervisor (batch launcher, session kernel) makes itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`, through
  `_ctypes` because `ctypes` costs ~14 ms to import, `_ctypes` ~0.7), so a case running as the same uid cannot
  ptrace it, open its `/proc/<pid>/mem` or reopen its descriptors through `/proc/<pid>/fd`.

Limits: `timeout_s` is each process's CPU time (RLIMIT_CPU, whole seconds), `wall_timeout_s` the case's wall-clock
deadline, enforced here by killing the case.

Each case runs in a forked child (its own session and rlimits, stdin from a memfd, stdout/stderr on pipes read here
and truncated at `max_output` bytes while the rest is drained). Python programs are compiled once and executed in
the forked copy of this interpreter, so a 100-case batch pays for one interpreter start; bash is exec'd. When a
case ends, every other process in the sandbox is killed (`kill(-1)`, only when inside a PID namespace). A single
Python case ("direct" mode) runs in this process itself, without the fork (see `sandbox.process`).
"""

import _signal
import marshal
import posix
import resource
import select
import sys
import time

STUB = (
    "import marshal,posix\n"
    "def r(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=posix.read(0,n-len(b))\n"
    "  if not c:raise SystemExit(3)\n"
    "  b+=c\n"
    " return b\n"
    "exec(marshal.loads(r(int(r(10)))))\n"
)
READY = b"@@GF-READY\n"
EXITED, SIGNALED, TIMED_OUT, SETUP_FAILED = 0, 1, 2, 3
SIGKILL = 9
SESSION_ENDED = 4
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
DRAIN_AFTER_EXIT_S = 1.0
CHUNK = 65536


def main():
    modules = dict(sys.modules)  # what a direct run's program finds; the fork server gives each run this table
    proto_in, proto_out = posix.dup(0), posix.dup(1)
    null = posix.open("/dev/null", posix.O_RDWR)
    posix.dup2(null, 0)
    posix.dup2(null, 1)
    posix.close(null)
    _write_all(proto_out, READY)
    request = read_frame(proto_in)
    if request is None:
        return
    try:
        if request["mode"] != "direct":  # a supervisor: the program must not reach into it (the module's docstring)
            prctl(PR_SET_DUMPABLE, 0)
        if request["mode"] == "forkserver":  # `sandbox.forkserver`: forks one sandbox per one-shot Python run
            forkserver = {"__name__": "gymfleet_forkserver"}
            exec(marshal.loads(request["forkserver"]), forkserver)
            forkserver["serve"](request, proto_in, proto_out, _namespace(), modules)
            return
        posix.chdir(request["workdir"])
        if request.get("archive"):
            extract_archive(request["workdir"], request["archive"])
        for name, content in request.get("files", {}).items():
            write_file(request["workdir"], name, content)
        program = Program(request)
    except Exception as exc:  # the caller's files or prelude are broken: say so instead of dying silently
        send_result(proto_out, SETUP_FAILED, 0, 0, 0, b"", describe(exc).encode(), 0)
        return
    if request["mode"] == "direct":
        run_direct(request, program, request["cases"][0])
    if request["mode"] == "session":
        kernel = {"__name__": "gymfleet_kernel"}
        exec(marshal.loads(request["kernel"]), kernel)
        kernel["serve"](request, program, proto_in, proto_out, _namespace())
        return
    for case in request["cases"]:
        kind, code = run_case(request, program, case, proto_out)
        if request.get("stop_on_failure") and not (kind == EXITED and code == 0):
            break


def _namespace():
    """This module, for the code the launcher runs (session kernel, fork server)."""
    namespace = type(sys)("launcher")
    namespace.__dict__.update(globals())
    return namespace


class Program:
    """What each case runs: a compiled Python code object (or its compile error), or a bash script."""

    def __init__(self, request):
        self.language = request["language"]
        self.namespace = {"__name__": "__main__", "__doc__": None, "__package__": None, "__spec__": None}
        self.code = self.error = None
        name = "main.py" if self.language == "python" else "main.sh"
        self.path = request["workdir"] + "/" + name
        if request["mode"] != "session":  # a session's workspace holds only the session's own files
            write_file(request["workdir"], name, request.get("code") or "")
        self.argv = [request["bash"], self.path]
        if self.language != "python":
            return
        sys.path.insert(0, request["workdir"])
        if request.get("prelude"):
            exec(compile(request["prelude"], "<prelude>", "exec", dont_inherit=True), self.namespace)
        try:
            self.code = compile(request.get("code") or "", self.path, "exec", dont_inherit=True)
        except Exception as exc:  # SyntaxError, and RecursionError or MemoryError from a pathological program
            self.error = exc


def run_direct(request, program, case):
    """Run the only case of a Python run in this very process (no fork), on the service's own stdout and stderr
    pipes, then end with its exit status. Nothing is reported on the protocol channel: the program holds no
    descriptor but its stdin, stdout and stderr (so it cannot forge a result), and bwrap's exit status says how it
    ended (a signal that ends the program ends us: bwrap exits with 128 + the signal)."""
    stdin_fd = _stdin(case)
    for target, fd in enumerate((stdin_fd, request["stdout_fd"], request["stderr_fd"])):
        posix.dup2(fd, target)
    posix.closerange(3, 1 << 20)  # the protocol descriptors included
    set_limits(request)
    launcher_pid = posix.getpid()
    code = run_python(program, case)
    if posix.getpid() != launcher_pid:  # a copy the program forked (os.fork) ended: only the original decides
        posix._exit(code)
    for fd in (1, 2):
        posix.close(fd)
    kill_all(request, 0)  # what the program left running would hold its output pipes open
    posix._exit(code)


def _stdin(case):
    stdin_fd = posix.memfd_create("stdin", 0)
    _write_all(stdin_fd, case.get("stdin") or b"")
    posix.lseek(stdin_fd, 0, 0)
    return stdin_fd


def run_case(request, program, case, proto_out, argv=None):
    """Run one case in a forked child and send its result frame; returns (kind, code)."""
    stdin_fd = _stdin(case)
    out_r, out_w = posix.pipe()
    err_r, err_w = posix.pipe()
    start = time.monotonic()
    pid = posix.fork()
    if pid == 0:
        _child(request, program, case, (stdin_fd, out_w, err_w), argv)
    for fd in (stdin_fd, out_w, err_w):
        posix.close(fd)
    kind, code, cpu_us, out, err, flags = supervise(request, pid, out_r, err_r, start)
    send_result(proto_out, kind, code, int((time.monotonic() - start) * 1e6), cpu_us, out, err, flags)
    return kind, code


def supervise(request, pid, out_r, err_r, start):
    """Collect a child's output until it exits or its time is up; kill whatever it leaves behind."""
    limit = request["max_output"]
    buffers = {out_r: bytearray(), err_r: bytearray()}
    truncated = set()
    open_fds = [out_r, err_r]
    pidfd = posix.pidfd_open(pid)
    deadline = start + request["wall_timeout_s"]
    status = drain_until = None
    cpu_us = 0
    timed_out = False
    while status is None or open_fds:
        now = time.monotonic()
        if status is None and not timed_out and now >= deadline:
            timed_out = True
            kill_all(request, pid)
        if status is None:
            wait = 1.0 if timed_out else deadline - now
        else:
            wait = drain_until - now
            if wait <= 0:
                break  # something we could not kill still holds a pipe open; what we have is the output
        ready = select.select(open_fds + ([pidfd] if status is None else []), [], [], max(wait, 0.0))[0]
        for fd in ready:
            if fd == pidfd:
                status, usage = posix.wait4(pid, 0)[1:]
                cpu_us = int((usage.ru_utime + usage.ru_stime) * 1e6)
                kill_all(request, pid)  # nothing a case starts outlives it
                drain_until = time.monotonic() + DRAIN_AFTER_EXIT_S
                continue
            data = posix.read(fd, CHUNK)
            if not data:
                open_fds.remove(fd)
            elif len(data) > limit - len(buffers[fd]):
                truncated.add(fd)
                buffers[fd] += data[: limit - len(buffers[fd])]
            else:
                buffers[fd] += data
    for fd in (out_r, err_r, pidfd):
        posix.close(fd)
    flags = (1 if out_r in truncated else 0) | (2 if err_r in truncated else 0)
    out, err = bytes(buffers[out_r]), bytes(buffers[err_r])
    if timed_out:
        return TIMED_OUT, 0, cpu_us, out, err, flags
    if posix.WIFSIGNALED(status):
        return SIGNALED, posix.WTERMSIG(status), cpu_us, out, err, flags
    return EXITED, posix.WEXITSTATUS(status), cpu_us, out, err, flags


def kill_all(request, pid):
    """Kill the case's processes: all of the sandbox but us and its init, or (no PID namespace) its group."""
    try:
        if request["pidns"]:
            posix.kill(-1, SIGKILL)
        else:
            posix.killpg(pid, SIGKILL)
    except OSError:
        pass


def _child(request, program, case, fds, argv):
    try:
        posix.setsid()
        for target, fd in enumerate(fds):
            posix.dup2(fd, target)
        posix.closerange(3, 1 << 20)
        set_limits(request)
        if argv is None and program.language == "python":
            posix._exit(run_python(program, case))
        argv = argv or program.argv + list(case.get("args") or ())
        for signum in (_signal.SIGPIPE, _signal.SIGXFSZ):  # what Python ignores, a shell expects at default
            _signal.signal(signum, _signal.SIG_DFL)
        posix.execv(argv[0], argv)
    except BaseException as exc:
        posix.write(2, ("sandbox: could not start the program: " + describe(exc) + "\n").encode())
    posix._exit(127)


def set_limits(request, cpu_s=None):
    """Address space, CPU seconds, processes, file size and open files, for this process and its children; and the
    OOM killer's first choice: an OOM in the run's memory cgroup (`sandbox.cgroups`), or the host's, takes the
    program before its supervisor or the sandbox's init (raising the score needs no privilege)."""
    try:
        fd = posix.open("/proc/self/oom_score_adj", posix.O_WRONLY)
        try:
            posix.write(fd, b"1000")
        finally:
            posix.close(fd)
    except OSError:
        pass

    def limit(which, value):
        resource.setrlimit(which, (value, value))

    cpu_s = cpu_s or max(1, -int(-request["timeout_s"] // 1))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # SIGXCPU at the limit, SIGKILL a second later
    limit(resource.RLIMIT_AS, request["memory_bytes"])
    if request["max_processes"] is not None:  # None: a pids cgroup limits the run (`sandbox.forkserver`)
        limit(resource.RLIMIT_NPROC, request["max_processes"])
    limit(resource.RLIMIT_FSIZE, request["max_file_bytes"])
    limit(resource.RLIMIT_NOFILE, request["max_open_files"])
    limit(resource.RLIMIT_CORE, 0)
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    stack = request["memory_bytes"] if hard == resource.RLIM_INFINITY else min(hard, request["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_STACK, (stack, hard))  # deep recursion is common in contest code


class Quit:
    """`exit()` / `quit()`: the interpreter runs without `site`, which is what normally defines them."""

    def __call__(self, code=None):
        raise SystemExit(code)

    def __repr__(self):
        return "Use exit() or Ctrl-D (i.e. EOF) to exit"


def run_python(program, case):
    """Behave as `python main.py args...` would, in this interpreter; returns the exit status it would have."""
    import builtins

    builtins.exit = builtins.quit = Quit()
    sys.argv = [program.path, *(case.get("args") or ())]
    module = type(sys)("__main__")
    module.__dict__.update(program.namespace)
    module.__file__ = program.path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    code = 0
    try:
        if program.error is not None:
            raise program.error
        exec(program.code, module.__dict__)
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException as exc:
        traceback = exc.__traceback__ if exc is not program.error else None  # a compile error has no frames
        exc = exc.with_traceback(traceback and traceback.tb_next)  # hide this function's frame
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    return finalize(code)


def exit_code(exc):
    """The status `python` exits with for an uncaught `SystemExit` (printing a non-integer code, as it does)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:
        sys.stderr.write(str(exc.code) + "\n")
    except Exception:
        pass
    return 1


def finalize(code):
    """What interpreter shutdown does: wait for non-daemon threads, run atexit hooks, flush stdio."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # contest code often runs main() in a big-stack thread and returns at once
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120
    return code


def write_file(workdir, name, content):
    """Write `content` to `workdir/name`, creating folders; `name` must stay inside `workdir`."""
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"file name {name!r} must be relative and stay inside the workspace")
    path = workdir
    for part in name.split("/")[:-1]:
        path += "/" + part
        try:
            posix.mkdir(path, 0o755)
        except FileExistsError:
            pass
    fd = posix.open(workdir + "/" + name, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o644)
    try:
        _write_all(fd, content if isinstance(content, bytes) else content.encode())
    finally:
        posix.close(fd)


def extract_archive(workdir, archive):
    """Unpack a tar archive (gzip, bz2 or xz too) into `workdir`: regular files, folders and symlinks whose target
    stays inside; anything that would land outside (absolute or `..` paths, links out) is refused."""
    import io
    import os
    import tarfile

    root = os.path.realpath(workdir)

    def inside(path):
        return path == root or path.startswith(root + "/")

    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        for member in tar:
            target = os.path.join(root, member.name)
            if member.name.startswith("/") or not inside(os.path.realpath(target)):
                raise ValueError(f"archive member {member.name!r} would land outside the workspace")
            if member.issym() and not inside(os.path.realpath(os.path.join(os.path.dirname(target), member.linkname))):
                raise ValueError(f"archive symlink {member.name!r} -> {member.linkname!r} leaves the workspace")
            if not (member.isfile() or member.isdir() or member.issym()):
                continue  # devices, fifos, hard links: nothing a repository needs
            member.mode = (member.mode & 0o755) | (0o700 if member.isdir() else 0o600)
            member.uid, member.gid, member.uname, member.gname = posix.getuid(), posix.getgid(), "", ""
            tar.extract(member, root, set_attrs=not member.issym())


def prctl(option, value):
    """`prctl(option, value)` through `_ctypes` (the `ctypes` package costs ~14 ms to import; this ~0.7 ms).

    Raises:
        OSError: the call failed.
    """
    import _ctypes

    function = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")
    if _ctypes.call_function(function, (option, value, 0, 0, 0)) != 0:
        raise OSError(f"prctl({option}, {value}) failed")


def send_result(fd, kind, code, duration_us, cpu_us, out, err, flags):
    header = b"@@GF-RESULT %d %d %d %d %d %d %d\n" % (kind, code, duration_us, cpu_us, len(out), len(err), flags)
    _write_all(fd, header + out + err)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view) :]


def _read_exact(fd, size):
    chunks = bytearray()
    while len(chunks) < size:
        data = posix.read(fd, min(size - len(chunks), 1 << 20))
        if not data:
            return None
        chunks += data
    return bytes(chunks)


def read_frame(fd):
    """The next `<10 digits><marshal>` frame from `fd`, or None at end of input."""
    header = _read_exact(fd, 10)
    if header is None:
        return None
    body = _read_exact(fd, int(header))
    return None if body is None else marshal.loads(body)


def describe(exc):
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    main()
    posix._exit(0)  # skip interpreter shutdown: the service is waiting for this process to end
