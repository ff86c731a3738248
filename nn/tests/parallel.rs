//! One model across processes (issue 50): a tiny fixture split over two ranks on loopback
//! (MLX's ring backend) answers as the whole model does in one process.
//!
//! Each test runs this binary twice more as the group's ranks (a child re-enters its test with
//! `MLX_RANK` set), each prefilling a prompt, decoding greedily over its own caches, and
//! writing every step's logits.
//!
//! - Tensor parallel (Llama, Qwen2, Qwen3): each rank holds half the attention heads and
//!   key/value heads and half the MLP columns. Both ranks hold the same logits, within 1e-4
//!   of the whole model's: each row-parallel projection sums two partial products where one
//!   process summed them all, which reorders f32 additions (measured below ~1e-5 here).
//! - Pipeline parallel (Llama, Gemma 3, Qwen3-MoE, LFM2): each rank holds half the layers and their
//!   caches. Rank 0's logits equal the whole model's exactly: every layer runs whole on one
//!   rank.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use mlx::Dtype;
use mlx::distributed::{Backend, Group};
use nn::pipeline_parallel::PipelineStage;
use nn::tensor_parallel::TensorParallel;
use nn::{Batch, Model, Weights, build_model};
use quant::{SafetensorsFile, Tensor};

const PROMPT: [u32; 9] = [5, 17, 200, 42, 9, 311, 64, 7, 128];
const DECODE: usize = 6;
const TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// How a rank holds its part of the model.
enum Split {
    Whole,
    Tensor(TensorParallel),
    Pipeline(PipelineStage),
}

/// Fixture `name`'s model, whole or as this rank's part of it.
fn model(name: &str, split: Split) -> Box<dyn Model> {
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(name).join("config.json")).unwrap()).unwrap();
    let file = SafetensorsFile::open(&fixture(name).join("model.safetensors")).unwrap();
    let tensors: Vec<(String, Tensor)> = file
        .entries()
        .keys()
        .map(|name| (name.clone(), Tensor::Dense(file.load(name).unwrap())))
        .collect();
    let mut weights = Weights::new(tensors, Dtype::F32);
    weights = match split {
        Split::Whole => weights,
        Split::Tensor(parallel) => weights.with_tensor_parallel(parallel),
        Split::Pipeline(stage) => weights.with_pipeline_stage(stage),
    };
    let model = build_model(&config, &mut weights).unwrap();
    assert!(weights.unused().is_empty(), "{:?}", weights.unused());
    model
}

/// The prompt's last logits and each greedy step's, flattened.
fn run(model: &dyn Model) -> Vec<f32> {
    let mut caches = model.new_caches().unwrap();
    let forward = model
        .forward(&Batch::single(&PROMPT, 0).unwrap(), &mut caches)
        .unwrap();
    let n = PROMPT.len() as i32;
    let last = forward.hidden.slice_axis(1, n - 1, n).unwrap();
    let mut logits: Vec<f32> = model.unembed(&last).unwrap().to_vec().unwrap();
    let vocab = logits.len();
    for position in PROMPT.len()..PROMPT.len() + DECODE {
        let row = &logits[logits.len() - vocab..];
        let token = (0..vocab)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap() as u32;
        let forward = model
            .forward(&Batch::single(&[token], position).unwrap(), &mut caches)
            .unwrap();
        logits.extend(
            model
                .unembed(&forward.hidden)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
        );
    }
    logits
}

/// The tokens `model` decodes greedily after the prompt.
fn greedy_tokens(model: &dyn Model) -> Vec<u32> {
    let logits = run(model);
    let vocab = logits.len() / (DECODE + 1);
    logits
        .chunks(vocab)
        .take(DECODE)
        .map(|row| {
            (0..vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap() as u32
        })
        .collect()
}

/// The prompt's and then each of `tokens`' forward through `model`; the logits of each, when
/// `unembeds` (a later pipeline stage holds no head, rank 0 unembeds).
fn run_fed(model: &dyn Model, tokens: &[u32], unembeds: bool) -> Vec<f32> {
    let mut caches = model.new_caches().unwrap();
    let forward = model
        .forward(&Batch::single(&PROMPT, 0).unwrap(), &mut caches)
        .unwrap();
    let n = PROMPT.len() as i32;
    mlx::eval([&forward.hidden]).unwrap();
    let mut hidden = vec![forward.hidden.slice_axis(1, n - 1, n).unwrap()];
    for (i, &token) in tokens.iter().enumerate() {
        let forward = model
            .forward(
                &Batch::single(&[token], PROMPT.len() + i).unwrap(),
                &mut caches,
            )
            .unwrap();
        // Every step's transfers run before the next step's, as the engine's do.
        mlx::eval([&forward.hidden]).unwrap();
        hidden.push(forward.hidden);
    }
    if !unembeds {
        return Vec::new();
    }
    hidden
        .iter()
        .flat_map(|h| model.unembed(h).unwrap().to_vec::<f32>().unwrap())
        .collect()
}

fn write_floats(path: &Path, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

fn read_floats(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs this binary's test `test` as two ranks on loopback over fixture `name`, each given
/// `MLXKIT_PARALLEL_OUT` (a folder for what it writes) and `MLXKIT_PARALLEL_FIXTURE`; returns
/// that folder once both succeeded.
fn two_ranks(test: &str, name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let hostfile = dir.path().join("hosts.json");
    let hosts = serde_json::json!([
        [format!("127.0.0.1:{}", free_port())],
        [format!("127.0.0.1:{}", free_port())]
    ]);
    std::fs::write(&hostfile, hosts.to_string()).unwrap();
    let spawn = |rank: usize| {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--test-threads=1"])
            .env("MLX_RANK", rank.to_string())
            .env("MLX_HOSTFILE", &hostfile)
            .env("MLXKIT_PARALLEL_OUT", dir.path())
            .env("MLXKIT_PARALLEL_FIXTURE", name)
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
        assert!(
            output.status.success(),
            "rank {rank}: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    dir
}

/// The rank's folder and fixture when this process is a rank, `None` in the parent.
fn rank_out() -> Option<(PathBuf, String)> {
    let out = std::env::var_os("MLXKIT_PARALLEL_OUT")?;
    let name = std::env::var("MLXKIT_PARALLEL_FIXTURE").ok()?;
    Some((PathBuf::from(out), name))
}

fn worst_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// Llama, Qwen2 (attention biases: the output's added once, after the sum) and Qwen3
/// (per-head q/k norms) split alike: their loaders ask the same layer types.
#[test]
fn models_split_over_two_ranks_answer_as_the_whole_model() {
    if let Some((out, name)) = rank_out() {
        let parallel = TensorParallel::new(Group::init(Backend::Ring).unwrap()).unwrap();
        let rank = parallel.rank();
        let logits = run(model(&name, Split::Tensor(parallel)).as_ref());
        return write_floats(&out.join(format!("rank{rank}.bin")), &logits);
    }
    for name in ["llama", "qwen2", "qwen3"] {
        let dir = two_ranks(
            "models_split_over_two_ranks_answer_as_the_whole_model",
            name,
        );
        let whole = run(model(name, Split::Whole).as_ref());
        let ranks = [0, 1].map(|r| read_floats(&dir.path().join(format!("rank{r}.bin"))));
        assert_eq!(ranks[0], ranks[1], "{name}: the ranks' logits differ");
        let worst = worst_difference(&whole, &ranks[0]);
        eprintln!("{name}, two ranks against one process: worst logit difference {worst:e}");
        assert!(worst <= TOLERANCE, "{name}: worst logit difference {worst}");
    }
}

/// How many layers fixture `name` has.
fn layer_count(name: &str) -> usize {
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(name).join("config.json")).unwrap()).unwrap();
    config["num_hidden_layers"].as_u64().unwrap() as usize
}

/// Llama; Gemma 3 (sliding-window and global layers); Qwen3-MoE, whose expert layers run
/// whole on their stage; and LFM2, a hybrid whose convolution layers keep recurrent state,
/// which stays with the stage that runs them.
#[test]
fn models_in_a_two_stage_pipeline_answer_exactly_as_the_whole_model() {
    if let Some((out, name)) = rank_out() {
        let layers = layer_count(&name);
        let group = Group::init(Backend::Ring).unwrap();
        let stage = PipelineStage::new(group, layers).unwrap();
        let rank = stage.rank();
        let own = stage.layers();
        assert_eq!(own.len(), layers / 2);
        // Both ranks feed the whole model's greedy tokens: only rank 0 unembeds.
        let tokens = greedy_tokens(model(&name, Split::Whole).as_ref());
        let model = model(&name, Split::Pipeline(stage));
        // Only this rank's layers keep caches.
        let caches = model.new_caches().unwrap();
        assert_eq!(caches.iter().flatten().count(), own.len());
        let logits = run_fed(model.as_ref(), &tokens, rank == 0);
        if rank == 0 {
            write_floats(&out.join("rank0.bin"), &logits);
        } else if name == "llama" {
            // A later stage holds no head.
            assert!(
                model
                    .unembed(&mlx::Array::zeros(&[1, 1, 64], Dtype::F32).unwrap())
                    .is_err()
            );
        }
        return;
    }
    for name in ["llama", "gemma3", "qwen3_moe", "lfm2"] {
        let dir = two_ranks(
            "models_in_a_two_stage_pipeline_answer_exactly_as_the_whole_model",
            name,
        );
        let whole = run(model(name, Split::Whole).as_ref());
        let staged = read_floats(&dir.path().join("rank0.bin"));
        assert_eq!(worst_difference(&whole, &staged), 0.0, "{name}");
    }
}
