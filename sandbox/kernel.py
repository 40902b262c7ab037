"""The session kernel: runs inside the sandbox for the whole life of a session, started by `launcher.main`.

Sent (compiled) with a session's first request. Python chunks run in one persistent namespace (variables, imports
and definitions carry over, as in a notebook; a final expression's value is printed like the REPL does); bash
commands run as children in the shared, persistent workspace. Output is captured from file descriptors 1 and 2, so
it includes what subprocesses print. Results use the launcher's frames.

Two kinds of process, so the program can neither forge a result nor run between execs:

- The kernel is the launcher's process. It alone holds the protocol descriptors (the service's stdin and stdout),
  runs no model code, is non-dumpable (`launcher.main`: the program cannot ptrace it, open its `/proc/<pid>/mem` or
  reopen its descriptors) and is a child subreaper, so every process the program orphans comes back to it to be
  killed, reaped and have its CPU time counted.
- The worker runs the chunks and holds the Python state. It has no protocol descriptor, only its stdin (a memfd per
  exec), stdout and stderr (pipes the kernel reads), the exec-request pipe (`CTL_FD`) and the report pipe
  (`REPORT_FD`). It waits for each exec stopped (SIGSTOP, resumed by the kernel's SIGCONT).

One exec: the kernel resumes the worker and sends it the chunk; the worker runs it (a Python chunk past its
wall-clock limit is interrupted by `ExecTimeout`), flushes its output, forks its successor - a copy of the state with
only the forking thread (threads do not survive a fork) - waits until the successor has stopped itself, reports the
successor's pid on the report pipe and exits with the chunk's status (a bash command's signal is re-raised on
itself). So every thread the chunk started ends with the exec. The kernel collects stdout and stderr while the exec
runs; once the worker has exited it checks the report (a stopped child of its own, not the worker), kills every
other process of the sandbox but the successor (itself and the sandbox's init excepted), reaps them, reads what is
left in the output pipes (all their writers are dead but the stopped successor, so nothing of a later exec can be
attributed to this one), and answers with the worker's exit status and the CPU time of everything it reaped
(`RUSAGE_CHILDREN`). Frames forged on the report pipe gain nothing: the status comes from the worker's exit, and a
fake successor is only another copy of the program's own state.

The session ends (the frame carries `launcher.SESSION_ENDED`; the kernel then exits) when an exec leaves no
valid successor: the worker died of a signal or was killed (`os._exit`, a crash, the memory watch), it outlived its
wall-clock limit by `EXIT_GRACE_S` and was killed, it could not fork, or the session's CPU time
(`session_cpu_s`: all its processes', idle time included, each worker's RLIMIT_CPU set to what is left) is spent.
"""

import _signal
import marshal
import posix
import resource
import select
import sys
import time

CTL_FD, REPORT_FD = 3, 4
EXIT_GRACE_S = 1.0
"""How long past its wall-clock limit a worker may take to hand over before the kernel kills it (session ended)."""
REPORT_MAX_BYTES = 64
SWEEP_PAUSE_S = 0.001
SWEEP_ROUNDS = 5000
CHUNK = 65536
SIGCONT, SIGSTOP = 18, 19


class ExecTimeout(BaseException):
    """Raised into a Python chunk that outlives its time limit (a BaseException, so `except Exception` keeps out)."""


def serve(request, program, proto_in, proto_out, launcher):
    """Start the worker, acknowledge the set-up, then answer `exec` frames until the service closes our stdin."""
    launcher.prctl(launcher.PR_SET_CHILD_SUBREAPER, 1)
    kernel = Kernel(request, launcher, proto_out)
    if not kernel.start(program):
        message = b"the session's worker process did not start"
        launcher.send_result(proto_out, launcher.SETUP_FAILED, 0, 0, 0, b"", message, 0)
        return
    launcher.send_result(proto_out, launcher.EXITED, 0, 0, 0, b"", b"", 0)  # set up: the session exists
    while True:
        chunk = launcher.read_frame(proto_in)
        if chunk is None or not kernel.exec(chunk):
            kernel.sweep(None)
            return


class Kernel:
    """The kernel's side of a session: the pipes to the worker, the current worker and the CPU time used."""

    def __init__(self, request, launcher, proto_out):
        self.request, self.launcher, self.proto_out = request, launcher, proto_out
        self.worker = None
        self.cpu_used_s = 0.0

    def start(self, program):
        """Fork the first worker; whether it came up (stopped, waiting for its first exec)."""
        ctl_r, self.ctl_w = posix.pipe()
        self.report_r, report_w = posix.pipe()
        self.out_r, out_w = posix.pipe()
        self.err_r, err_w = posix.pipe()
        for fd in (self.report_r, self.out_r, self.err_r):
            posix.set_blocking(fd, False)
        pid = posix.fork()
        if pid == 0:
            _become_worker(self.request, program, self.launcher, {1: out_w, 2: err_w, CTL_FD: ctl_r,
                                                                  REPORT_FD: report_w})
        for fd in (ctl_r, report_w, out_w, err_w):
            posix.close(fd)
        if _stopped(pid, block=True):
            self.worker = pid
            return True
        self.sweep(None)
        return False

    def exec(self, chunk):
        """Run one exec in the worker and send its result; whether the session goes on."""
        request = self.request
        start, cpu_before = time.monotonic(), _children_cpu_s()
        worker, limit = self.worker, request["max_output"]
        order = {**chunk, "cpu_left_s": request["session_cpu_s"] - self.cpu_used_s}
        pidfd = posix.pidfd_open(worker)
        posix.kill(worker, SIGCONT)
        blob = marshal.dumps(order)
        self.launcher._write_all(self.ctl_w, b"%010d" % len(blob) + blob)
        output = {self.out_r: bytearray(), self.err_r: bytearray()}
        truncated = set()
        deadline = start + chunk["wall_timeout_s"] + EXIT_GRACE_S
        report = bytearray()  # the report pipe is drained too, so what the chunk writes there blocks nobody
        killed = False
        open_fds = [self.out_r, self.err_r, self.report_r]
        while True:
            wait = None if killed else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                posix.kill(worker, 9)  # stuck (uninterruptible, stopped by the chunk): the session ends
                killed, wait = True, None
            ready = select.select([*open_fds, pidfd], [], [], wait)[0]
            for fd in ready:
                if fd == self.report_r:
                    if not _read_tail(fd, report):
                        open_fds.remove(fd)
                elif fd != pidfd and not _read_into(fd, output[fd], limit, truncated):
                    open_fds.remove(fd)  # every writer closed it (the chunk closed its stdout, say)
            if pidfd in ready:
                break
        posix.close(pidfd)
        status = posix.waitpid(worker, 0)[1]
        _read_tail(self.report_r, report)
        successor, timed_out = (None, False) if killed else self._successor(worker, report)
        if not self.sweep(successor):
            successor = None
        for fd in output:
            _read_into(fd, output[fd], limit, truncated)
        cpu_s = _children_cpu_s() - cpu_before
        self.cpu_used_s += cpu_s
        if successor is not None and self.cpu_used_s >= request["session_cpu_s"]:  # the session's CPU is spent
            _kill(successor)
            _reap()
            successor = None
        if killed or timed_out:
            kind, code = self.launcher.TIMED_OUT, 0
        elif posix.WIFSIGNALED(status):
            kind, code = self.launcher.SIGNALED, posix.WTERMSIG(status)
        else:
            kind, code = self.launcher.EXITED, posix.WEXITSTATUS(status)
        flags = (1 if self.out_r in truncated else 0) | (2 if self.err_r in truncated else 0)
        flags |= self.launcher.SESSION_ENDED if successor is None else 0
        duration_us = int((time.monotonic() - start) * 1e6)
        out, err = bytes(output[self.out_r]), bytes(output[self.err_r])
        self.launcher.send_result(self.proto_out, kind, code, duration_us, int(cpu_s * 1e6), out, err, flags)
        self.worker = successor
        return successor is not None

    def _successor(self, worker, report):
        """(pid, timed out) from the last line the dead worker reported, if that pid is a stopped child of ours,
        else (None, False). What the chunk wrote there before is ignored; a forged last line gains nothing."""
        parts = report[:-1].rpartition(b"\n")[2].split() if report.endswith(b"\n") else []
        if len(parts) != 2:
            return None, False
        try:
            pid, timed_out = int(parts[0]), int(parts[1])
        except ValueError:
            return None, False
        if pid <= 1 or pid in (worker, posix.getpid()) or not _stopped(pid, block=False):
            return None, False
        return pid, bool(timed_out)

    def sweep(self, keep):
        """Kill and reap every process of the sandbox but ourselves, its init and `keep`; whether it managed.

        Without a PID namespace (`isolation: none`), only the worker's process group is killed (the successor has
        a group of its own; at the session's end it is the worker)."""
        if not self.request["pidns"]:
            if self.worker is not None:
                try:
                    posix.killpg(self.worker, 9)
                except OSError:
                    pass
            _reap()
            return True
        spared = {1, posix.getpid(), keep}
        for _ in range(SWEEP_ROUNDS):
            _reap()
            others = [int(name) for name in posix.listdir("/proc") if name.isdigit() and int(name) not in spared]
            if not others:
                return True
            for pid in others:
                _kill(pid)
            select.select([], [], [], SWEEP_PAUSE_S)
        if keep is not None:  # something would not die: give up on the session rather than on the sweep
            _kill(keep)
        return False


def _kill(pid):
    try:
        posix.kill(pid, 9)
    except OSError:
        pass


def _reap():
    """Collect every child of ours that has exited (a stopped successor is left alone)."""
    while True:
        try:
            pid = posix.waitpid(-1, posix.WNOHANG)[0]
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stopped(pid, block):
    """Whether our child `pid` is stopped (waiting for it to stop or end if `block`); consumes the stop report."""
    flags = posix.WSTOPPED | (posix.WEXITED | posix.WNOWAIT if block else posix.WNOHANG)
    try:
        info = posix.waitid(posix.P_PID, pid, flags)
    except ChildProcessError:
        return False
    if info is None or info.si_code != posix.CLD_STOPPED:
        return False
    if block:
        posix.waitid(posix.P_PID, pid, posix.WSTOPPED | posix.WNOHANG)
    return True


def _children_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _drain(fd, take):
    """Hand each chunk `fd` (non-blocking) holds now to `take`; False at its end."""
    while True:
        try:
            data = posix.read(fd, CHUNK)
        except BlockingIOError:
            return True
        if not data:
            return False
        take(data)


def _read_tail(fd, buffer):
    """Read what `fd` (non-blocking) holds now, keeping the last `REPORT_MAX_BYTES` of `buffer`; False at its end."""
    def take(data):
        buffer.extend(data)
        del buffer[:-REPORT_MAX_BYTES]

    return _drain(fd, take)


def _read_into(fd, buffer, limit, truncated):
    """Read what `fd` (non-blocking) holds now into `buffer`, keeping at most `limit` bytes; False at its end."""
    def take(data):
        room = limit - len(buffer)
        if len(data) > room:
            truncated.add(fd)
        buffer.extend(data[: max(room, 0)])

    return _drain(fd, take)


def _become_worker(request, program, launcher, fds):
    """In the first worker: keep only `fds` (moved to their numbers), drop the kernel's privileges and serve."""
    try:
        moved = {}
        for index, (target, fd) in enumerate(fds.items()):
            moved[target] = posix.dup2(fd, 100 + index)
        for target, fd in moved.items():
            posix.dup2(fd, target)
        posix.closerange(REPORT_FD + 1, 1 << 20)  # the protocol descriptors included
        for fd in (CTL_FD, REPORT_FD):
            posix.set_inheritable(fd, False)
        posix.setsid()
        launcher.prctl(launcher.PR_SET_DUMPABLE, 1)  # the program's own process, as in a run
        launcher.set_limits(request, cpu_s=request["session_cpu_s"])
        Worker(request, program, launcher).serve()
    except BaseException as exc:
        posix.write(2, ("sandbox: the session worker failed: " + launcher.describe(exc) + "\n").encode())
    posix._exit(127)


class Worker:
    """Runs the chunks in the session's namespace; every exec ends in a fork (see the module's docstring)."""

    def __init__(self, request, program, launcher):
        import builtins

        self.request, self.launcher = request, launcher
        builtins.exit = builtins.quit = launcher.Quit()
        self.module = type(sys)("__main__")
        self.module.__dict__.update(program.namespace)
        self.module.__builtins__ = builtins
        sys.modules["__main__"] = self.module
        _signal.signal(_signal.SIGALRM, _on_alarm)

    def serve(self):
        count = 0
        while True:
            posix.kill(posix.getpid(), SIGSTOP)  # nothing of the session runs between execs
            chunk = self.launcher.read_frame(CTL_FD)
            if chunk is None:
                posix._exit(0)
            count += 1
            self.run(chunk, count)  # returns in the successor only

    def run(self, chunk, count):
        worker = posix.getpid()
        _stdin(chunk.get("stdin") or b"")
        _limit_cpu(chunk["cpu_left_s"])
        timed_out, code, signum = self.attempt(chunk, count)
        if posix.getpid() != worker:  # a copy the chunk forked (os.fork) ended: it must not hand over
            posix._exit(self.launcher.finalize(code))
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            successor = posix.fork()
        except OSError:  # the chunk's processes took every slot: no successor, the session ends
            posix._exit(code)
        if successor == 0:
            posix.setsid()
            return
        posix.waitid(posix.P_PID, successor, posix.WSTOPPED | posix.WEXITED | posix.WNOWAIT)
        self.launcher._write_all(REPORT_FD, b"%d %d\n" % (successor, timed_out))
        if signum:
            _signal.signal(signum, _signal.SIG_DFL)
            posix.kill(worker, signum)
        posix._exit(code)

    def attempt(self, chunk, count):
        """Run the chunk; (timed out, exit status, signal that ended a bash command or 0)."""
        timed_out, code, signum = False, 0, 0
        try:
            try:
                _signal.setitimer(_signal.ITIMER_REAL, chunk["wall_timeout_s"])
                if chunk["language"] == "python":
                    _run_cell(chunk["code"], f"<cell {count}>", self.module.__dict__)
                else:
                    code, signum = self.bash(chunk)
            except SystemExit as exc:
                code = self.launcher.exit_code(exc)
            except ExecTimeout:
                raise
            except BaseException:
                sys.excepthook(*sys.exc_info())
                code = 1
            finally:
                _signal.setitimer(_signal.ITIMER_REAL, 0)
        except ExecTimeout:
            timed_out = True
        return timed_out, code, signum

    def bash(self, chunk):
        """Run a bash command as a child (its own CPU limit: `timeout_s`); (exit status, signal or 0)."""
        bash = self.request["bash"]
        pid = posix.fork()
        if pid == 0:
            try:
                cpu_s = max(1, -int(-chunk["timeout_s"] // 1))
                soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
                resource.setrlimit(resource.RLIMIT_CPU, (min(cpu_s, soft), min(cpu_s + 1, hard)))
                for signum in (_signal.SIGPIPE, _signal.SIGXFSZ):  # what Python ignores, a shell expects at default
                    _signal.signal(signum, _signal.SIG_DFL)
                posix.execv(bash, [bash, "-c", chunk["code"]])
            except BaseException as exc:
                posix.write(2, ("sandbox: could not start bash: " + self.launcher.describe(exc) + "\n").encode())
            posix._exit(127)
        status = posix.waitpid(pid, 0)[1]
        if posix.WIFSIGNALED(status):
            return 0, posix.WTERMSIG(status)
        return posix.WEXITSTATUS(status), 0


def _stdin(data):
    fd = posix.memfd_create("stdin", 0)
    posix.write(fd, data)
    posix.lseek(fd, 0, 0)
    posix.dup2(fd, 0)
    posix.close(fd)
    sys.stdin = open(0, closefd=False)  # a fresh reader: fd 0 is this exec's stdin now


def _limit_cpu(left_s):
    """The worker's CPU limit: what is left of the session's (each worker starts counting from zero)."""
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    seconds = max(1, int(left_s))
    if hard != resource.RLIM_INFINITY:
        seconds = min(seconds, hard - 1)
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))


def _on_alarm(signum, frame):
    raise ExecTimeout()


def _run_cell(source, filename, namespace):
    import ast

    tree = ast.parse(source, filename)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
        if value is not None:
            print(repr(value))
