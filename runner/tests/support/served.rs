//! `mlxkit serve` as its own process, on a loopback port that separate processes (the agents)
//! connect to: the binary, its command line and its environment, as a user runs it, with its
//! own allocator, whose memory a test can read.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// How long the server may take to start listening (the engine starts before the socket).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `mlxkit serve`, ended when the test process exits.
pub struct Served {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its process id.
    pub pid: u32,
    /// What it has written to stderr (its request log among it).
    log: Arc<Mutex<String>>,
}

impl Served {
    /// Starts `mlxkit serve` over the store in `home` with `args` after `serve`.
    pub fn start(home: &Path, args: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlxkit"))
            .arg("serve")
            .args(["--host", "127.0.0.1:0"])
            .args(args)
            .env("MLXKIT_HOME", home)
            // Each request and what the server made of it, for failure messages.
            .env("MLXKIT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting mlxkit serve: {e}"));
        let stderr = child.stderr.take().expect("stderr is piped");
        let pid = child.id();
        crate::support::kill_at_exit(child);
        let log = Arc::new(Mutex::new(String::new()));
        let (address_tx, address_rx) = mpsc::channel();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some((_, address)) = line.split_once(" listening on ") {
                    let _ = address_tx.send(address.trim().to_string());
                }
                let mut log = lines.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let address = address_rx.recv_timeout(START_TIMEOUT).unwrap_or_else(|_| {
            panic!(
                "mlxkit serve did not start listening:\n{}",
                log.lock().unwrap_or_else(|e| e.into_inner())
            )
        });
        Served {
            base: format!("http://{address}"),
            pid,
            log,
        }
    }

    /// Everything the server has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Runs the `mlxkit` command line over the store in `home`, panicking with its output when it
/// fails.
pub fn mlxkit(home: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_mlxkit"))
        .args(args)
        .env("MLXKIT_HOME", home)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running mlxkit {args:?}: {e}"));
    assert!(
        output.status.success(),
        "mlxkit {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
