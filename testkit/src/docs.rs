//! The command transcripts of a Markdown page, for tests that run them as typed: each
//! ```` ```console ```` block is a transcript, `$ COMMAND` lines (a line ending in `\` goes on
//! on the next) each followed by what the command prints on its standard output. A transcript
//! after a ```` ```sh ```` block that is only `make TARGET` talks to what that target serves
//! (`make::Serving`).
//!
//! What a transcript shows agrees with what a command printed when:
//! - both are JSON: they are the same value, whatever the layout;
//! - or line by line, exactly, where a line `...` stands for any lines (none included); a Unix
//!   time in seconds (ten digits) and an RFC 3339 time stand for any other.

/// The files of the repo's directory `dir` whose names end in one of `extensions`, in order.
pub fn files(dir: &str, extensions: &[&str]) -> Vec<std::path::PathBuf> {
    let dir = crate::repo_root().join(dir);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut found: Vec<_> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| {
            let extension = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
            extensions.contains(&extension)
        })
        .collect();
    found.sort();
    found
}

/// One ```` ```console ```` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transcript {
    /// The block's first line in the page, from 1.
    pub line: usize,
    /// The make target the page's last ```` ```sh ```` block before it runs, if that block is only
    /// `make TARGET`.
    pub serving: Option<String>,
    pub commands: Vec<Shown>,
}

/// A command of a transcript and what the page shows it prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub command: String,
    pub output: Vec<String>,
}

/// The transcripts of `markdown`, in order.
pub fn transcripts(markdown: &str) -> Vec<Transcript> {
    let mut transcripts = Vec::new();
    let mut serving = None;
    let mut lines = markdown.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let Some(lang) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let block: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        match lang.trim() {
            "sh" => {
                serving = match block.as_slice() {
                    [only] => only.trim().strip_prefix("make ").map(str::to_string),
                    _ => None,
                };
            }
            "console" => transcripts.push(Transcript {
                line: index + 1,
                serving: serving.clone(),
                commands: commands(&block),
            }),
            _ => {}
        }
    }
    transcripts
}

fn commands(block: &[&str]) -> Vec<Shown> {
    let mut commands: Vec<Shown> = Vec::new();
    let mut continued = false;
    for line in block {
        match (line.strip_prefix("$ "), commands.last_mut()) {
            (_, Some(last)) if continued => {
                last.command.push('\n');
                last.command.push_str(line);
            }
            (Some(command), _) => commands.push(Shown {
                command: command.to_string(),
                output: Vec::new(),
            }),
            (None, Some(last)) => last.output.push(line.to_string()),
            (None, None) => {}
        }
        continued = line.ends_with('\\');
    }
    commands
}

impl Transcript {
    /// Runs each command through `sh` (which gives its standard output), in order, until one
    /// does not print what the page shows: then what it printed and what `page` shows, with
    /// the transcript's line and the command.
    pub fn run(&self, page: &str, sh: impl Fn(&str) -> String) -> Result<(), String> {
        for shown in &self.commands {
            let printed = sh(&shown.command);
            if !shown.agrees(&printed) {
                return Err(format!(
                    "{page}:{}: `{}` printed\n{printed}\nwhere the page shows\n{}",
                    self.line,
                    shown.command,
                    shown.output.join("\n")
                ));
            }
        }
        Ok(())
    }
}

impl Shown {
    /// Whether `printed` is what the page shows (see the module's rules).
    pub fn agrees(&self, printed: &str) -> bool {
        let shown = self.output.join("\n");
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).ok();
        if let (Some(shown), Some(printed)) = (json(&shown), json(printed)) {
            if shown == printed {
                return true;
            }
        }
        let shown: Vec<&str> = self.output.iter().map(String::as_str).collect();
        let printed: Vec<&str> = printed.lines().collect();
        lines_agree(&shown, &printed)
    }
}

/// `shown` against `printed`, `...` standing for any lines.
fn lines_agree(shown: &[&str], printed: &[&str]) -> bool {
    match shown.split_first() {
        None => printed.is_empty(),
        Some((&"...", rest)) => (0..=printed.len()).any(|skip| lines_agree(rest, &printed[skip..])),
        Some((line, rest)) => match printed.split_first() {
            Some((first, more)) => masked(line) == masked(first) && lines_agree(rest, more),
            None => false,
        },
    }
}

/// `line` with every Unix time (ten digits alone) and RFC 3339 time as a placeholder.
fn masked(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let bytes = line.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let digits = bytes[at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let alone = (at == 0 || !bytes[at - 1].is_ascii_alphanumeric())
            && bytes
                .get(at + digits)
                .is_none_or(|b| !b.is_ascii_alphanumeric());
        if let Some(len) = rfc3339_len(&bytes[at..]) {
            out.push_str("<time>");
            at += len;
        } else if digits == 10 && alone {
            out.push_str("<unix time>");
            at += digits;
        } else if digits > 0 {
            out.push_str(&line[at..at + digits]);
            at += digits;
        } else {
            let next = line[at..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&line[at..at + next]);
            at += next;
        }
    }
    out
}

/// The length of the RFC 3339 time `2026-12-01T09:00:00.123456Z` at the start of `text`.
fn rfc3339_len(text: &[u8]) -> Option<usize> {
    const SHAPE: &[u8] = b"dddd-dd-ddTdd:dd:dd";
    let fits = |(b, s): (&u8, &u8)| {
        if *s == b'd' {
            b.is_ascii_digit()
        } else {
            b == s
        }
    };
    if text.len() < SHAPE.len() || !text.iter().zip(SHAPE).all(fits) {
        return None;
    }
    let mut len = SHAPE.len();
    if text.get(len) == Some(&b'.') {
        len += 1 + text[len + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
    }
    (text.get(len) == Some(&b'Z')).then_some(len + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "Start it:\n\n```sh\nmake run-rls\n```\n\nThen:\n\n```console\n$ curl -s a \\\n  -H 'x: y'\n200\n...\nretry-after: 6\n$ echo done\ndone\n```\n\n```sh\nmake run LISTEN_PORT=1\ncargo test\n```\n\n```console\n$ true\n```\n";

    #[test]
    fn a_console_block_is_a_transcript_of_the_make_target_started_before_it() {
        let found = transcripts(PAGE);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].line, 9);
        assert_eq!(found[0].serving.as_deref(), Some("run-rls"));
        let commands: Vec<_> = found[0]
            .commands
            .iter()
            .map(|c| c.command.as_str())
            .collect();
        assert_eq!(commands, ["curl -s a \\\n  -H 'x: y'", "echo done"]);
        assert_eq!(
            found[0].commands[0].output,
            ["200", "...", "retry-after: 6"]
        );
        assert_eq!(found[1].serving, None, "a block of more than `make TARGET`");
    }

    fn shown(lines: &[&str]) -> Shown {
        Shown {
            command: String::new(),
            output: lines.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn lines_agree_exactly_but_for_the_elisions_and_the_times() {
        let headers = shown(&[
            "HTTP/1.1 200 OK",
            "...",
            "x-ratelimit-reset: 1796063342",
            "...",
        ]);
        let printed = "HTTP/1.1 200 OK\ndate: x\nx-ratelimit-reset: 1796163339\n\nhello\n";
        assert!(headers.agrees(printed));
        assert!(!headers.agrees("HTTP/1.1 429 Too Many Requests\nx-ratelimit-reset: 1\n"));
        let exact = shown(&["200", "429"]);
        assert!(exact.agrees("200\n429\n"));
        assert!(
            !exact.agrees("200\n429\n429\n"),
            "no line beyond the shown without `...`"
        );
        assert!(!exact.agrees("200\n"));
        let timed = shown(&["start 2026-12-01T09:00:00Z, 12 requests"]);
        assert!(timed.agrees("start 2027-01-15T08:30:00.123456Z, 12 requests"));
        assert!(!timed.agrees("start 2027-01-15T08:30:00Z, 13 requests"));
    }

    #[test]
    fn json_agrees_as_the_same_value_in_any_layout() {
        let pretty = shown(&["{\"a\": 1,", " \"b\": [true]}"]);
        assert!(pretty.agrees("{\"b\":[true],\"a\":1}\n"));
        assert!(!pretty.agrees("{\"b\":[false],\"a\":1}\n"));
    }
}
