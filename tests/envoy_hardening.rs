//! Hostile and odd requests through a real Envoy (`--concurrency 2`): what Envoy refuses before
//! the filter runs, what the filter sees of what it lets through, and that none of it panics the
//! VM, reaches a response header, or lets a client pick its own identity or tier.
//!
//! Each test starts its own Envoy and ends by checking that the filter still works (a fresh key
//! gets exactly its burst), that every request the filter saw is in its counters and no other,
//! and that Envoy's log has no panic, VM failure, error or critical line.
//!
//! Outcomes are written `"<status> <policy> r=<remaining>"`: the policy the draft `ratelimit`
//! header names (the enforcing policy with the fewest tokens left) and its remaining tokens, or
//! `"<status> -"` when the response has no rate-limit headers. `per-ip` applies to every request
//! the filter sees with a budget that never runs out; its remaining count is left out.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use sluice::limiter::PolicyOutcome::{Allowed, Denied};
use sluice::output::metrics::requests_counter;
use sluice_testkit::envoy::{Envoy, EnvoyOptions};
use sluice_testkit::http::Response;
use std::cell::RefCell;
use std::collections::BTreeSet;

/// Keyed on a header (with a tier), on the path and on the client address. Limits are "per 1h"
/// so nothing refills during a test.
const ODD: &str = r#"{"headers": "both", "policies": [
  {"name": "per-user", "match": {"path_prefix": "/user/"}, "key": ["header:x-user-id"],
   "requests": 1, "per": "1h", "burst": 2, "max_keys": 1000,
   "tiers": {"by": "header:x-plan", "values": {"premium": {"requests": 1, "per": "1h", "burst": 3}}}},
  {"name": "shared", "match": {"path_prefix": "/shared/"}, "key": ["header:x-user-id"],
   "missing_key": "shared", "requests": 1, "per": "1h", "burst": 2, "max_keys": 1000},
  {"name": "per-path", "match": {"path_prefix": "/api/"}, "key": ["path"],
   "requests": 1, "per": "1h", "burst": 1, "max_keys": 1000},
  {"name": "per-ip", "key": ["ip"], "requests": 1000000, "per": "1h", "burst": 1000000, "max_keys": 100}
]}"#;

/// Envoy's log lines that mean the filter or Envoy broke.
const BAD_LOG_MARKERS: [&str; 4] = ["panicked", "Wasm VM failed", "][critical][", "][error]["];

/// An Envoy with the `ODD` config (or another), remembering every outcome it gave.
struct Odd {
    envoy: Envoy,
    outcomes: RefCell<Vec<String>>,
}

impl Odd {
    fn start(options: EnvoyOptions) -> Odd {
        Odd {
            envoy: options.start(),
            outcomes: RefCell::new(Vec::new()),
        }
    }

    /// One GET; its outcome (see the module doc).
    fn get(&self, path: &str, headers: &[(&str, &[u8])]) -> String {
        self.send(path, headers).0
    }

    /// One GET; its outcome and the response.
    fn send(&self, path: &str, headers: &[(&str, &[u8])]) -> (String, Response) {
        let response = self.envoy.get(path, headers);
        let outcome = outcome(&response);
        self.outcomes.borrow_mut().push(outcome.clone());
        (outcome, response)
    }

    /// `n` GETs in a row; their outcomes.
    fn gets(&self, n: usize, path: &str, headers: &[(&str, &[u8])]) -> Vec<String> {
        (0..n).map(|_| self.get(path, headers)).collect()
    }

    fn count(&self, status: &str) -> u64 {
        let outcomes = self.outcomes.borrow();
        outcomes.iter().filter(|o| o.starts_with(status)).count() as u64
    }

    /// The filter still admits a fresh user's burst of 2 and no more; it counted every request
    /// it answered (each 200 in `per-ip.allowed`, each 429 in one `denied`) and none that Envoy
    /// refused before it; the log is clean.
    fn assert_still_healthy(&self, denying: &[&str]) {
        let fresh: &[(&str, &[u8])] = &[("x-user-id", b"fresh-after-all-of-it")];
        assert_eq!(
            self.gets(3, "/user/fresh", fresh),
            ["200 per-user r=1", "200 per-user r=0", "429 per-user r=0"]
        );
        let ok = self.count("200");
        assert_eq!(
            self.envoy
                .wait_for_wasm_counter(&requests_counter("per-ip", Allowed), ok),
            ok,
            "per-ip.allowed is not the number of 200s: a request Envoy refused reached the filter?"
        );
        let denied: u64 = denying
            .iter()
            .map(|p| {
                self.envoy
                    .wasm_counter(&requests_counter(p, Denied))
                    .unwrap_or(0)
            })
            .sum();
        assert_eq!(denied, self.count("429"), "denials counted vs 429s seen");
        assert_clean_log(&self.envoy);
    }
}

fn assert_clean_log(envoy: &Envoy) {
    let log = envoy.log();
    let bad: Vec<&str> = log
        .lines()
        .filter(|line| BAD_LOG_MARKERS.iter().any(|m| line.contains(m)))
        .collect();
    assert!(bad.is_empty(), "Envoy logged:\n{}", bad.join("\n"));
}

/// `"200 per-user r=1"`, `"429 per-path r=0"`, `"200 per-ip"`, or `"431 -"` without rate-limit
/// headers.
fn outcome(r: &Response) -> String {
    let Some(ratelimit) = r.header("ratelimit") else {
        assert!(
            r.header("x-ratelimit-limit").is_none(),
            "legacy headers without draft ones: {r:?}"
        );
        return format!("{} -", r.status);
    };
    // `"<name>";r=<remaining>;t=<seconds>`
    let (name, rest) = ratelimit
        .strip_prefix('"')
        .and_then(|s| s.split_once("\";r="))
        .unwrap_or_else(|| panic!("malformed ratelimit header {ratelimit:?}"));
    let remaining = rest.split(';').next().unwrap_or_default();
    if name == "per-ip" {
        format!("{} per-ip", r.status)
    } else {
        format!("{} {name} r={remaining}", r.status)
    }
}

fn user(id: &[u8]) -> [(&str, &[u8]); 1] {
    [("x-user-id", id)]
}

/// `count` distinct small headers `x-h<i>: v`.
fn many_headers(count: usize) -> Vec<(String, Vec<u8>)> {
    (0..count)
        .map(|i| (format!("x-h{i}"), b"v".to_vec()))
        .collect()
}

fn as_refs(headers: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect()
}

// --- 1. Odd header values.

#[test]
fn odd_header_values_are_keys_like_any_other_and_what_envoy_refuses_never_reaches_the_filter() {
    let odd = Odd::start(Envoy::options(ODD));

    // Non-UTF-8 bytes (obs-text) pass Envoy and are hashed as bytes: one bucket per value.
    assert_eq!(
        odd.gets(3, "/user/x", &user(b"\xff\xfe")),
        ["200 per-user r=1", "200 per-user r=0", "429 per-user r=0"]
    );
    assert_eq!(odd.get("/user/x", &user(b"\xff\xfd")), "200 per-user r=1");
    assert_eq!(odd.get("/user/x", &user(b"caf\xe9")), "200 per-user r=1");
    // The same name in UTF-8 is another key.
    assert_eq!(
        odd.get("/user/x", &user("café".as_bytes())),
        "200 per-user r=1"
    );

    // An empty value counts as missing: the per-user policy does not apply...
    assert_eq!(odd.gets(3, "/user/x", &user(b"")), ["200 per-ip"; 3]);
    // ...unless missing_key is shared: empty and absent then share one bucket.
    assert_eq!(odd.get("/shared/x", &user(b"")), "200 shared r=1");
    assert_eq!(odd.get("/shared/x", &[]), "200 shared r=0");
    assert_eq!(odd.get("/shared/x", &user(b"")), "429 shared r=0");

    // Envoy strips surrounding whitespace (OWS): `  lead  ` is the key `lead`.
    assert_eq!(odd.get("/user/x", &user(b"  lead\t ")), "200 per-user r=1");
    assert_eq!(odd.get("/user/x", &user(b"lead")), "200 per-user r=0");

    // A repeated key header: the first value is the key (Envoy hands the filter the first of
    // repeated headers); the joined form `dup1,dup2` is another key. An empty first value makes
    // the key missing whatever follows. A backend that reads another of the values disagrees
    // with the filter on who the client is: one more reason to key on verified metadata.
    let repeated: &[(&str, &[u8])] = &[("x-user-id", b"dup1"), ("x-user-id", b"dup2")];
    assert_eq!(odd.get("/user/x", repeated), "200 per-user r=1");
    assert_eq!(odd.get("/user/x", &user(b"dup1")), "200 per-user r=0");
    assert_eq!(odd.get("/user/x", &user(b"dup2")), "200 per-user r=1");
    assert_eq!(odd.get("/user/x", &user(b"dup1,dup2")), "200 per-user r=1");
    let empty_first: &[(&str, &[u8])] = &[("x-user-id", b""), ("x-user-id", b"dup3")];
    assert_eq!(odd.get("/user/x", empty_first), "200 per-ip");

    // A 60 KiB value, or 300 headers, is over Envoy's default limits (max_request_headers_kb 60,
    // max_headers_count 100): Envoy answers 431 itself, the filter never sees the request.
    let big = vec![b'k'; 60 * 1024];
    assert_eq!(odd.get("/user/x", &user(&big)), "431 -");
    let three_hundred = many_headers(300);
    assert_eq!(odd.get("/user/x", &as_refs(&three_hundred)), "431 -");
    // 90 extra headers are within the limit and change nothing.
    let mut ninety = many_headers(90);
    ninety.push(("x-user-id".into(), b"ninety".to_vec()));
    assert_eq!(odd.get("/user/x", &as_refs(&ninety)), "200 per-user r=1");

    odd.assert_still_healthy(&["per-user", "shared", "per-path"]);
}

#[test]
fn with_raised_header_limits_a_60_kib_key_and_300_headers_are_ordinary_requests() {
    let odd = Odd::start(
        Envoy::options(ODD)
            .hcm_option("max_request_headers_kb", "96")
            .hcm_option("common_http_protocol_options", "{ max_headers_count: 500 }"),
    );

    // The whole 60 KiB value is the key: one byte different at the end is another bucket.
    let mut big = vec![b'k'; 60 * 1024];
    assert_eq!(
        odd.gets(3, "/user/x", &user(&big)),
        ["200 per-user r=1", "200 per-user r=0", "429 per-user r=0"]
    );
    *big.last_mut().unwrap() = b'l';
    assert_eq!(odd.get("/user/x", &user(&big)), "200 per-user r=1");

    // 300 headers: the key among them is found like in any request.
    let mut headers = many_headers(300);
    headers.push(("x-user-id".into(), b"in-a-crowd".to_vec()));
    assert_eq!(
        odd.gets(3, "/user/x", &as_refs(&headers)),
        ["200 per-user r=1", "200 per-user r=0", "429 per-user r=0"]
    );

    odd.assert_still_healthy(&["per-user", "shared", "per-path"]);
}

// --- Paths.

#[test]
fn by_default_path_prefix_and_the_path_key_see_the_path_exactly_as_the_client_sent_it() {
    let odd = Odd::start(Envoy::options(ODD));

    // Percent-encoded UTF-8 passes Envoy unchanged; encodings are not equated (hex case counts).
    assert_eq!(
        odd.gets(2, "/api/caf%C3%A9", &[]),
        ["200 per-path r=0", "429 per-path r=0"]
    );
    assert_eq!(odd.get("/api/caf%c3%a9", &[]), "200 per-path r=0");
    // Raw UTF-8 (or any byte over 0x7F) in the request line: Envoy answers 400 itself.
    assert_eq!(odd.get("/api/café", &[]), "400 -");
    assert_eq!(odd.get("/api/\u{1F600}", &[]), "400 -");

    // No normalization by default (normalize_path and merge_slashes off): dot segments, encoded
    // dots and double slashes are kept, so each spelling is its own key...
    assert_eq!(odd.get("/api/x", &[]), "200 per-path r=0");
    for spelling in [
        "/api/%2e%2e/x",
        "/api/%2E%2E/x",
        "/api/../x",
        "/api/./x",
        "/api//x",
    ] {
        assert_eq!(odd.get(spelling, &[]), "200 per-path r=0", "{spelling}");
    }
    assert_eq!(odd.get("/api/%2e%2e/x", &[]), "429 per-path r=0");
    // ...and a path that only resolves to /api/ after dot-segment removal is not under the
    // `/api/` prefix: the policy does not apply. Envoy's own route matching sees the same raw
    // path; turn on normalize_path (next test) when a backend resolves dot segments.
    assert_eq!(odd.get("/public/../api/x", &[]), "200 per-ip");
    assert_eq!(odd.get("/public/%2e%2e/api/x", &[]), "200 per-ip");

    // An 8 KiB path is a key like any other; 65 KiB is over Envoy's header limit (431).
    let long = format!("/api/{}", "a".repeat(8 * 1024));
    assert_eq!(
        odd.gets(2, &long, &[]),
        ["200 per-path r=0", "429 per-path r=0"]
    );
    let other_long = format!("{}b", &long[..long.len() - 1]);
    assert_eq!(odd.get(&other_long, &[]), "200 per-path r=0");
    let too_long = format!("/api/{}", "a".repeat(65 * 1024));
    assert_eq!(odd.get(&too_long, &[]), "431 -");
    // The query string is not part of the path.
    assert_eq!(
        odd.get("/api/q?a=%ff%00&b=%22x%22", &[]),
        "200 per-path r=0"
    );
    assert_eq!(odd.get("/api/q?other", &[]), "429 per-path r=0");

    odd.assert_still_healthy(&["per-user", "shared", "per-path"]);
}

#[test]
fn with_normalize_path_and_merge_slashes_the_filter_sees_the_normalized_path() {
    let odd = Odd::start(
        Envoy::options(ODD)
            .hcm_option("normalize_path", "true")
            .hcm_option("merge_slashes", "true"),
    );

    // Envoy resolves dot segments (also percent-encoded ones), merges slashes and decodes
    // percent-encoded unreserved characters before any filter runs.
    assert_eq!(odd.get("/public/../api/w", &[]), "200 per-path r=0");
    assert_eq!(odd.get("/api/w", &[]), "429 per-path r=0");
    assert_eq!(odd.get("/api/./v", &[]), "200 per-path r=0");
    assert_eq!(odd.get("/api//v", &[]), "429 per-path r=0");
    assert_eq!(odd.get("/api/%7Et", &[]), "200 per-path r=0");
    assert_eq!(odd.get("/api/~t", &[]), "429 per-path r=0");
    // `/api/%2e%2e/y` is `/y`: no longer under `/api/`.
    assert_eq!(odd.get("/api/%2e%2e/y", &[]), "200 per-ip");
    assert_eq!(odd.get("/api/../y", &[]), "200 per-ip");
    // Encoded slashes are left alone (path_with_escaped_slashes_action default), so is the
    // case of other percent-encodings.
    assert_eq!(odd.get("/api/a%2Fb", &[]), "200 per-path r=0");
    assert_eq!(odd.get("/api/caf%C3%A9", &[]), "200 per-path r=0");
    assert_eq!(odd.get("/api/caf%c3%a9", &[]), "200 per-path r=0");

    odd.assert_still_healthy(&["per-user", "shared", "per-path"]);
}

// --- 2. Nothing from the request reaches a response header.

/// `#` is one or more ASCII digits, `@` one ASCII letter; every other character is itself.
fn fits(value: &str, template: &str) -> bool {
    let (mut v, mut t) = (value.as_bytes(), template.as_bytes());
    while let Some((&want, rest)) = t.split_first() {
        t = rest;
        match want {
            b'#' => {
                let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
                if digits == 0 {
                    return false;
                }
                v = &v[digits..];
            }
            b'@' => match v.split_first() {
                Some((b, rest)) if b.is_ascii_alphabetic() => v = rest,
                _ => return false,
            },
            _ => match v.split_first() {
                Some((&b, rest)) if b == want => v = rest,
                _ => return false,
            },
        }
    }
    v.is_empty()
}

/// The response has exactly these headers, in this order, each value fitting its template.
fn assert_headers_are(r: &Response, expected: &[(&str, &str)]) {
    let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
    let expected_names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, expected_names, "{r:?}");
    for ((name, value), (_, template)) in r.headers.iter().zip(expected) {
        assert!(
            fits(value, template),
            "{name}: {value:?} does not fit {template:?}"
        );
    }
}

const DATE: &str = "@@@, # @@@ # #:#:# GMT";

#[test]
fn no_byte_of_a_request_header_reaches_a_response_header_allowed_or_denied() {
    let odd = Odd::start(Envoy::options(ODD));
    // Quotes, separators and digits as the draft headers use them, and bytes no response
    // header has: as the key, as the tier, and as the request's own rate-limit headers.
    let evil: &[u8] = b"evil\"; r=999, q=999;w=1 <x>{}|\\^`!$%&*+ \xff";
    let tier: &[u8] = b"premium\"; r=999; t=0";
    let headers: &[(&str, &[u8])] = &[
        ("x-user-id", evil),
        ("x-plan", tier),
        ("ratelimit", b"\"per-user\";r=999;t=0"),
        ("x-ratelimit-limit", b"999"),
    ];

    let (first, allowed) = odd.send("/user/x", headers);
    odd.send("/user/x", headers);
    let (last, denied) = odd.send("/user/x", headers);
    // The tier value is not `premium` exactly, so the default tier (burst 2) applies.
    assert_eq!(
        [first.as_str(), last.as_str()],
        ["200 per-user r=1", "429 per-user r=0"]
    );

    assert_headers_are(
        &allowed,
        &[
            ("content-length", "2"),
            ("content-type", "text/plain"),
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "#"),
            ("ratelimit-policy", "\"per-user\";q=2;w=7200"),
            ("ratelimit", "\"per-user\";r=1;t=#"),
            ("date", DATE),
            ("server", "envoy"),
            ("connection", "close"),
        ],
    );
    assert_headers_are(
        &denied,
        &[
            ("content-type", "application/json"),
            ("retry-after", "#"),
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "#"),
            ("ratelimit-policy", "\"per-user\";q=2;w=7200"),
            ("ratelimit", "\"per-user\";r=0;t=#"),
            ("content-length", "#"),
            ("date", DATE),
            ("server", "envoy"),
            ("connection", "close"),
        ],
    );
    assert!(
        fits(
            &denied.text(),
            r#"{"error":"too_many_requests","policy":"per-user","retry_after":#}"#
        ),
        "{:?}",
        denied.text()
    );

    // Belt and braces: bytes of the request's values that no expected value is made of appear
    // in no response header value.
    let expected_bytes: BTreeSet<u8> = (b'0'..=b'9')
        .chain(b'a'..=b'z')
        .chain(b'A'..=b'Z')
        .chain(*b"\"-;=/,: ")
        .collect();
    let foreign: BTreeSet<u8> = headers
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|b| !expected_bytes.contains(b))
        .collect();
    assert!(foreign.len() >= 10, "{foreign:?}");
    for r in [&allowed, &denied] {
        for (name, value) in &r.headers {
            let leaked: Vec<u8> = value.bytes().filter(|b| foreign.contains(b)).collect();
            assert!(leaked.is_empty(), "{name}: {value:?} carries {leaked:?}");
            assert!(!value.contains("evil"), "{name}: {value:?}");
        }
    }

    // The same key with the real `premium` tier: burst 3, still only numbers in the headers.
    let premium: &[(&str, &[u8])] = &[
        ("x-user-id", b"evil-premium\"; r=999"),
        ("x-plan", b"premium"),
    ];
    let (outcome, r) = odd.send("/user/x", premium);
    assert_eq!(outcome, "200 per-user r=2");
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));

    odd.assert_still_healthy(&["per-user", "shared", "per-path"]);
}

#[test]
fn crlf_and_control_bytes_in_a_key_header_are_refused_or_neutralized_by_envoy_first() {
    let odd = Odd::start(Envoy::options(ODD));

    // CRLF followed by text that is no header line, a bare LF, NUL and other control bytes:
    // Envoy answers 400 itself; the filter never sees the request.
    for value in [&b"a\r\nb"[..], b"a\nb", b"a\x00b", b"a\x01b", b"a\x7fb"] {
        assert_eq!(odd.get("/user/x", &user(value)), "400 -", "{value:?}");
    }

    // CRLF followed by `name: value` is just another request header (the client could have sent
    // it plainly): the key is `a`, and the response's x-ratelimit-limit is the filter's own.
    let (outcome, r) = odd.send("/user/x", &user(b"a\r\nx-ratelimit-limit: 999"));
    assert_eq!(outcome, "200 per-user r=1");
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(odd.get("/user/x", &user(b"a")), "200 per-user r=0");

    // Obsolete line folding (CRLF then a space) is unfolded by Envoy to one space...
    assert_eq!(
        odd.get("/user/x", &user(b"b\r\n folded")),
        "200 per-user r=1"
    );
    assert_eq!(odd.get("/user/x", &user(b"b folded")), "200 per-user r=0");
    // ...and a bare CR inside a value is dropped: `c\rd` is the key `cd`, and `c d` another.
    assert_eq!(odd.get("/user/x", &user(b"c\rd")), "200 per-user r=1");
    assert_eq!(odd.get("/user/x", &user(b"cd")), "200 per-user r=0");
    assert_eq!(odd.get("/user/x", &user(b"c d")), "200 per-user r=1");
    // A tab inside a value is kept.
    assert_eq!(odd.get("/user/x", &user(b"c\td")), "200 per-user r=1");

    odd.assert_still_healthy(&["per-user", "shared", "per-path"]);
}

// --- 3. Identity and tier from trusted metadata.

/// `verified` keys on a subject and takes its tier from metadata that a trusted filter wrote
/// (here header_to_metadata copies `x-verified-sub` / `x-verified-plan` and removes them, as a
/// proxy that authenticated the client would; in production, e.g. jwt_authn's payload). `plain`
/// keys and tiers on what the client sends.
const TRUSTED: &str = r#"{"headers": "both", "policies": [
  {"name": "verified", "match": {"path_prefix": "/api/"}, "key": ["metadata:auth:sub"],
   "requests": 1, "per": "1h", "burst": 2, "max_keys": 1000,
   "tiers": {"by": "metadata:auth:plan", "values": {"premium": {"requests": 1, "per": "1h", "burst": 4}}}},
  {"name": "verified-shared", "match": {"path_prefix": "/shared/"}, "key": ["metadata:auth:sub"],
   "missing_key": "shared", "requests": 1, "per": "1h", "burst": 2, "max_keys": 1000},
  {"name": "raw-sub", "match": {"path_prefix": "/raw/"}, "key": ["header:x-verified-sub"],
   "requests": 1, "per": "1h", "burst": 1, "max_keys": 1000},
  {"name": "per-user", "match": {"path_prefix": "/user/"}, "key": ["header:x-user-id"],
   "requests": 1, "per": "1h", "burst": 2, "max_keys": 1000,
   "tiers": {"by": "header:x-plan", "values": {"premium": {"requests": 1, "per": "1h", "burst": 4}}}},
  {"name": "per-ip", "key": ["ip"], "requests": 1000000, "per": "1h", "burst": 1000000, "max_keys": 100}
]}"#;

const TRUSTED_DENIERS: [&str; 4] = ["verified", "verified-shared", "raw-sub", "per-user"];

fn trusted() -> Odd {
    Odd::start(
        Envoy::options(TRUSTED)
            .header_to_metadata("x-verified-sub", "auth", "sub")
            .header_to_metadata("x-verified-plan", "auth", "plan"),
    )
}

fn sub(id: &[u8]) -> [(&str, &[u8]); 1] {
    [("x-verified-sub", id)]
}

#[test]
fn each_verified_subject_gets_its_own_bucket_and_requests_without_one_skip_or_share() {
    let odd = trusted();

    for who in [&b"alice"[..], b"bob"] {
        assert_eq!(
            odd.gets(3, "/api/x", &sub(who)),
            ["200 verified r=1", "200 verified r=0", "429 verified r=0"],
            "{who:?}"
        );
    }
    // No subject: the key is missing and `verified` does not apply (missing_key skip).
    assert_eq!(odd.gets(4, "/api/x", &[]), ["200 per-ip"; 4]);
    // A made-up x-user-id changes nothing: the key is the subject.
    assert_eq!(
        odd.get(
            "/api/x",
            &[("x-verified-sub", b"alice"), ("x-user-id", b"someone-else")]
        ),
        "429 verified r=0"
    );
    // With missing_key shared, all requests without a subject share one bucket.
    assert_eq!(
        odd.gets(3, "/shared/x", &[]),
        [
            "200 verified-shared r=1",
            "200 verified-shared r=0",
            "429 verified-shared r=0"
        ]
    );
    assert_eq!(
        odd.get("/shared/x", &sub(b"carol")),
        "200 verified-shared r=1"
    );

    // header_to_metadata removed the header: a policy keyed on the header itself never sees it.
    assert_eq!(odd.gets(3, "/raw/x", &sub(b"alice")), ["200 per-ip"; 3]);

    odd.assert_still_healthy(&TRUSTED_DENIERS);
}

#[test]
fn a_tier_from_a_plain_header_is_the_clients_choice_a_tier_from_metadata_is_not() {
    let odd = trusted();
    let premium = ("x-plan", &b"premium"[..]);

    // Spoofing, as documented: with `tiers.by: header:x-plan` any client promotes itself.
    assert_eq!(
        odd.gets(3, "/user/x", &user(b"mallory")),
        ["200 per-user r=1", "200 per-user r=0", "429 per-user r=0"]
    );
    assert_eq!(
        odd.gets(5, "/user/x", &[("x-user-id", b"mallory-premium"), premium]),
        [
            "200 per-user r=3",
            "200 per-user r=2",
            "200 per-user r=1",
            "200 per-user r=0",
            "429 per-user r=0"
        ]
    );

    // With `tiers.by: metadata:auth:plan` the client's x-plan header changes nothing...
    assert_eq!(
        odd.gets(3, "/api/x", &[("x-verified-sub", b"mallory"), premium]),
        ["200 verified r=1", "200 verified r=0", "429 verified r=0"]
    );
    // ...only the plan the trusted filter recorded does.
    assert_eq!(
        odd.gets(
            5,
            "/api/x",
            &[
                ("x-verified-sub", b"carol"),
                ("x-verified-plan", b"premium")
            ]
        ),
        [
            "200 verified r=3",
            "200 verified r=2",
            "200 verified r=1",
            "200 verified r=0",
            "429 verified r=0"
        ]
    );

    odd.assert_still_healthy(&TRUSTED_DENIERS);
}
