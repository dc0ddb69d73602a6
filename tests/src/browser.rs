//! A headless Chromium driven over the DevTools protocol, for testing the
//! page `convert --html` writes in a real browser.
//!
//! Chromium is started with `--remote-debugging-pipe`: it reads protocol
//! commands from file descriptor 3 and writes responses and events to file
//! descriptor 4, each message one JSON object ended by a NUL byte, so no
//! WebSocket client is needed. [`Browser::open`] makes a page and attaches
//! to it (a flat session); [`Browser::eval`] runs JavaScript in it,
//! [`Browser::click`] and [`Browser::type_text`] send real input events, and
//! [`Browser::errors`] lists what the page reported as errors (uncaught
//! exceptions, `console.error`, log entries of level error).
//!
//! Chromium is `/usr/lib/chromium/chromium` (Debian's package `chromium`,
//! which `scripts/install-deps.sh` installs); it runs in its own process
//! group, which is killed when the [`Browser`] is dropped. Every wait has a
//! deadline: a browser that stops answering fails the test, never hangs it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// How long one protocol command may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The Chromium binary, if installed.
pub fn chromium() -> Option<PathBuf> {
    ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// A running headless Chromium with one page attached.
#[derive(Debug)]
pub struct Browser {
    child: Child,
    to_browser: File,
    from_browser: Receiver<Value>,
    next_id: u64,
    session: String,
    /// Events received so far (responses are not kept).
    events: Vec<Value>,
}

/// A pipe whose ends are both above the descriptors the child needs (3 and
/// 4) and close on exec, as `(read, write)`.
fn pipe_above_4() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let high = |fd: RawFd| {
        // SAFETY: fcntl on a descriptor this function owns.
        let h = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        assert!(h >= 10, "fcntl(F_DUPFD_CLOEXEC)");
        // SAFETY: `fd` is ours and no longer used.
        unsafe { libc::close(fd) };
        h
    };
    (high(fds[0]), high(fds[1]))
}

impl Browser {
    /// Starts Chromium (window `width` x `height`) with its profile in
    /// `dir`, makes a blank page and attaches to it.
    pub fn open(dir: &Path, width: u32, height: u32) -> Browser {
        let bin = chromium().expect("chromium is not installed (run scripts/install-deps.sh)");
        let (cmd_read, cmd_write) = pipe_above_4();
        let (out_read, out_write) = pipe_above_4();
        let mut c = Command::new(&bin);
        c.args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--window-size={width},{height}"))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
        // SAFETY: only async-signal-safe calls (dup2) between fork and exec;
        // dup2 clears close-on-exec on the new descriptors.
        unsafe {
            c.pre_exec(move || {
                if libc::dup2(cmd_read, 3) != 3 || libc::dup2(out_write, 4) != 4 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        // SAFETY: these descriptors are ours; the child has its copies.
        unsafe {
            libc::close(cmd_read);
            libc::close(out_write);
        }
        // SAFETY: fresh descriptors owned by nothing else.
        let to_browser = unsafe { File::from_raw_fd(cmd_write) };
        // SAFETY: as above.
        let mut from = unsafe { File::from_raw_fd(out_read) };
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 65536];
            while let Ok(n) = from.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|&b| b == 0) {
                    let msg: Vec<u8> = buf.drain(..=end).collect();
                    match serde_json::from_slice::<Value>(&msg[..end]) {
                        Ok(v) => {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                        Err(e) => panic!("chromium sent a message that is not JSON: {e}"),
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to_browser,
            from_browser: rx,
            next_id: 1,
            session: String::new(),
            events: Vec::new(),
        };
        let target = b.browser_call("Target.createTarget", json!({"url": "about:blank"}));
        let attached = b.browser_call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_owned();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            b.call(domain, json!({}));
        }
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        );
        b
    }

    fn send(&mut self, method: &str, params: Value, session: bool) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if session {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to_browser
            .write_all(&bytes)
            .unwrap_or_else(|e| panic!("{method}: chromium is gone: {e}"));
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from_browser.recv_timeout(left) {
                Ok(v) if v["id"] == json!(id) => {
                    if let Some(e) = v.get("error") {
                        panic!("{method}: {e}");
                    }
                    return v["result"].clone();
                }
                Ok(v) => self.events.push(v),
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no answer in 60 s"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: chromium exited"),
            }
        }
    }

    fn browser_call(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, false)
    }

    /// Sends `method` to the page and returns its result (panics on a
    /// protocol error).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, true)
    }

    /// Waits for the page event `method`, received before or after now.
    pub fn wait_event(&mut self, method: &str) -> Value {
        let is = |v: &Value| v["method"] == method;
        if let Some(i) = self.events.iter().position(is) {
            return self.events.remove(i);
        }
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from_browser.recv_timeout(left) {
                Ok(v) if is(&v) => return v,
                Ok(v) => self.events.push(v),
                Err(_) => panic!("no {method} event in 60 s"),
            }
        }
    }

    /// Loads `file` and waits for its load event.
    pub fn load(&mut self, file: &Path) {
        let url = format!("file://{}", file.canonicalize().unwrap().display());
        let r = self.call("Page.navigate", json!({"url": url}));
        assert!(r.get("errorText").is_none(), "loading {url}: {r}");
        self.wait_event("Page.loadEventFired");
    }

    /// The value of the JavaScript expression `js` (panics if it throws).
    pub fn eval(&mut self, js: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{js}: threw {e}");
        }
        r["result"]["value"].clone()
    }

    /// A real mouse click (press and release) at the centre of the first
    /// element that the JavaScript expression `element_js` yields.
    pub fn click(&mut self, element_js: &str) {
        let rect = self.eval(&format!(
            "(() => {{ const e = {element_js}; e.scrollIntoView({{block: 'center'}}); \
             const r = e.getBoundingClientRect(); \
             return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
        ));
        let (x, y) = (rect[0].as_f64().unwrap(), rect[1].as_f64().unwrap());
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Focuses `element_js` and types `text` into it (an `input` event, as
    /// a user's typing gives).
    pub fn type_text(&mut self, element_js: &str, text: &str) {
        self.eval(&format!("{element_js}.focus()"));
        self.call("Input.insertText", json!({"text": text}));
    }

    /// A PNG screenshot of the whole page.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        base64_decode(r["data"].as_str().unwrap())
    }

    /// The errors the page reported so far: uncaught exceptions,
    /// `console.error`/`console.assert`, log entries of level error.
    pub fn errors(&mut self) -> Vec<String> {
        // A round trip, so that events sent before it are in.
        self.eval("0");
        self.events
            .iter()
            .filter(|v| {
                let p = &v["params"];
                match v["method"].as_str() {
                    Some("Runtime.exceptionThrown") => true,
                    Some("Runtime.consoleAPICalled") => {
                        matches!(p["type"].as_str(), Some("error" | "assert"))
                    }
                    Some("Log.entryAdded") => p["entry"]["level"] == "error",
                    _ => false,
                }
            })
            .map(|v| v.to_string())
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The process group this struct started (its id is the child's pid).
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // A signal to the group of the child we spawned.
            let group = Pid::from_raw(pid);
            let _ = killpg(group, Signal::SIGKILL);
            let _ = self.child.wait();
            // Its other processes (renderer, zygotes) go with the group.
            let deadline = Instant::now() + Duration::from_secs(10);
            // No signal: only whether the group still exists.
            while killpg(group, None).is_ok() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Standard base64 (the screenshot's encoding).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=' && c != b'\n').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= u32::from(val(c)) << (18 - 6 * i);
        }
        let n = chunk.len() * 6 / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..=n]);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64() {
        assert_eq!(super::base64_decode("aGVsbG8="), b"hello");
        assert_eq!(super::base64_decode("aGk="), b"hi");
        assert_eq!(super::base64_decode("YWJj"), b"abc");
    }
}
