//! The body of `POST /v1/settle`: strict parsing and validation into `Settlement`s, and the
//! response. A settlement names the state its check wrote (`store::settled_key`), so its key
//! and numbers are validated as a check's are (`check::validate_limit`); then its operation,
//! which must fit the algorithm. A rejection names the field at fault.

use serde::Serialize;
use sluice::core::algorithm::Kind;
use sluice::wire::protocol::{SettleOp as WireOp, SettleRequest, Settlement as WireSettlement};

use crate::decision::check::{
    deserialize, validate_limit, validate_slot, within, BadRequest, Bounds, Shape,
};
use crate::stores::MAX_DEBT;
use crate::stores::{Algorithm, Namespace, SettleOp, Settlement};

/// Settlements per call: the filter's batch (`sluice::remote::outbox::MAX_BATCH`).
pub const MAX_SETTLEMENTS: usize = sluice::remote::outbox::MAX_BATCH;
/// The oldest reservation a refund may name: a year, the longest window.
const MAX_AGE_MS: u64 = 31_536_000_000;

/// The body of the 200 answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SettleResponse {
    /// How many settlements changed something: tokens charged or given back, a slot released
    /// or renewed. The others found nothing to settle (a window that ended, a slot that had
    /// expired), which is not an error.
    pub settled: u64,
    /// How many the service refused (`Parsed::rejected`) and dropped, the others applied; left
    /// out when none were.
    #[serde(skip_serializing_if = "is_zero")]
    pub rejected: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A body's settlements: those to apply, in request order, and those refused. Each settlement
/// is judged on its own: one the service can never take (a debt that would outlive
/// `--max-key-ttl`, numbers out of bounds) is dropped and counted, and never holds back the
/// others of its batch, which a filter would otherwise send again and again.
#[derive(Debug)]
pub struct Parsed {
    pub settlements: Vec<Settlement>,
    /// Each refused settlement's op (its wire name) and what is wrong with it.
    pub rejected: Vec<(&'static str, BadRequest)>,
}

/// Parses a request body and validates each settlement. A body that is not a list of
/// well-formed settlements (broken JSON, an unknown field or op, too many) is refused whole;
/// so is one whose every settlement is refused (`Parsed::refusal`).
pub fn parse(body: &[u8], bounds: &Bounds) -> Result<Parsed, BadRequest> {
    let raw: SettleRequest = deserialize(body)?;
    let count = raw.settlements.len();
    if !(1..=MAX_SETTLEMENTS).contains(&count) {
        let reason = format!("must hold 1 to {MAX_SETTLEMENTS} settlements, got {count}");
        return Err(BadRequest::new("settlements", reason));
    }
    let mut parsed = Parsed {
        settlements: Vec::with_capacity(count),
        rejected: Vec::new(),
    };
    for (i, settlement) in raw.settlements.into_iter().enumerate() {
        let op = wire_name(&settlement.op);
        match validate(settlement, &format!("settlements[{i}]"), bounds) {
            Ok(settlement) => parsed.settlements.push(settlement),
            Err(error) => parsed.rejected.push((op, error)),
        }
    }
    Ok(parsed)
}

impl Parsed {
    /// The first settlement's error when none is left to apply: the 400 of the whole call.
    pub fn refusal(&self) -> Option<&BadRequest> {
        let first = self.rejected.first().map(|(_, error)| error);
        first.filter(|_| self.settlements.is_empty())
    }
}

fn wire_name(op: &WireOp) -> &'static str {
    match op {
        WireOp::Charge { .. } => "charge",
        WireOp::Refund { .. } => "refund",
        WireOp::Release { .. } => "release",
        WireOp::Renew { .. } => "renew",
    }
}

fn validate(raw: WireSettlement, at: &str, bounds: &Bounds) -> Result<Settlement, BadRequest> {
    let field = |name: &str| format!("{at}.{name}");
    check_fits(&raw.op, raw.algorithm, &field("op"))?;
    let shape = Shape {
        name: raw.algorithm,
        requests: raw.requests,
        per_ms: raw.per_ms,
        burst: raw.burst,
        max_delay_ms: None,
        calendar: crate::decision::check::calendar(
            raw.algorithm,
            raw.calendar.as_ref(),
            &field("calendar"),
        )?,
    };
    let algorithm = validate_limit(&raw.key, &shape, &field, bounds)?;
    let id = match &raw.op {
        WireOp::Charge { id, .. } | WireOp::Refund { id, .. } => id.clone(),
        WireOp::Release { .. } | WireOp::Renew { .. } => None,
    };
    // The filter names a settlement as it names a slot.
    let id = (id.map(|id| validate_slot(id, &field("id")))).transpose()?;
    let op = op(raw.op, &algorithm, &field, bounds)?;
    Ok(Settlement {
        namespace: Namespace::Http,
        key: raw.key,
        algorithm,
        op,
        id,
    })
}

/// Usage is settled against the metering algorithms, slots against concurrency.
fn check_fits(op: &WireOp, kind: Kind, field: &str) -> Result<(), BadRequest> {
    let (name, fits, which) = match op {
        WireOp::Charge { .. } => ("charge", kind.meters(), METERING),
        WireOp::Refund { .. } => ("refund", kind.meters(), METERING),
        WireOp::Release { .. } => ("release", kind == Kind::Concurrency, "concurrency"),
        WireOp::Renew { .. } => ("renew", kind == Kind::Concurrency, "concurrency"),
    };
    if fits {
        return Ok(());
    }
    let reason = format!("{name} is only for {which}, not {}", kind.name());
    Err(BadRequest::new(field, reason))
}

const METERING: &str = "token_bucket, fixed_window and sliding_window";

/// The operation in the store's units. Tokens beyond what the state could ever take or give
/// back are the same as that many (`Algorithm::chargeable`, `refundable`), and are cut to it so
/// that the scripts' numbers stay exact.
fn op(
    raw: WireOp,
    algorithm: &Algorithm,
    field: &dyn Fn(&str) -> String,
    bounds: &Bounds,
) -> Result<SettleOp, BadRequest> {
    let tokens = |value: u64| within(&field("tokens"), value, 1, u64::MAX, "");
    Ok(match raw {
        WireOp::Charge {
            tokens: t,
            max_debt,
            ..
        } => {
            let max_debt = within(&field("max_debt"), max_debt, 0, MAX_DEBT, "")?;
            (bounds.check_lifetime_owing(algorithm, max_debt))
                .map_err(|reason| BadRequest::new(&field("max_debt"), reason))?;
            SettleOp::Charge {
                tokens: tokens(t)?.min(algorithm.chargeable(max_debt)),
                max_debt,
            }
        }
        WireOp::Refund {
            tokens: t, age_ms, ..
        } => SettleOp::Refund {
            tokens: tokens(t)?.min(algorithm.refundable()),
            age_us: within(&field("age_ms"), age_ms, 0, MAX_AGE_MS, "")? * 1000,
        },
        WireOp::Release { slot } => SettleOp::Release {
            slot: validate_slot(slot, &field("slot"))?,
        },
        WireOp::Renew { slot } => SettleOp::Renew {
            slot: validate_slot(slot, &field("slot"))?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(body: &str) -> String {
        match parse(body.as_bytes(), &Bounds::default()) {
            Err(error) => error.detail,
            Ok(parsed) => parsed.refusal().unwrap().detail.clone(),
        }
    }

    fn one(fields: &str) -> String {
        format!(r#"{{"settlements": [{{{fields}}}]}}"#)
    }

    const BUCKET: &str =
        r#""key": "llm/00000000000000ff", "requests": 1000, "per_ms": 60000, "burst": 1000"#;
    const SLOTS: &str = r#""key": "streams/00000000000000ff", "algorithm": "concurrency", "requests": 4, "per_ms": 10000, "burst": 4"#;

    #[test]
    fn each_op_becomes_the_store_settlement_of_the_checks_state() {
        let body = format!(
            r#"{{"settlements": [{{{BUCKET}, "algorithm": "token_bucket", "op": "charge", "tokens": 250, "max_debt": 1000, "id": "00000000000000c1"}},
                {{{BUCKET}, "algorithm": "fixed_window", "op": "refund", "tokens": 20, "age_ms": 1500}},
                {{{SLOTS}, "op": "release", "slot": "00000000000000aa"}},
                {{{SLOTS}, "op": "renew", "slot": "00000000000000aa"}}]}}"#
        );
        let settlements = parse(body.as_bytes(), &Bounds::default())
            .unwrap()
            .settlements;
        let ops: Vec<&SettleOp> = settlements.iter().map(|s| &s.op).collect();
        let slot = || "00000000000000aa".to_string();
        assert_eq!(
            ops,
            [
                &SettleOp::Charge {
                    tokens: 250,
                    max_debt: 1000
                },
                &SettleOp::Refund {
                    tokens: 20,
                    age_us: 1_500_000
                },
                &SettleOp::Release { slot: slot() },
                &SettleOp::Renew { slot: slot() },
            ]
        );
        let expected = Algorithm::Concurrency {
            limit: 4,
            lease_us: 10_000_000,
        };
        assert_eq!(settlements[2].algorithm, expected);
        let ids: Vec<Option<&str>> = settlements.iter().map(|s| s.id.as_deref()).collect();
        assert_eq!(ids, [Some("00000000000000c1"), None, None, None]);
    }

    #[test]
    fn a_charge_beyond_what_the_key_can_owe_is_cut_to_it() {
        let body = one(&format!(
            r#"{BUCKET}, "algorithm": "sliding_window", "op": "charge", "tokens": 18446744073709551615, "max_debt": 10"#
        ));
        let settlements = parse(body.as_bytes(), &Bounds::default())
            .unwrap()
            .settlements;
        let charged = SettleOp::Charge {
            tokens: 1010,
            max_debt: 10,
        };
        assert_eq!(settlements[0].op, charged);
    }

    #[test]
    fn errors_name_the_field() {
        let many = format!(
            r#"{{"settlements": [{}]}}"#,
            vec![
                one(&format!(
                    r#"{SLOTS}, "op": "release", "slot": "00000000000000aa""#
                ))
                .trim_start_matches(r#"{"settlements": ["#)
                .trim_end_matches("]}")
                .to_string();
                257
            ]
            .join(",")
        );
        let cases = [
            (r#"{"settlements": []}"#.to_string(), "settlements: must hold 1 to 256 settlements, got 0"),
            (many, "settlements: must hold 1 to 256 settlements, got 257"),
            (
                one(&format!(r#"{SLOTS}, "op": "charge", "tokens": 1, "max_debt": 0"#)),
                "settlements[0].op: charge is only for token_bucket, fixed_window and sliding_window, not concurrency",
            ),
            (
                one(&format!(r#"{BUCKET}, "algorithm": "sliding_log", "op": "refund", "tokens": 1, "age_ms": 0"#)),
                "settlements[0].op: refund is only for",
            ),
            (
                one(&format!(r#"{BUCKET}, "algorithm": "token_bucket", "op": "release", "slot": "00000000000000aa""#)),
                "settlements[0].op: release is only for concurrency, not token_bucket",
            ),
            (
                one(&format!(r#"{SLOTS}, "op": "renew", "slot": "AA""#)),
                "settlements[0].slot: must be 16 lowercase hex digits",
            ),
            (
                one(&format!(r#"{BUCKET}, "algorithm": "token_bucket", "op": "refund", "tokens": 1, "age_ms": 0, "id": "00000000000000C1""#)),
                "settlements[0].id: must be 16 lowercase hex digits, got \"00000000000000C1\"",
            ),
            (
                one(&format!(r#"{SLOTS}, "op": "release", "slot": "00000000000000aa", "id": "00000000000000c1""#)),
                "settlements[0]: unknown field `id`",
            ),
            (
                one(&format!(r#"{BUCKET}, "algorithm": "token_bucket", "op": "charge", "tokens": 0, "max_debt": 0"#)),
                "settlements[0].tokens: 0 is not in 1..=",
            ),
            (
                one(&format!(r#"{BUCKET}, "algorithm": "fixed_window", "op": "refund", "tokens": 1, "age_ms": 31536000001"#)),
                "settlements[0].age_ms: 31536000001 is not in 0..=31536000000",
            ),
            (
                one(&(SLOTS.replace(r#""requests": 4"#, r#""requests": 10001"#) + r#", "op": "release", "slot": "00000000000000aa""#)),
                "settlements[0].requests: 10001 is not in 1..=10000",
            ),
            (
                one(&format!(r#"{BUCKET}, "algorithm": "fixed_window", "op": "flush""#)),
                "settlements[0]: unknown variant `flush`",
            ),
            (
                one(&format!(r#"{BUCKET}, "algorithm": "fixed_window", "op": "refund", "tokens": 1, "age_ms": 0, "x": 1"#)),
                "settlements[0]: unknown field `x`",
            ),
            (
                one(&(BUCKET.replace("llm/", "llm /") + r#", "algorithm": "token_bucket", "op": "refund", "tokens": 1, "age_ms": 0"#)),
                "settlements[0].key: character ' '",
            ),
        ];
        for (body, expected) in cases {
            let got = detail(&body);
            assert!(
                got.starts_with(expected),
                "{body}\n  gave {got:?}\n  expected {expected:?}"
            );
        }
    }

    #[test]
    fn a_debt_that_would_outlive_max_key_ttl_is_refused_naming_max_debt() {
        let body = one(
            r#""key": "k", "algorithm": "token_bucket", "requests": 1, "per_ms": 86400000, "burst": 30, "op": "charge", "tokens": 1, "max_debt": 40"#,
        );
        assert_eq!(
            detail(&body),
            "settlements[0].max_debt: its key would live 70d, more than --max-key-ttl 62d"
        );
    }

    /// Issue 31: a charge the service can never take once held back every settlement of its
    /// batch, the filter sending it again and again.
    #[test]
    fn a_settlement_the_service_refuses_is_dropped_and_the_others_are_applied() {
        let body = format!(
            r#"{{"settlements": [{{"key": "k", "algorithm": "token_bucket", "requests": 1, "per_ms": 86400000, "burst": 30, "op": "charge", "tokens": 1, "max_debt": 40}},
                {{{SLOTS}, "op": "release", "slot": "00000000000000aa"}}]}}"#
        );
        let parsed = parse(body.as_bytes(), &Bounds::default()).unwrap();
        assert_eq!(parsed.settlements.len(), 1);
        assert!(matches!(parsed.settlements[0].op, SettleOp::Release { .. }));
        let [(op, error)] = &parsed.rejected[..] else {
            panic!("one rejected: {:?}", parsed.rejected);
        };
        assert_eq!(*op, "charge");
        assert!(
            error.detail.starts_with("settlements[0].max_debt: "),
            "{error:?}"
        );
    }
}
