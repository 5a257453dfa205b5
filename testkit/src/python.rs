//! The Python peers of `testkit/python/`, run by the Python of the repo's `.venv`
//! (`scripts/ensure-deps` installs their packages there; `make test` does): a server prints its
//! port on its first line and is killed by PID when its `Peer` drops; a client prints JSON lines
//! and is killed when it overruns its deadline.

use crate::{repo_root, send_signal, SIGKILL};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A script of `testkit/python/` and the Python of `.venv` that runs it.
pub(crate) struct Script {
    python: PathBuf,
    path: PathBuf,
}

impl Script {
    /// The script `name`, which needs only Python's standard library: run by the Python of
    /// `.venv` all the same, the one every peer has.
    pub(crate) fn stdlib(name: &str) -> Script {
        let root = repo_root();
        let python = root.join(".venv/bin/python");
        assert!(
            python.is_file(),
            "{} is missing: `scripts/find-envoy` makes it (make test does)",
            python.display()
        );
        let path = root.join("testkit/python").join(name);
        Script { python, path }
    }

    /// The script `name`, once the Python of `.venv` imports `module` (a package that
    /// `scripts/ensure-deps <dependency>` installs there).
    pub(crate) fn with_package(name: &str, module: &str, dependency: &str) -> Script {
        let script = Script::stdlib(name);
        let imports = Command::new(&script.python)
            .args(["-c", &format!("import {module}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            imports,
            "{} cannot import {module}: run `scripts/ensure-deps {dependency}` (make test does)",
            script.python.display()
        );
        script
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg(&self.path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        command
    }

    /// Starts `script serve ARGS...` and waits (30 s at most) for the port it prints first.
    pub(crate) fn serve(&self, args: &[&str]) -> Peer {
        let mut child = self
            .command()
            .arg("serve")
            .args(args)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.path.display()));
        let lines = lines_of(child.stdout.take().expect("the peer's stdout"));
        let port = lines
            .recv_timeout(START_TIMEOUT)
            .ok()
            .and_then(|l| l.trim().parse().ok());
        match port {
            Some(port) => Peer { child, port, lines },
            None => {
                kill(&mut child);
                panic!(
                    "{} did not say its port within {START_TIMEOUT:?}",
                    self.path.display()
                )
            }
        }
    }

    /// Starts `script ARGS...` and returns at once: what it prints, as it prints it, in
    /// `Peer::lines` (its port is 0). Killed when dropped.
    pub(crate) fn start<S: AsRef<OsStr>>(&self, args: impl IntoIterator<Item = S>) -> Peer {
        let mut child = self
            .command()
            .args(args)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.path.display()));
        let lines = lines_of(child.stdout.take().expect("the client's stdout"));
        Peer {
            child,
            port: 0,
            lines,
        }
    }

    /// Runs `script ARGS...` to its end and returns the lines it printed; panics with its
    /// stderr when it fails, and kills it when it runs past `limit`.
    pub(crate) fn run<S: AsRef<OsStr>>(
        &self,
        args: impl IntoIterator<Item = S>,
        limit: Duration,
    ) -> Vec<String> {
        let mut child = self
            .command()
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.path.display()));
        let lines = lines_of(child.stdout.take().expect("the client's stdout"));
        let mut stderr = child.stderr.take().expect("the client's stderr");
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break status;
            }
            if Instant::now() > deadline {
                kill(&mut child);
                panic!("{} ran past {limit:?}", self.path.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let errors = errors.join().unwrap_or_default();
        assert!(
            status.success(),
            "{} failed ({status}): {errors}",
            self.path.display()
        );
        lines.iter().collect()
    }
}

/// The lines a child prints, read on a thread so that a hung child cannot hang the test.
fn lines_of(stdout: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sent, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sent.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

fn kill(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        send_signal(pid, SIGKILL);
    }
    let _ = child.wait();
}

/// A peer serving on 127.0.0.1 (`Script::serve`), killed by PID when dropped.
pub(crate) struct Peer {
    child: Child,
    pub(crate) port: u16,
    /// The lines it prints after its port.
    pub(crate) lines: mpsc::Receiver<String>,
}

impl Peer {
    /// Its resident memory (VmRSS), in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        crate::rss_kib(self.child.id())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}
