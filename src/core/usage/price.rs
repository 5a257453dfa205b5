//! Spend budgets: what a response costs in money, from its usage and its model's price, in whole
//! micro-units of the currency so that charges add up exactly. Prices are in currency per
//! million tokens, as providers publish them (`{"input": 2.5, "output": 10, "cache_read":
//! 1.25}`), kept in millionths of a micro-unit per token: a price of 0.075 a million is exact.
//! Each token is priced once, by its kind, as `Meter::Weighted` weighs it.
//!
//! **Which model.** The one the response says served it (`Served`), else the one the request
//! named: a client can name a cheap model that the upstream maps, aliases or ignores, never the
//! one the upstream reports. Names are compared without case and without the whitespace around
//! them, as upstreams that map names loosely (vLLM aliases, LiteLLM, Azure deployments) may read
//! them: `" GPT-4o "` is priced as `gpt-4o`.
//!
//! **Unpriced models** (`UnknownModel`): refused before the upstream, charged a default price,
//! or charged nothing. What a request reserves never depends on that: a request that names no
//! listed model reserves at the dearest price the policy has (`Pricing::reservation`), since its
//! response may name any.

use serde_json::{Map, Value};

use super::meter::Weights;
use super::{Counts, Meter, Served};

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

/// What a model no entry prices is charged (`unknown_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownModel {
    /// A request that names one is refused before the upstream; a response that names one (or
    /// whose request named none and that names none itself) is charged as the dearest entry
    /// would charge it. The default: nothing unpriced runs cheaper than what is priced.
    Refuse,
    /// This price.
    Price(Price),
    /// Nothing.
    Free,
}

impl UnknownModel {
    /// `"refuse"`, `"free"` or `{"price": PRICE}`.
    pub fn parse(config: &Value) -> Result<UnknownModel, String> {
        const EXPECTED: &str =
            r#"must be "refuse" (the default), "free" or {"price": {"input": .., "output": ..}}"#;
        match config {
            Value::String(mode) if mode == "refuse" => Ok(UnknownModel::Refuse),
            Value::String(mode) if mode == "free" => Ok(UnknownModel::Free),
            Value::Object(fields) => match (fields.get("price"), fields.len()) {
                (Some(price), 1) => Price::parse(price)
                    .map(UnknownModel::Price)
                    .map_err(|e| format!("price: {e}")),
                _ => Err(EXPECTED.into()),
            },
            _ => Err(EXPECTED.into()),
        }
    }
}

/// How the model a response was charged at was priced: by an entry, or as `UnknownModel` says
/// (what `sluice_unknown_model_total` counts, by `as_str`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PricedAs {
    Listed,
    /// `"refuse"`: a request naming it was refused before the upstream.
    Refused,
    /// `"refuse"`, but the model came with the response (or none was named): the dearest entry.
    Dearest,
    DefaultPrice,
    Free,
}

impl PricedAs {
    /// The ways an unpriced model is dealt with, as the metric's `sluice_outcome` names them.
    pub const UNKNOWN: [PricedAs; 4] = [
        PricedAs::Refused,
        PricedAs::Dearest,
        PricedAs::DefaultPrice,
        PricedAs::Free,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PricedAs::Listed => "listed",
            PricedAs::Refused => "refused",
            PricedAs::Dearest => "dearest",
            PricedAs::DefaultPrice => "default_price",
            PricedAs::Free => "free",
        }
    }
}

/// A spend budget's prices (`cost.price`) and what an unpriced model costs (`unknown_model`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pricing {
    pub prices: Prices,
    pub unknown: UnknownModel,
}

impl Pricing {
    /// Whether a request naming `asked` is refused before the upstream: it names a model that
    /// no entry prices, and unpriced models are refused. A request that names none is not (a
    /// Gemini request names its model in the path): its response is priced.
    pub fn refuses(&self, asked: Option<&[u8]>) -> bool {
        self.unknown == UnknownModel::Refuse && asked.is_some_and(|m| self.prices.of(m).is_none())
    }

    /// What a request asking for at most `tokens` of output reserves: their price for the model
    /// it names, if an entry prices it; else the dearest output price the policy has (its
    /// entries' and the default's), since the response may name any model.
    pub fn reservation(&self, asked: Option<&[u8]>, tokens: u64) -> u64 {
        if let Some(price) = asked.and_then(|m| self.prices.of(m)) {
            return price.output_cost(tokens);
        }
        let default = match self.unknown {
            UnknownModel::Price(price) => Some(price),
            _ => None,
        };
        let all = self.prices.entries.iter().map(|(_, p)| p).chain(&default);
        all.map(|p| p.output_cost(tokens)).max().unwrap_or(0)
    }

    /// What `counts` cost, the model being the one the response says `served` it, else the
    /// one the request named (`asked`); `None` when a count the price needs was not reported.
    pub fn cost(
        &self,
        counts: &Counts,
        served: Served,
        asked: Option<&[u8]>,
    ) -> (Option<u64>, PricedAs) {
        if let Some(price) = self.price_of(served, asked) {
            return (price.cost(counts), PricedAs::Listed);
        }
        (self.unpriced_cost(counts), self.priced_as(served, asked))
    }

    /// The price of the model charged: the one `served`, else the one `asked`, if listed.
    fn price_of(&self, served: Served, asked: Option<&[u8]>) -> Option<&Price> {
        let model = match served {
            Served::Named(name) => Some(name),
            Served::Unreadable => None,
            Served::Unnamed => asked,
        };
        model.and_then(|m| self.prices.of(m))
    }

    /// How the model charged is priced (what the metrics count).
    pub fn priced_as(&self, served: Served, asked: Option<&[u8]>) -> PricedAs {
        match self.unknown {
            _ if self.price_of(served, asked).is_some() => PricedAs::Listed,
            UnknownModel::Refuse => PricedAs::Dearest,
            UnknownModel::Price(_) => PricedAs::DefaultPrice,
            UnknownModel::Free => PricedAs::Free,
        }
    }

    /// What `counts` cost at the price of an unpriced model.
    fn unpriced_cost(&self, counts: &Counts) -> Option<u64> {
        match self.unknown {
            UnknownModel::Refuse => {
                let each = self.prices.entries.iter().map(|(_, p)| p.cost(counts));
                each.max().flatten()
            }
            UnknownModel::Price(price) => price.cost(counts),
            UnknownModel::Free => Some(0),
        }
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

/// The prices of a budget's models, by name or glob (`*` matches any run of characters),
/// compared without case and without the whitespace around them.
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
        let mut entries: Vec<(String, Price)> = Vec::with_capacity(models.len());
        for (model, price) in models {
            let name = String::from_utf8(normal(model.as_bytes()))
                .map_err(|_| format!("{model}: not UTF-8"))?;
            if name.is_empty() {
                return Err("a model's name must not be empty".into());
            }
            if let Some((other, _)) = models
                .iter()
                .find(|(other, _)| *other < model && normal(other.as_bytes()) == name.as_bytes())
            {
                return Err(format!(
                    "{model}: names the same models as {other} (names are compared without case \
                     or surrounding whitespace)"
                ));
            }
            let price = Price::parse(price).map_err(|e| format!("{model}: {e}"))?;
            // Kept in order as they come (a sort would add kilobytes to the wasm for a few
            // entries): after every entry as specific, before the first less so.
            let order = |name: &str| (name.contains('*'), std::cmp::Reverse(name.len()));
            let at = entries
                .iter()
                .position(|(other, _)| order(other) > order(&name));
            entries.insert(at.unwrap_or(entries.len()), (name, price));
        }
        Ok(Prices { entries })
    }

    /// The price of `model`, if an entry names it (without case, whitespace around it aside).
    pub fn of(&self, model: &[u8]) -> Option<&Price> {
        let model = normal(model);
        let matching = |(pattern, _): &&(String, Price)| glob(pattern.as_bytes(), &model);
        self.entries.iter().find(matching).map(|(_, price)| price)
    }
}

/// A model's name as prices compare it: without the whitespace around it, ASCII in lower case.
fn normal(model: &[u8]) -> Vec<u8> {
    model.trim_ascii().to_ascii_lowercase()
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

    fn pricing(unknown: UnknownModel) -> Pricing {
        let prices = Prices::parse(&json!({
            "gpt-4o-mini*": {"input": 0.15, "output": 0.6},
            "gpt-4o*": {"input": 2.5, "output": 10},
        }))
        .unwrap();
        Pricing { prices, unknown }
    }

    #[test]
    fn names_are_priced_without_case_or_surrounding_whitespace() {
        let pricing = pricing(UnknownModel::Free);
        let mini = pricing.prices.of(b"gpt-4o-mini").copied();
        for spelling in ["GPT-4o-Mini", " gpt-4o-mini\t", "gpt-4O-MINI-2024-07-18\n"] {
            assert_eq!(
                pricing.prices.of(spelling.as_bytes()).copied(),
                mini,
                "{spelling:?}"
            );
        }
        // Inner whitespace is another name.
        assert!(pricing.prices.of(b"gpt 4o").is_none());
        let twice =
            json!({"GPT-4o": {"input": 1, "output": 1}, "gpt-4o ": {"input": 2, "output": 2}});
        assert!(Prices::parse(&twice)
            .unwrap_err()
            .contains("names the same models as"));
    }

    #[test]
    fn the_served_model_wins_over_the_asked_one() {
        let pricing = pricing(UnknownModel::Free);
        let used = counts(1_000_000, 0);
        let cost =
            |served, asked: Option<&str>| pricing.cost(&used, served, asked.map(str::as_bytes));
        // Asked for mini, served 4o: charged 4o's $2.50 a million in.
        assert_eq!(
            cost(Served::Named(b"gpt-4o-2024-08-06"), Some("gpt-4o-mini")),
            (Some(2_500_000), PricedAs::Listed)
        );
        // No model in the response: the request's.
        assert_eq!(
            cost(Served::Unnamed, Some("GPT-4o-mini")),
            (Some(150_000), PricedAs::Listed)
        );
        // A response whose model cannot be read is an unpriced model, not the request's.
        assert_eq!(
            cost(Served::Unreadable, Some("gpt-4o-mini")),
            (Some(0), PricedAs::Free)
        );
        assert_eq!(cost(Served::Unnamed, None), (Some(0), PricedAs::Free));
    }

    #[test]
    fn an_unpriced_model_is_refused_charged_a_default_or_free() {
        let used = counts(1_000_000, 1_000_000);
        let default = Price::parse(&json!({"input": 1, "output": 2})).unwrap();
        let refuse = pricing(UnknownModel::Refuse);
        assert!(refuse.refuses(Some(b"llama-3")));
        assert!(!refuse.refuses(Some(b"GPT-4o")));
        assert!(
            !refuse.refuses(None),
            "a Gemini request names no model in its body"
        );
        // Served an unpriced model anyway: charged as the dearest entry would charge it.
        assert_eq!(
            refuse.cost(&used, Served::Named(b"llama-3"), None),
            (Some(12_500_000), PricedAs::Dearest)
        );
        let priced = pricing(UnknownModel::Price(default));
        assert!(!priced.refuses(Some(b"llama-3")));
        assert_eq!(
            priced.cost(&used, Served::Named(b"llama-3"), None),
            (Some(3_000_000), PricedAs::DefaultPrice)
        );
        let free = pricing(UnknownModel::Free);
        assert_eq!(
            free.cost(&used, Served::Named(b"llama-3"), Some(b"gpt-4o")),
            (Some(0), PricedAs::Free)
        );
        // A count a price needs, missing: unknown, whatever the model.
        let no_output = Counts {
            output: None,
            ..used
        };
        assert_eq!(
            priced.cost(&no_output, Served::Unnamed, Some(b"gpt-4o")).0,
            None
        );
        assert_eq!(refuse.cost(&no_output, Served::Unnamed, None).0, None);
    }

    #[test]
    fn a_request_naming_no_priced_model_reserves_at_the_dearest_output_price() {
        let default = Price::parse(&json!({"input": 1, "output": 20})).unwrap();
        for (unknown, dearest) in [
            (UnknownModel::Refuse, 10_000),
            (UnknownModel::Free, 10_000),
            (UnknownModel::Price(default), 20_000),
        ] {
            let pricing = pricing(unknown);
            // 1,000 tokens out: mini's $0.60 a million, 4o's $10, the default's $20.
            assert_eq!(pricing.reservation(Some(b"Gpt-4o-Mini"), 1000), 600);
            assert_eq!(pricing.reservation(Some(b"gpt-4o"), 1000), 10_000);
            for asked in [None, Some(&b"gpt4o"[..]), Some(b"llama")] {
                assert_eq!(pricing.reservation(asked, 1000), dearest, "{unknown:?}");
            }
        }
    }

    #[test]
    fn unknown_model_modes_parse_and_refusals_name_the_bad_part() {
        assert_eq!(
            UnknownModel::parse(&json!("refuse")),
            Ok(UnknownModel::Refuse)
        );
        assert_eq!(UnknownModel::parse(&json!("free")), Ok(UnknownModel::Free));
        let price = json!({"price": {"input": 1, "output": 2}});
        assert!(matches!(
            UnknownModel::parse(&price),
            Ok(UnknownModel::Price(_))
        ));
        let bad = json!({"price": {"input": 1}});
        assert_eq!(
            UnknownModel::parse(&bad).unwrap_err(),
            "price: output: required"
        );
        for bad in [json!("charge"), json!({"price": {}, "x": 1}), json!(0)] {
            assert!(UnknownModel::parse(&bad)
                .unwrap_err()
                .starts_with("must be \"refuse\""));
        }
    }
}
