//! One pass over a log: each line read and parsed, put back in start order, decided by the
//! configuration (and the one compared with it), then counted. Nothing is kept per line.

use crate::check::Check;
use crate::compare::Comparison;
use crate::engine::Engine;
use crate::log::{read_line, Record};
use crate::order::Reorder;
use crate::report::Report;
use crate::times::StartTimes;
use sluice::config::ConfigError;
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
    let mut order = Reorder::new(options.window);
    let mut times = StartTimes::default();
    let mut number = 0;
    loop {
        let mut record = order.blank();
        match read_line(&mut input, record.buffer()) {
            Ok(0) => break,
            Ok(_) => number += 1,
            Err(e) => return Err(RunError::Read(number, e)),
        }
        if record.is_blank() {
            order.recycle(record);
            continue;
        }
        pass.replay.report.lines += 1;
        match record.parse(number, &mut times) {
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
