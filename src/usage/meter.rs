//! What a response costs a policy: one of its counts, or a weighted sum of input and output
//! tokens (output usually costs several times as much).

use serde_json::{Map, Value};

use super::{Count, Counts};

/// The largest weight of a count.
pub const MAX_WEIGHT: u64 = 1_000_000;

/// How counts become a cost, compiled from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meter {
    /// One count as reported (a total missing is input + output).
    Count(Count),
    /// `input` per input token plus `output` per output token; a count weighted 0 is not needed.
    Weighted { input: u64, output: u64 },
}

/// The names the configuration gives the counts.
const NAMES: [(&str, Count); 5] = [
    ("total_tokens", Count::Total),
    ("prompt_tokens", Count::Input),
    ("input_tokens", Count::Input),
    ("completion_tokens", Count::Output),
    ("output_tokens", Count::Output),
];

fn count_named(name: &str) -> Result<Count, String> {
    let known = NAMES.iter().find(|(known, _)| *known == name);
    known.map(|&(_, count)| count).ok_or_else(|| {
        let names: Vec<&str> = NAMES.iter().map(|(known, _)| *known).collect();
        format!(
            "unknown count {name:?}: expected one of {}",
            names.join(", ")
        )
    })
}

impl Meter {
    /// The meter `config` describes: a count's name (`"total_tokens"`), or weights of input and
    /// output (`{"input_tokens": 1, "output_tokens": 4}`), whole numbers from 0 to `MAX_WEIGHT`,
    /// not all 0. The error names the part that is wrong.
    pub fn parse(config: &Value) -> Result<Meter, String> {
        match config {
            Value::String(name) => count_named(name).map(Meter::Count),
            Value::Object(weights) => Meter::weighted(weights),
            _ => Err(r#"must be a count's name ("total_tokens") or weights ({"input_tokens": 1, "output_tokens": 4})"#.into()),
        }
    }

    fn weighted(weights: &Map<String, Value>) -> Result<Meter, String> {
        let (mut input, mut output) = (None, None);
        for (name, weight) in weights {
            let slot = match count_named(name)? {
                Count::Input => &mut input,
                Count::Output => &mut output,
                Count::Total => {
                    return Err(format!(
                        r#"{name}: the total is not weighted; meter "total_tokens" alone"#
                    ))
                }
            };
            if slot.is_some() {
                return Err(format!("{name}: a second weight for the same count"));
            }
            let weight = weight.as_u64().filter(|&w| w <= MAX_WEIGHT);
            *slot =
                Some(weight.ok_or_else(|| {
                    format!("{name}: must be a whole number from 0 to {MAX_WEIGHT}")
                })?);
        }
        match (input.unwrap_or(0), output.unwrap_or(0)) {
            (0, 0) => Err("weights: at least one must be above 0".into()),
            (input, output) => Ok(Meter::Weighted { input, output }),
        }
    }

    /// What `tokens` of output cost at most: a reservation for what a request may produce.
    pub fn output_cost(&self, tokens: u64) -> u64 {
        match *self {
            Meter::Count(_) => tokens,
            Meter::Weighted { output, .. } => tokens.saturating_mul(output),
        }
    }

    /// What `counts` cost; `None` when a count it needs was not reported.
    pub fn cost(&self, counts: &Counts) -> Option<u64> {
        match *self {
            Meter::Count(count) => counts.get(count),
            Meter::Weighted { input, output } => {
                let part = |weight: u64, count| match weight {
                    0 => Some(0),
                    _ => Some(weight.saturating_mul(counts.get(count)?)),
                };
                Some(part(input, Count::Input)?.saturating_add(part(output, Count::Output)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn counts(input: Option<u64>, output: Option<u64>, total: Option<u64>) -> Counts {
        Counts {
            input,
            output,
            total,
            provisional: false,
        }
    }

    #[test]
    fn a_named_count_costs_that_count_with_either_api_spelling() {
        let reported = counts(Some(10), Some(20), Some(35));
        let cost = |name: &str| Meter::parse(&json!(name)).unwrap().cost(&reported);
        assert_eq!(cost("total_tokens"), Some(35));
        assert_eq!(cost("prompt_tokens"), Some(10));
        assert_eq!(cost("input_tokens"), Some(10));
        assert_eq!(cost("completion_tokens"), Some(20));
        assert_eq!(cost("output_tokens"), Some(20));
    }

    #[test]
    fn a_total_not_reported_is_input_plus_output() {
        let total = Meter::parse(&json!("total_tokens")).unwrap();
        assert_eq!(total.cost(&counts(Some(25), Some(15), None)), Some(40));
        assert_eq!(total.cost(&counts(Some(25), None, None)), None);
    }

    #[test]
    fn weights_charge_output_tokens_at_their_own_rate() {
        let meter = Meter::parse(&json!({"input_tokens": 1, "output_tokens": 4})).unwrap();
        assert_eq!(
            meter,
            Meter::Weighted {
                input: 1,
                output: 4
            }
        );
        assert_eq!(meter.cost(&counts(Some(10), Some(20), None)), Some(90));
        assert_eq!(meter.cost(&counts(Some(10), None, Some(30))), None);
    }

    #[test]
    fn a_count_weighted_zero_or_not_weighted_is_not_needed() {
        let output_only = Meter::parse(&json!({"completion_tokens": 3})).unwrap();
        assert_eq!(output_only.cost(&counts(None, Some(5), None)), Some(15));
        let zero = Meter::parse(&json!({"prompt_tokens": 0, "output_tokens": 2})).unwrap();
        assert_eq!(zero.cost(&counts(None, Some(5), None)), Some(10));
    }

    #[test]
    fn costs_saturate_rather_than_overflow() {
        let meter = Meter::Weighted {
            input: MAX_WEIGHT,
            output: MAX_WEIGHT,
        };
        let huge = counts(Some(u64::MAX / 2), Some(u64::MAX / 2), None);
        assert_eq!(meter.cost(&huge), Some(u64::MAX));
        let total = counts(Some(u64::MAX), Some(1), None);
        assert_eq!(Meter::Count(Count::Total).cost(&total), Some(u64::MAX));
    }

    #[test]
    fn refusals_name_the_bad_part() {
        let refused = |config: Value| Meter::parse(&config).unwrap_err();
        assert!(refused(json!("tokens")).starts_with(r#"unknown count "tokens""#));
        assert!(refused(json!(4)).starts_with("must be a count's name"));
        assert!(refused(json!({"input_tokens": 1, "cost": 2})).contains(r#""cost""#));
        assert!(refused(json!({"output_tokens": -1})).starts_with("output_tokens: must be"));
        assert!(refused(json!({"output_tokens": 1.5})).starts_with("output_tokens: must be"));
        assert!(refused(json!({"output_tokens": 1_000_001})).starts_with("output_tokens: must"));
        assert!(refused(json!({"output_tokens": "4"})).starts_with("output_tokens: must be"));
        assert!(refused(json!({"total_tokens": 1})).starts_with("total_tokens: the total"));
        let twice = refused(json!({"input_tokens": 1, "prompt_tokens": 2}));
        assert!(
            twice.ends_with("a second weight for the same count"),
            "{twice}"
        );
        assert!(refused(json!({})).starts_with("weights: at least one"));
        assert!(refused(json!({"input_tokens": 0, "output_tokens": 0})).starts_with("weights"));
    }
}
