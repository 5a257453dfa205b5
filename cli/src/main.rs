//! `sluice`: the operator's command line. `keys`, `overrides`, `top`, `rlqs` and `envoys` drive sluice-service's admin API
//! (`/admin/v1/`, docs/operations-api.md); `replay` is `sluice-replay`. A subcommand is one
//! file; `client` speaks HTTP, `table` prints what comes back for a human (or as it came with
//! `--json`).

mod client;
mod envoys;
mod keys;
mod overrides;
mod replay;
mod rlqs;
mod table;
mod top;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::client::Client;

/// Operate sluice's limits at runtime: see a key, reset it, credit it, give it its own limit.
#[derive(Parser, Debug)]
#[command(name = "sluice", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One key of a global policy: show, reset, credit
    #[command(subcommand)]
    Keys(keys::Keys),
    /// One key's own limit: set, list, delete
    #[command(subcommand)]
    Overrides(overrides::Overrides),
    /// The heaviest keys of a policy, by refusals or consumption, over the last minute or hour
    Top(top::Top),
    /// The RLQS's buckets on a replica: Envoys sharing each descriptor, their shares, reports
    Rlqs(rlqs::Rlqs),
    /// The Envoys calling a replica: when each last did, its workers, settlements they dropped
    Envoys(envoys::Envoys),
    /// Replay an access log through a configuration, offline (`sluice-replay`'s arguments)
    Replay(replay::Replay),
}

/// Where the admin API is and how to reach it: every subcommand that calls the service.
#[derive(Args, Debug, Clone)]
pub struct Service {
    /// The service's HTTP address (http://host:port)
    #[arg(
        long,
        env = "SLUICE_SERVICE",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub service: String,

    /// A file holding the admin (or read-only) token; else $SLUICE_ADMIN_TOKEN
    #[arg(
        long,
        env = "SLUICE_ADMIN_TOKEN_FILE",
        value_name = "PATH",
        global = true
    )]
    pub token_file: Option<std::path::PathBuf>,

    /// Print the service's JSON as it came, for scripts
    #[arg(long, global = true)]
    pub json: bool,
}

impl Service {
    pub fn client(&self) -> Result<Client, String> {
        let token = match &self.token_file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("--token-file {}: {e}", path.display()))?,
            None => std::env::var("SLUICE_ADMIN_TOKEN")
                .map_err(|_| "no token: give --token-file or set SLUICE_ADMIN_TOKEN".to_string())?,
        };
        // A token file of the service's may hold `NAME TOKEN`: the token is the last word.
        let token = token
            .split_whitespace()
            .last()
            .unwrap_or_default()
            .to_string();
        Client::new(&self.service, token)
    }

    /// A client of another address (an Envoy's admin listener) with the same token.
    pub fn client_of(&self, address: &str) -> Result<Client, String> {
        Service {
            service: address.to_string(),
            token_file: self.token_file.clone(),
            json: self.json,
        }
        .client()
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Keys(command) => keys::run(command),
        Command::Overrides(command) => overrides::run(command),
        Command::Top(command) => top::run(command),
        Command::Rlqs(command) => rlqs::run(&command),
        Command::Envoys(command) => envoys::run(&command),
        Command::Replay(replay) => replay::run(&replay),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("sluice: {message}");
            ExitCode::FAILURE
        }
    }
}
