"""One Envoy process of ours: its bootstrap written to the run's directory, started on free ports
(again on other ports if they were taken meanwhile), ready once its route answers, its stats
read from the admin endpoint, and stopped by PID (a `with` block stops it on the way out)."""

import json

from .envoy_config import bootstrap, sluice_filter
from .load import CLIENT_HEADERS, PATH, http_get
from .paths import FIND_ENVOY
from .processes import ENVOY_CORE, Child, Failure, free_ports, launch_prefix, run


def find_envoy():
    """The Envoy binary make run and make test use (scripts/find-envoy)."""
    return run([str(FIND_ENVOY)], timeout=600).strip()


class Envoy(Child):
    """`pin`: Envoy on the benchmark's Envoy core. `wrapper`: a command Envoy runs under
    (valgrind); its process is the one started, so its PID is still Envoy's. `response`: what
    its route answers (`envoy_config.Response`; by default "ok\n")."""

    def __init__(self, envoy, name, filters, workdir, concurrency=1, pin=True, clusters=(), access_log=None,
                 wrapper=(), response=None):
        super().__init__(workdir, core=ENVOY_CORE if pin else None)
        self.envoy, self.name, self.filters, self.concurrency = envoy, f"envoy-{name}", filters, concurrency
        self.clusters, self.access_log, self.wrapper = clusters, access_log, list(wrapper)
        self.response = response

    def start(self, timeout=60):
        for _attempt in range(3):
            self.port, self.admin_port = free_ports(2)
            try:
                return super().start(timeout)
            except Failure as failure:
                if "ddress already in use" not in str(failure):
                    raise
        raise Failure(f"{self.name} did not start: its ports were taken three times")

    def prefix(self):
        """nice (run.py --nice), taskset to the Envoy core (`pin`), then the wrapper."""
        return launch_prefix(self.core) + self.wrapper

    def command(self):
        """Envoy on the bootstrap for the ports chosen, written to the run's directory."""
        config = self.workdir / f"{self.name}.json"
        config.write_text(json.dumps(bootstrap(self.port, self.admin_port, self.filters, self.clusters,
                                               self.access_log, self.response)))
        return [self.envoy, "-c", str(config), "--concurrency", str(self.concurrency), "--disable-hot-restart",
                "-l", "warn"]

    def ready(self):
        try:
            # Served by the route, or refused by a rate limit: either way, up.
            return (http_get(self.admin_port, "/ready")[0] == 200
                    and http_get(self.port, PATH, CLIENT_HEADERS)[0] in (200, 429))
        except OSError:
            return False

    def stats(self):
        """Envoy's counters and gauges, by name."""
        _, text = http_get(self.admin_port, "/stats", timeout=5)
        values = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                values[name] = int(value)
        return values

    def downstream_counts(self):
        """Envoy's own counts of the requests it answered: 2xx, 4xx, 5xx and all completed."""
        stats = self.stats()
        return {k: stats.get(f"http.bench.downstream_rq_{k}", 0) for k in ("2xx", "4xx", "5xx", "completed")}

    def wasm_counters(self):
        """The filter's counters, without Envoy's `wasmcustom.` prefix."""
        return {k[len("wasmcustom."):]: v for k, v in self.stats().items() if k.startswith("wasmcustom.")}


def sluice_envoy(envoy_bin, name, config, workdir, clusters=()):
    """The reliability runs' Envoy: sluice with a whole configuration, 2 workers, not pinned; not
    started yet, so that the caller can register it for cleanup first."""
    return Envoy(envoy_bin, name, [sluice_filter(config)], workdir, concurrency=2, pin=False, clusters=list(clusters))
