//! The `sluice-replay` command: arguments in, the replay's report out. Exit status 0 when the
//! replay ran, 1 when it could not (a refused configuration, an unreadable log), 2 for bad
//! arguments, 3 when `--check` found a request on which Envoy answered otherwise.

use clap::{Parser, ValueEnum};
use sluice_replay::run::{run, Options, Replay};
use sluice_replay::{config_file, json, log, log_format, svg, text};
use std::path::PathBuf;
use std::process::ExitCode;

/// What a sluice configuration would have done to the traffic of an access log: replayed offline
/// with the filter's own code, the log's timestamps as the clock, as one Envoy worker.
#[derive(Parser)]
#[command(name = "sluice-replay", version)]
struct Cli {
    /// The sluice configuration: JSON, or Envoy or Istio YAML holding one.
    #[arg(long, value_name = "CONFIG")]
    config: PathBuf,
    /// The access log: JSON lines as --print-log-format makes Envoy write them; `-` for standard
    /// input; gzip accepted.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "print_log_format"
    )]
    log: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Also write a chart of each policy's requests and denials over time.
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
    /// List the most denied keys by their values, not only their hashes.
    #[arg(long)]
    show_keys: bool,
    /// Print the Envoy access-log configuration that writes the log this needs, and exit.
    #[arg(long)]
    print_log_format: bool,
    /// Also replay another configuration and report the requests whose outcome changes.
    #[arg(long, value_name = "OTHER_CONFIG")]
    compare: Option<PathBuf>,
    /// Compare each replayed answer (429 or not) with the log's response_code.
    #[arg(long)]
    check: bool,
    /// How much later than requests that started after it a line may come (Envoy logs a
    /// request when it ends) and still be replayed in start order; 0 replays in log order.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = reorder_window)]
    reorder_window: u64,
}

/// `--reorder-window`: a duration (`500ms`, `2s`, `1m`), or zero (`0`, `0s`) for log order.
fn reorder_window(text: &str) -> Result<u64, String> {
    let unit = text.trim_start_matches('0');
    let zero = unit.len() < text.len()
        && !unit.starts_with(|c: char| c.is_ascii_digit())
        && (unit.is_empty() || sluice::core::duration::parse_nanos(&format!("1{unit}")).is_ok());
    if zero {
        Ok(0)
    } else {
        sluice::core::duration::parse_nanos(text)
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn main() -> ExitCode {
    match replay(&Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice-replay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn replay(cli: &Cli) -> Result<ExitCode, String> {
    let config = config_file::load(&cli.config)?;
    if cli.print_log_format {
        let plan = sluice_replay::engine::plan(config.json.as_bytes())
            .map_err(|e| format!("--config: invalid configuration: {e}"))?;
        print!("{}", log_format::print(&plan));
        return Ok(ExitCode::SUCCESS);
    }
    let compare = cli.compare.as_deref().map(config_file::load).transpose()?;
    let options = Options {
        config: config.json,
        compare: compare.map(|other| other.json),
        check: cli.check,
        show_keys: cli.show_keys,
        window: cli.reorder_window,
        routes_off: config.routes_off,
    };
    let path = cli.log.as_deref().unwrap_or("-");
    let input = log::open(path).map_err(|e| format!("--log {path}: {e}"))?;
    let replay = run(&options, input).map_err(|e| e.to_string())?;
    if let Some(out) = &cli.svg {
        std::fs::write(out, svg::render(&replay.report))
            .map_err(|e| format!("--svg {}: {e}", out.display()))?;
    }
    match cli.format {
        Format::Text => print!("{}", text::render(&replay)),
        Format::Json => println!("{}", json::render(&replay)),
    }
    Ok(exit_code(&replay))
}

fn exit_code(replay: &Replay) -> ExitCode {
    match &replay.check {
        Some(check) if !check.all_agree() => ExitCode::from(3),
        _ => ExitCode::SUCCESS,
    }
}
