"""``divergence train`` children forked from a server that imported the heavy modules once.

Why: every ``divergence train`` child (a study's or an atlas's pair run, a separate-job pair's arm
job) spends seconds of CPU importing before it trains (``python -X importtime``: torchmetrics,
torch._dynamo, scipy.signal, transformers), and a CPU atlas starts hundreds of children. A small zygote
(the idea of Android's zygote and of ``multiprocessing``'s forkserver) imports ``PRELOAD`` once;
each child is an ``os.fork()`` of it, so it starts with those modules imported. What that saves a
child and a separate-job pair is measured in docs/measurements.md ("Children forked from the
zygote", ``benchmarks/child_start.py``).

What is forked from the one zygote: the study's (or atlas's) pair runs and, inside a forked pair
run, its separate-job arm jobs. Each forked child gets its own control socket to the zygote
(``inherited``), so ``start`` in it asks that same zygote, whose key it knows, and none of these
processes forks itself: a pair run has run torch and may hold threads; only the zygote, which has
done neither, forks. A zygote serves every open control socket and exits once all are closed (each
with its process) and every child is reaped. A key that does not match starts a new zygote. The
ranks 1..N-1 of a multi-rank arm are started by Lightning's own launcher, as fresh interpreters.

How a child is made the same as ``python -m divergence ARGS`` run with env ENV, cwd and stdio:
the zygote receives the command, ENV, the cwd and the caller's fds 0, 1, 2 (``SCM_RIGHTS``); the
forked child ``dup2``s the fds onto 0, 1, 2 (C-level output goes to the log too), replaces
``os.environ`` by ENV (plus what the imports set in it, as in a fresh interpreter: Lightning's
``PYTORCH_NVML_BASED_CUDA_CHECK=1``), changes to the cwd, sets ``sys.argv``/``sys.orig_argv`` and
runs the package with ``runpy.run_module(..., alter_sys=True)``, so ``__main__.__spec__`` and
``sys.argv`` are those of ``python -m divergence``, from which Lightning's launcher builds the
command of an arm's rank 1 (``python -m divergence.__main__ ARGS``). Its exit is the interpreter's
own (``SystemExit`` codes, 1 for an exception, death by SIGINT on an uncaught Ctrl-C, atexit
handlers run). The child is the zygote's child: the zygote reaps it and sends its exit code
(``Popen.returncode``'s convention: -N for signal N) to the caller's ``ForkedChild``, which is used
like a ``Popen`` (pid, poll, wait(timeout) raising ``TimeoutExpired``, terminate, kill,
returncode); SIGTERM goes straight to the child, whose handlers are the default ones (SIGINT:
``KeyboardInterrupt``), so ``training.stop_signals`` and Lightning's handlers see it as with
``Popen``.

Fork safety: the zygote runs no torch compute and starts no thread; it refuses to serve (the
caller falls back to ``Popen``) unless it has exactly one thread after importing
(``/proc/self/task`` and ``threading``). Importing numpy and scipy loads two OpenBLAS builds, each
starting an idle thread pool; OpenBLAS stops its pool at a fork (``pthread_atfork``), so the zygote
forks once, empty, before it counts (``_quiesce``). It never queries CUDA, so
``CUDA_VISIBLE_DEVICES`` is read by each child.

Garbage collection: once imported, the zygote freezes its objects (``gc.freeze``, the recipe of
Python's ``gc`` documentation for a process that forks without exec): a child's collector never
scans the millions of preloaded objects again, above all in the full collections of the
interpreter's exit (seconds of CPU of every forked child; docs/measurements.md), nor writes the collector's bookkeeping into their shared pages (copy-on-write).

Environment: the preloaded modules read environment at import (torch._inductor.config alone
reads ~190 variables: ``TORCHINDUCTOR_CACHE_DIR`` and the rest; libgomp reads ``OMP_*`` when it
is loaded; Lightning and torchmetrics read ``LOCAL_RANK``/``RANK``), so the zygote is started
lazily, at the first child, with that child's environment and cwd, and a child is forked from it
only if its environment equals the zygote's in every variable except ``JOB_ONLY`` (read by wandb,
which the zygote never imports, or pytest's per-test name). Any other difference starts a new
zygote (the old one exits once its children have). ``DIVERGENCE_CHILD_START=popen`` turns all this
off (``Popen``); off Linux, or when the zygote cannot start, children are started with ``Popen``.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

MODE_VARIABLE = "DIVERGENCE_CHILD_START"
MODES = ("fork", "popen")
# What `divergence train` imports before it trains, of a single run and of a pair (the heavy part is torch,
# lightning, and the model classes of diffusers and transformers, which import peft, torchao and accelerate).
PRELOAD = (
    "divergence.cli",
    "divergence.training.arms_module",
    "divergence.training.fit",
    "divergence.training.single",
    "divergence.training.lockstep",
    "divergence.training.separate_arm",
    "divergence.training.separate_pair",
    "divergence.variants.pair_recipe",
    "divergence.models.sampling",
    "divergence.attention.processor",
    "divergence.loggers.sinks",
    "divergence.store",
    "divergence.training.probe",
    "divergence.training.checkpoint_io",
    "diffusers.optimization",
    "diffusers.schedulers.scheduling_ddpm",
    "diffusers.models.unets.unet_2d_condition",
    "transformers.models.clip.modeling_clip",
)
# Variables a child may have different from the zygote's: read only when wandb starts a run (wandb is not
# preloaded), or only by test helpers no preloaded module imports (pytest sets PYTEST_CURRENT_TEST per test),
# and ``MODE_VARIABLE``, read by ``start`` only (a child told ``popen`` Popens its own children).
JOB_ONLY = ("WANDB_RUN_GROUP", "WANDB_SERVICE", "PYTEST_CURRENT_TEST", MODE_VARIABLE)
PACKAGE = "divergence"
COMMANDS = "divergence.cli"  # preloaded (PRELOAD), with each of its command modules
_MESSAGE = 1 << 20
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def start(command: list[str], env: dict[str, str], stdout=None, stderr=None):
    """``subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr)``, or the same child forked
    from the zygote when ``command`` is ``[sys.executable, -m, divergence, ...]`` and the mode allows
    it. ``stdout``/``stderr``: None (ours), a file or an fd; ``stderr`` also ``subprocess.STDOUT``.
    In a forked child, the zygote that forked it serves when the key matches."""
    if _mode(env) == "fork" and list(command[:3]) == [sys.executable, "-m", PACKAGE]:
        zygote = _zygote(env)
        if zygote is not None:
            child = zygote.fork(list(command), env, stdout, stderr)
            if child is not None:
                return child
    return subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr)


def _mode(env: dict[str, str]) -> str:
    """The child's ``DIVERGENCE_CHILD_START`` (its environment is ours, plus what the caller sets)."""
    from divergence.errors import UserInputError

    mode = env.get(MODE_VARIABLE, "fork") or "fork"
    if mode not in MODES:
        raise UserInputError(f"{MODE_VARIABLE}={mode}: use one of {', '.join(MODES)}")
    if not sys.platform.startswith("linux"):
        return "popen"
    return mode


class ForkedChild:
    """A child forked by the zygote, used like ``subprocess.Popen``: the zygote sends its exit code."""

    def __init__(self, args: list[str], pid: int, status: socket.socket):
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._status = status
        # a signal handler may poll or signal while ``wait`` blocks: one reader at a time (as Popen's)
        self._reading = threading.Lock()

    def poll(self) -> int | None:
        if self.returncode is None and self._reading.acquire(blocking=False):
            try:
                if self.returncode is None and select.select([self._status], [], [], 0)[0]:
                    self._read()
            finally:
                self._reading.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._reading.acquire(timeout=-1 if timeout is None else timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
            try:
                if self.returncode is None:
                    if not select.select([self._status], [], [], timeout)[0]:
                        raise subprocess.TimeoutExpired(self.args, timeout)
                    self._read()
            finally:
                self._reading.release()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a signal to a pid the zygote has reaped (as Popen)
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self) -> None:
        message = self._status.recv(_MESSAGE)
        self._status.close()
        # no message: the zygote itself was killed; the child's code is lost, and it counts as failed
        self.returncode = json.loads(message)["returncode"] if message else 1


class Zygote:
    """The caller's side of one zygote: a control socket, the environment and cwd it imported under
    (``key``), what its imports changed in that environment (``imported``: name -> [before, after]),
    its process (None in a forked child, whose zygote is its parent's: ``inherited``), and how many
    objects it froze for its children's collectors (``frozen``)."""

    def __init__(self, control: socket.socket, key: tuple, imported: dict, process=None, error=None, frozen=0):
        self.control, self.key, self.imported, self.process, self.error = control, key, imported, process, error
        self.frozen = frozen

    @classmethod
    def start(cls, env: dict[str, str], cwd: str) -> Zygote:
        """A new zygote process, once it has imported ``PRELOAD`` (or refused: ``error``)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = f"from divergence.training.child_start import serve; serve({theirs.fileno()})"
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            cwd=cwd,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        theirs.close()
        ready = json.loads(ours.recv(_MESSAGE) or b'{"error": "exited while importing"}')
        return cls(ours, _key(env, cwd), ready.get("imported", {}), process, ready.get("error"), ready.get("frozen", 0))

    def serves(self, env: dict[str, str], cwd: str) -> bool:
        """Whether a child with ``env`` and ``cwd`` may be forked from this zygote: the key matches once a
        variable that holds what the zygote's imports set it to counts as it was before them (a child of a
        forked child has those in its environment, as a fresh interpreter's child has)."""
        env = dict(env)
        for name, (before, after) in self.imported.items():
            if env.get(name) == after:
                env.pop(name, None) if before is None else env.__setitem__(name, before)
        return _key(env, cwd) == self.key

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def fork(self, command: list[str], env: dict[str, str], stdout, stderr) -> ForkedChild | None:
        """The forked child, or None when the zygote is gone (the caller starts a Popen)."""
        status, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = {
            "module": command[2],
            "args": command[3:],
            "env": env,
            "cwd": os.getcwd(),
            "ignored": [s.name for s in _STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN],
        }
        fds = [_fd(None, 0), _fd(stdout, 1), _fd(stdout, 1) if stderr == subprocess.STDOUT else _fd(stderr, 2)]
        try:
            socket.send_fds(self.control, [json.dumps(request).encode()], [*fds, theirs.fileno()])
            message = status.recv(_MESSAGE)
        except OSError:
            message = b""
        finally:
            theirs.close()
            for fd in set(fds) - set(_given(stdout, stderr)):
                os.close(fd)  # a /dev/null opened for a closed fd
        if not message:
            status.close()
            return None
        return ForkedChild(command, json.loads(message)["pid"], status)

    def close(self) -> None:
        """The zygote exits once the children it forked have (it still reports their exit codes)."""
        self.control.close()


_zygotes: dict[tuple, Zygote] = {}
inherited: Zygote | None = None  # in a forked child: the zygote that forked it (``_become``)


def _zygote(env: dict[str, str]) -> Zygote | None:
    """The zygote for ``env`` and our cwd: the one that forked us, or ours, or one started now (a
    zygote of another key is closed)."""
    cwd = os.getcwd()
    if inherited is not None and inherited.serves(env, cwd):
        return inherited
    key = _key(env, cwd)
    zygote = _zygotes.get(key)
    if zygote is not None and zygote.alive():
        return zygote
    close_all()
    try:
        zygote = Zygote.start(env, cwd)
    except OSError as err:
        print(f"divergence: cannot start the fork server ({err}); starting children with Popen", file=sys.stderr)
        return None
    if zygote.error:
        zygote.close()
        print(f"divergence: fork server refused ({zygote.error}); starting children with Popen", file=sys.stderr)
        return None
    _zygotes[key] = zygote
    return zygote


def close_all() -> None:
    """Close every zygote (each exits once its children have); a process's exit closes them too."""
    for zygote in _zygotes.values():
        zygote.close()
    _zygotes.clear()


def _key(env: dict[str, str], cwd: str) -> tuple:
    return sys.executable, cwd, frozenset((k, v) for k, v in env.items() if k not in JOB_ONLY)


def _given(*streams) -> list[int]:
    """The fds the caller holds: ours and those of the streams it passed."""
    return [0, 1, 2, *(s if isinstance(s, int) else s.fileno() for s in streams if s not in (None, subprocess.STDOUT))]


def _fd(stream, default: int) -> int:
    """The fd a Popen argument names (None: ours), or /dev/null's where ours is closed."""
    fd = default if stream is None else stream if isinstance(stream, int) else stream.fileno()
    try:
        os.fstat(fd)
    except OSError:
        return os.open(os.devnull, os.O_RDWR)
    return fd


# The zygote's side.


def serve(fd: int) -> None:
    """The zygote's main: import ``PRELOAD``, then fork a child per request until every control
    socket (the caller's, and each forked child's own) is closed and every child has been reaped.
    Returns in a forked child only, which then becomes ``python -m divergence ARGS`` (its exit is the
    interpreter's)."""
    control = socket.socket(fileno=fd)
    key, before = _key(dict(os.environ), os.getcwd()), dict(os.environ)
    error = _preload()
    imported = {
        k: [before.get(k), os.environ.get(k)] for k in {*before, *os.environ} if before.get(k) != os.environ.get(k)
    }
    if error:
        control.send(json.dumps({"error": error}).encode())
        return
    gc.freeze()  # the imported objects: never scanned again by a child's collector (module docstring)
    control.send(json.dumps({"ready": True, "imported": imported, "frozen": gc.get_freeze_count()}).encode())
    request, fds, own = _serve(control)
    _become(request, fds, Zygote(own, key, imported))


def _preload() -> str | None:
    """Import ``PRELOAD``; why this process must not fork, or None."""
    import importlib
    import pkgutil
    import threading

    for name in PRELOAD:
        importlib.import_module(name)
    # every command's module, by name: the zygote serves ``python -m divergence``, the layer above this one
    for command in pkgutil.iter_modules(sys.modules[COMMANDS].__path__):
        importlib.import_module(f"{COMMANDS}.{command.name}")
    if "wandb" in sys.modules:  # JOB_ONLY holds only while wandb reads its variables in the child
        return "wandb was imported; the WANDB_* variables it read would be the zygote's"
    _quiesce()
    threads = threads_running(), threading.active_count()
    if threads != (1, 1):
        return f"{threads[0]} threads ({threads[1]} Python ones) after importing; a fork would copy their locks"
    return None


def _quiesce() -> None:
    """Fork once and reap the child: the libraries that keep idle worker threads from the moment they
    are loaded (numpy's and scipy's OpenBLAS, one pool each) stop them at a fork (their
    ``pthread_atfork`` handler) and start them again only when next used, which the zygote never does."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def threads_running() -> int:
    """This process's threads, as the kernel counts them (Python's and native ones alike)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _serve(control: socket.socket):
    """Fork a child per request on any control socket and report each child's exit; in a child, its
    request, its fds and its own control socket (the child's requests come back to this process)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for s in _STOP_SIGNALS:  # stopped through the control sockets only: it must outlive its children
        signal.signal(s, signal.SIG_IGN)
    controls, children = {control}, {}
    while controls or children:
        ready = select.select([*controls, wake_r], [], [])[0]
        if wake_r in ready:
            while _drained(wake_r):
                pass
        _reap(children)
        for sock in controls.intersection(ready):
            message, fds, _flags, _address = socket.recv_fds(sock, _MESSAGE, 4)
            if not message or len(fds) != 4:  # closed: its process (and every fork of it) has exited
                controls.discard(sock)
                sock.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                for other in (*controls, *children.values(), ours):
                    other.close()
                os.close(wake_r)
                os.close(wake_w)
                os.close(fds[3])
                return json.loads(message), fds[:3], theirs
            theirs.close()
            controls.add(ours)
            for stdio in fds[:3]:
                os.close(stdio)
            status = socket.socket(fileno=fds[3])
            status.send(json.dumps({"pid": pid}).encode())
            children[pid] = status
    sys.exit(0)


def _drained(fd: int) -> bool:
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        pid, wait_status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        status = children.pop(pid, None)
        if status is not None:
            try:
                status.send(json.dumps({"returncode": os.waitstatus_to_exitcode(wait_status)}).encode())
            except OSError:
                pass  # the caller is gone
            status.close()


def _become(request: dict, fds: list[int], zygote: Zygote) -> None:
    """This forked process becomes ``python -m divergence ARGS`` with the request's env (and what the
    imports set in it, as they would have), cwd and stdio; ``zygote`` forks its own children."""
    import runpy

    global inherited
    inherited = zygote

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in request["ignored"]:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    if os.isatty(1):  # as Python decides at start (the zygote's stdout is /dev/null, its environment the child's)
        sys.stdout.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(request["env"])
    for name, (before, after) in zygote.imported.items():  # lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1
        if os.environ.get(name) == before:
            os.environ.pop(name, None) if after is None else os.environ.__setitem__(name, after)
    os.chdir(request["cwd"])
    if sys.path and sys.path[0] == "":
        sys.path[0] = request["cwd"]  # `python -m` puts the cwd first
    sys.argv = ["-m", *request["args"]]
    sys.orig_argv = [sys.executable, "-m", request["module"], *request["args"]]
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
