"""Envoy bootstraps for the benchmark and the reliability runs: one listener on 127.0.0.1 whose
only route is a `direct_response` (no upstream cost hides the filter's), the filters in front
of it (sluice, the wasm fixtures, Envoy's native local rate limit), and the cluster that leads
to sluice-service for global policies."""

import json

from .paths import SLUICE_WASM

# The Envoy cluster that global policies name, and its authority.
SERVICE_CLUSTER = "sluice_service"

_ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}


def address(port):
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def wasm_filter(filename, configuration=None, root_id=""):
    config = {
        "name": "bench",
        "root_id": root_id,
        "vm_config": {
            "vm_id": "bench",
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": str(filename)}},
        },
    }
    if configuration is not None:
        config["configuration"] = {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": json.dumps(configuration),
        }
    return {
        "name": "envoy.filters.http.wasm",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", "config": config},
    }


def sluice_filter(configuration):
    """sluice with a whole plugin configuration."""
    return wasm_filter(SLUICE_WASM, configuration, "sluice")


def sluice(*policies, service=None):
    """sluice with its default rate-limit headers ("legacy": x-ratelimit-* on every response);
    `service`: the top-level `global` settings, for global policies."""
    config = {"version": "bench", "headers": "legacy", "policies": list(policies)}
    if service:
        config["global"] = service
    return sluice_filter(config)


def policy(name, key, requests, per, burst=None):
    p = {"name": name, "key": key if isinstance(key, list) else [key], "requests": requests, "per": per}
    if burst is not None:
        p["burst"] = burst
    return p


def policy_counter(policy, outcome):
    """A policy's counter as the filter names it (src/metrics.rs), without Envoy's `wasmcustom.`:
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


def connection_manager(filters, access_log=None):
    direct = {"status": 200, "body": {"inline_string": "ok\n"}}
    route = {"name": "bench", "match": {"prefix": "/"}, "direct_response": direct}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "bench",
        "use_remote_address": True,
        "route_config": {"name": "bench", "virtual_hosts": [{"name": "bench", "domains": ["*"], "routes": [route]}]},
        "http_filters": list(filters) + [_ROUTER],
    }
    if access_log:
        hcm["access_log"] = access_log_to(access_log)
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}


def bootstrap(port, admin_port, filters, clusters=(), access_log=None):
    listener = {
        "name": "bench",
        "address": address(port),
        "filter_chains": [{"filters": [connection_manager(filters, access_log)]}],
    }
    return {
        "admin": {"address": address(admin_port)},
        "static_resources": {"listeners": [listener], "clusters": list(clusters)},
    }
