//! `acyclic CRATE_ROOT...`: fails when the modules of a crate import each other in a circle.
//!
//! Each crate root (`src/lib.rs`, `src/main.rs`) is read with every module it declares. Every
//! path a module names (`use` lines and paths in code, through `crate::`, `self::`, `super::` or
//! a child module's name) is an edge from that module to the module the path lands in. An edge is
//! counted between the two siblings that hold its ends under their nearest common parent, so a
//! circle is seen at the level where it is a design decision: `config` and `limiter` importing
//! each other is one, whatever files inside them do it. A parent and its own children are one
//! unit and may use each other. Test-only code (`#[cfg(test)]`, `tests.rs`) is left out: a test
//! may look at anything.

mod graph;
mod modules;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let roots: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if roots.is_empty() {
        eprintln!("usage: acyclic CRATE_ROOT... (e.g. src/lib.rs service/src/lib.rs)");
        return ExitCode::from(2);
    }
    let mut circles = 0;
    for root in &roots {
        let crate_modules = match modules::read(root) {
            Ok(found) => found,
            Err(error) => {
                eprintln!("acyclic: {error}");
                return ExitCode::from(2);
            }
        };
        for circle in graph::circles(&crate_modules) {
            circles += 1;
            eprintln!("{}: modules import each other in a circle:", root.display());
            eprintln!("{circle}");
        }
    }
    if circles > 0 {
        eprintln!("acyclic: {circles} circle(s); the lower module should own the type it needs");
        return ExitCode::FAILURE;
    }
    println!("acyclic: no circles in {} crate(s)", roots.len());
    ExitCode::SUCCESS
}
