//! What a client sees at the status path (`status_path`): its own quota under every enforcing
//! policy that applies to it, as JSON. The numbers are the rate-limit headers' (`headers`):
//! `limit` is `x-ratelimit-limit`, `remaining` `x-ratelimit-remaining`, `reset` the seconds
//! until the key's bucket is full again (the time `x-ratelimit-reset` names, counted from now).

use super::headers::{retry_after_secs, Quota, QuotaUnit};
use crate::core::duration::ceil_secs;
use crate::core::text::{push_decimal, push_json_string};

/// Where a policy's numbers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A local policy: the key's state in this Envoy, what its next request here is decided on.
    Local,
    /// A global policy: what the service last said of the key to this Envoy, less what this
    /// Envoy spent since. Other Envoys' requests since then are not in it.
    LocalEstimate,
    /// A global policy this Envoy has no live word on for the key: only the service knows.
    Unknown,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Local => "local",
            Source::LocalEstimate => "local_estimate",
            Source::Unknown => "unknown",
        }
    }
}

/// One policy's line of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    pub quota: Quota<'a>,
    pub source: Source,
    /// A calendar window's `per` (`1mo`) and time zone.
    pub calendar: Option<(&'static str, String)>,
}

/// The JSON body: `{"policies": [...]}`, one object per line, in the order given. Written by
/// hand, as the headers are: `serde_json`'s `Value` would add 35 KB to the module.
pub fn body<'a>(lines: impl IntoIterator<Item = Line<'a>>) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"policies\":[");
    for (i, line) in lines.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_line(&mut out, &line);
    }
    out.push_str("]}");
    out
}

fn push_line(out: &mut String, line: &Line) {
    let quota = &line.quota;
    let known = line.source != Source::Unknown;
    let windowed = quota.unit != QuotaUnit::ConcurrentRequests;
    out.push_str("{\"policy\":");
    push_json_string(out, quota.policy);
    out.push_str(",\"unit\":\"");
    out.push_str(unit(quota.unit));
    out.push('"');
    let retry = quota.retry_after.filter(|_| known).map(retry_after_secs);
    let numbers = [
        ("limit", Some(quota.limit)),
        ("remaining", known.then(|| quota.left())),
        (
            "reset",
            (known && windowed).then(|| ceil_secs(quota.reset_after)),
        ),
        ("retry_after", retry),
        ("requests", windowed.then_some(quota.requests)),
        ("window", windowed.then(|| ceil_secs(quota.per_nanos))),
    ];
    for (name, value) in numbers {
        out.push_str(",\"");
        out.push_str(name);
        out.push_str("\":");
        match value {
            Some(n) => push_decimal(out, n),
            None => out.push_str("null"),
        }
    }
    if let Some((per, zone)) = &line.calendar {
        out.push_str(",\"calendar\":{\"per\":");
        push_json_string(out, per);
        out.push_str(",\"timezone\":");
        push_json_string(out, zone);
        out.push('}');
    }
    out.push_str(",\"source\":\"");
    out.push_str(line.source.as_str());
    out.push_str("\"}");
}

/// What a policy counts, as the answer names it.
fn unit(unit: QuotaUnit) -> &'static str {
    match unit {
        QuotaUnit::Requests => "requests",
        QuotaUnit::Tokens => "tokens",
        QuotaUnit::ConcurrentRequests => "concurrent",
        QuotaUnit::MicroUnits => "micro-units",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::duration::NANOS_PER_SEC as SEC;
    use serde_json::{json, Value};

    fn quota(unit: QuotaUnit) -> Quota<'static> {
        Quota {
            policy: "per-user",
            limit: 5,
            requests: 1,
            per_nanos: SEC,
            remaining: 3,
            reset_after: 1_500_000_000,
            retry_after: None,
            unit,
        }
    }

    #[test]
    fn each_policy_says_its_limit_what_is_left_when_it_is_full_and_its_window() {
        let line = Line {
            quota: quota(QuotaUnit::Requests),
            source: Source::Local,
            calendar: None,
        };
        let text = body([line]);
        assert_eq!(
            text,
            r#"{"policies":[{"policy":"per-user","unit":"requests","limit":5,"remaining":3,"reset":2,"retry_after":null,"requests":1,"window":1,"source":"local"}]}"#
        );
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value,
            json!({"policies": [{"policy": "per-user", "unit": "requests", "limit": 5,
                "remaining": 3, "reset": 2, "retry_after": null, "requests": 1, "window": 1,
                "source": "local"}]})
        );
    }

    #[test]
    fn an_unknown_global_key_has_no_remaining_and_a_concurrency_limit_no_window() {
        let unknown = Line {
            quota: quota(QuotaUnit::Tokens),
            source: Source::Unknown,
            calendar: Some(("1mo", "Europe/Berlin".into())),
        };
        let value: Value = serde_json::from_str(&body([unknown])).unwrap();
        let line = &value["policies"][0];
        assert_eq!(
            (&line["remaining"], &line["reset"]),
            (&Value::Null, &Value::Null)
        );
        assert_eq!(
            line["calendar"],
            json!({"per": "1mo", "timezone": "Europe/Berlin"})
        );
        assert_eq!(line["unit"], "tokens");
        let slots = Line {
            quota: Quota {
                retry_after: Some(SEC),
                ..quota(QuotaUnit::ConcurrentRequests)
            },
            source: Source::Local,
            calendar: None,
        };
        let value: Value = serde_json::from_str(&body([slots])).unwrap();
        let line = &value["policies"][0];
        assert_eq!(
            (
                &line["unit"],
                &line["window"],
                &line["reset"],
                &line["retry_after"]
            ),
            (&json!("concurrent"), &Value::Null, &Value::Null, &json!(1))
        );
    }

    #[test]
    fn no_policy_and_several_make_json() {
        assert_eq!(body([]), r#"{"policies":[]}"#);
        let line = |source| Line {
            quota: quota(QuotaUnit::MicroUnits),
            source,
            calendar: None,
        };
        let text = body([line(Source::Local), line(Source::LocalEstimate)]);
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["policies"][1]["source"], "local_estimate");
        assert_eq!(value["policies"][0]["unit"], "micro-units");
    }
}
