//! Caches with rewind slack (what the engine gives every sequence, so a rejected draft needs no
//! snapshot) hold a sliding window's ring with extra slots, and attention then masks the stale
//! ones with an array. A sequence decoded on them gives what it gives on plain caches, whose
//! windows need no such mask once a decode step starts: sliding windows (Gemma 2 and 3,
//! Mistral) and chunked layers (Llama 4), prompts and decodes well past the 8-token windows.

use std::path::Path;

use nn::{Batch, Model};

fn model(name: &str) -> Box<dyn Model> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    nn::load::load(&dir, Some(mlx::Dtype::F32)).unwrap().model
}

/// The logits of a 21-token prompt (in chunks of 7) and of 16 greedy steps after it.
fn logits(model: &dyn Model, slack: Option<usize>) -> Vec<Vec<f32>> {
    let mut caches = match slack {
        Some(slack) => model.new_caches_rewindable(slack).unwrap(),
        None => model.new_caches().unwrap(),
    };
    let vocab = model.spec().vocab_size as u32;
    let prompt: Vec<u32> = (0..21u32).map(|i| (i * 37 + 5) % vocab).collect();
    let mut all = Vec::new();
    let mut last = None;
    for (c, chunk) in prompt.chunks(7).enumerate() {
        let out = model
            .forward(&Batch::single(chunk, c * 7).unwrap(), &mut caches)
            .unwrap();
        let n = chunk.len() as i32;
        last = Some(out.hidden.slice_axis(1, n - 1, n).unwrap());
    }
    for position in prompt.len()..prompt.len() + 16 {
        let row = model
            .unembed(last.as_ref().unwrap())
            .unwrap()
            .reshape(&[-1])
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let next = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap() as u32;
        all.push(row);
        let out = model
            .forward(&Batch::single(&[next], position).unwrap(), &mut caches)
            .unwrap();
        last = Some(out.hidden);
    }
    all
}

#[test]
fn slack_in_the_ring_does_not_change_what_a_sequence_sees() {
    for name in ["gemma3", "gemma2", "mistral", "llama4"] {
        let model = model(name);
        let plain = logits(model.as_ref(), None);
        let slack = logits(model.as_ref(), Some(8));
        for (step, (a, b)) in plain.iter().zip(&slack).enumerate() {
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            // Same values through a different mask path: f32 rounding of sums over at most
            // 37 positions, far below this.
            assert!(
                worst < 1e-4,
                "{name}, step {step}: logits differ by {worst}"
            );
        }
    }
}
