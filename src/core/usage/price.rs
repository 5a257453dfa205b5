//! Spend budgets: what a response costs in money, from its usage and its model's price, in whole
//! micro-units of the currency so that charges add up exactly. Prices are in currency per
//! million tokens, as providers publish them (`{"input": 2.5, "output": 10, "cache_read":
//! 1.25}`), kept in millionths of a micro-unit per token: a price of 0.075 a million is exact.
//! Each token is priced once, by its kind, as `Meter::Weighted` weighs it.

use serde_json::{Map, Value};

use super::meter::Weights;
use super::{Counts, Meter};

/// Millionths of a micro-unit per token in a price of 1 a million tokens.
const SCALE: u64 = 1_000_000;
/// The highest price a million tokens can have: 1,000,000 (of the currency).
pub const MAX_PRICE: f64 = 1_000_000.0;

/// A model's price of each kind of token, in millionths of a micro-unit per token (the price
/// in currency per million tokens, times a million).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price(Weights);

impl Price {
    /// `{"input": .., "output": .., "cache_read": .., "cache_write": .., "reasoning": ..}`, in
    /// currency per million tokens, from 0 to `MAX_PRICE`: `input` and `output` required, cache
    /// reads and writes at the input's price and reasoning at the output's unless given.
    pub fn parse(config: &Value) -> Result<Price, String> {
        let Value::Object(fields) = config else {
            return Err(r#"must be an object: {"input": 2.5, "output": 10}"#.into());
        };
        let known = ["input", "output", "cache_read", "cache_write", "reasoning"];
        if let Some(name) = fields.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!(
                "unknown price {name:?}: expected {}",
                known.join(", ")
            ));
        }
        let price = |name: &str| scaled(fields, name);
        let (input, output) = (
            price("input")?.ok_or("input: required")?,
            price("output")?.ok_or("output: required")?,
        );
        Ok(Price(Weights {
            input,
            output,
            cache_read: price("cache_read")?.unwrap_or(input),
            cache_write: price("cache_write")?.unwrap_or(input),
            reasoning: price("reasoning")?.unwrap_or(output),
        }))
    }

    /// What `counts` cost, in micro-units rounded up; `None` when a count the price needs was
    /// not reported (input or output, priced above 0).
    pub fn cost(&self, counts: &Counts) -> Option<u64> {
        let scaled = Meter::Weighted(self.0).cost(counts)?;
        Some(scaled.div_ceil(SCALE))
    }

    /// What `tokens` of output cost at most, in micro-units rounded up: a reservation.
    pub fn output_cost(&self, tokens: u64) -> u64 {
        Meter::Weighted(self.0).output_cost(tokens).div_ceil(SCALE)
    }
}

/// A price in currency per million tokens as millionths of a micro-unit per token, rounded to
/// the nearest: `None` when not given.
fn scaled(fields: &Map<String, Value>, name: &str) -> Result<Option<u64>, String> {
    let Some(value) = fields.get(name) else {
        return Ok(None);
    };
    let price = value
        .as_f64()
        .filter(|p| (0.0..=MAX_PRICE).contains(p))
        .ok_or_else(|| format!("{name}: must be a number from 0 to {MAX_PRICE}"))?;
    // At most 10^12: exact in f64, and far inside u64.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Some((price * SCALE as f64).round() as u64))
}

/// The prices of a budget's models, by name or glob (`*` matches any run of characters).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prices {
    /// Exact names first, then globs from the longest: the most specific entry wins.
    entries: Vec<(String, Price)>,
}

impl Prices {
    /// `{"MODEL-or-glob": PRICE, ...}`; errors name the entry.
    pub fn parse(config: &Value) -> Result<Prices, String> {
        let Value::Object(models) = config else {
            return Err(r#"must be an object of prices by model: {"gpt-4o*": {...}}"#.into());
        };
        if models.is_empty() {
            return Err("at least one model's price is required".into());
        }
        let mut entries = Vec::with_capacity(models.len());
        for (model, price) in models {
            if model.is_empty() {
                return Err("a model's name must not be empty".into());
            }
            let price = Price::parse(price).map_err(|e| format!("{model}: {e}"))?;
            entries.push((model.clone(), price));
        }
        entries.sort_by_key(|(model, _)| (model.contains('*'), std::cmp::Reverse(model.len())));
        Ok(Prices { entries })
    }

    /// The price of `model`, if an entry names it.
    pub fn of(&self, model: &[u8]) -> Option<&Price> {
        let matching = |(pattern, _): &&(String, Price)| glob(pattern.as_bytes(), model);
        self.entries.iter().find(matching).map(|(_, price)| price)
    }
}

/// Whether `text` matches `pattern`, whose `*` matches any run of bytes (none included).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let mut parts = pattern.split(|&b| b == b'*');
    let Some(first) = parts.next() else {
        return text.is_empty();
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&[u8]> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole text.
        return rest.is_empty();
    };
    for part in middle {
        match rest
            .windows(part.len().max(1))
            .position(|w| part.is_empty() || w == *part)
        {
            Some(at) => rest = rest.get(at + part.len()..).unwrap_or_default(),
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn counts(input: u64, output: u64) -> Counts {
        Counts {
            input: Some(input),
            output: Some(output),
            ..Counts::default()
        }
    }

    #[test]
    fn a_charge_is_usage_times_price_in_whole_micro_units_rounded_up() {
        let price = Price::parse(&json!({"input": 2.5, "output": 10})).unwrap();
        // 1,000 in at $2.50/M = 2,500 µ$; 500 out at $10/M = 5,000 µ$.
        assert_eq!(price.cost(&counts(1000, 500)), Some(7500));
        // One token in at $0.075/M is 0.075 µ$: charged 1.
        let cheap = Price::parse(&json!({"input": 0.075, "output": 0.3})).unwrap();
        assert_eq!(cheap.cost(&counts(1, 0)), Some(1));
        assert_eq!(cheap.cost(&counts(1_000_000, 0)), Some(75_000));
        assert_eq!(cheap.output_cost(1000), 300);
    }

    #[test]
    fn cache_and_reasoning_tokens_have_their_own_prices_else_the_inputs_and_outputs() {
        let price = Price::parse(
            &json!({"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}),
        )
        .unwrap();
        let anthropic = Counts {
            cache_read: 5000,
            cache_write: 1000,
            ..counts(20, 30)
        };
        assert_eq!(price.cost(&anthropic), Some(60 + 450 + 1500 + 3750));
        let openai = Counts {
            cached: 800,
            reasoning: 300,
            ..counts(1000, 500)
        };
        assert_eq!(price.cost(&openai), Some(600 + 240 + 7500));
    }

    #[test]
    fn the_most_specific_entry_prices_a_model() {
        let prices = Prices::parse(&json!({
            "*": {"input": 1, "output": 1},
            "gpt-4o*": {"input": 2.5, "output": 10},
            "gpt-4o-mini*": {"input": 0.15, "output": 0.6},
            "gpt-4o-mini-2024-07-18": {"input": 0.1, "output": 0.1},
            "claude-*-sonnet-*": {"input": 3, "output": 15}
        }))
        .unwrap();
        let input_price = |model: &str| {
            let price = prices.of(model.as_bytes()).unwrap();
            price.cost(&counts(1_000_000, 0)).unwrap()
        };
        assert_eq!(input_price("gpt-4o-2024-08-06"), 2_500_000);
        assert_eq!(input_price("gpt-4o-mini"), 150_000);
        assert_eq!(input_price("gpt-4o-mini-2024-07-18"), 100_000);
        assert_eq!(input_price("claude-3-5-sonnet-latest"), 3_000_000);
        assert_eq!(input_price("llama"), 1_000_000);
        let exact = Prices::parse(&json!({"gpt-4o": {"input": 1, "output": 1}})).unwrap();
        assert!(exact.of(b"gpt-4o-mini").is_none());
        assert!(exact.of(b"gpt-4o").is_some());
    }

    #[test]
    fn globs_match_as_shells_do() {
        for (pattern, text, matches) in [
            ("*", "", true),
            ("a*", "a", true),
            ("a*c", "abc", true),
            ("a*c", "ab", false),
            ("*b*", "abc", true),
            ("a*b*c", "axbxc", true),
            ("a*b*c", "axcxb", false),
            ("ab", "abc", false),
            ("*c", "c", true),
            ("a**c", "ac", true),
        ] {
            assert_eq!(
                glob(pattern.as_bytes(), text.as_bytes()),
                matches,
                "{pattern} {text}"
            );
        }
    }

    #[test]
    fn refusals_name_the_bad_part() {
        let refused = |config: Value| Prices::parse(&config).unwrap_err();
        assert!(refused(json!({})).starts_with("at least one"));
        assert!(refused(json!({"m": {"input": 1}})).starts_with("m: output: required"));
        assert!(refused(json!({"m": {"input": -1, "output": 1}})).starts_with("m: input: must"));
        assert!(
            refused(json!({"m": {"input": 1, "output": 1, "cached": 1}}))
                .starts_with(r#"m: unknown price "cached""#)
        );
        assert!(refused(json!([])).starts_with("must be an object"));
    }
}
