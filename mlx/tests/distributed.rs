//! MLX's ring backend between two processes on loopback (issue 50): the group forms from the
//! environment `mlx.launch` sets, and its collectives carry what each rank gave.
//!
//! The test runs this binary twice more as the group's ranks (the child re-enters this test
//! with `MLX_RANK` set and does a rank's part), each on its own port of 127.0.0.1.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use mlx::Array;
use mlx::distributed::{self, Backend, Group};

/// What a rank does: all-sum and all-gather of its own values, then rank 0 sends to rank 1.
/// Prints one line per result for the parent to read.
fn rank_part() {
    let group = Group::init(Backend::Ring).expect("the ring forms");
    let (rank, size) = (group.rank().unwrap(), group.size().unwrap());
    println!("size {size}");
    let mine = Array::from_slice(&[rank as f32 + 1.0, 10.0 * (rank as f32 + 1.0)], &[2]).unwrap();
    let sum: Vec<f32> = group.all_sum(&mine).unwrap().to_vec().unwrap();
    println!("sum {sum:?}");
    let gathered: Vec<f32> = group.all_gather(&mine).unwrap().to_vec().unwrap();
    println!("gathered {gathered:?}");
    let message = Array::from_slice(&[7i32, 8, 9], &[3]).unwrap();
    if rank == 0 {
        mlx::eval([&group.send(&message, 1).unwrap()]).unwrap();
    } else {
        let got: Vec<i32> = group.recv_like(&message, 0).unwrap().to_vec().unwrap();
        println!("received {got:?}");
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn two_ranks_on_loopback_sum_gather_and_send() {
    if std::env::var_os("MLX_RANK").is_some() {
        return rank_part();
    }
    assert!(distributed::available(Backend::Ring).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hosts.json");
    let hosts = serde_json::json!([
        [format!("127.0.0.1:{}", free_port())],
        [format!("127.0.0.1:{}", free_port())]
    ]);
    std::fs::write(&hostfile, hosts.to_string()).unwrap();
    let spawn = |rank: usize| {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "two_ranks_on_loopback_sum_gather_and_send",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("MLX_RANK", rank.to_string())
            .env("MLX_HOSTFILE", &hostfile)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Rank 0 listens first: a rank that finds no listener gives up.
    let first = spawn(0);
    std::thread::sleep(Duration::from_millis(300));
    let second = spawn(1);
    let outputs: Vec<Output> = [first, second]
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect();
    for (rank, output) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "rank {rank}: {stdout}\n{stderr}");
        assert!(stdout.contains("size 2"), "rank {rank}: {stdout}");
        assert!(stdout.contains("sum [3.0, 30.0]"), "rank {rank}: {stdout}");
        assert!(
            stdout.contains("gathered [1.0, 10.0, 2.0, 20.0]"),
            "rank {rank}: {stdout}"
        );
    }
    let received = String::from_utf8_lossy(&outputs[1].stdout);
    assert!(received.contains("received [7, 8, 9]"), "{received}");
}

#[test]
fn every_backend_has_a_name_and_this_build_names_its_own() {
    for backend in Backend::ALL {
        assert_eq!(Backend::parse(backend.name()), Some(backend));
    }
    assert_eq!(Backend::parse("carrier-pigeon"), None);
    let available = distributed::available_backends().unwrap();
    // Every MLX build carries the ring.
    assert!(available.contains(&Backend::Ring), "{available:?}");
}
