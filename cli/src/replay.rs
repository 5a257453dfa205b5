//! `sluice replay ARGS...`: `sluice-replay ARGS...`, the binary next to this one (or on the
//! PATH), so that both names work and the replay stays one program.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use clap::Args;

#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct Replay {
    /// sluice-replay's arguments (`sluice replay --help` shows them)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(replay: &Replay) -> Result<ExitCode, String> {
    let beside = (std::env::current_exe().ok())
        .and_then(|exe| exe.parent().map(|dir| dir.join("sluice-replay")))
        .filter(|path| path.is_file());
    let program = beside.unwrap_or_else(|| PathBuf::from("sluice-replay"));
    let status = (Command::new(&program).args(&replay.args).status())
        .map_err(|e| format!("replay: cannot run {}: {e}", program.display()))?;
    let code = status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(1);
    Ok(ExitCode::from(code))
}
