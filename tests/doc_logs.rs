//! Every log event the docs show is one the code writes: each JSON log line of a ```` ```json ````
//! block (an object with `level`, `message` and `target`) and each row of a log table
//! (`| Level | message | Fields | When |`, alternatives as `INFO / WARN`, `a` / `b`,
//! `none / error`) must be a `tracing` event of the workspace's source with that message, at
//! that level, with exactly those fields, and for a JSON line in the module its `target` names.
//! The events are read from the source: each `info!(...)`, `warn!(...)`, ... whose last argument
//! is the message literal. A message the source writes through a format (`warn!(reason, "{}",
//! message)`) need only be a string literal of the source.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sluice_testkit::docs::files;
use sluice_testkit::{repo_root, workspace_crates};

/// A log event: level, message, module (`sluice_service::rls`), fields.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    level: String,
    message: String,
    module: Option<String>,
    fields: BTreeSet<String>,
}

const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

#[test]
fn every_log_event_in_the_docs_is_one_the_code_writes() {
    let (written, literals) = events_in_source();
    assert!(written.len() > 10, "{written:?}");
    let mut shown = 0;
    let mut wrong = Vec::new();
    for path in pages() {
        let text = std::fs::read_to_string(&path).unwrap();
        let at = path
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        for (line, event) in json_lines(&text).into_iter().chain(table_rows(&text)) {
            shown += 1;
            let same = |e: &Event| {
                e.level == event.level
                    && e.message == event.message
                    && e.fields == event.fields
                    && event
                        .module
                        .as_ref()
                        .is_none_or(|m| e.module.as_ref() == Some(m))
            };
            let like: Vec<_> = written
                .iter()
                .filter(|e| e.message == event.message)
                .collect();
            let known = if like.is_empty() {
                literals.contains(&event.message)
            } else {
                like.iter().any(|e| same(e))
            };
            if !known {
                wrong.push(format!("{at}:{line}: {event:?}\n    the code: {like:?}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "log events the code does not write:\n  {}",
        wrong.join("\n  ")
    );
    assert!(shown >= 10, "only {shown} log events found in the docs");
}

/// README.md and docs/*.md.
fn pages() -> Vec<PathBuf> {
    let readme = repo_root().join("README.md");
    std::iter::once(readme)
        .chain(files("docs", &["md"]))
        .collect()
}

/// The JSON log lines of the page's ```` ```json ```` blocks, with their line numbers.
fn json_lines(text: &str) -> Vec<(usize, Event)> {
    let mut in_json = false;
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            in_json = !in_json && lang.trim() == "json";
            continue;
        }
        let Ok(serde_json::Value::Object(object)) = serde_json::from_str(line) else {
            continue;
        };
        let text = |key: &str| object.get(key).and_then(|v| v.as_str()).map(str::to_string);
        let (Some(level), Some(message), Some(target)) =
            (text("level"), text("message"), text("target"))
        else {
            continue;
        };
        if in_json {
            let fixed = ["timestamp", "level", "message", "target"];
            let fields = object.keys().filter(|k| !fixed.contains(&k.as_str()));
            found.push((
                index + 1,
                Event {
                    level,
                    message,
                    module: Some(target),
                    fields: fields.cloned().collect(),
                },
            ));
        }
    }
    found
}

/// The rows of the page's log tables (`| INFO / WARN | `a` / `b` | `x`, `y` / none | ... |`),
/// one event per alternative.
fn table_rows(text: &str) -> Vec<(usize, Event)> {
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let [levels, messages, fields, ..] = cells.as_slice() else {
            continue;
        };
        let levels: Vec<&str> = levels.split(" / ").collect();
        let is_level = |l: &&str| LEVELS.iter().any(|level| level.eq_ignore_ascii_case(l));
        if !line.starts_with('|') || !levels.iter().all(is_level) {
            continue;
        }
        let messages: Vec<String> = messages
            .split(" / ")
            .map(|m| m.trim_matches('`').to_string())
            .collect();
        let fields: Vec<BTreeSet<String>> = fields.split(" / ").map(field_names).collect();
        for (i, message) in messages.into_iter().enumerate() {
            let level = levels.get(i).or(levels.last()).unwrap().to_string();
            let fields = fields.get(i).or(fields.last()).unwrap().clone();
            let module = None;
            found.push((
                index + 1,
                Event {
                    level,
                    message,
                    module,
                    fields,
                },
            ));
        }
    }
    found
}

/// The backticked names of a fields cell, what parentheses say about them left out.
fn field_names(cell: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut depth = 0;
    for (i, part) in cell.split('`').enumerate() {
        if i % 2 == 1 && depth == 0 {
            names.insert(part.to_string());
        } else if i % 2 == 0 {
            depth += part.matches('(').count();
            depth -= part.matches(')').count().min(depth);
        }
    }
    names
}

/// The `tracing` events of every crate's source in the workspace.
fn events_in_source() -> (Vec<Event>, BTreeSet<String>) {
    let (mut events, mut literals) = (Vec::new(), BTreeSet::new());
    for (krate, src) in crate_sources() {
        for file in rust_files(&src) {
            let module = module_of(&krate, &src, &file);
            let source = std::fs::read_to_string(&file).unwrap();
            events.extend(events_in(&source, &module));
            literals.extend(string_literals(&source));
        }
    }
    (events, literals)
}

/// The text of every `"..."` of `source`, as `literal` reads it.
fn string_literals(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find('"') {
        // A `'"'` is a character, not the start of a string.
        if rest[..at].ends_with('\'') && rest[at + 1..].starts_with('\'') {
            rest = &rest[at + 1..];
            continue;
        }
        let (text, after) = quoted(&rest[at..]);
        found.push(literal(text));
        rest = after;
    }
    found
}

/// The `"..."` at the start of `text` (quotes included), and what follows it.
fn quoted(text: &str) -> (&str, &str) {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '"') => return (&text[..=i], &text[i + 1..]),
            _ => escaped = false,
        }
    }
    (text, "")
}

/// A string literal's text: the quotes off, `\` with the line break and indentation after it
/// dropped, `\n` a line break, other escapes the character escaped.
fn literal(quoted: &str) -> String {
    let inner = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"'));
    let mut chars = inner.unwrap_or(quoted).chars();
    let mut text = String::new();
    while let Some(c) = chars.next() {
        if c != '\\' {
            text.push(c);
            continue;
        }
        match chars.next() {
            Some('\n') => chars = chars.as_str().trim_start().chars(),
            Some('n') => text.push('\n'),
            Some(escaped) => text.push(escaped),
            None => {}
        }
    }
    text
}

/// Each workspace crate's Rust name and source directory.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let crates = workspace_crates().into_iter();
    crates.map(|(name, dir)| (name, dir.join("src"))).collect()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// `sluice_service::rules::watch` for `service/src/rules/watch.rs`; `mod.rs`, `lib.rs` and
/// `main.rs` are their directory's module.
fn module_of(krate: &str, src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let parts = relative.iter().map(|p| p.to_string_lossy().into_owned());
    let parts = parts.filter(|p| !["mod", "lib", "main"].contains(&p.as_str()));
    std::iter::once(krate.to_string())
        .chain(parts)
        .collect::<Vec<_>>()
        .join("::")
}

/// The events of one file: each `LEVEL!(args..., "message")`.
fn events_in(source: &str, module: &str) -> Vec<Event> {
    let mut events = Vec::new();
    for level in LEVELS {
        let call = format!("{level}!(");
        let mut from = 0;
        while let Some(at) = source[from..].find(&call).map(|i| i + from) {
            from = at + call.len();
            let starts_a_word = !source[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
            let Some(args) = starts_a_word.then(|| arguments(&source[from..])).flatten() else {
                continue;
            };
            let Some((message, fields)) = args.split_last() else {
                continue;
            };
            if !(message.starts_with('"') && message.ends_with('"')) {
                continue;
            }
            events.push(Event {
                level: level.to_ascii_uppercase(),
                message: literal(message),
                module: Some(module.to_string()),
                fields: fields.iter().filter_map(|f| field_name(f)).collect(),
            });
        }
    }
    events
}

/// The top-level, comma-separated arguments of a call whose `(` came just before `text`.
fn arguments(text: &str) -> Option<Vec<String>> {
    let (mut args, mut current, mut depth) = (Vec::new(), String::new(), 0usize);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                current.push(c);
                while let Some(s) = chars.next() {
                    current.push(s);
                    match s {
                        '\\' => current.extend(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '(' | '[' | '{' => {
                depth += 1;
                current.push(c);
            }
            ')' if depth == 0 => {
                args.push(current.trim().to_string());
                return Some(args.into_iter().filter(|a| !a.is_empty()).collect());
            }
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                current.push(c);
            }
            ',' if depth == 0 => args.push(std::mem::take(&mut current).trim().to_string()),
            _ => current.push(c),
        }
    }
    None
}

/// The field an event argument names: `name = value`, `%name`, `?name` or `name`.
fn field_name(arg: &str) -> Option<String> {
    let ident = |s: &str| {
        let s = s.trim();
        let ok = !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_');
        ok.then(|| s.to_string())
    };
    match arg.split_once('=') {
        Some((name, value)) if !value.starts_with('=') => ident(name),
        _ => ident(arg.trim_start_matches(['%', '?'])),
    }
}
