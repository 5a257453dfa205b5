//! What a response costs a policy: one of its counts, or a weighted sum of input and output
//! tokens (output usually costs several times as much).

use serde_json::{Map, Value};

use super::{Count, Counts};

/// The largest weight of a count.
pub const MAX_WEIGHT: u64 = 1_000_000;

/// How counts become a cost, compiled from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meter {
    /// One count as reported (a total missing is every token counted, `Counts::get`).
    Count(Count),
    /// A weight per token of each priced kind; a count weighted 0 is not needed.
    Weighted(Weights),
}

/// The weight of each kind of token, every token counted once whichever count a provider
/// includes it in: input not read from a cache, input read from a cache (OpenAI's and Gemini's
/// cached tokens among the input, Anthropic's cache reads apart from it), input written to a
/// cache (Anthropic's), output not reasoning, and reasoning (OpenAI's among the output, Gemini's
/// thoughts apart from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    pub input: u64,
    pub output: u64,
    /// The input's weight unless configured.
    pub cache_read: u64,
    /// The input's weight unless configured.
    pub cache_write: u64,
    /// The output's weight unless configured.
    pub reasoning: u64,
}

/// The names the configuration gives the counts a meter of one count charges.
const NAMES: [(&str, Count); 5] = [
    ("total_tokens", Count::Total),
    ("prompt_tokens", Count::Input),
    ("input_tokens", Count::Input),
    ("completion_tokens", Count::Output),
    ("output_tokens", Count::Output),
];

/// A weight's kind of token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Input,
    Output,
    CacheRead,
    CacheWrite,
    Reasoning,
}

/// The names the configuration gives the kinds weights price, in each provider's spelling.
const WEIGHT_NAMES: [(&str, Kind); 10] = [
    ("prompt_tokens", Kind::Input),
    ("input_tokens", Kind::Input),
    ("completion_tokens", Kind::Output),
    ("output_tokens", Kind::Output),
    ("cache_read_input_tokens", Kind::CacheRead),
    ("cached_tokens", Kind::CacheRead),
    ("cachedContentTokenCount", Kind::CacheRead),
    ("cache_creation_input_tokens", Kind::CacheWrite),
    ("reasoning_tokens", Kind::Reasoning),
    ("thoughtsTokenCount", Kind::Reasoning),
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

fn kind_named(name: &str) -> Result<Kind, String> {
    if name == "total_tokens" {
        return Err(format!(
            r#"{name}: the total is not weighted; meter "total_tokens" alone"#
        ));
    }
    let known = WEIGHT_NAMES.iter().find(|(known, _)| *known == name);
    known.map(|&(_, kind)| kind).ok_or_else(|| {
        let names: Vec<&str> = WEIGHT_NAMES.iter().map(|(known, _)| *known).collect();
        format!(
            "unknown count {name:?}: expected one of {}",
            names.join(", ")
        )
    })
}

impl Meter {
    /// The meter `config` describes: a count's name (`"total_tokens"`), or weights of the kinds
    /// of tokens (`{"input_tokens": 1, "output_tokens": 4, "cache_read_input_tokens": 0}`),
    /// whole numbers from 0 to `MAX_WEIGHT`, not all 0. The error names the part that is wrong.
    pub fn parse(config: &Value) -> Result<Meter, String> {
        match config {
            Value::String(name) => count_named(name).map(Meter::Count),
            Value::Object(weights) => Meter::weighted(weights),
            _ => Err(r#"must be a count's name ("total_tokens") or weights ({"input_tokens": 1, "output_tokens": 4})"#.into()),
        }
    }

    fn weighted(weights: &Map<String, Value>) -> Result<Meter, String> {
        let mut given: [Option<u64>; 5] = [None; 5];
        for (name, weight) in weights {
            let kind = kind_named(name)?;
            let slot = given.get_mut(kind as usize).ok_or("unreachable")?;
            if slot.is_some() {
                return Err(format!("{name}: a second weight for the same count"));
            }
            let weight = weight.as_u64().filter(|&w| w <= MAX_WEIGHT);
            *slot =
                Some(weight.ok_or_else(|| {
                    format!("{name}: must be a whole number from 0 to {MAX_WEIGHT}")
                })?);
        }
        let [input, output, cache_read, cache_write, reasoning] = given;
        let (input, output) = (input.unwrap_or(0), output.unwrap_or(0));
        let weights = Weights {
            input,
            output,
            cache_read: cache_read.unwrap_or(input),
            cache_write: cache_write.unwrap_or(input),
            reasoning: reasoning.unwrap_or(output),
        };
        let all = [
            input,
            output,
            weights.cache_read,
            weights.cache_write,
            weights.reasoning,
        ];
        if all.iter().all(|w| *w == 0) {
            return Err("weights: at least one must be above 0".into());
        }
        Ok(Meter::Weighted(weights))
    }

    /// What `tokens` of output cost at most: a reservation for what a request may produce.
    pub fn output_cost(&self, tokens: u64) -> u64 {
        match *self {
            Meter::Count(_) => tokens,
            Meter::Weighted(w) => tokens.saturating_mul(w.output.max(w.reasoning)),
        }
    }

    /// What `counts` cost; `None` when a count it needs was not reported.
    pub fn cost(&self, counts: &Counts) -> Option<u64> {
        match *self {
            Meter::Count(count) => counts.get(count),
            Meter::Weighted(w) => {
                // Among the input and the output: never more than they are.
                let cached = counts.cached.min(counts.input.unwrap_or(counts.cached));
                let reasoning = counts
                    .reasoning
                    .min(counts.output.unwrap_or(counts.reasoning));
                let part = |weight: u64, count: Option<u64>, among: u64| match weight {
                    0 => Some(0),
                    _ => Some(weight.saturating_mul(count?.saturating_sub(among))),
                };
                let parts = [
                    part(w.input, counts.input, cached)?,
                    part(w.output, counts.output, reasoning)?,
                    w.cache_read
                        .saturating_mul(cached.saturating_add(counts.cache_read)),
                    w.cache_write.saturating_mul(counts.cache_write),
                    w.reasoning
                        .saturating_mul(reasoning.saturating_add(counts.thoughts)),
                ];
                Some(parts.iter().fold(0u64, |sum, p| sum.saturating_add(*p)))
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
            ..Counts::default()
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
            Meter::Weighted(Weights {
                input: 1,
                output: 4,
                cache_read: 1,
                cache_write: 1,
                reasoning: 4,
            })
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
        let meter = Meter::Weighted(Weights {
            input: MAX_WEIGHT,
            output: MAX_WEIGHT,
            cache_read: MAX_WEIGHT,
            cache_write: MAX_WEIGHT,
            reasoning: MAX_WEIGHT,
        });
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

    #[test]
    fn anthropic_cache_tokens_are_charged_apart_from_the_input_at_its_weight_by_default() {
        // The issue's response: 50 tokens in and out, 5,000 read from the cache, 1,000 written.
        let reported = Counts {
            cache_read: 5000,
            cache_write: 1000,
            ..counts(Some(20), Some(30), None)
        };
        let total = Meter::parse(&json!("total_tokens")).unwrap();
        assert_eq!(total.cost(&reported), Some(6050));
        let plain = Meter::parse(&json!({"input_tokens": 1, "output_tokens": 1})).unwrap();
        assert_eq!(plain.cost(&reported), Some(6050));
        let priced = json!({"input_tokens": 10, "output_tokens": 50,
            "cache_read_input_tokens": 1, "cache_creation_input_tokens": 12});
        let priced = Meter::parse(&priced).unwrap();
        assert_eq!(priced.cost(&reported), Some(200 + 1500 + 5000 + 12_000));
    }

    #[test]
    fn openai_cached_and_reasoning_tokens_are_never_counted_twice() {
        // 1,000 prompt tokens of which 800 cached; 500 completion of which 300 reasoning.
        let reported = Counts {
            cached: 800,
            reasoning: 300,
            ..counts(Some(1000), Some(500), Some(1500))
        };
        let same = Meter::parse(&json!({"prompt_tokens": 1, "completion_tokens": 1})).unwrap();
        assert_eq!(same.cost(&reported), Some(1500));
        let discounted = json!({"prompt_tokens": 4, "cached_tokens": 1, "completion_tokens": 16,
            "reasoning_tokens": 16});
        let discounted = Meter::parse(&discounted).unwrap();
        assert_eq!(discounted.cost(&reported), Some(200 * 4 + 800 + 500 * 16));
        let no_reasoning = json!({"completion_tokens": 1, "reasoning_tokens": 0});
        assert_eq!(
            Meter::parse(&no_reasoning).unwrap().cost(&reported),
            Some(200)
        );
    }

    #[test]
    fn gemini_thoughts_are_output_apart_from_the_candidates() {
        let reported = Counts {
            cached: 40,
            thoughts: 70,
            ..counts(Some(100), Some(30), Some(200))
        };
        let weights = json!({"input_tokens": 1, "output_tokens": 1});
        assert_eq!(Meter::parse(&weights).unwrap().cost(&reported), Some(200));
        let cheap_cache =
            json!({"input_tokens": 4, "cachedContentTokenCount": 1, "output_tokens": 10});
        assert_eq!(
            Meter::parse(&cheap_cache).unwrap().cost(&reported),
            Some(60 * 4 + 40 + 100 * 10)
        );
    }
}
