//! One pass over a log: each line read and parsed (what the pass reads of it kept), put back in
//! start order, decided by the configuration (and the one compared with it), then counted; lines
//! are parsed a few dozen at a time, then ordered and decided. Nothing is kept per line once it
//! is decided.

use crate::check::Check;
use crate::compare::Comparison;
use crate::engine::{Decided, Engine};
use crate::log::{read_line, Parser, Record, Wanted};
use crate::order::Reorder;
use crate::report::Report;
use sluice::config::ConfigError;
use sluice::core::request::Attr;
use sluice::limiter::Outcome;
use std::collections::BTreeSet;
use std::io::BufRead;

/// What to replay and how.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The configuration, as JSON.
    pub config: String,
    /// Another configuration to compare it with (`--compare`).
    pub compare: Option<String>,
    /// Compare with Envoy's response codes (`--check`).
    pub check: bool,
    /// Top keys by their values too (`--show-keys`).
    pub show_keys: bool,
    /// How long (log time, nanoseconds) a line may come after later-starting ones (see `order`).
    pub window: u64,
    /// The routes on which Envoy does not run the filter (`config_file::Loaded::routes_off`):
    /// their requests pass undecided.
    pub routes_off: BTreeSet<Vec<u8>>,
}

/// What one pass found.
#[derive(Debug)]
pub struct Replay {
    pub report: Report,
    pub check: Option<Check>,
    pub comparison: Option<Comparison>,
}

/// Why a replay could not run.
#[derive(Debug)]
pub enum RunError {
    /// A configuration is refused: which one (`--config` or `--compare`), and why.
    Config(&'static str, ConfigError),
    /// The log could not be read, after this many lines.
    Read(u64, std::io::Error),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            RunError::Config(which, e) => write!(f, "{which}: invalid configuration: {e}"),
            RunError::Read(lines, e) => write!(f, "reading the log after line {lines}: {e}"),
        }
    }
}

/// The engines of one pass and what they found so far.
struct Pass {
    engine: Engine,
    other: Option<Engine>,
    routes_off: BTreeSet<Vec<u8>>,
    replay: Replay,
}

impl Pass {
    /// What the pass reads of each line: what its configurations' policies read, the method
    /// and path `--compare`'s examples show, the route that may switch the filter off, and what
    /// `--check` compares (`check`).
    fn wanted(&self, check: bool) -> Wanted {
        let mut attrs = self.engine.plan.attrs.clone();
        if let Some(other) = &self.other {
            attrs.extend(other.plan.attrs.iter().cloned());
            attrs.extend([Attr::Method, Attr::Path]);
        }
        if !self.routes_off.is_empty() {
            attrs.push(Attr::Route);
        }
        let wanted = Wanted::new(&attrs, check).settling(&self.engine.plan);
        match &self.other {
            Some(other) => wanted.settling(&other.plan),
            None => wanted,
        }
    }

    /// At the end of the log: the requests still in flight end, and their settlements count.
    fn finish(&mut self) {
        self.engine.finish();
        if let Some(other) = &mut self.other {
            other.finish();
        }
        self.replay.report.settled(&self.engine);
    }

    /// Whether the filter ran for the request: not on a route that switches it off.
    fn filter_ran(&self, record: &Record) -> bool {
        let route = record.route_name();
        self.routes_off.is_empty() || !route.is_some_and(|r| self.routes_off.contains(r))
    }

    fn decide(&mut self, record: &Record) {
        let (decided, after) = if self.filter_ran(record) {
            let after = self.other.as_mut().map(|other| other.decide(record));
            (self.engine.decide(record), after)
        } else {
            // No policy saw the request, and none counts it.
            self.replay.report.filter_off += 1;
            let passed = || Decided {
                outcome: Outcome::default(),
                now: record.time,
            };
            (passed(), self.other.as_ref().map(|_| passed()))
        };
        self.count(record, &decided, after);
    }

    /// Counts a request's outcome (and under the other configuration, `after`).
    fn count(&mut self, record: &Record, decided: &Decided, after: Option<Decided>) {
        let plan = &self.engine.plan;
        self.replay.report.add(plan, record, decided);
        if self.replay.report.counts_in_flight() {
            self.replay.report.add_in_flight(plan, record, decided);
        }
        if let Some(check) = &mut self.replay.check {
            check.add(plan, record, decided);
        }
        let compared = (&self.other, &mut self.replay.comparison, after);
        if let (Some(other), Some(comparison), Some(after)) = compared {
            let show_keys = self.replay.report.show_keys;
            comparison.add(record, (plan, decided), (&other.plan, &after), show_keys);
        }
    }
}

/// Lines parsed in a row before their requests are put in order and decided in a row. One line
/// at a time, the CPU fetched the parser's code and the limiter's again for every line, the
/// two being more than its instruction cache holds: about a sixth of a line's time. (64 and 256
/// did a little worse than 128 on the benchmark's VM; their records, too, stay in the cache.)
const BATCH: usize = 128;

/// The log's lines, read and parsed.
struct Lines<R> {
    input: R,
    parser: Parser,
    /// The line being read.
    line: Vec<u8>,
    /// Its number in the log, from 1.
    number: u64,
}

impl<R: BufRead> Lines<R> {
    /// Parses the next `BATCH` lines into `parsed` (records from `order`'s spares), counting and
    /// listing those it skips. Returns whether the log goes on.
    #[allow(clippy::vec_box)] // Boxed as `order` holds them: a record moves as a pointer.
    fn parse(
        &mut self,
        parsed: &mut Vec<Box<Record>>,
        order: &mut Reorder,
        report: &mut Report,
    ) -> Result<bool, RunError> {
        while parsed.len() < BATCH {
            self.line.clear();
            match read_line(&mut self.input, &mut self.line) {
                Ok(0) => return Ok(false),
                Ok(_) => self.number += 1,
                Err(e) => return Err(RunError::Read(self.number, e)),
            }
            if self.line.trim_ascii().is_empty() {
                continue;
            }
            report.lines += 1;
            let mut record = order.blank();
            match self.parser.parse(&self.line, self.number, &mut record) {
                Ok(()) => parsed.push(record),
                Err(e) => {
                    report.skip(self.number, e.to_string());
                    order.recycle(record);
                }
            }
        }
        Ok(true)
    }
}

/// Replays the log read from `input`.
pub fn run(options: &Options, input: impl BufRead) -> Result<Replay, RunError> {
    let engine =
        Engine::new(options.config.as_bytes()).map_err(|e| RunError::Config("--config", e))?;
    let other = options
        .compare
        .as_ref()
        .map(|json| Engine::new(json.as_bytes()));
    let other = other
        .transpose()
        .map_err(|e| RunError::Config("--compare", e))?;
    let report = Report::new(&engine.plan, options.show_keys);
    let mut pass = Pass {
        replay: Replay {
            report,
            check: options.check.then(|| Check::new(&engine.plan)),
            comparison: other.as_ref().map(|_| Comparison::default()),
        },
        engine,
        other,
        routes_off: options.routes_off.clone(),
    };
    let mut lines = Lines {
        input,
        parser: Parser::new(pass.wanted(options.check)),
        line: Vec::new(),
        number: 0,
    };
    let mut order = Reorder::new(options.window);
    let mut parsed = Vec::with_capacity(BATCH);
    loop {
        let more = lines.parse(&mut parsed, &mut order, &mut pass.replay.report)?;
        for record in parsed.drain(..) {
            order.push(record);
            while let Some(record) = order.ready() {
                pass.decide(&record);
                order.recycle(record);
            }
        }
        if !more {
            break;
        }
    }
    while let Some(record) = order.release() {
        pass.decide(&record);
    }
    pass.finish();
    pass.replay.report.late = order.late;
    Ok(pass.replay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::core::duration::NANOS_PER_SEC;

    /// A request of `user` at `millis` after a start, and Envoy's answer to it.
    fn line(user: &str, millis: u64, code: u16) -> String {
        let time =
            sluice::core::time::format_rfc3339(1_800_000_000 * NANOS_PER_SEC + millis * 1_000_000);
        format!(
            r#"{{"start_time":"{time}","headers":{{"x-user-id":"{user}"}},"response_code":{code}}}"#
        )
    }

    #[test]
    fn lines_across_many_batches_are_decided_in_start_order_as_one_by_one() {
        // Each user's two requests, the second started first: the one started first passes.
        let mut log = Vec::new();
        let (mut lines, mut bad) = (0, 0);
        for pair in 0..2 * BATCH as u64 {
            let user = format!("u{pair}");
            log.push(line(&user, 10 * (2 * pair + 1), 429));
            log.push(line(&user, 10 * 2 * pair, 200));
            lines += 2;
            if pair % 5 == 0 {
                log.push(String::new());
            }
            if pair % 7 == 0 {
                log.push("not json".into());
                (lines, bad) = (lines + 1, bad + 1);
            }
        }
        // Started before every line the window let go: decided at once, and counted late.
        log.push(line("late", 0, 200));
        lines += 1;
        let options = Options {
            config: r#"{"policies": [{"name": "p", "key": ["header:x-user-id"],
                "requests": 1, "per": "1h", "burst": 1}]}"#
                .into(),
            check: true,
            window: NANOS_PER_SEC / 2,
            ..Options::default()
        };
        let replay = run(&options, log.join("\n").as_bytes()).unwrap();
        let (report, check) = (&replay.report, replay.check.unwrap());
        assert_eq!((report.lines, report.skipped), (lines, bad));
        assert_eq!((report.requests, report.late), (lines - bad, 1));
        assert_eq!(
            (check.compared, check.agreed),
            (lines - bad, lines - bad),
            "{:?}",
            check.disagreements
        );
    }
}
