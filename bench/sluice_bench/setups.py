"""The Envoy configurations the benchmark measures, 1 to 13T, each defined once for the CPU run
and the callgrind run; the services the global rows need; and what the reports compute over the
setups: the ratios, the steps from one setup to the next, and the issues' targets (5: the cost of
a decision; 24: token budgets; 25: concurrency limits; 33: an LLM gateway; 35: top keys)."""

import contextlib
import dataclasses

from .builds import build_fixtures, build_service
from .envoy_config import native_local_ratelimit, policy, service_cluster, service_settings, sluice, wasm_filter
from .llm_bodies import event_stream_response, json_response
from .processes import LOAD_CORE, free_ports
from .services import redis_and_service

# sluice's default max_keys: the slots each key layout (table) creates up front.
DEFAULT_MAX_KEYS = 10_000
# Never-denying limits: a million requests per second per key, a burst of as many.
NEVER = 1_000_000
# A never-refusing concurrency policy: sluice-service holds at most 10,000 slots of a global key.
SLOTS = 10_000
# A never-denying token budget: the 4 KiB response uses 1,963 tokens, some 40 million a second.
TOKENS = 1_000_000_000

# What the ratios compare, on CPU per request (requests/s shown too).
RATIOS = [
    ("4", "3b", "sluice over the design's floor"),
    ("4", "3", "sluice over an empty wasm filter"),
    ("4", "2", "sluice over native local_ratelimit"),
    ("4L", "3b", "a hot key on worker leases over the floor"),
    ("4L", "4", "worker leases of 100 over none"),
    ("5", "4", "5 layered policies over 1"),
    ("5b", "4", "5 keys over 1"),
    ("7", "4", "a 429 over an allowed request"),
    ("9", "4", "global with leases over local"),
    ("8", "4", "strict global over local"),
    ("10", "4", "a concurrency slot over a token bucket"),
    ("11", "8", "global concurrency over strict global"),
    ("12T", "12", "a token budget over a request count, 4 KiB JSON"),
    ("13T", "13", "a token budget over a request count, 200-event stream"),
    ("12P", "12", "OpenAI's rate-limit headers too, 4 KiB JSON"),
    ("4P", "4", "a policy matched on the path over one for every request"),
    ("4A", "4P", "top keys recorded on an allowed request"),
    ("7A", "7P", "top keys recorded on a refusal"),
]
# What each step from one setup to the next adds (a − b), in the CPU and instruction reports.
STEPS = [
    ("3", "1", "a proxy-wasm filter that does nothing"),
    ("3b", "3", "header, clock, shared-data read and CAS"),
    ("4", "3b", "sluice beyond that floor"),
    ("4L", "4", "worker leases of 100: a shared-data read and CAS per 100 requests"),
    ("2", "1", "native local_ratelimit"),
    ("8", "4", "a call to sluice-service per request"),
    ("9", "4", "leases of 100: a call per 100 requests"),
    ("10", "4", "a slot taken and given back instead of a token bucket's decision"),
    ("12T", "12", "reading a 4 KiB JSON response's usage and settling it"),
    ("13T", "13", "reading a 200-event stream's usage and settling it"),
    ("12P", "12", "OpenAI's own rate-limit headers on every response"),
    ("4P", "4", "the :path read (the admin path's routing reads it too)"),
    ("4A", "4P", "recording an allowed request among the top keys"),
    ("7A", "7P", "recording a refusal among the top keys"),
]
# The issues' targets, on CPU per request: numerator <= factor x denominator, and the issue.
TARGETS = [
    ("4", "3b", 1.15, "5"), ("4L", "3b", 1.0, "5"), ("5", "4", 1.2, "5"), ("7", "4", 1.0, "5"),
    ("9", "4", 1.25, "5"), ("12T", "12", 1.3, "24"), ("10", "4", 1.15, "25"),
    ("12T", "12", 1.2, "33"), ("13T", "13", 1.5, "33"), ("12P", "12", 1.03, "33"),
    ("4A", "4P", 1.03, "35"), ("7A", "7P", 1.05, "35"),
]
# The global concurrency setup whose traffic to the service the CPU run also counts, after its
# rounds (global_traffic).
TRAFFIC_SETUP = "11"
# A peer's gRPC callout per request costs about +630 µs over Envoy alone (the figure):
# strict global (8) must cost at most half of that over Envoy alone (1).
CALLOUT_BUDGET_US = 630 / 2


@dataclasses.dataclass
class Setup:
    id: str
    label: str
    filters: list
    # Whether the setup is meant to deny most requests (the others must deny none).
    denies: bool = False
    # The Envoy clusters its filter configuration names: the global rows' sluice-service.
    clusters: list = dataclasses.field(default_factory=list)
    # What its route answers (envoy_config.Response): by default "ok\n".
    response: object = None

    @property
    def uses_service(self):
        """Whether the run must start redis-server and sluice-service for it."""
        return bool(self.clusters)


def setups(fixtures, service_port, valgrind=False):
    """The setups, 1 to 13T; the global rows call sluice-service on `service_port`. `valgrind`: for a
    run under valgrind, where Envoy answers about 50 times slower: the denying setups (6, 7)
    refill per hour rather than per second, so that every request after the burst is denied, and
    the global rows (8, 9) give the service 5 s, not 1 s. (1 s is generous already, so that the
    rows measure calls, not failures: a failed call would fail open.)"""
    deny_per, service = ("1h", service_settings("5s")) if valgrind else ("1s", service_settings("1s"))
    per_user = policy("per-user", "header:x-user-id", NEVER, "1s")
    denying = policy("per-user", "header:x-user-id", 100, deny_per, 100)
    strict = dict(policy("global-user", "header:x-user-id", NEVER, "1s", NEVER), scope="global")
    calls = [service_cluster(service_port)]
    return [
        Setup("1", "Envoy, no rate limit (ceiling)", []),
        Setup("2", "native local_ratelimit, never denies", [native_local_ratelimit(1_000_000_000)]),
        Setup("3", "empty proxy-wasm filter", [wasm_filter(fixtures["empty"])]),
        Setup("3b", "floor: header + clock + shared-data read + CAS", [wasm_filter(fixtures["floor"])]),
        Setup("4", "sluice, 1 policy", [sluice(per_user)]),
        Setup("4L", "sluice, 1 policy, worker lease of 100", [sluice(dict(per_user, lease=100))]),
        Setup("4P", "sluice, 1 policy matched on the path", [sluice(on_path(per_user))]),
        Setup("4A", "sluice, 1 policy matched on the path, admin path on (top keys)",
              [sluice(on_path(per_user), admin=True)]),
        Setup("5", "sluice, 5 layered policies, 1 key", [sluice(*layered_policies())]),
        Setup("5b", "sluice, 5 policies, 5 keys", [sluice(*keyed_policies())]),
        Setup("6", "native local_ratelimit, denying",
              [native_local_ratelimit(100, "3600s" if valgrind else "1s")], denies=True),
        Setup("7", "sluice, denying", [sluice(denying)], denies=True),
        Setup("7P", "sluice, denying, matched on the path", [sluice(on_path(denying))], denies=True),
        Setup("7A", "sluice, denying, matched on the path, admin path on (top keys)",
              [sluice(on_path(denying), admin=True)], denies=True),
        Setup("8", "sluice, global, strict (a call per request)", [sluice(strict, service=service)], clusters=calls),
        Setup("9", "sluice, global, lease of 100 on the hot key",
              [sluice(dict(strict, lease=100), service=service)], clusters=calls),
        Setup("10", "sluice, concurrency (a slot per request)",
              [sluice(slots("streams"))]),
        Setup("11", "sluice, global concurrency (a check per request)",
              [sluice(dict(slots("global-streams"), scope="global"), service=service)], clusters=calls),
        Setup("12", "sluice, 1 policy, 4 KiB JSON response", [sluice(per_user)], response=json_response()),
        Setup("12T", "sluice, token budget, 4 KiB JSON response", [sluice(token_budget())],
              response=json_response()),
        Setup("12P", "sluice, 1 policy, OpenAI's headers too, 4 KiB JSON response",
              [sluice(dict(per_user, api="openai"))], response=json_response()),
        Setup("13", "sluice, 1 policy, 200-event SSE response", [sluice(per_user)],
              response=event_stream_response()),
        Setup("13T", "sluice, token budget, 200-event SSE response", [sluice(token_budget())],
              response=event_stream_response()),
    ]


def on_path(p):
    """`p` for requests under /api/ only (every bench request): its decision reads `:path`, which
    the admin path's routing then reads for nothing more, so that a row with the admin path on
    over one without shows the top keys' recording alone."""
    return dict(p, match={"path_prefix": "/api/"})


def slots(name):
    """A concurrency policy that never refuses (wrk keeps 16 requests in flight): a slot per
    request of the user in flight, given back when the request ends."""
    return {"name": name, "key": ["header:x-user-id"], "algorithm": "concurrency", "requests": SLOTS}


def token_budget():
    """A token bucket per user charged each response's usage (total_tokens, read from its body),
    reserving nothing: never refusing, at a billion tokens a second."""
    return dict(policy("per-user-tokens", "header:x-user-id", TOKENS, "1s", TOKENS),
                cost={"from_response": {"usage": "total_tokens"}})


def layered_policies():
    """Five never-denying policies on one key, per second to per 30 days: one table."""
    return [
        policy(f"per-{per}", "header:x-user-id", NEVER * seconds, per, NEVER * seconds)
        for per, seconds in [("1s", 1), ("1m", 60), ("1h", 3600), ("1d", 86400), ("30d", 30 * 86400)]
    ]


def keyed_policies():
    """Five never-denying policies, each on its own key: five tables."""
    keys = [("user", "header:x-user-id"), ("api-key", "header:x-api-key"), ("ip", "ip"), ("route", "route"),
            ("global", "global")]
    return [policy(f"by-{name}", key, NEVER, "1s") for name, key in keys]


def chosen_setups(only, valgrind=False):
    """The setups to run (--only's, or all) with the port their global rows call the service on;
    the fixtures built, and sluice-service too when a global row is among them (before any
    deadline: the first build takes minutes)."""
    service_port = free_ports(1)[0]
    chosen = selected(setups(build_fixtures(), service_port, valgrind), only)
    if any(s.uses_service for s in chosen):
        build_service()
    return chosen, service_port


def selected(all_setups, only):
    """The setups --only names (comma-separated ids), or all of them."""
    if not only:
        return all_setups
    wanted = set(only.split(","))
    return [s for s in all_setups if s.id in wanted]


def ratio(summary, a, b, key):
    """summary[a][key] / summary[b][key], or None when either is missing (or b's is 0)."""
    if a in summary and b in summary and summary[b][key]:
        return summary[a][key] / summary[b][key]
    return None


def step(summary, a, b, key):
    """summary[a][key] − summary[b][key], or None when either is missing."""
    if a in summary and b in summary:
        return summary[a][key] - summary[b][key]
    return None


@contextlib.contextmanager
def services_for(chosen, workdir, port):
    """redis-server and sluice-service on `port` for the global rows among `chosen` (nothing
    without them), on the load generator's core so that Envoy's core measures Envoy alone; the
    service is built first (minutes, the first time)."""
    if not any(s.uses_service for s in chosen):
        yield
        return
    with redis_and_service(workdir, build_service(), port, core=LOAD_CORE, timeout=30):
        yield
