//! `acyclic [CRATE_ROOT...]`: fails when the modules of a crate import each other in a circle.
//! Without arguments it checks every crate under the current directory (each `src/lib.rs` and
//! `src/main.rs`).
//!
//! Each crate root is read with every module it declares. Every path a module names (`use`
//! lines and paths in code, through `crate::`, `self::`, `super::` or a child module's name) is
//! an edge from that module to the module the path lands in. An edge is counted between the two
//! siblings that hold its ends under their nearest common parent, so a circle is seen at the
//! level where it is a design decision: `config` and `limiter` importing each other is one,
//! whatever files inside them do it. A parent and its own children are one unit and may use
//! each other. Test-only code (`#[cfg(test)]`) is left out: a test may look at anything.

mod graph;
mod modules;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut roots: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if roots.is_empty() {
        crate_roots(Path::new("."), &mut roots);
        roots.sort();
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
    println!("acyclic: no circles in {} crate root(s)", roots.len());
    ExitCode::SUCCESS
}

/// Every `src/lib.rs` and `src/main.rs` under `dir`, outside build outputs and hidden folders.
fn crate_roots(dir: &Path, roots: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() && !name.starts_with('.') && name != "target" && name != "node_modules" {
            crate_roots(&path, roots);
        } else if (name == "lib.rs" || name == "main.rs") && dir.ends_with("src") {
            roots.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a crate of `files` (path, text) to a fresh directory and lists its circles.
    fn circles_in(files: &[(&str, &str)]) -> Vec<String> {
        let dir =
            std::env::temp_dir().join(format!("acyclic-{}-{}", std::process::id(), files.len()));
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let found = graph::circles(&modules::read(&dir.join("lib.rs")).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        found
    }

    #[test]
    fn two_siblings_that_import_each_other_are_a_circle() {
        let found = circles_in(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b/mod.rs", "mod inner;\n"),
            ("b/inner.rs", "pub fn f() { let _ = crate::a::A; }\n"),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("a -> b") && found[0].contains("b -> a"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn parents_and_children_and_tests_may_use_each_other() {
        let found = circles_in(&[
            ("lib.rs", "mod a;\nmod b;\npub struct Root;\n"),
            ("a.rs", "use crate::b::B;\nuse super::Root;\n"),
            (
                "b.rs",
                "pub struct B;\n#[cfg(test)]\nmod tests { use crate::a; }\n",
            ),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }
}
