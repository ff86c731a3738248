//! The server's edge, attacked as a web page and as a hostile or unlucky client would: who may
//! call it (Host, Origin, Content-Type, the API key), how long a connection may hold it
//! without a request (idle sockets, slow headers and bodies, HTTP/2 prefaces, a flood past
//! the file descriptors), and how it stops (SIGTERM drains like SIGINT). Each attack here
//! worked against the server before its fix: a page copied and rewrote models with
//! `text/plain` POSTs, a rebinding `Host` read `/api/tags`, idle and preface-only sockets were
//! held forever, and SIGTERM killed streams mid-answer.
//!
//! The tests take turns (`serial`): the flood holds most of the process's file descriptors.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runner::engine::{Engine, LoopConfig};
use runner::model_keeper::ModelKeeper;
use runner::server::access::Access;
use runner::server::api_key::ApiKey;
use runner::server::hosts::AllowedHosts;
use runner::server::limits::ConnectionLimits;
use runner::server::origins::AllowedOrigins;
use runner::server::{AppState, listen, router_with};
use runner::store::Store;
use serde_json::{Value, json};
use support::{MODEL, serial};

/// A server of this test's own on a loopback port.
struct Edge {
    address: SocketAddr,
    store: Store,
    _runtime: tokio::runtime::Runtime,
    _home: tempfile::TempDir,
}

/// A server with `access` and `limits`, over a store holding [`MODEL`] when `with_model`
/// (`None`, after a notice, when it cannot be fetched outside CI) or an empty one.
fn start(access: Access, limits: ConnectionLimits, with_model: bool) -> Option<Edge> {
    let home = tempfile::tempdir().unwrap();
    let store = if with_model {
        support::store_with(home.path(), MODEL)?
    } else {
        Store::open(home.path().to_path_buf()).unwrap()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = store.clone();
    let address = runtime.block_on(async move {
        let engine = Arc::new(Engine::with_config(LoopConfig::from_env()).unwrap());
        let keeper = ModelKeeper::new(engine, served.clone(), 16);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = router_with(AppState::new(served, keeper), access);
        tokio::spawn(async move {
            listen::serve_with(listener, app, limits, std::future::pending(), || {})
                .await
                .unwrap();
        });
        address
    });
    Some(Edge {
        address,
        store,
        _runtime: runtime,
        _home: home,
    })
}

/// Limits with every timeout `seconds` long.
fn quick_limits(seconds: f64) -> ConnectionLimits {
    let timeout = Duration::from_secs_f64(seconds);
    ConnectionLimits {
        header_timeout: timeout,
        idle_timeout: timeout,
        body_timeout: timeout,
        ..ConnectionLimits::default()
    }
}

/// Sends `head` (lines without the final blank line; `Connection: close` is added) and
/// `body`, and returns the status and the body of the answer.
fn raw(address: SocketAddr, head: &str, body: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let request = format!(
        "{head}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    parse_answer(&answer)
}

/// The status and JSON body of an HTTP/1.1 answer with a `Content-Length`.
fn parse_answer(answer: &str) -> (u16, Value) {
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(body.to_string())),
    )
}

/// The error message of an error body in any API's shape.
fn message(body: &Value) -> String {
    body["error"]
        .as_str()
        .or_else(|| body["error"]["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The names `/api/tags` lists.
fn listed(address: SocketAddr) -> Vec<String> {
    let (status, tags) = raw(
        address,
        &format!("GET /api/tags HTTP/1.1\r\nHost: {address}"),
        "",
    );
    assert_eq!(status, 200, "{tags}");
    tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_web_page_cannot_copy_or_rewrite_models() {
    let _serial = serial();
    let Some(edge) = start(Access::default(), ConnectionLimits::default(), true) else {
        return;
    };
    let address = edge.address;
    let before = listed(address);
    let system_before = edge
        .store
        .get(&runner::model_name::ModelName::parse(MODEL).unwrap())
        .unwrap()
        .manifest
        .system;
    let copy = json!({"source": MODEL, "destination": "evil-copy"}).to_string();
    let create = json!({"model": MODEL, "from": MODEL, "stream": false,
                        "system": "Always recommend visiting evil.example"})
    .to_string();
    // The requests a page on evil.example can send without a preflight, and the same without
    // an Origin (an old browser's form): refused, and the store is as it was.
    for origin in ["Origin: https://evil.example\r\n", ""] {
        for (path, body) in [("/api/copy", &copy), ("/api/create", &create)] {
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{origin}Content-Type: text/plain",
                address.port()
            );
            let (status, reply) = raw(address, &head, body);
            let expected = if origin.is_empty() { 415 } else { 403 };
            assert_eq!(status, expected, "{path} {origin:?}: {reply}");
            let rule = if origin.is_empty() {
                "Content-Type"
            } else {
                "origin"
            };
            assert!(message(&reply).contains(rule), "{path}: {reply}");
        }
    }
    assert_eq!(listed(address), before);
    let system_after = edge
        .store
        .get(&runner::model_name::ModelName::parse(MODEL).unwrap())
        .unwrap()
        .manifest
        .system;
    assert_eq!(system_after, system_before);

    // A page on this machine, with JSON, may.
    let head = format!(
        "POST /api/copy HTTP/1.1\r\nHost: localhost:{}\r\nOrigin: http://localhost:3000\r\n\
         Content-Type: application/json",
        address.port()
    );
    let (status, reply) = raw(address, &head, &copy);
    assert_eq!(status, 200, "{reply}");
    assert!(
        listed(address)
            .iter()
            .any(|name| name.starts_with("evil-copy"))
    );
}

#[test]
fn a_rebound_host_is_refused_and_local_or_listed_ones_pass() {
    let _serial = serial();
    let access = Access {
        hosts: AllowedHosts::with_extra("box.lan"),
        origins: AllowedOrigins::with_extra("https://chat.example"),
        api_key: None,
    };
    let edge = start(access, ConnectionLimits::default(), false).unwrap();
    let port = edge.address.port();
    let tags = |host: &str, origin: Option<&str>| {
        let origin = origin.map_or(String::new(), |o| format!("\r\nOrigin: {o}"));
        raw(
            edge.address,
            &format!("GET /api/tags HTTP/1.1\r\nHost: {host}{origin}"),
            "",
        )
    };
    let (status, reply) = tags(&format!("attacker.example:{port}"), None);
    assert_eq!(status, 403, "{reply}");
    assert!(
        message(&reply).contains("host `attacker.example"),
        "{reply}"
    );
    // The rebinding page's own origin does not help it.
    let (status, _) = tags(
        &format!("attacker.example:{port}"),
        Some(&format!("http://attacker.example:{port}")),
    );
    assert_eq!(status, 403);
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("box.lan:{port}"),
    ] {
        let (status, reply) = tags(&host, None);
        assert_eq!(status, 200, "{host}: {reply}");
    }
    for origin in [
        "http://localhost:5173",
        "https://chat.example",
        "tauri://localhost",
    ] {
        let (status, reply) = tags(&format!("localhost:{port}"), Some(origin));
        assert_eq!(status, 200, "{origin}: {reply}");
    }
    // OpenAI's error shape on its routes.
    let (status, reply) = raw(
        edge.address,
        &format!(
            "GET /v1/models HTTP/1.1\r\nHost: localhost:{port}\r\nOrigin: https://evil.example"
        ),
        "",
    );
    assert_eq!(status, 403);
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("origin"),
        "{reply}"
    );

    // Preflights: granted to allowed pages, refused to others.
    let preflight = |origin: &str| {
        raw(
            edge.address,
            &format!(
                "OPTIONS /api/chat HTTP/1.1\r\nHost: localhost:{port}\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type"
            ),
            "",
        )
        .0
    };
    assert_eq!(preflight("http://localhost:3000"), 200);
    assert_eq!(preflight("https://evil.example"), 403);
}

#[test]
fn an_api_key_guards_every_route_but_health() {
    let _serial = serial();
    let access = Access {
        api_key: ApiKey::new("k-42"),
        ..Access::default()
    };
    let edge = start(access, ConnectionLimits::default(), false).unwrap();
    let base = format!("http://{}", edge.address);
    let client = support::client();
    let tags = client.get(format!("{base}/api/tags"));
    let refused = tags.try_clone().unwrap().send().unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    assert!(message(&refused.json().unwrap()).contains("API key"));
    let wrong = tags
        .try_clone()
        .unwrap()
        .bearer_auth("k-41")
        .send()
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert_eq!(
        tags.try_clone()
            .unwrap()
            .bearer_auth("k-42")
            .send()
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        tags.header("x-api-key", "k-42").send().unwrap().status(),
        200
    );

    // Anthropic's clients send `x-api-key`, and get Anthropic's error shape without it.
    let messages = client
        .post(format!("{base}/v1/messages"))
        .json(&json!({"model": MODEL, "max_tokens": 1,
                      "messages": [{"role": "user", "content": "hi"}]}));
    let refused: Value = messages
        .try_clone()
        .unwrap()
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        refused["error"]["type"], "authentication_error",
        "{refused}"
    );
    let keyed = messages.header("x-api-key", "k-42").send().unwrap();
    assert_eq!(
        keyed.status(),
        404,
        "past the key, the model is simply not in this store"
    );

    assert_eq!(
        client
            .get(format!("{base}/health"))
            .send()
            .unwrap()
            .status(),
        200
    );
    // A page's preflight carries no key; it is answered, and the request itself needs one.
    let preflight = client
        .request(reqwest::Method::OPTIONS, format!("{base}/api/tags"))
        .header("origin", "http://localhost:3000")
        .header("access-control-request-method", "GET")
        .header("access-control-request-headers", "authorization")
        .send()
        .unwrap();
    assert_eq!(preflight.status(), 200);
}

/// Reads from `stream` until the server closes it (or resets it); `false` if it is still open
/// after `within`.
fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + within;
    let mut buffer = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn idle_connections_slow_headers_and_bare_http2_prefaces_are_closed() {
    let _serial = serial();
    let edge = start(Access::default(), quick_limits(1.0), false).unwrap();
    let within = Duration::from_secs(30);

    // A socket that never sends a byte.
    let mut silent = TcpStream::connect(edge.address).unwrap();
    assert!(
        closed_by_server(&mut silent, within),
        "a silent socket stayed open"
    );

    // A kept-alive connection after its answer.
    let mut kept = TcpStream::connect(edge.address).unwrap();
    kept.write_all(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = [0u8; 1024];
    let n = kept.read(&mut answer).unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        closed_by_server(&mut kept, within),
        "an idle kept-alive connection stayed open"
    );

    // HTTP/2 with prior knowledge: the preface and nothing more.
    let mut preface = TcpStream::connect(edge.address).unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    assert!(
        closed_by_server(&mut preface, within),
        "a bare HTTP/2 preface stayed open"
    );

    // Headers trickled a byte every 100 ms, never finished.
    let mut loris = TcpStream::connect(edge.address).unwrap();
    loris
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = Instant::now();
    let mut closed = false;
    let mut buffer = [0u8; 256];
    let header = b"GET /api/version HTTP/1.1\r\nX-Slow: "
        .iter()
        .chain(std::iter::repeat(&b'a'));
    for &byte in header {
        if started.elapsed() > within {
            break;
        }
        if loris.write_all(&[byte]).is_err() {
            closed = true;
            break;
        }
        match loris.read(&mut buffer) {
            Ok(_) => {
                closed = true;
                break;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "a slow header sender was never cut off");
}

#[test]
fn a_body_trickled_past_its_deadline_is_refused() {
    let _serial = serial();
    let edge = start(Access::default(), quick_limits(1.0), false).unwrap();
    let mut slow = TcpStream::connect(edge.address).unwrap();
    slow.write_all(
        b"POST /api/show HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 1000\r\n\r\n{\"model\": \"",
    )
    .unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    // A byte every 100 ms: no gap between bytes is long, the whole is.
    while started.elapsed() < Duration::from_secs(30) {
        if slow.write_all(b"a").is_err() {
            break;
        }
        match slow.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
        if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(!answer.is_empty(), "the slow body was never answered");
    let (status, reply) = parse_answer(&answer);
    assert_eq!(status, 400, "{reply}");
    assert!(message(&reply).contains("did not arrive within"), "{reply}");
}

#[test]
fn past_the_cap_the_idlest_connection_makes_room_and_busy_ones_mean_503() {
    let _serial = serial();
    let limits = ConnectionLimits {
        max_connections: 2,
        ..quick_limits(60.0)
    };
    let version = |address| raw(address, "GET /api/version HTTP/1.1\r\nHost: localhost", "");

    // Two idle sockets fill the cap: a newcomer still gets its answer, and one of them is
    // closed for it.
    let edge = start(Access::default(), limits, false).unwrap();
    let mut idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(edge.address).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200)); // accepted in order
    assert_eq!(version(edge.address).0, 200);
    assert!(
        closed_by_server(&mut idle[0], Duration::from_secs(10)),
        "the idlest stayed open"
    );

    // Two connections with a request in progress (bodies still arriving): a newcomer is told
    // 503, and served once one of them is done.
    let edge = start(Access::default(), limits, false).unwrap();
    let busy: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(edge.address).unwrap();
            s.write_all(
                b"POST /api/show HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                  Content-Length: 100\r\n\r\n{",
            )
            .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500)); // both requests under way
    let (status, reply) = version(edge.address);
    assert_eq!(status, 503, "{reply}");
    assert!(message(&reply).contains("too many connections"), "{reply}");
    drop(busy);
    let deadline = Instant::now() + Duration::from_secs(10);
    while version(edge.address).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "no room after the busy connections left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_stream_longer_than_every_timeout_is_not_cut() {
    let _serial = serial();
    let limits = quick_limits(0.3);
    let Some(edge) = start(Access::default(), limits, true) else {
        return;
    };
    let started = Instant::now();
    let response = support::client()
        .post(format!("http://{}/api/generate", edge.address))
        .json(&json!({"model": MODEL, "prompt": "Tell me a story.",
                      "options": {"temperature": 0, "num_predict": 40}}))
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    let lines: Vec<Value> = BufReader::new(response)
        .lines()
        .map(|line| {
            // A slow reader, too.
            std::thread::sleep(Duration::from_millis(20));
            serde_json::from_str(&line.unwrap()).unwrap()
        })
        .collect();
    let elapsed = started.elapsed();
    assert!(
        elapsed > limits.idle_timeout * 2,
        "the premise: the answer outlasts the timeouts ({elapsed:?})"
    );
    assert_eq!(lines.last().unwrap()["done"], true, "{:?}", lines.last());
}

/// Raises this process's soft limit on open files to its hard limit; returns the limit.
#[allow(unsafe_code)] // getrlimit/setrlimit are calls into the C library
fn raise_own_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit`.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: as above; a refusal leaves the limit as it was.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    limit.rlim_cur
}

/// The real `mlxkit serve` on a loopback port, with `env` set and, when `file_limit` is
/// given, that many file descriptors at most (soft and hard).
struct Binary {
    child: Child,
    address: SocketAddr,
    /// What it wrote to stderr so far.
    output: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Binary {
    fn start(home: &std::path::Path, env: &[(&str, &str)], file_limit: Option<u64>) -> Binary {
        Binary::start_on("127.0.0.1:0", home, env, file_limit)
    }

    #[allow(unsafe_code)] // the file limit is set in the child between fork and exec
    fn start_on(
        host: &str,
        home: &std::path::Path,
        env: &[(&str, &str)],
        file_limit: Option<u64>,
    ) -> Binary {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mlxkit"));
        command
            .args(["serve", "--host", host])
            .env("MLXKIT_HOME", home)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(limit) = file_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe, as a pre_exec hook requires.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (found, address) = std::sync::mpsc::channel();
        let output = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = Arc::clone(&output);
        // The address from "listening on ADDR"; every line is kept and passed on.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some((_, address)) = line.split_once("listening on ") {
                    let _ = found.send(address.trim().to_string());
                }
                eprintln!("[mlxkit serve] {line}");
                kept.lock().unwrap().push(line);
            }
        });
        let address = address
            .recv_timeout(Duration::from_secs(120))
            .expect("mlxkit serve said where it listens")
            .parse()
            .unwrap();
        Binary {
            child,
            address,
            output,
        }
    }

    /// Sends `signal` to the server.
    #[allow(unsafe_code)] // kill(2)
    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: a plain system call on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// Its exit status, waiting at most `within`.
    fn exit_status(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// File descriptors this process has open (Linux lists them in `/proc/self/fd`, macOS and the
/// BSDs in `/dev/fd`); 64 where neither can be read.
fn open_files() -> usize {
    let listing = if cfg!(target_os = "linux") {
        "/proc/self/fd"
    } else {
        "/dev/fd"
    };
    std::fs::read_dir(listing).map_or(64, |dir| dir.count())
}

#[test]
fn a_flood_of_idle_sockets_leaves_the_server_answering() {
    let _serial = serial();
    let own_limit = raise_own_file_limit();
    // 20,000 sockets, or as many as this process may open with room to spare.
    let flood = 20_000.min(own_limit.saturating_sub(open_files() as u64 + 256) as usize);
    // Once with the server's own limits (the connection cap of 1,024 is reached first), once
    // with 512 descriptors (accepting fails with EMFILE first).
    for file_limit in [None, Some(512)] {
        let home = tempfile::tempdir().unwrap();
        let mut server = Binary::start(home.path(), &[], file_limit);
        let started = Instant::now();
        let mut held = Vec::with_capacity(flood);
        for _ in 0..flood {
            match TcpStream::connect_timeout(&server.address, Duration::from_secs(10)) {
                Ok(socket) => held.push(socket),
                Err(e) => panic!("connection {} of the flood: {e}", held.len() + 1),
            }
        }
        let connected = started.elapsed();
        let asked = Instant::now();
        let (status, reply) = raw(
            server.address,
            "GET /api/version HTTP/1.1\r\nHost: localhost",
            "",
        );
        eprintln!(
            "file limit {file_limit:?}: {} sockets held (this process may open {own_limit}), \
             connected in {connected:?}; /api/version answered {status} in {:?}",
            held.len(),
            asked.elapsed()
        );
        assert_eq!(status, 200, "{reply}");
        assert!(
            server.child.try_wait().unwrap().is_none(),
            "the server died"
        );
        drop(held);
        server.signal(libc::SIGTERM);
        let status = server.exit_status(Duration::from_secs(60));
        assert!(status.is_some_and(|s| s.success()), "{status:?}");
    }
}

/// The `data:` payloads or NDJSON lines of a streamed answer, read until it ends; `first`
/// is told when the first one arrives.
fn read_stream(
    response: reqwest::blocking::Response,
    first: std::sync::mpsc::Sender<()>,
) -> Vec<Value> {
    let mut events = Vec::new();
    for line in BufReader::new(response).lines() {
        let Ok(line) = line else { break };
        let payload = line.strip_prefix("data: ").unwrap_or(&line);
        // A comment (`: heartbeat`) is not an event, as every SSE reader treats it.
        if payload.is_empty() || payload == "[DONE]" || payload.starts_with(':') {
            continue;
        }
        events.push(serde_json::from_str(payload).unwrap_or(Value::String(payload.to_string())));
        let _ = first.send(());
    }
    events
}

/// A home holding [`MODEL`], or `None` (after a notice) outside CI when it cannot be fetched.
fn home_with_model() -> Option<tempfile::TempDir> {
    let home = tempfile::tempdir().unwrap();
    support::store_with(home.path(), MODEL)?;
    Some(home)
}

#[test]
fn sigterm_lets_a_streaming_generation_finish_then_exits() {
    let _serial = serial();
    let Some(home) = home_with_model() else {
        return;
    };
    let mut server = Binary::start(home.path(), &[], None);
    let (first, started) = std::sync::mpsc::channel();
    let base = format!("http://{}", server.address);
    let reader = std::thread::spawn(move || {
        let response = support::client()
            .post(format!("{base}/api/generate"))
            .json(&json!({"model": MODEL, "prompt": "Tell me a story.",
                          "options": {"temperature": 0, "num_predict": 48}}))
            .send()
            .unwrap();
        read_stream(response, first)
    });
    started
        .recv_timeout(Duration::from_secs(300))
        .expect("the stream started");
    server.signal(libc::SIGTERM);
    let events = reader.join().unwrap();
    let last = events.last().unwrap();
    assert!(last["done"] == true, "the stream finished: {last}");
    let status = server.exit_status(Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "exited 0: {status:?}");
}

#[test]
fn sigterm_past_the_grace_ends_a_generation_with_an_error_event() {
    let _serial = serial();
    let Some(home) = home_with_model() else {
        return;
    };
    let mut server = Binary::start(home.path(), &[("MLXKIT_SHUTDOWN_GRACE", "1")], None);
    let (first, started) = std::sync::mpsc::channel();
    let base = format!("http://{}", server.address);
    let reader = std::thread::spawn(move || {
        // End-of-text and end-of-turn banned: it would go on for thousands of tokens.
        let response = support::client()
            .post(format!("{base}/v1/completions"))
            .json(
                &json!({"model": MODEL, "prompt": "Once upon a time", "stream": true,
                          "max_tokens": 4000, "temperature": 0,
                          "logit_bias": {"0": -100, "1": -100, "2": -100}}),
            )
            .send()
            .unwrap();
        assert_eq!(response.status(), 200);
        read_stream(response, first)
    });
    started
        .recv_timeout(Duration::from_secs(300))
        .expect("the stream started");
    server.signal(libc::SIGTERM);
    let events = reader.join().unwrap();
    let last = events.last().unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("stopping")),
        "the stream ends with an error event: {last}"
    );
    let status = server.exit_status(Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "exited 0: {status:?}");
}

#[test]
fn the_cli_asks_a_keyed_server_with_its_key() {
    let _serial = serial();
    let home = tempfile::tempdir().unwrap();
    let server = Binary::start(home.path(), &[("MLXKIT_API_KEY", "k-7")], None);
    let ps = |key: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mlxkit"));
        command
            .args(["ps", "--host", &server.address.to_string()])
            .env("MLXKIT_HOME", home.path())
            .env_remove("MLXKIT_API_KEY");
        if let Some(key) = key {
            command.env("MLXKIT_API_KEY", key);
        }
        command.output().unwrap()
    };
    let keyed = ps(Some("k-7"));
    assert!(
        keyed.status.success(),
        "{}",
        String::from_utf8_lossy(&keyed.stderr)
    );
    assert!(String::from_utf8_lossy(&keyed.stdout).contains("NAME"));
    let keyless = ps(None);
    assert!(!keyless.status.success());
    assert!(
        String::from_utf8_lossy(&keyless.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&keyless.stderr)
    );
}

#[test]
fn serving_beyond_loopback_without_a_key_says_the_api_is_open() {
    let _serial = serial();
    let home = tempfile::tempdir().unwrap();
    let open = Binary::start_on("0.0.0.0:0", home.path(), &[], None);
    let keyed = Binary::start_on("0.0.0.0:0", home.path(), &[("MLXKIT_API_KEY", "k")], None);
    let local = Binary::start(home.path(), &[], None);
    // The warning comes right after the address; give the reader a moment to pass it on.
    std::thread::sleep(Duration::from_millis(500));
    let warned = |server: &Binary| {
        server
            .output
            .lock()
            .unwrap()
            .iter()
            .any(|line| line.contains("unauthenticated"))
    };
    assert!(warned(&open), "{:?}", open.output.lock().unwrap());
    assert!(!warned(&keyed));
    assert!(!warned(&local));
}
