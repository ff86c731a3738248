//! Real safetensors written by transformers (the tiny reference models under
//! `nn/tests/fixtures`) read through `Checkpoint` agree, tensor for tensor, with MLX's own
//! safetensors loader.

use std::path::{Path, PathBuf};

use mlx::Dtype;
use quant::{Checkpoint, Format};

fn fixture_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.safetensors").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_fixture_reads_the_same_as_mlx_reads_it() {
    let dirs = fixture_dirs();
    assert!(
        dirs.len() >= 4,
        "expected the transformers fixtures, found {dirs:?}"
    );
    for dir in dirs {
        let checkpoint = Checkpoint::open(&dir).unwrap();
        assert_eq!(checkpoint.format(), Format::Safetensors);
        assert!(
            checkpoint.config()["model_type"].is_string(),
            "{}",
            dir.display()
        );
        // Read when written: an encoder alone (the Whisper fixture) has none.
        assert_eq!(
            checkpoint.generation_config().is_some(),
            dir.join("generation_config.json").is_file(),
            "{}",
            dir.display()
        );
        let reference = mlx::load_safetensors(&dir.join("model.safetensors")).unwrap();
        let mut names = checkpoint.names();
        names.sort();
        let mut expected: Vec<String> = reference.iter().map(|(n, _)| n.clone()).collect();
        expected.sort();
        assert_eq!(names, expected, "{}", dir.display());
        for (name, want) in reference {
            let got = checkpoint.tensor(&name).unwrap();
            assert_eq!(got.shape(), want.shape(), "{name}");
            assert_eq!(checkpoint.shape(&name).unwrap(), want.shape(), "{name}");
            let got = got
                .into_dense(Some(Dtype::F32))
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let want = want.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(got, want, "{} {name}", dir.display());
        }
    }
}
