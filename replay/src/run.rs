//! One pass over a log: each line read and parsed (what the pass reads of it kept), put back in
//! start order, decided by the configuration (and the one compared with it), then counted.
//! Nothing is kept per line once it is decided.

use crate::check::Check;
use crate::compare::Comparison;
use crate::engine::Engine;
use crate::log::{read_line, Parser, Record, Wanted};
use crate::order::Reorder;
use crate::report::Report;
use sluice::config::ConfigError;
use sluice::request::Attr;
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
    replay: Replay,
}

impl Pass {
    /// What the pass reads of each line: what its configurations' policies read, the method
    /// and path `--compare`'s examples show, and what `--check` compares (`check`).
    fn wanted(&self, check: bool) -> Wanted {
        let mut attrs = self.engine.plan.attrs.clone();
        if let Some(other) = &self.other {
            attrs.extend(other.plan.attrs.iter().cloned());
            attrs.extend([Attr::Method, Attr::Path]);
        }
        Wanted::new(&attrs, check)
    }

    fn decide(&mut self, record: &Record) {
        let decided = self.engine.decide(record);
        let plan = &self.engine.plan;
        self.replay.report.add(plan, record, &decided);
        if let Some(check) = &mut self.replay.check {
            check.add(plan, record, &decided);
        }
        if let (Some(other), Some(comparison)) = (&mut self.other, &mut self.replay.comparison) {
            let after = other.decide(record);
            let show_keys = self.replay.report.show_keys;
            comparison.add(record, (plan, &decided), (&other.plan, &after), show_keys);
        }
    }
}

/// Replays the log read from `input`.
pub fn run(options: &Options, mut input: impl BufRead) -> Result<Replay, RunError> {
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
    };
    let mut parser = Parser::new(pass.wanted(options.check));
    let mut order = Reorder::new(options.window);
    let (mut line, mut number) = (Vec::new(), 0);
    loop {
        line.clear();
        match read_line(&mut input, &mut line) {
            Ok(0) => break,
            Ok(_) => number += 1,
            Err(e) => return Err(RunError::Read(number, e)),
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        pass.replay.report.lines += 1;
        let mut record = order.blank();
        match parser.parse(&line, number, &mut record) {
            Ok(()) => order.push(record),
            Err(e) => {
                pass.replay.report.skip(number, e.to_string());
                order.recycle(record);
            }
        }
        while let Some(record) = order.ready() {
            pass.decide(&record);
            order.recycle(record);
        }
    }
    while let Some(record) = order.release() {
        pass.decide(&record);
    }
    pass.replay.report.late = order.late;
    Ok(pass.replay)
}
