"""The session kernel: runs inside the sandbox, in the launcher's process, for the whole life of a session.

Sent (compiled) with a session's first request and started by `launcher.main`. Python chunks run in this process
in one persistent namespace (variables, imports and definitions carry over, as in a notebook; a final expression's
value is printed like the REPL does); bash commands run as children in the shared, persistent workspace. Output is
captured from file descriptors 1 and 2, so it includes what subprocesses print. A chunk past its time limit is
interrupted (`TimeoutError`-like `ExecTimeout`); one that cannot be interrupted is the service's to kill, session
and all. Results use the launcher's frames.
"""

import _signal
import _thread
import posix
import select
import sys
import time

CAPTURE_GRACE_S = 0.5


class ExecTimeout(BaseException):
    """Raised into a Python chunk that outlives its time limit (a BaseException, so `except Exception` keeps out)."""


def serve(request, program, proto_in, proto_out, launcher):
    """Acknowledge the set-up, then answer `exec` frames until the service closes our stdin."""
    launcher.set_limits(request, cpu_s=request["session_cpu_s"])
    import builtins

    builtins.exit = builtins.quit = launcher.Quit()
    module = type(sys)("__main__")
    module.__dict__.update(program.namespace)
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    _signal.signal(_signal.SIGALRM, _on_alarm)
    launcher.send_result(proto_out, launcher.EXITED, 0, 0, 0, b"", b"", 0)  # set up: the session exists
    count = 0
    while True:
        chunk = launcher.read_frame(proto_in)
        if chunk is None:
            return
        count += 1
        limits = {**request, "timeout_s": chunk["timeout_s"], "wall_timeout_s": chunk["wall_timeout_s"]}
        if chunk["language"] == "python":
            _exec_python(chunk, module.__dict__, count, limits, proto_out, launcher)
        else:
            argv = [request["bash"], "-c", chunk["code"]]
            launcher.run_case(limits, program, {"stdin": chunk.get("stdin")}, proto_out, argv=argv)


def _on_alarm(signum, frame):
    raise ExecTimeout()


def _exec_python(chunk, namespace, count, limits, proto_out, launcher):
    capture = _Capture(limits["max_output"])
    stdin_fd = posix.memfd_create("stdin", 0)
    posix.write(stdin_fd, chunk.get("stdin") or b"")
    posix.lseek(stdin_fd, 0, 0)
    posix.dup2(stdin_fd, 0)
    posix.close(stdin_fd)
    sys.stdin = open(0, closefd=False)  # a fresh reader: fd 0 is this exec's stdin now
    start, cpu_start = time.monotonic(), time.process_time()
    kind, code = launcher.EXITED, 0
    kernel_pid = posix.getpid()
    capture.start()
    try:
        _signal.setitimer(_signal.ITIMER_REAL, chunk["wall_timeout_s"])
        _run_cell(chunk["code"], f"<cell {count}>", namespace)
    except ExecTimeout:
        kind = launcher.TIMED_OUT
    except SystemExit as exc:
        code = launcher.exit_code(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
    if posix.getpid() != kernel_pid:  # a copy the chunk forked (os.fork) ended: it must not answer for the kernel
        posix._exit(launcher.finalize(code))
    out, err, flags = capture.stop()
    launcher.kill_all(limits, posix.getpid())  # background processes the chunk started end with it
    duration_us, cpu_us = int((time.monotonic() - start) * 1e6), int((time.process_time() - cpu_start) * 1e6)
    launcher.send_result(proto_out, kind, code, duration_us, cpu_us, out, err, flags)


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


class _Capture:
    """Points fds 1 and 2 at pipes drained by a thread (keeping `limit` bytes of each) while a chunk runs."""

    def __init__(self, limit):
        self.limit = limit
        self.out_r, self.out_w = posix.pipe()
        self.err_r, self.err_w = posix.pipe()
        self.buffers = {self.out_r: bytearray(), self.err_r: bytearray()}
        self.truncated = set()
        self.stopping = False
        self.done = _thread.allocate_lock()

    def start(self):
        self.saved = (posix.dup(1), posix.dup(2))
        posix.dup2(self.out_w, 1)
        posix.dup2(self.err_w, 2)
        posix.close(self.out_w)
        posix.close(self.err_w)
        self.done.acquire()
        _thread.start_new_thread(self._pump, ())

    def stop(self):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        posix.dup2(self.saved[0], 1)
        posix.dup2(self.saved[1], 2)
        for fd in self.saved:
            posix.close(fd)
        if not self.done.acquire(True, CAPTURE_GRACE_S):  # a background child still holds the pipes
            self.stopping = True
            self.done.acquire()
        for fd in self.buffers:
            posix.close(fd)
        flags = (1 if self.out_r in self.truncated else 0) | (2 if self.err_r in self.truncated else 0)
        return bytes(self.buffers[self.out_r]), bytes(self.buffers[self.err_r]), flags

    def _pump(self):
        open_fds = list(self.buffers)
        try:
            while open_fds and not self.stopping:
                for fd in select.select(open_fds, [], [], 0.05)[0]:
                    data = posix.read(fd, 65536)
                    if not data:
                        open_fds.remove(fd)
                        continue
                    room = self.limit - len(self.buffers[fd])
                    if len(data) > room:
                        self.truncated.add(fd)
                    self.buffers[fd] += data[: max(room, 0)]
        finally:
            self.done.release()
