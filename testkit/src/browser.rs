//! A real headless browser to drive a page as an operator would: Debian's `chromium`, spoken to
//! over its DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages ended by a
//! NUL, commands on the browser's fd 3, answers on its fd 4), so no port and no WebSocket.
//! The child is killed when the `Browser` is dropped, test failed or not.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The longest one command may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Browser {
    child: Child,
    commands: ChildStdin,
    messages: Receiver<Value>,
    next_id: u64,
    session: String,
}

impl Browser {
    /// A browser (its profile in `profile`) with one page at `url`.
    pub fn open(url: &str, profile: &Path) -> Browser {
        // The shell gives the browser our pipes as its fds 3 and 4, then its own stdin and
        // stdout elsewhere.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>/dev/null"#)
            .args([
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium (scripts/ensure-deps chromium)");
        let commands = child.stdin.take().expect("piped stdin");
        let answers = child.stdout.take().expect("piped stdout");
        let (sender, messages) = mpsc::channel();
        std::thread::spawn(move || {
            let mut answers = BufReader::new(answers);
            let mut message = Vec::new();
            while answers.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                message.pop();
                let parsed = serde_json::from_slice(&message).unwrap_or(Value::Null);
                if sender.send(parsed).is_err() {
                    break;
                }
                message.clear();
            }
        });
        let mut browser = Browser {
            child,
            commands,
            messages,
            next_id: 0,
            session: String::new(),
        };
        let target = browser.command("Target.createTarget", json!({ "url": url }));
        let target = target["targetId"].clone();
        let attached = browser.command(
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        browser
    }

    /// Sends a command (to the page once attached) and returns its result.
    fn command(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("JSON");
        bytes.push(0);
        self.commands.write_all(&bytes).expect("the browser reads");
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = match self.messages.recv_timeout(left) {
                Ok(answer) => answer,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("no answer to {method} within {ANSWER_TIMEOUT:?}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                    "the browser is gone, at {method}: {:?} (chromium: scripts/ensure-deps chromium)",
                    self.child.try_wait()
                ),
            };
            if answer["id"] == json!(id) {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page (a promise's, once settled).
    pub fn eval(&mut self, expression: &str) -> Value {
        let params = json!({
            "expression": expression,
            "awaitPromise": true,
            "returnByValue": true,
        });
        let result = self.command("Runtime.evaluate", params);
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` every 100 ms until it is true; panics, naming it, past `within`.
    pub fn wait_for(&mut self, expression: &str, within: Duration) {
        let started = Instant::now();
        while self.eval(expression) != json!(true) {
            assert!(
                started.elapsed() < within,
                "not true within {within:?}: {expression}\npage: {}",
                self.eval("document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    /// Closes the browser, so that it ends its own renderers; kills it if it has not within 5 s.
    fn drop(&mut self) {
        let close = br#"{"id":0,"method":"Browser.close","params":{}}"#;
        let _ = self
            .commands
            .write_all(close)
            .and_then(|()| self.commands.write_all(b"\0"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
