"""The facts a report starts with: when, on which machine, at which commit, with which command,
and the versions of Envoy, wrk (and for the reliability runs Redis and sluice-service; for the
siege, which runs no Envoy, those two alone)."""

import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .builds import service_binary
from .paths import ROOT
from .processes import run


def command_line(script):
    """How this run was started, as a report shows it."""
    return f"python3 bench/{script}" + "".join(" " + a for a in sys.argv[1:])


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


# What the runs themselves rewrite: a change there is not a change to what they measure.
REPORT_FILES = ("BENCHMARKS.md", "bench/*.json", "bench/*.jsonl", "bench/*.svg", "docs/reliability.md")


def commit():
    """HEAD, and whether anything but the report files differs from it."""
    described = git("rev-parse", "--short=12", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":(exclude){p}" for p in REPORT_FILES)):
        described += " (with uncommitted changes)"
    return described


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def wrk_version():
    if not shutil.which("wrk"):
        return "no wrk"
    return subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split("\n")[0].strip()


def machine_facts(command):
    """When, where, at which commit and how a run was started."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "commit": commit(),
        "command": command,
    }


def facts(envoy, command):
    """The facts of a run started with `command`."""
    version = run([envoy, "--version"], timeout=30).strip()
    match = re.search(r"version: \S+?/([\d.]+)/", version)
    return {
        **machine_facts(command),
        "envoy": match.group(1) if match else version,
        "envoy_full": version.split("version: ", 1)[-1],
        "wrk": wrk_version(),
    }


def service_facts(command, binary):
    """machine_facts, with the sluice-service `binary` and redis-server's version."""
    return {
        **machine_facts(command),
        "service": str(binary.relative_to(ROOT)) if binary.is_relative_to(ROOT) else str(binary),
        "redis": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip(),
    }


def reliability_facts(envoy, command):
    """facts, with the sluice-service binary and redis-server's version."""
    return {**facts(envoy, command), **service_facts(command, service_binary())}


def machine_lines(info):
    return [
        f"- Date: {info['date']}",
        f"- Machine: {info['cpu']}, {info['cores']} cores, Linux {info['kernel']}; "
        f"load average at the start {' '.join(info['loadavg'])}",
        f"- Commit: {info['commit']}; command: `{info['command']}`",
    ]


def facts_lines(info):
    """The facts as the reports list them: the reliability runs' with Redis and the service."""
    service = (f"; {info['redis'].split(' sha=')[0]}; sluice-service `{info['service']}`"
               if "redis" in info else "")
    return machine_lines(info) + [f"- Envoy {info['envoy']}; {info['wrk']}{service}"]


def service_facts_lines(info):
    """The facts of a run without Envoy."""
    return machine_lines(info) + [f"- {info['redis'].split(' sha=')[0]}; sluice-service `{info['service']}`"]
