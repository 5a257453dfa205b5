"""Envoy bootstraps for the benchmark and the reliability runs: one listener on 127.0.0.1 whose
only route is a `direct_response` (no upstream cost hides the filter's), the filters in front
of it (sluice, the wasm fixtures, Envoy's native local rate limit), and the cluster that leads
to sluice-service for global policies."""

import dataclasses
import json

from .paths import SLUICE_WASM

# The Envoy cluster that global policies name, and its authority.
SERVICE_CLUSTER = "sluice_service"
# The largest body Envoy's direct_response takes unless the route configuration allows more.
_DIRECT_BODY_DEFAULT_MAX = 4096


@dataclasses.dataclass(frozen=True)
class Response:
    """What the benchmark's route answers: a body, and its content-type (None: Envoy's own)."""

    body: str
    content_type: str = None

_ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}


def address(port):
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def wasm_filter(filename, configuration=None, root_id="", env=None):
    """`env`: the VM's environment variables, by name."""
    config = {
        "name": "bench",
        "root_id": root_id,
        "allow_on_headers_stop_iteration": True,
        "vm_config": {
            "vm_id": "bench",
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": str(filename)}},
        },
    }
    if env:
        config["vm_config"]["environment_variables"] = {"key_values": env}
    if configuration is not None:
        config["configuration"] = {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": json.dumps(configuration),
        }
    return {
        "name": "envoy.filters.http.wasm",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", "config": config},
    }


def sluice_filter(configuration, env=None):
    """sluice with a whole plugin configuration."""
    return wasm_filter(SLUICE_WASM, configuration, "sluice", env)


# The filter's admin path (on a listener no bench request reaches): with it on, every decision
# of a local policy is recorded among the worker's top keys.
ADMIN = {"listener": "ops", "token_env": "SLUICE_ADMIN_TOKEN"}
ADMIN_ENV = {"SLUICE_ADMIN_TOKEN": "bench 0123456789abcdef0123"}


def sluice(*policies, service=None, admin=False):
    """sluice with its default rate-limit headers ("legacy": x-ratelimit-* on every response, or a
    provider's own in their place for a policy with an `api`); `service`: the top-level `global`
    settings, for global policies; `admin`: the admin path on (`ADMIN`), so top keys recorded."""
    config = {"version": "bench", "policies": list(policies)}
    if service:
        config["global"] = service
    if admin:
        config["admin"] = ADMIN
        return sluice_filter(config, ADMIN_ENV)
    return sluice_filter(config)


def policy(name, key, requests, per, burst=None):
    p = {"name": name, "key": key if isinstance(key, list) else [key], "requests": requests, "per": per}
    if burst is not None:
        p["burst"] = burst
    return p


def policy_counter(policy, outcome):
    """A policy's counter as the filter names it (src/output/metrics.rs), without Envoy's `wasmcustom.`:
    `outcome` is allowed, denied, shadow_denied or bypassed, or degraded."""
    if outcome == "degraded":
        return f"sluice.sluice_policy=.={policy};.;degraded_total"
    return f"sluice.sluice_policy=.={policy};.;sluice_outcome=.={outcome};.;requests_total"


def service_settings(timeout):
    """sluice's top-level `global`: where the service is, and how long a call may take."""
    return {"cluster": SERVICE_CLUSTER, "authority": "sluice-service", "timeout": timeout}


def native_local_ratelimit(tokens, fill_interval="1s"):
    """Envoy's own local rate limit: one bucket of `tokens`, refilled with as many every
    `fill_interval`, with its x-ratelimit-* response headers on (as sluice's "legacy" headers are)."""
    percent = {"numerator": 100, "denominator": "HUNDRED"}
    return {
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "bench_local",
            "token_bucket": {"max_tokens": tokens, "tokens_per_fill": tokens, "fill_interval": fill_interval},
            "filter_enabled": {"runtime_key": "bench_local_enabled", "default_value": percent},
            "filter_enforced": {"runtime_key": "bench_local_enforced", "default_value": percent},
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        },
    }


def service_cluster(port):
    """The cluster of sluice-service on 127.0.0.1:`port`, over HTTP/1.1 keep-alive."""
    return {
        "name": SERVICE_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "common_http_protocol_options": {"idle_timeout": "60s"},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": SERVICE_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(port)}}]}],
        },
    }


def access_log_to(path):
    """Each request's start time and status, one line each: `<epoch seconds> <status>`."""
    return [{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(path),
            "log_format": {"text_format_source": {"inline_string": "%START_TIME(%s.%6f)% %RESPONSE_CODE%\n"}},
        },
    }]


def connection_manager(filters, access_log=None, response=None):
    """The listener's HTTP: `filters`, then a route that answers every request with `response`
    (a `Response`; by default "ok\n", to which Envoy gives its text/plain)."""
    response = response or Response("ok\n")
    direct = {"status": 200, "body": {"inline_string": response.body}}
    route = {"name": "bench", "match": {"prefix": "/"}, "direct_response": direct}
    if response.content_type:
        route["response_headers_to_add"] = [{
            "header": {"key": "content-type", "value": response.content_type},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }]
    route_config = {"name": "bench", "virtual_hosts": [{"name": "bench", "domains": ["*"], "routes": [route]}]}
    if len(response.body.encode()) > _DIRECT_BODY_DEFAULT_MAX:
        route_config["max_direct_response_body_size_bytes"] = len(response.body.encode())
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "bench",
        "use_remote_address": True,
        "route_config": route_config,
        "http_filters": list(filters) + [_ROUTER],
    }
    if access_log:
        hcm["access_log"] = access_log_to(access_log)
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}


def bootstrap(port, admin_port, filters, clusters=(), access_log=None, response=None):
    listener = {
        "name": "bench",
        "address": address(port),
        "filter_chains": [{"filters": [connection_manager(filters, access_log, response)]}],
    }
    return {
        "admin": {"address": address(admin_port)},
        "static_resources": {"listeners": [listener], "clusters": list(clusters)},
    }


# The cluster Envoy's native ratelimit filter calls, and the upstream its route leads to.
RLS_CLUSTER = "rls"
BACKEND_CLUSTER = "backend"


def native_ratelimit_bootstrap(port, admin_port, backend_port, rls_port, domain, descriptor_key):
    """Envoy's own ratelimit filter in front of a Rate Limit Service on `rls_port` (gRPC), as
    envoy/rls.yaml sets it up: the route's `rate_limits` send one descriptor, `(descriptor_key=
    <x-user-id>)`, in `domain`; the route leads to a second listener of the same Envoy on
    `backend_port` that answers "ok\\n" (the filter reads a route's `rate_limits` only on a route
    to a cluster, never on a direct_response). An answer within 1 s, else the request goes on
    (failure_mode_deny: false, counted in the filter's `error` and `failure_mode_allowed`)."""
    limits = [{"actions": [{"request_headers": {"header_name": "x-user-id", "descriptor_key": descriptor_key}}]}]
    route = {"match": {"prefix": "/"}, "route": {"cluster": BACKEND_CLUSTER, "rate_limits": limits}}
    ratelimit = {
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": domain,
            "timeout": "1s",
            "failure_mode_deny": False,
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": RLS_CLUSTER}},
            },
        },
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "bench",
        "use_remote_address": True,
        "route_config": {"name": "bench", "virtual_hosts": [{"name": "bench", "domains": ["*"], "routes": [route]}]},
        "http_filters": [ratelimit, _ROUTER],
    }
    front = {
        "name": "bench",
        "address": address(port),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": hcm}]}],
    }
    backend = bootstrap(backend_port, admin_port, [])["static_resources"]["listeners"][0]
    backend["name"] = BACKEND_CLUSTER
    http2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    return {
        "admin": {"address": address(admin_port)},
        "static_resources": {
            "listeners": [front, backend],
            "clusters": [static_cluster(BACKEND_CLUSTER, backend_port),
                         dict(static_cluster(RLS_CLUSTER, rls_port), typed_extension_protocol_options=http2)],
        },
    }


def static_cluster(name, port):
    """A cluster of one endpoint, 127.0.0.1:`port`."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(port)}}]}]},
    }
