//! How long a connection may hold the server without a request in progress, how long a
//! request's body may take, and how many connections may be open. A client that opens a
//! socket and sends nothing, trickles its headers, sends only HTTP/2's preface, or uploads a
//! body a byte at a time costs a socket and a task for as long as the server lets it; without
//! these bounds ~20,000 such sockets used up the file descriptors and every request timed out.
//! None of them touches a response in progress: a generation may stream for minutes.

use std::time::Duration;

/// The connection limits `serve` enforces, each overridable by its environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A new connection must deliver its first request's headers within this
    /// (`MLXKIT_HEADER_TIMEOUT`, seconds; default 10).
    pub header_timeout: Duration,
    /// A connection with no request in progress is closed after this: between kept-alive
    /// requests, and for the next request's headers (`MLXKIT_IDLE_TIMEOUT`, seconds; default 30).
    pub idle_timeout: Duration,
    /// A request's body must arrive in full within this after its headers
    /// (`MLXKIT_BODY_TIMEOUT`, seconds; default 120: a 64 MiB body at 1 MB/s fits).
    pub body_timeout: Duration,
    /// Connections open at once (`MLXKIT_MAX_CONNECTIONS`; default 1024). Past it the
    /// longest-idle connection is closed to make room; when every connection has a request in
    /// progress, a new one is answered 503.
    pub max_connections: usize,
    /// How long a stop (SIGINT, SIGTERM) waits for requests in progress before ending the
    /// generations still running with an error event (`MLXKIT_SHUTDOWN_GRACE`, seconds;
    /// default 30).
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(120),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// An environment variable holding a limit that is not a positive number.
#[derive(Debug, thiserror::Error)]
#[error("{variable}=`{value}` is not {expected}")]
pub struct InvalidLimit {
    variable: &'static str,
    value: String,
    expected: &'static str,
}

impl ConnectionLimits {
    /// The defaults, with each limit whose variable is set replaced by its value.
    pub fn from_env() -> Result<ConnectionLimits, InvalidLimit> {
        ConnectionLimits::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`ConnectionLimits::from_env`], reading variables through `lookup`.
    fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<ConnectionLimits, InvalidLimit> {
        let mut limits = ConnectionLimits::default();
        let seconds = |variable: &'static str, slot: &mut Duration| {
            if let Some(value) = lookup(variable) {
                *slot = parse_seconds(&value).ok_or(InvalidLimit {
                    variable,
                    value,
                    expected: "a positive number of seconds",
                })?;
            }
            Ok(())
        };
        seconds("MLXKIT_HEADER_TIMEOUT", &mut limits.header_timeout)?;
        seconds("MLXKIT_IDLE_TIMEOUT", &mut limits.idle_timeout)?;
        seconds("MLXKIT_BODY_TIMEOUT", &mut limits.body_timeout)?;
        seconds("MLXKIT_SHUTDOWN_GRACE", &mut limits.shutdown_grace)?;
        if let Some(value) = lookup("MLXKIT_MAX_CONNECTIONS") {
            limits.max_connections =
                value
                    .trim()
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
                    .ok_or(InvalidLimit {
                        variable: "MLXKIT_MAX_CONNECTIONS",
                        value,
                        expected: "a positive whole number",
                    })?;
        }
        Ok(limits)
    }
}

/// Raises this process's soft limit on open files to its hard limit, as Go's runtime does for
/// every Go server (Ollama's included): Linux's default soft limit, 1,024, is below the default
/// connection cap plus the files a server keeps open. Returns the limit in force afterwards.
#[allow(unsafe_code)] // getrlimit/setrlimit are calls into the C library
pub fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit` for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    // macOS refuses an unlimited soft limit for files; its per-process ceiling is 10,240
    // (`OPEN_MAX`) unless sysctl raises it.
    let wanted = if cfg!(target_os = "macos") {
        limit.rlim_max.min(10_240)
    } else {
        limit.rlim_max
    };
    if wanted > limit.rlim_cur {
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid `rlimit`; a refusal leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = wanted;
        }
    }
    Some(limit.rlim_cur)
}

/// `"30"` or `"0.5"` seconds; zero, negative and non-finite values are refused (a zero
/// timeout would close every connection at once).
fn parse_seconds(text: &str) -> Option<Duration> {
    let seconds: f64 = text.trim().trim_end_matches('s').parse().ok()?;
    (seconds.is_finite() && seconds > 0.0 && seconds < 1e9)
        .then(|| Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(vars: &[(&str, &str)]) -> Result<ConnectionLimits, InvalidLimit> {
        ConnectionLimits::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_variables_keep_the_defaults() {
        assert_eq!(limits(&[]).unwrap(), ConnectionLimits::default());
    }

    #[test]
    fn set_variables_replace_their_limit() {
        let set = limits(&[
            ("MLXKIT_IDLE_TIMEOUT", "2"),
            ("MLXKIT_HEADER_TIMEOUT", "0.5s"),
            ("MLXKIT_MAX_CONNECTIONS", "8"),
        ])
        .unwrap();
        assert_eq!(set.idle_timeout, Duration::from_secs(2));
        assert_eq!(set.header_timeout, Duration::from_millis(500));
        assert_eq!(set.max_connections, 8);
        assert_eq!(set.body_timeout, ConnectionLimits::default().body_timeout);
    }

    #[test]
    fn nonsense_is_refused_with_the_variable_named() {
        for (variable, value) in [
            ("MLXKIT_IDLE_TIMEOUT", "0"),
            ("MLXKIT_BODY_TIMEOUT", "-3"),
            ("MLXKIT_SHUTDOWN_GRACE", "soon"),
            ("MLXKIT_MAX_CONNECTIONS", "0"),
            ("MLXKIT_HEADER_TIMEOUT", "inf"),
        ] {
            let error = limits(&[(variable, value)]).unwrap_err().to_string();
            assert!(error.contains(variable) && error.contains(value), "{error}");
        }
    }
}
