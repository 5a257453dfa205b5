//! The configuration format through `parse`: what compiles to what, and what is refused with
//! which field named.

use super::*;
use crate::core::algorithm::{Algorithm, Drain, Rate, Window};
use crate::core::request::Attr;
use serde_json::{json, Value};

fn policy() -> Value {
    json!({"name": "per-user", "key": ["header:x-user-id"], "requests": 100, "per": "1m", "burst": 20})
}

fn with(policy_fields: Value) -> Value {
    let mut p = policy();
    for (k, v) in policy_fields.as_object().unwrap() {
        p[k] = v.clone();
    }
    json!({ "policies": [p] })
}

fn refused(config: Value) -> ConfigError {
    parse(config.to_string().as_bytes()).expect_err("should be refused")
}

fn assert_refused(config: Value, field: &str, reason_contains: &str) {
    let e = refused(config);
    assert_eq!(e.field, field, "{e}");
    assert!(e.reason.contains(reason_contains), "{e}");
}

#[test]
fn the_issue_example_compiles_with_defaults() {
    let plan = parse(
        br#"{"version":"2026-11-29.1","headers":"legacy","policies":[{"name":"per-user",
        "match":{"path_prefix":"/api/","methods":["GET","POST"]},"key":["header:x-user-id"],
        "requests":100,"per":"1m","burst":20,"mode":"enforce"}]}"#,
    )
    .unwrap();
    assert_eq!(plan.version, "2026-11-29.1");
    let p = &plan.policies[0];
    assert_eq!((p.cost, p.shadow, p.share_missing_key), (1, false, false));
    assert_eq!(
        p.tier.algorithm,
        Algorithm::TokenBucket(Rate::new(100, 60_000_000_000, 20).unwrap())
    );
    assert_eq!((p.tier.requests, p.tier.per_nanos), (100, 60_000_000_000));
    assert_eq!(plan.tables[0].capacity, DEFAULT_MAX_KEYS);
}

#[test]
fn burst_defaults_to_requests() {
    let plan = parse(
        json!({"policies": [{"name": "a", "key": ["ip"], "requests": 7, "per": "1s"}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(plan.policies[0].tier.algorithm.capacity(), 7);
}

#[test]
fn policies_with_the_same_key_share_one_table() {
    let config = json!({"policies": [
        {"name": "second", "key": ["header:x-user-id"], "requests": 1, "per": "1s"},
        {"name": "ip", "key": ["ip"], "requests": 1, "per": "1s"},
        {"name": "minute", "key": ["header:X-User-Id"], "requests": 10, "per": "1m", "max_keys": 50000},
    ]});
    let plan = parse(config.to_string().as_bytes()).unwrap();
    assert_eq!(plan.tables.len(), 2);
    assert_eq!(
        (plan.policies[2].table, plan.policies[2].words.start),
        (0, 1)
    );
    assert_eq!((plan.tables[0].width, plan.tables[0].capacity), (2, 50000));
}

#[test]
fn the_slot_layout_ignores_attribute_order() {
    let a = json!({"policies": [
        {"name": "m", "match": {"headers": [{"name": "x-a", "present": true}]}, "key": ["header:x-user-id"], "requests": 1, "per": "1s"}]});
    let b = json!({"policies": [{"name": "m", "key": ["header:x-user-id"], "requests": 1, "per": "1s"}]});
    let id = |c: Value| {
        let table = &parse(c.to_string().as_bytes()).unwrap().tables[0];
        (table.tag, table.space.clone())
    };
    assert_eq!(id(a), id(b));
}

#[test]
fn rejects_unknown_fields_naming_them() {
    assert_refused(
        with(json!({"brust": 3})),
        "policies[0].brust",
        "unknown field",
    );
    assert_refused(
        json!({"policies": [], "polices": []}),
        "polices",
        "unknown field",
    );
}

#[test]
fn rejects_wrong_types_naming_the_field() {
    assert_refused(
        with(json!({"burst": "5"})),
        "policies[0].burst",
        "invalid type",
    );
    assert_refused(
        with(json!({"key": "ip"})),
        "policies[0].key",
        "invalid type",
    );
}

#[test]
fn rejects_zero_and_negative_rates() {
    assert_refused(
        with(json!({"requests": 0})),
        "policies[0].requests",
        "at least 1",
    );
    assert_refused(
        with(json!({"requests": -5})),
        "policies[0].requests",
        "invalid value",
    );
    assert_refused(with(json!({"burst": 0})), "policies[0].burst", "at least 1");
    assert_refused(with(json!({"cost": 0})), "policies[0].cost", "at least 1");
}

#[test]
fn rejects_rates_out_of_range() {
    assert_refused(
        with(json!({"requests": 2_000_000, "per": "1ms"})),
        "policies[0].requests",
        "more than one request per nanosecond",
    );
    assert_refused(
        with(json!({"requests": 1, "per": "365d", "burst": 1_000_000})),
        "policies[0].burst",
        "over a century",
    );
}

/// `with(fields)` without a burst: for the algorithms that have none.
fn burstless(fields: Value) -> Value {
    let mut config = with(fields);
    config["policies"][0]
        .as_object_mut()
        .unwrap()
        .remove("burst");
    config
}

/// Every number that could overflow the arithmetic is bounded, and refused naming its field:
/// the configurations a fuzzer found overflowing among them.
#[test]
fn rejects_numbers_beyond_what_the_arithmetic_holds() {
    let fixed = |fields: Value| {
        let mut config = burstless(fields);
        config["policies"][0]["algorithm"] = json!("fixed_window");
        config
    };
    let huge = json!({"requests": u64::MAX, "cost": 1u64 << 63, "per": "1s"});
    assert_refused(
        fixed(huge),
        "policies[0].requests",
        "at most 1000000000000000",
    );
    let costly = json!({"requests": 10, "cost": 1_000_000_000_000_001u64});
    assert_refused(
        fixed(costly),
        "policies[0].cost",
        "at most 1000000000000000",
    );
    for (algorithm, per) in [("sliding_window", "106752d"), ("sliding_log", "200000d")] {
        let config = burstless(json!({"algorithm": algorithm, "requests": 10, "per": per}));
        assert_refused(config, "policies[0].per", "at most 365d");
    }
    assert_refused(
        with(json!({"per": "366d"})),
        "policies[0].per",
        "at most 365d",
    );
    let burst = json!({"burst": 1_000_000_000_000_001u64});
    assert_refused(with(burst), "policies[0].burst", "at most 1000000000000000");
    let leaky = |max_delay: &str, cost: u64| {
        burstless(
            json!({"algorithm": "leaky_bucket", "requests": 1, "per": "365d",
            "max_delay": max_delay, "cost": cost}),
        )
    };
    assert_refused(leaky("366d", 1), "policies[0].max_delay", "at most 365d");
    assert_refused(leaky("1s", 200), "policies[0].cost", "over a century");
}

#[test]
fn a_tiers_numbers_are_refused_on_the_tier_and_the_policys_cost_on_the_policy() {
    let tiers = json!({"by": "header:x-plan", "values": {"gold": {"requests": 10, "per": "400d"}}});
    assert_refused(
        with(json!({ "tiers": tiers })),
        "policies[0].tiers.values.gold.per",
        "at most 365d",
    );
    let tiers = json!({"by": "header:x-plan", "values": {"gold": {"requests": 10, "per": "1s", "burst": 2}}});
    assert_refused(
        with(json!({"tiers": tiers, "cost": 3, "burst": 5})),
        "policies[0].tiers.values.gold.burst",
        "must be >= cost (3)",
    );
}

#[test]
fn rejects_burst_below_cost() {
    assert_refused(
        with(json!({"burst": 2, "cost": 3})),
        "policies[0].burst",
        "must be >= cost (3)",
    );
}

#[test]
fn rejects_unparsable_durations() {
    assert_refused(with(json!({"per": "1 minute"})), "policies[0].per", "unit");
    assert_refused(
        with(json!({"per": "0s"})),
        "policies[0].per",
        "greater than zero",
    );
}

#[test]
fn rejects_duplicate_names() {
    let p = policy();
    assert_refused(json!({"policies": [p, p]}), "policies[1].name", "duplicate");
    assert_refused(
        json!({"policies": [p], "default": p}),
        "default.name",
        "duplicate",
    );
}

#[test]
fn rejects_names_that_would_need_escaping() {
    assert_refused(
        with(json!({"name": "a\"b"})),
        "policies[0].name",
        "characters",
    );
    assert_refused(with(json!({"name": ""})), "policies[0].name", "characters");
}

#[test]
fn rejects_bad_keys() {
    assert_refused(with(json!({"key": []})), "policies[0].key", "at least one");
    assert_refused(
        with(json!({"key": ["ip", "cookie:x"]})),
        "policies[0].key[1]",
        "unknown key part",
    );
    assert_refused(
        with(json!({"missing_key": "deny"})),
        "policies[0].missing_key",
        "unknown variant",
    );
}

#[test]
fn rejects_bad_matches() {
    assert_refused(
        with(json!({"match": {"path_prefix": "/a", "path_exact": "/b"}})),
        "policies[0].match.path_exact",
        "not both",
    );
    assert_refused(
        with(json!({"match": {"path_prefix": "api"}})),
        "policies[0].match.path_prefix",
        "start with '/'",
    );
    assert_refused(
        with(json!({"match": {"methods": []}})),
        "policies[0].match.methods",
        "not be empty",
    );
    assert_refused(
        with(json!({"match": {"methods": ["get"]}})),
        "policies[0].match.methods",
        "upper-case",
    );
    assert_refused(
        with(json!({"match": {"routes": []}})),
        "policies[0].match.routes",
        "not be empty",
    );
    assert_refused(
        with(json!({"match": {"routes": ["checkout", ""]}})),
        "policies[0].match.routes[1]",
        "name a route",
    );
    assert_refused(
        with(json!({"match": {"headers": [{"name": "x"}]}})),
        "policies[0].match.headers[0]",
        "exactly one",
    );
    assert_refused(
        with(json!({"match": {"headers": [{"name": "a b", "present": true}]}})),
        "policies[0].match.headers[0].name",
        "header name",
    );
}

#[test]
fn rejects_bad_modes_and_header_styles() {
    assert_refused(
        with(json!({"mode": "log"})),
        "policies[0].mode",
        "unknown variant",
    );
    assert_refused(
        json!({"headers": "rfc", "policies": [policy()]}),
        "headers",
        "unknown variant",
    );
}

#[test]
fn rejects_bad_tiers() {
    let tiers = |values: Value| {
        with(json!({"cost": 2, "tiers": {"by": "header:x-plan", "values": values}}))
    };
    assert_refused(
        tiers(json!({"pro": {"requests": 10, "per": "1s", "burst": 1}})),
        "policies[0].tiers.values.pro.burst",
        ">= cost",
    );
    assert_refused(
        tiers(json!({"pro": {"requests": 10, "per": "soon"}})),
        "policies[0].tiers.values.pro.per",
        "unit",
    );
    assert_refused(
        tiers(json!({"pro": {"requests": 10}})),
        "policies[0].tiers.values.pro",
        "missing field `per`",
    );
    assert_refused(
        with(json!({"tiers": {"by": "plan", "values": {}}})),
        "policies[0].tiers.by",
        "unknown key part",
    );
}

#[test]
fn rejects_max_keys_out_of_range() {
    assert_refused(
        with(json!({"max_keys": 0})),
        "policies[0].max_keys",
        "between",
    );
    assert_refused(
        with(json!({"max_keys": 10_000_001})),
        "policies[0].max_keys",
        "between",
    );
}

#[test]
fn rejects_an_empty_configuration() {
    assert_refused(json!({}), "policies", "at least one");
    assert_eq!(refused(json!([])).field, "configuration");
    assert!(parse(b"not json").is_err());
}

#[test]
fn a_default_policy_takes_no_match() {
    let mut d = policy();
    d["match"] = json!({"path_prefix": "/"});
    assert_refused(
        json!({"policies": [], "default": d}),
        "default.match",
        "no match",
    );
    let plan = parse(json!({"default": policy()}).to_string().as_bytes()).unwrap();
    assert!(plan.policies[0].fallback);
}

fn with_service(policy_fields: Value) -> Value {
    let mut config = with(policy_fields);
    config["global"] = json!({"cluster": "ratelimit", "authority": "ratelimit.local"});
    config
}

#[test]
fn a_global_policy_compiles_with_its_defaults() {
    let plan = parse(
        with_service(json!({"scope": "global"}))
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let service = plan.global.as_ref().unwrap();
    let path = "/v1/check".to_string();
    assert_eq!(
        (&service.protocol, service.timeout_ms),
        (&Protocol::Sluice { path }, 50)
    );
    assert_eq!(
        plan.policies[0].scope,
        Scope::Global(OnFailure::Open { emergency: None })
    );
    assert_eq!(plan.policies[0].take, 1);
    assert_eq!(plan.tables[0].width, 1 + GLOBAL_COLUMNS);
}

#[test]
fn global_only_fields_are_refused_on_local_policies() {
    assert_refused(
        with(json!({"failure_mode": "closed"})),
        "policies[0].failure_mode",
        "global policies only",
    );
    let emergency = json!({"requests": 1, "per": "1s"});
    assert_refused(
        with(json!({"emergency": emergency})),
        "policies[0].emergency",
        "global policies only",
    );
}

#[test]
fn a_global_policy_needs_the_service_settings() {
    assert_refused(
        with(json!({"scope": "global"})),
        "policies[0].scope",
        "\"global\" service settings",
    );
    assert_refused(
        with(json!({"scope": "cluster"})),
        "policies[0].scope",
        "unknown variant",
    );
}

#[test]
fn a_local_token_bucket_can_lease_and_nothing_else_locally() {
    let plan = parse(with(json!({"lease": 5})).to_string().as_bytes()).unwrap();
    assert_eq!((plan.policies[0].take, plan.policies[0].cost), (5, 1));
    assert_refused(
        with(json!({"lease": 21})),
        "policies[0].lease",
        "between cost (1) and burst (20)",
    );
    assert_refused(
        with(json!({"algorithm": "fixed_window", "burst": null, "lease": 2})),
        "policies[0].lease",
        "does not apply to the fixed_window algorithm",
    );
}

#[test]
fn rejects_bad_leases_and_failure_modes() {
    assert_refused(
        with_service(json!({"scope": "global", "lease": 21})),
        "policies[0].lease",
        "between cost (1) and burst (20)",
    );
    assert_refused(
        with_service(json!({"scope": "global", "cost": 2, "lease": 1})),
        "policies[0].lease",
        "between cost (2)",
    );
    let closed = json!({"scope": "global", "failure_mode": "closed", "emergency": {"requests": 1, "per": "1s"}});
    assert_refused(
        with_service(closed),
        "policies[0].emergency",
        "fails closed",
    );
    assert_refused(
        with_service(json!({"scope": "global", "failure_mode": "maybe"})),
        "policies[0].failure_mode",
        "unknown variant",
    );
}

#[test]
fn rejects_bad_service_settings() {
    let service = |s: Value| json!({"global": s, "policies": [policy()]});
    assert_refused(
        service(json!({"cluster": "", "authority": "a"})),
        "global.cluster",
        "Envoy cluster",
    );
    assert_refused(
        service(json!({"cluster": "c", "authority": "a", "timeout": "soon"})),
        "global.timeout",
        "unit",
    );
    assert_refused(
        service(json!({"cluster": "c", "authority": "a", "path": "check"})),
        "global.path",
        "start with '/'",
    );
    assert_refused(
        service(json!({"cluster": "c", "authority": ""})),
        "global.authority",
        "must not be empty",
    );
}

#[test]
fn an_rls_is_asked_about_a_domain_at_the_clusters_authority_and_grants_no_leases() {
    let config =
        |global: Value, policy: Value| json!({"global": global, "policies": [policy]}).to_string();
    let rls = json!({"protocol": "rls", "cluster": "ratelimit", "domain": "edge"});
    let global_policy = with(json!({"scope": "global"}))["policies"][0].clone();
    let plan = parse(config(rls.clone(), global_policy.clone()).as_bytes()).unwrap();
    let service = plan.global.as_ref().unwrap();
    assert_eq!(service.authority, "ratelimit", "the cluster's name");
    let Protocol::Rls {
        domain,
        grpc_service,
    } = &service.protocol
    else {
        panic!("an RLS");
    };
    assert_eq!(domain, "edge");
    assert_eq!(
        grpc_service[..4],
        [0x0a, 22, 0x0a, 9],
        "GrpcService.envoy_grpc.cluster_name"
    );
    assert!(plan.policies[0].asks_rls(plan.global.as_ref()));
    let mut leasing = global_policy.clone();
    leasing["lease"] = json!(5);
    assert_refused(
        serde_json::from_str(&config(rls.clone(), leasing)).unwrap(),
        "policies[0].lease",
        "grants no tokens ahead",
    );
    let mut no_domain = rls.clone();
    no_domain.as_object_mut().unwrap().remove("domain");
    assert_refused(
        serde_json::from_str(&config(no_domain, global_policy.clone())).unwrap(),
        "global.domain",
        "needs the domain",
    );
    let mut with_path = rls.clone();
    with_path["path"] = json!("/v1/check");
    assert_refused(
        serde_json::from_str(&config(with_path, global_policy.clone())).unwrap(),
        "global.path",
        "no path",
    );
    let sluice = json!({"cluster": "c", "domain": "edge"});
    assert_refused(
        serde_json::from_str(&config(sluice, global_policy)).unwrap(),
        "global.domain",
        "\"rls\" only",
    );
}

#[test]
fn the_services_token_comes_from_the_environment_and_never_shows_in_debug_output() {
    let config = json!({"global": {"cluster": "c", "authority": "a", "token_env": "TOKEN"},
        "policies": [policy()]});
    let env = |name: &str| (name == "TOKEN").then(|| " s3cret\n".to_string());
    let plan = parse_with_env(config.to_string().as_bytes(), &env).unwrap();
    let service = plan.global.as_ref().unwrap();
    let authorization = service.authorization.as_ref().map(Secret::expose);
    assert_eq!(authorization, Some("Bearer s3cret"));
    assert!(!format!("{plan:?}").contains("s3cret"));
    let unset = parse_with_env(config.to_string().as_bytes(), &|_| None).unwrap_err();
    assert_eq!(unset.field, "global.token_env");
    assert!(unset.reason.contains("host_env_keys"), "{unset}");
}

#[test]
fn every_algorithm_compiles_with_its_own_fields() {
    for (name, expected) in [
        (
            "fixed_window",
            Algorithm::FixedWindow(Window::new(100, 60_000_000_000).unwrap()),
        ),
        (
            "sliding_window",
            Algorithm::SlidingWindow(Window::new(100, 60_000_000_000).unwrap()),
        ),
        (
            "sliding_log",
            Algorithm::SlidingLog(Window::new(100, 60_000_000_000).unwrap()),
        ),
    ] {
        let mut fields = policy();
        fields.as_object_mut().unwrap().remove("burst");
        fields["algorithm"] = json!(name);
        let config = json!({"policies": [fields]});
        assert_eq!(
            parse(config.to_string().as_bytes()).unwrap().policies[0]
                .tier
                .algorithm,
            expected
        );
    }
    let mut fields = policy();
    fields.as_object_mut().unwrap().remove("burst");
    fields["algorithm"] = json!("leaky_bucket");
    fields["max_delay"] = json!("500ms");
    let plan = parse(json!({"policies": [fields]}).to_string().as_bytes()).unwrap();
    assert_eq!(
        plan.policies[0].tier.algorithm,
        Algorithm::LeakyBucket(Drain::new(1, 600_000_000, 500_000_000).unwrap())
    );
}

#[test]
fn fields_that_do_not_apply_to_an_algorithm_are_refused() {
    assert_refused(
        with(json!({"algorithm": "fixed_window"})),
        "policies[0].burst",
        "does not apply to the fixed_window algorithm",
    );
    assert_refused(
        with(json!({"max_delay": "1s"})),
        "policies[0].max_delay",
        "does not apply to the token_bucket algorithm",
    );
    let mut leaky = policy();
    leaky.as_object_mut().unwrap().remove("burst");
    leaky["algorithm"] = json!("leaky_bucket");
    assert_refused(
        json!({"policies": [leaky.clone()]}),
        "policies[0].max_delay",
        "needs the longest",
    );
    leaky["max_delay"] = json!("1s");
    leaky["scope"] = json!("global");
    leaky["lease"] = json!(2);
    let config = json!({"global": {"cluster": "c", "authority": "a"}, "policies": [leaky]});
    assert_refused(
        config,
        "policies[0].lease",
        "does not apply to the leaky_bucket algorithm",
    );
    assert_refused(
        with(json!({"algorithm": "gcra"})),
        "policies[0].algorithm",
        "unknown variant",
    );
}

#[test]
fn a_sliding_log_is_capped_and_windows_need_room_for_the_cost() {
    let mut log = policy();
    log.as_object_mut().unwrap().remove("burst");
    log["algorithm"] = json!("sliding_log");
    log["requests"] = json!(MAX_SLIDING_LOG + 1);
    assert_refused(
        json!({"policies": [log.clone()]}),
        "policies[0].requests",
        "at most 1000",
    );
    log["requests"] = json!(2);
    log["cost"] = json!(3);
    assert_refused(
        json!({"policies": [log]}),
        "policies[0].requests",
        "must be >= cost (3)",
    );
}

#[test]
fn a_sliding_log_keeps_a_word_per_request_of_its_largest_tier() {
    let mut log = policy();
    log.as_object_mut().unwrap().remove("burst");
    log["algorithm"] = json!("sliding_log");
    log["tiers"] =
        json!({"by": "header:x-plan", "values": {"pro": {"requests": 300, "per": "1m"}}});
    let plan = parse(json!({"policies": [log]}).to_string().as_bytes()).unwrap();
    assert_eq!(plan.policies[0].columns(), 300);
}

fn with_bypass(entry: Value) -> Value {
    json!({"policies": [policy()], "bypass": [entry]})
}

fn alice_bypass() -> Value {
    json!({"key": ["alice"], "policies": ["per-user"], "owner": "oncall@example.com",
        "reason": "INC-42", "expires": "2026-12-01T00:00:00Z"})
}

#[test]
fn a_bypass_names_its_key_policies_owner_reason_and_expiry() {
    let plan = parse(with_bypass(alice_bypass()).to_string().as_bytes()).unwrap();
    let b = &plan.bypass[0];
    assert_eq!(
        (b.policy, b.owner.as_str(), b.reason.as_str()),
        (0, "oncall@example.com", "INC-42")
    );
    assert_eq!(
        b.key,
        crate::core::key::hash_values(&["alice".into()], &crate::core::key::HashSecret::PUBLIC)
    );
    assert_eq!(b.expires, 1_796_083_200_000_000_000);
    let mut by_hash = alice_bypass();
    by_hash.as_object_mut().unwrap().remove("key");
    by_hash["key_hash"] = json!(format!("{:016x}", b.key));
    assert_eq!(
        parse(with_bypass(by_hash).to_string().as_bytes())
            .unwrap()
            .bypass,
        plan.bypass
    );
}

#[test]
fn a_bypass_without_its_audit_trail_is_refused() {
    for field in ["owner", "reason", "expires", "policies"] {
        let mut entry = alice_bypass();
        entry.as_object_mut().unwrap().remove(field);
        assert_refused(
            with_bypass(entry),
            "bypass[0]",
            &format!("missing field `{field}`"),
        );
    }
    let mut entry = alice_bypass();
    entry["owner"] = json!(" ");
    assert_refused(with_bypass(entry), "bypass[0].owner", "audit trail");
    let mut entry = alice_bypass();
    entry["expires"] = json!("next week");
    assert_refused(with_bypass(entry), "bypass[0].expires", "RFC 3339");
    let mut entry = alice_bypass();
    entry["policies"] = json!(["nope"]);
    assert_refused(
        with_bypass(entry),
        "bypass[0].policies[0]",
        "no policy is named",
    );
    let mut entry = alice_bypass();
    entry["key"] = json!(["alice", "extra"]);
    assert_refused(with_bypass(entry), "bypass[0].key", "1 key parts");
    let mut entry = alice_bypass();
    entry["key_hash"] = json!("zz");
    assert_refused(
        with_bypass(entry),
        "bypass[0]",
        "exactly one of key or key_hash",
    );
}

#[test]
fn a_denial_falls_back_field_by_field_to_the_top_level_then_to_429_json_resource_exhausted() {
    use crate::config::{Denial, GrpcStatus};
    let mut config = with(json!({"denial": {"status": 503}}));
    config["denial"] = json!({"body": "slow down", "content_type": "text/plain"});
    config["default"] = json!({"name": "d", "key": ["ip"], "requests": 1, "per": "1s"});
    let plan = parse(config.to_string().as_bytes()).unwrap();
    let own = &plan.policies[0].denial;
    assert_eq!((own.status, own.body.as_deref()), (503, Some("slow down")));
    assert_eq!(own.content_type, "text/plain");
    assert_eq!(own.grpc_status, GrpcStatus::ResourceExhausted);
    assert_eq!(
        plan.policies[1].denial.status, 429,
        "the default policy: the top level's"
    );
    let plain = parse(with(json!({})).to_string().as_bytes()).unwrap();
    assert_eq!(plain.policies[0].denial, Denial::default());
}

#[test]
fn rejects_bad_denials_naming_the_field() {
    for status in [200, 399, 600] {
        assert_refused(
            with(json!({"denial": {"status": status}})),
            "policies[0].denial.status",
            "between 400 and 599",
        );
    }
    let mut top = with(json!({}));
    top["denial"] = json!({"content_type": "text/plain\r\nx-evil: 1"});
    assert_refused(top, "denial.content_type", "printable ASCII");
    assert_refused(
        with(json!({"denial": {"content_type": ""}})),
        "policies[0].denial.content_type",
        "not empty",
    );
    assert_refused(
        with(json!({"denial": {"grpc_status": "ok"}})),
        "policies[0].denial.grpc_status",
        "unknown variant",
    );
    assert_refused(
        with(json!({"denial": {"code": 429}})),
        "policies[0].denial.code",
        "unknown field",
    );
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..200)) {
        let _ = parse(&bytes);
    }
}

#[test]
fn route_scope_reads_the_route_only_when_asked_to() {
    let routes = with(json!({"match": {"routes": ["checkout"]}}));
    let plan = parse(routes.to_string().as_bytes()).unwrap();
    assert!(plan.attrs.contains(&Attr::Route));
    assert_eq!(plan.route_metadata, None);
    let mut asked = with(json!({}));
    asked["route_metadata"] = json!(true);
    let plan = parse(asked.to_string().as_bytes()).unwrap();
    let attr = plan.route_metadata.map(|i| &plan.attrs[i]);
    assert_eq!(attr, Some(&Attr::RouteMetadata));
    let plain = parse(with(json!({})).to_string().as_bytes()).unwrap();
    assert!(!plain
        .attrs
        .iter()
        .any(|a| matches!(a, Attr::Route | Attr::RouteMetadata)));
}

#[test]
fn a_rollout_enforces_for_its_share_of_the_keys_in_millionths() {
    let plan = parse(
        with(json!({"rollout": {"enforce_percent": 12.5}}))
            .to_string()
            .as_bytes(),
    );
    let rollout = plan.unwrap().policies[0].rollout;
    assert_eq!(
        rollout,
        Some(Rollout {
            enforce_per_million: 125_000
        })
    );
    for percent in [0, 100] {
        let plan = parse(
            with(json!({"rollout": {"enforce_percent": percent}}))
                .to_string()
                .as_bytes(),
        );
        assert!(plan.is_ok(), "{percent}");
    }
}

#[test]
fn rejects_a_rollout_out_of_range_or_on_a_shadow_policy() {
    for percent in [json!(-1), json!(100.5), json!("10")] {
        let config = with(json!({"rollout": {"enforce_percent": percent}}));
        assert_eq!(refused(config).field, "policies[0].rollout.enforce_percent");
    }
    assert_refused(
        with(json!({"rollout": {"enforce_percent": 10}, "mode": "shadow"})),
        "policies[0].rollout",
        "mode",
    );
    assert_refused(
        with(json!({"rollout": {"percent": 10}})),
        "policies[0].rollout.percent",
        "unknown field",
    );
}

fn with_cost(cost: Value) -> Value {
    with(json!({"requests": 1000, "per": "1m", "burst": null, "cost": cost}))
}

#[test]
fn a_cost_read_from_the_response_reserves_nothing_owes_a_burst_and_charges_the_most_unknown_by_default(
) {
    let config = with_cost(json!({"from_response": {"usage": "total_tokens"}}));
    let plan = parse(config.to_string().as_bytes()).unwrap();
    let policy = &plan.policies[0];
    let metered = policy.metered.as_ref().unwrap();
    assert_eq!(metered.reserve, Reserve::Tokens(0));
    assert_eq!(metered.on_unknown, OnUnknown::Max);
    assert_eq!(metered.max_debt(&policy.tier), 1000, "one burst");
    assert_eq!(policy.cost, 0);
    assert!(!metered.ask_stream_usage);
}

#[test]
fn a_metered_cost_takes_weights_a_header_and_a_reservation_from_the_request() {
    let weights = json!({"from_response": {"usage": {"input_tokens": 1, "output_tokens": 4}},
        "reserve": {"request": "max_tokens", "default": 500}, "max_debt": 2000,
        "on_unknown": 300, "ask_stream_usage": true});
    let plan = parse(with_cost(weights).to_string().as_bytes()).unwrap();
    let metered = plan.policies[0].metered.clone().unwrap();
    assert_eq!(
        metered.source,
        UsageSource::Body(crate::core::usage::Meter::Weighted(
            crate::core::usage::Weights {
                input: 1,
                output: 4,
                cache_read: 1,
                cache_write: 1,
                reasoning: 4,
            }
        ))
    );
    assert!(matches!(
        metered.reserve,
        Reserve::MaxOutputTokens { default: 500, .. }
    ));
    assert!(plan.reads_body);
    assert_eq!(plan.policies[0].cost, 500);
    assert_eq!(
        (metered.max_debt, metered.on_unknown),
        (Some(2000), OnUnknown::Tokens(300))
    );
    let header = json!({"from_response": {"header": "X-Usage-Total-Tokens"}, "reserve": 100});
    let plan = parse(with_cost(header).to_string().as_bytes()).unwrap();
    let source = &plan.policies[0].metered.as_ref().unwrap().source;
    assert_eq!(*source, UsageSource::Header("x-usage-total-tokens".into()));
}

#[test]
fn a_metered_cost_names_what_is_wrong_in_it() {
    let from = |from: Value| with_cost(json!({"from_response": from}));
    assert_refused(
        from(json!({"usage": "tokens"})),
        "policies[0].cost.from_response.usage",
        "unknown count",
    );
    assert_refused(
        from(json!({"usage": "total_tokens", "header": "x-usage"})),
        "policies[0].cost.from_response",
        "one of usage or header",
    );
    assert_refused(
        from(json!({"header": "x usage"})),
        "policies[0].cost.from_response.header",
        "not a valid header name",
    );
    assert_refused(
        with_cost(json!({"from_response": {"usage": "total_tokens"}, "reserve": 5000})),
        "policies[0].burst",
        ">= cost (5000)",
    );
    assert_refused(
        with_cost(
            json!({"from_response": {"usage": "total_tokens"}, "reserve": {"request": "model", "default": 1}}),
        ),
        "policies[0].cost.reserve.request",
        "max_tokens",
    );
    assert_refused(
        with_cost(json!({"from_response": {"usage": "total_tokens"}, "on_unknown": "forgive"})),
        "policies[0].cost.on_unknown",
        "reserve",
    );
    assert_refused(
        with_cost(json!({"from_response": {"usage": "total_tokens"}, "reserv": 1})),
        "policies[0].cost.reserv",
        "unknown field",
    );
    assert_refused(
        with_cost(json!("many")),
        "policies[0].cost",
        "number of tokens",
    );
    let log = with(
        json!({"algorithm": "sliding_log", "burst": null, "requests": 10, "per": "1m",
        "cost": {"from_response": {"usage": "total_tokens"}}}),
    );
    assert_refused(log, "policies[0].cost.from_response", "sliding_log");
    let lent = with(
        json!({"requests": 1000, "per": "1m", "burst": null, "lease": 10,
        "cost": {"from_response": {"usage": "total_tokens"}}}),
    );
    assert_refused(lent, "policies[0].lease", "lent ahead");
}

#[test]
fn a_concurrency_policy_refuses_a_window_a_burst_and_a_cost() {
    let streams = |fields: Value| {
        let mut policy = json!({"name": "streams", "key": ["header:x-user-id"],
            "algorithm": "concurrency", "requests": 4});
        for (k, v) in fields.as_object().unwrap() {
            policy[k] = v.clone();
        }
        json!({"policies": [policy]})
    };
    let plan = parse(streams(json!({})).to_string().as_bytes()).unwrap();
    let Algorithm::Concurrency(slots) = plan.policies[0].tier.algorithm else {
        panic!("concurrency");
    };
    assert_eq!(
        (slots.limit, slots.lease()),
        (4, 60 * crate::core::duration::NANOS_PER_SEC)
    );
    assert_refused(
        streams(json!({"per": "1s"})),
        "policies[0].per",
        "concurrency",
    );
    assert_refused(
        streams(json!({"burst": 2})),
        "policies[0].burst",
        "concurrency",
    );
    assert_refused(streams(json!({"cost": 2})), "policies[0].cost", "no cost");
    assert_refused(
        streams(json!({"lease": 3})),
        "policies[0].lease",
        "duration",
    );
    assert_refused(
        streams(json!({"lease": "1s"})),
        "policies[0].lease",
        "between 4s",
    );
    assert_refused(
        streams(json!({"retry_after": "soon"})),
        "policies[0].retry_after",
        "",
    );
    assert_refused(
        with(json!({"retry_after": "1s"})),
        "policies[0].retry_after",
        "does not apply",
    );
    assert_refused(
        with(json!({"lease": "5m"})),
        "policies[0].lease",
        "number of tokens",
    );
}

#[test]
fn a_global_concurrency_limit_fits_what_the_service_keeps_of_a_key() {
    let streams = |requests: u64, tiers: Value| {
        json!({"global": {"cluster": "c", "authority": "a"}, "policies": [{"name": "streams",
            "key": ["header:x-user-id"], "algorithm": "concurrency", "requests": requests,
            "scope": "global", "tiers": tiers}]})
    };
    let tiers =
        |requests: u64| json!({"by": "header:x-plan", "values": {"big": {"requests": requests}}});
    let most = crate::config::MAX_GLOBAL_SLOTS;
    assert!(parse(streams(most, tiers(most)).to_string().as_bytes()).is_ok());
    assert_refused(
        streams(most + 1, tiers(1)),
        "policies[0].requests",
        "at most 10000 requests of one key in flight",
    );
    assert_refused(
        streams(1, tiers(most + 1)),
        "policies[0].tiers.values.big.requests",
        "at most 10000",
    );
    let mut local = streams(most + 1, tiers(most + 1));
    local["policies"][0]["scope"] = json!("local");
    assert!(
        parse(local.to_string().as_bytes()).is_ok(),
        "a local one keeps its own"
    );
}

/// Issue 31, finding 3: sluice-service refuses a check or a charge whose key would outlive its
/// --max-key-ttl (62 days unless told), so a global policy of such a limit is refused here,
/// naming the field; `global.max_key_ttl` says the service keeps keys longer.
#[test]
fn a_global_policy_whose_key_would_outlive_the_services_max_key_ttl_is_refused() {
    let budget = |policy: Value, max_key_ttl: Option<&str>| {
        let mut global = json!({"cluster": "c", "authority": "a"});
        if let Some(ttl) = max_key_ttl {
            global["max_key_ttl"] = json!(ttl);
        }
        let mut p = json!({"name": "llm", "key": ["header:x-user-id"], "scope": "global"});
        for (k, v) in policy.as_object().unwrap() {
            p[k] = v.clone();
        }
        json!({"global": global, "policies": [p]})
    };
    let metered = json!({"requests": 30, "per": "40d",
        "cost": {"from_response": {"usage": "total_tokens"}}});
    // 40 days to refill the burst, and as long again for a debt of a burst: 80 days.
    assert_refused(
        budget(metered.clone(), None),
        "policies[0].cost.max_debt",
        "its key would live 80d, more than sluice-service keeps a key (62d",
    );
    assert!(parse(budget(metered, Some("90d")).to_string().as_bytes()).is_ok());
    assert_refused(
        budget(json!({"requests": 10, "per": "70d"}), None),
        "policies[0].burst",
        "70d",
    );
    assert_refused(
        budget(
            json!({"algorithm": "sliding_window", "requests": 10, "per": "40d"}),
            None,
        ),
        "policies[0].per",
        "80d",
    );
    let flat = json!({"algorithm": "fixed_window", "requests": 10, "per": "40d"});
    assert!(parse(budget(flat, None).to_string().as_bytes()).is_ok());
    assert_refused(
        budget(json!({"requests": 10, "per": "1d"}), Some("tomorrow")),
        "global.max_key_ttl",
        "",
    );
    let mut local = budget(json!({"requests": 10, "per": "70d"}), None);
    local["policies"][0]["scope"] = json!("local");
    assert!(
        parse(local.to_string().as_bytes()).is_ok(),
        "a local key lives in shared data"
    );
}

#[test]
fn a_policys_api_wins_over_the_top_level_one_which_wins_over_generic() {
    use crate::config::Api;
    let mut config = with(json!({"api": "anthropic", "denial": {"status": 503}}));
    config["api"] = json!("openai");
    let mut other = policy();
    other["name"] = json!("other");
    config["policies"].as_array_mut().unwrap().push(other);
    let plan = parse(config.to_string().as_bytes()).unwrap();
    assert_eq!(plan.policies[0].denial.api, Api::Anthropic);
    assert_eq!(plan.policies[0].denial.status, 503);
    assert_eq!(plan.policies[1].denial.api, Api::Openai);
    let plain = parse(with(json!({})).to_string().as_bytes()).unwrap();
    assert_eq!(plain.policies[0].denial.api, Api::Generic);
    let e = refused(with(json!({"api": "cohere"})));
    assert!(e.reason.contains("unknown variant"), "{e}");
}

fn calendar_policy(per: &str, calendar: Value) -> Value {
    with(json!({"algorithm": "fixed_window", "burst": null, "per": per, "calendar": calendar}))
}

/// `with` leaves a `"burst": null` that the strict reader takes as none.
fn calendar_plan(per: &str, calendar: Value) -> Result<Plan, ConfigError> {
    let mut config = calendar_policy(per, calendar);
    config["policies"][0]
        .as_object_mut()
        .unwrap()
        .remove("burst");
    parse(config.to_string().as_bytes())
}

#[test]
fn a_calendar_window_compiles_to_a_fixed_window_on_that_calendar() {
    let plan = calendar_plan(
        "1mo",
        json!({"timezone": "Europe/Berlin", "starts": {"day": 15, "time": "06:00"}}),
    )
    .unwrap();
    let Algorithm::FixedWindow(window) = plan.policies[0].tier.algorithm else {
        panic!("a fixed window");
    };
    let calendar = window.calendar.unwrap();
    assert_eq!(calendar.unit, crate::core::calendar::Unit::Month);
    let (zone, starts) = calendar.describe().unwrap();
    assert_eq!(
        (zone.as_str(), starts.day, starts.second),
        ("Europe/Berlin", 15, 6 * 3600)
    );
    assert_eq!(plan.policies[0].tier.per_nanos, 30 * 86_400 * 1_000_000_000);
    let weekly = json!({"timezone": "UTC", "starts": {"weekday": "friday", "time": "17:00:30"}});
    assert!(calendar_plan("1w", weekly).is_ok());
    let yearly = json!({"timezone": "Asia/Tokyo", "starts": {"month": 4, "day": 1}});
    assert!(calendar_plan("1y", yearly).is_ok());
    assert!(calendar_plan("1d", json!({"timezone": "America/New_York"})).is_ok());
}

#[test]
fn calendar_errors_name_the_field() {
    let refused_as = |per: &str, calendar: Value, field: &str, says: &str| {
        let e = calendar_plan(per, calendar).expect_err("should be refused");
        assert_eq!(e.field, field, "{e}");
        assert!(e.reason.contains(says), "{e}");
    };
    let berlin = |starts: Value| json!({"timezone": "Europe/Berlin", "starts": starts});
    refused_as(
        "1mo",
        json!({"timezone": "Europe/Atlantis"}),
        "policies[0].calendar.timezone",
        "not a time zone",
    );
    refused_as("1h", berlin(json!({})), "policies[0].per", "1mo");
    refused_as(
        "30d",
        berlin(json!({})),
        "policies[0].per",
        "calendar window",
    );
    refused_as(
        "1mo",
        berlin(json!({"day": 0})),
        "policies[0].calendar.starts.day",
        "1 to 31",
    );
    refused_as(
        "1mo",
        berlin(json!({"day": 32})),
        "policies[0].calendar.starts.day",
        "1 to 31",
    );
    refused_as(
        "1y",
        berlin(json!({"month": 13})),
        "policies[0].calendar.starts.month",
        "1 to 12",
    );
    refused_as(
        "1mo",
        berlin(json!({"weekday": "monday"})),
        "policies[0].calendar.starts.weekday",
        "1w only",
    );
    refused_as(
        "1w",
        berlin(json!({"weekday": "mon"})),
        "policies[0].calendar.starts.weekday",
        "day of the week",
    );
    refused_as(
        "1w",
        berlin(json!({"day": 3})),
        "policies[0].calendar.starts.day",
        "1mo or 1y",
    );
    refused_as(
        "1d",
        berlin(json!({"time": "24:00"})),
        "policies[0].calendar.starts.time",
        "time of day",
    );
    refused_as(
        "1d",
        berlin(json!({"time": "6:00"})),
        "policies[0].calendar.starts.time",
        "time of day",
    );
    refused_as(
        "1mo",
        berlin(json!({"hour": 6})),
        "policies[0].calendar.starts.hour",
        "unknown field",
    );
    refused_as(
        "1mo",
        json!({"starts": {}}),
        "policies[0].calendar",
        "timezone",
    );
    // Without a calendar a calendar period is no duration, and says what it lacks.
    assert_refused(
        with(json!({"algorithm": "fixed_window", "per": "1mo"})),
        "policies[0].per",
        "needs the policy's \"calendar\"",
    );
    // Only a fixed window follows a calendar.
    for algorithm in [
        "token_bucket",
        "sliding_window",
        "sliding_log",
        "leaky_bucket",
    ] {
        let mut config = calendar_policy("1mo", json!({"timezone": "UTC"}));
        config["policies"][0]["algorithm"] = json!(algorithm);
        assert_refused(config, "policies[0].calendar", algorithm);
    }
}

#[test]
fn a_tier_takes_the_policys_calendar_with_its_own_period() {
    let mut config = calendar_policy("1mo", json!({"timezone": "Europe/Berlin"}));
    let policy = config["policies"][0].as_object_mut().unwrap();
    policy.remove("burst");
    policy.insert(
        "tiers".into(),
        json!({"by": "header:x-plan", "values": {"daily": {"requests": 5, "per": "1d"}, "bad": {"requests": 5, "per": "1h"}}}),
    );
    assert_refused(
        config,
        "policies[0].tiers.values.bad.per",
        "calendar window",
    );
}

#[test]
fn header_policies_is_from_one_to_eight() {
    let config = |n: u64| json!({"header_policies": n, "policies": [{"name": "p", "key": ["header:x"], "requests": 1, "per": "1s"}]});
    assert_eq!(
        parse(config(8).to_string().as_bytes())
            .unwrap()
            .header_policies,
        8
    );
    for n in [0, 9, 300] {
        assert_refused(config(n), "header_policies", "from 1 to 8");
    }
}

#[test]
fn a_global_calendar_needs_sluice_service_and_a_key_ttl_for_its_longest_period() {
    let global = |per: &str, service: Value| {
        let mut config = calendar_policy(per, json!({"timezone": "Europe/Berlin"}));
        let policy = config["policies"][0].as_object_mut().unwrap();
        policy.remove("burst");
        policy.insert("scope".into(), json!("global"));
        config["global"] = service;
        config
    };
    let sluice = json!({"cluster": "sluice"});
    assert!(parse(global("1mo", sluice.clone()).to_string().as_bytes()).is_ok());
    // A year's period lives 366 days and an hour: more than the service's default 62d.
    let e = refused(global("1y", sluice));
    assert!(e.reason.contains("max_key_ttl"), "{e}");
    let longer = json!({"cluster": "sluice", "max_key_ttl": "367d"});
    assert!(parse(global("1y", longer).to_string().as_bytes()).is_ok());
    let rls = json!({"cluster": "rls", "protocol": "rls", "domain": "d"});
    assert_refused(global("1mo", rls), "policies[0].calendar", "sluice-service");
}

#[test]
fn a_spend_budget_prices_by_model_reads_the_body_and_refuses_unpriced_models_by_default() {
    use crate::core::usage::price::UnknownModel;
    let price = json!({"gpt-4o*": {"input": 2.5, "output": 10}});
    let plan = parse(with_cost(json!({"price": price})).to_string().as_bytes()).unwrap();
    let policy = &plan.policies[0];
    let (pricing, model) = policy.metered.as_ref().unwrap().source.pricing().unwrap();
    assert_eq!(pricing.unknown, UnknownModel::Refuse);
    assert_eq!(
        plan.attrs[model],
        Attr::Body(crate::core::request::BodyField::String("model".into()))
    );
    assert!(plan.reads_body && plan.policy_reads_body(policy));
    assert!(policy.meters_bodies());
    let free = with_cost(json!({"price": price, "unknown_model": "free"}));
    let plan = parse(free.to_string().as_bytes()).unwrap();
    let source = &plan.policies[0].metered.as_ref().unwrap().source;
    assert_eq!(source.pricing().unwrap().0.unknown, UnknownModel::Free);
}

#[test]
fn a_spend_budget_names_what_is_wrong_in_it() {
    let price = json!({"gpt-4o": {"input": 2.5, "output": 10}});
    assert_refused(
        with_cost(json!({"price": {"gpt-4o": {"input": 2.5}}})),
        "policies[0].cost.price",
        "gpt-4o: output: required",
    );
    assert_refused(
        with_cost(json!({"price": price, "from_response": {"usage": "total_tokens"}})),
        "policies[0].cost.from_response",
        "leave from_response out",
    );
    assert_refused(
        with_cost(json!({"reserve": 10})),
        "policies[0].cost",
        "needs from_response",
    );
    assert_refused(
        with_cost(json!({"price": price, "unknown_model": "charge"})),
        "policies[0].cost.unknown_model",
        "\"refuse\"",
    );
    assert_refused(
        with_cost(json!({"price": price, "unknown_model": {"price": {"input": -1, "output": 1}}})),
        "policies[0].cost.unknown_model",
        "price: input: must be a number",
    );
    assert_refused(
        with_cost(json!({"from_response": {"usage": "total_tokens"}, "unknown_model": "free"})),
        "policies[0].cost.unknown_model",
        "only a spend budget",
    );
    // $2,000 a day across Envoys is more than sluice-service counts for a key.
    let mut global = with(json!({"requests": 2_000_000_000u64, "per": "1d",
        "scope": "global", "cost": {"price": price}}));
    global["global"] = json!({"cluster": "sluice"});
    assert_refused(global, "policies[0].requests", "at most 1000000000");
}

#[test]
fn a_status_path_is_a_path_alone_and_off_unless_given() {
    assert_eq!(
        parse(with(json!({})).to_string().as_bytes())
            .unwrap()
            .status_path,
        None
    );
    let mut on = with(json!({}));
    on["status_path"] = json!("/api/ratelimit/status");
    let plan = parse(on.to_string().as_bytes()).unwrap();
    assert_eq!(plan.status_path.as_deref(), Some("/api/ratelimit/status"));
    for bad in [
        "ratelimit/status",
        "",
        "/status?key=bob",
        "/status#x",
        "/rate limit",
        "/s\u{7f}",
        "/é",
    ] {
        let mut config = with(json!({}));
        config["status_path"] = json!(bad);
        assert_eq!(refused(config).field, "status_path", "{bad:?}");
    }
    let mut long = with(json!({}));
    long["status_path"] = json!(format!("/{}", "a".repeat(256)));
    assert_eq!(refused(long).field, "status_path");
}

#[test]
fn overrides_are_pulled_only_when_asked_and_within_their_bounds() {
    let global = |overrides: Value| json!({"global": {"cluster": "sluice", "overrides": overrides}, "policies": [policy()]});
    let plan = parse(global(json!({})).to_string().as_bytes()).unwrap();
    let sync = plan.global.unwrap().overrides.unwrap();
    assert_eq!(
        (sync.every, sync.max, sync.path.as_str()),
        (2_000_000_000, 10_000, "/v1/overrides")
    );
    let off = parse(
        json!({"global": {"cluster": "sluice"}, "policies": [policy()]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        off.unwrap().global.unwrap().overrides,
        None,
        "off by default"
    );
    assert_refused(
        global(json!({"every": "500ms"})),
        "global.overrides.every",
        "between 1s and 60s",
    );
    assert_refused(
        global(json!({"max": 0})),
        "global.overrides.max",
        "between 1 and 100000",
    );
    assert_refused(
        global(json!({"max": 100_001})),
        "global.overrides.max",
        "100000",
    );
    assert_refused(
        global(json!({"path": "v1"})),
        "global.overrides.path",
        "'/'",
    );
    assert_refused(
        global(json!({"often": "1s"})),
        "global.overrides.often",
        "unknown field",
    );
    let rls = json!({"global": {"protocol": "rls", "cluster": "rls", "domain": "d",
        "overrides": {}}, "policies": [policy()]});
    assert_refused(rls, "global.overrides", "sluice-service's");
}

#[test]
fn an_admin_path_is_off_unless_given_and_needs_a_listener_and_its_tokens() {
    assert_eq!(
        parse(with(json!({})).to_string().as_bytes()).unwrap().admin,
        None
    );
    let token = "alice 0123456789abcdef0123456789abcdef\nbob fedcba9876543210fedcba9876543210";
    let env = |name: &str| match name {
        "ADMIN_T" => Some(token.to_string()),
        "READ_T" => Some("fedcba9876543210fedcba98765432ff".to_string()),
        "SHORT" => Some("tooshort".to_string()),
        "THREE" => Some("a b c".to_string()),
        _ => None,
    };
    let admin = |fields: Value| {
        let mut config = with(json!({}));
        config["admin"] = fields;
        parse_with_env(config.to_string().as_bytes(), &env)
    };
    let plan =
        admin(json!({"listener": "ops", "token_env": "ADMIN_T", "read_token_env": "READ_T"}))
            .unwrap();
    let path = plan.admin.unwrap();
    assert_eq!(
        (path.path.as_str(), path.listener.as_str()),
        ("/sluice/admin/v1", "ops")
    );
    let names: Vec<(&str, bool)> = path
        .tokens
        .iter()
        .map(|t| (t.name.as_str(), t.writes))
        .collect();
    assert_eq!(names, [("alice", true), ("bob", true), ("read", false)]);
    assert!(path.covers(b"/sluice/admin/v1/keys/show"));
    assert!(!path.covers(b"/sluice/admin/v10"));
    let cases = [
        (json!({"token_env": "ADMIN_T"}), "admin"),
        (
            json!({"listener": "", "token_env": "ADMIN_T"}),
            "admin.listener",
        ),
        (
            json!({"listener": "o p", "token_env": "ADMIN_T"}),
            "admin.listener",
        ),
        (json!({"listener": "ops"}), "admin"),
        (
            json!({"listener": "ops", "token_env": "UNSET"}),
            "admin.token_env",
        ),
        (
            json!({"listener": "ops", "token_env": "SHORT"}),
            "admin.token_env",
        ),
        (
            json!({"listener": "ops", "token_env": "THREE"}),
            "admin.token_env",
        ),
        (
            json!({"listener": "ops", "token_env": "1X"}),
            "admin.token_env",
        ),
        (
            json!({"listener": "ops", "token_env": "ADMIN_T", "read_token_env": "UNSET"}),
            "admin.read_token_env",
        ),
        (
            json!({"listener": "ops", "token_env": "ADMIN_T", "path": "/a/"}),
            "admin.path",
        ),
        (
            json!({"listener": "ops", "token_env": "ADMIN_T", "path": "a"}),
            "admin.path",
        ),
        (
            json!({"listener": "ops", "token_env": "ADMIN_T", "path": "/a?b"}),
            "admin.path",
        ),
        (
            json!({"listener": "ops", "token_env": "ADMIN_T", "other": 1}),
            "admin.other",
        ),
    ];
    for (fields, field) in cases {
        let error = admin(fields.clone()).unwrap_err();
        assert!(error.field.starts_with(field), "{fields}: {error}");
        assert!(
            !error.reason.contains("0123456789abcdef"),
            "no token in {error}"
        );
    }
}
