"""Our processes: commands run to completion, long-running children on ports of their own,
stopped by PID, the CPU time and RSS /proc gives for them, and the signals and deadlines that
unwind a run through the `finally` and `with` blocks that stop every child; with the script's
log lines and how its failures end it. Everything binds 127.0.0.1 on free ports."""

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .paths import ROOT

CLK_TCK = os.sysconf("SC_CLK_TCK")
# The core Envoy is pinned to in the benchmark, and the one its load generator (and, for the
# global rows, Redis and the service) gets.
ENVOY_CORE = "0"
LOAD_CORE = "1"

# The script's name, in its log lines and error messages (set by run_main).
_script = "bench"
# `nice -n N` in front of Envoy and wrk (run.py --nice): on a machine busy with other work.
_nice = []


class Stop(Exception):
    """A signal or a deadline: unwind, so that every child gets stopped."""


class Failure(Exception):
    """A step that could not be done (a build, a start, a tool): the run stops with its message."""


def run_main(script, main):
    """Runs a script's main, its failures and signals turned into one line and a non-zero exit."""
    global _script
    _script = script
    try:
        main()
    except (Stop, Failure) as error:
        sys.exit(f"{script}: {error}")


def log(message):
    print(f"[{_script} {time.strftime('%H:%M:%S')}] {message}", flush=True)


def install_signal_handlers():
    """Whatever stops us (a signal, the alarm of a run's overall bound), unwind."""

    def on_signal(signum, _frame):
        raise Stop(f"stopped by signal {signal.Signals(signum).name}")

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, on_signal)


def set_nice(niceness):
    _nice[:] = ["nice", "-n", str(niceness)] if niceness else []


def pinned(core):
    """The command prefix that pins a process to `core` (none for None)."""
    return ["taskset", "-c", core] if core is not None else []


def launch_prefix(core=None):
    """What goes in front of Envoy's and wrk's command: nice (--nice), then taskset to `core`."""
    return _nice + pinned(core)


def require(*tools, hint=""):
    """Fails, naming the first of `tools` not on PATH (and `hint`: how to get it)."""
    for tool in tools:
        if not shutil.which(tool):
            raise Failure(f"{tool} not found{hint}")


def run(cmd, timeout, **kwargs):
    """Runs a command to completion within `timeout` seconds; its output, or a Failure."""
    shown = " ".join(map(str, cmd))
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise Failure(f"{shown} took over {timeout}s") from None
    if done.returncode != 0:
        raise Failure(f"{shown} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held open together, so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def wait_until(probe, timeout, interval=0.05):
    """Polls `probe` until it returns a true value or `timeout` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def stop_process(proc):
    """Stops one of our processes by its PID: SIGTERM, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def cpu_seconds(pid):
    """utime + stime of a whole process (all threads), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds():
    """The CPU time every process of the machine has used (/proc/stat: all but idle and iowait),
    in seconds: less ours, what other work took."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def children_cpu_seconds():
    """The CPU time of our children that ended and were waited for (the load generators, wrk)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rss_mib(pid):
    """VmRSS of a process in MiB; NaN once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Child:
    """A child process we own, on a port of its own, restartable on it, stopped by PID. A `with`
    block stops it on the way out: enter it before starting, so that a failed start is cleaned
    up too."""

    name = "child"

    def __init__(self, workdir, port=None, core=None):
        self.workdir, self.core = workdir, core
        self.port = port or free_ports(1)[0]
        self.proc = None
        self.starts = 0

    def command(self):
        raise NotImplementedError

    def ready(self):
        raise NotImplementedError

    def prefix(self):
        """What goes in front of the command: taskset to `core`, if any."""
        return pinned(self.core)

    def start(self, timeout=15):
        self.starts += 1
        self.log_path = self.workdir / f"{self.name}-{self.starts}.log"
        command = self.prefix() + self.command()
        with open(self.log_path, "w") as log_file:
            try:
                self.proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log_file,
                                             stderr=subprocess.STDOUT)
            except OSError as error:
                raise Failure(f"{self.name} could not be started: {error}") from None
        if not wait_until(lambda: not self.running() or self.ready(), timeout) or not self.running():
            tail = self.log_path.read_text(errors="replace")[-2000:]
            self.stop()
            raise Failure(f"{self.name} did not start on port {self.port}:\n{tail}")
        return self

    @property
    def pid(self):
        return self.proc.pid

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL: a crash, no goodbye."""
        if self.running():
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.running():
            # A stopped process must be continued to act on SIGTERM.
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signal.SIGCONT)
        stop_process(self.proc)

    def rss_mib(self):
        return rss_mib(self.proc.pid) if self.running() else float("nan")

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.stop()
