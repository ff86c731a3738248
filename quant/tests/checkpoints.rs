//! The `Checkpoint` view: sharded safetensors directories, mlx-lm quantized weights, and GGUF
//! files seen with HF names, an HF config, and converter changes undone.

mod support;

use half::f16;
use mlx::quantized::{QuantMode, QuantSpec, quantize};
use mlx::{Array, Dtype};
use quant::{Checkpoint, Error, Format, MetaValue, Tensor};
use serde_json::json;
use support::gguf_writer::GgufWriter;
use support::safetensors_writer::{f32_bytes, safetensors_file};
use support::{Rng, random_blocks};

fn values(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

fn dense(t: &Tensor) -> Vec<f32> {
    t.clone()
        .into_dense(Some(Dtype::F32))
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn a_sharded_directory_reads_as_one_checkpoint() {
    let dir = support::scratch();
    let mut rng = Rng::new(1);
    let (a, b, c) = (
        values(&mut rng, 6),
        values(&mut rng, 4),
        values(&mut rng, 3),
    );
    let shard1 = safetensors_file(&[
        (
            "model.embed_tokens.weight",
            "F32",
            vec![2, 3],
            f32_bytes(&a),
        ),
        ("model.norm.weight", "F32", vec![4], f32_bytes(&b)),
    ]);
    let halves: Vec<u8> = c
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect();
    let shard2 = safetensors_file(&[("lm_head.weight", "F16", vec![3, 1], halves)]);
    std::fs::write(dir.path().join("model-00001-of-00002.safetensors"), shard1).unwrap();
    std::fs::write(dir.path().join("model-00002-of-00002.safetensors"), shard2).unwrap();
    let index = json!({"metadata": {"total_size": 46}, "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
    }});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"hidden_size": 3}"#).unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": 2}"#,
    )
    .unwrap();

    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(checkpoint.format(), Format::Safetensors);
    assert_eq!(checkpoint.config()["hidden_size"], 3);
    assert_eq!(checkpoint.generation_config().unwrap()["eos_token_id"], 2);
    assert_eq!(
        checkpoint.names(),
        vec![
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.norm.weight"
        ]
    );
    let embed = checkpoint.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embed.shape(), vec![2, 3]);
    assert_eq!(dense(&embed), a);
    let head = checkpoint.tensor("lm_head.weight").unwrap();
    assert_eq!(head.as_dense().unwrap().dtype(), Dtype::F16);
    let head = checkpoint.tensor_as("lm_head.weight", Dtype::F32).unwrap();
    assert_eq!(head.as_dense().unwrap().dtype(), Dtype::F32);
    for (got, want) in dense(&head).iter().zip(&c) {
        assert!((got - want).abs() < 1e-3);
    }
    match checkpoint.tensor("model.layers.0.mlp.up_proj.weight") {
        Err(Error::MissingTensor(name)) => assert_eq!(name, "model.layers.0.mlp.up_proj.weight"),
        other => panic!("expected a missing-tensor error, got {other:?}"),
    }
    assert!(checkpoint.optional_tensor("nope").unwrap().is_none());
}

fn array_bytes(a: &Array) -> (String, Vec<u64>, Vec<u8>) {
    let shape = a.shape().iter().map(|&d| d as u64).collect();
    match a.dtype() {
        Dtype::U32 => (
            "U32".into(),
            shape,
            bytemuck_u32(&a.to_vec::<u32>().unwrap()),
        ),
        Dtype::F32 => ("F32".into(), shape, f32_bytes(&a.to_vec::<f32>().unwrap())),
        Dtype::U8 => ("U8".into(), shape, a.to_vec::<u8>().unwrap()),
        other => panic!("unexpected dtype {other:?}"),
    }
}

fn bytemuck_u32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn mlx_lm_quantized_weights_load_with_their_per_module_specs() {
    let dir = support::scratch();
    let mut rng = Rng::new(2);
    let w = Array::from_slice(&values(&mut rng, 8 * 128), &[8, 128]).unwrap();
    let modules = [
        ("model.layers.0.mlp.up_proj", QuantSpec::affine(64, 4)),
        ("model.layers.0.mlp.down_proj", QuantSpec::affine(32, 8)),
        (
            "model.layers.0.mlp.gate_proj",
            QuantSpec {
                group_size: 32,
                bits: 4,
                mode: QuantMode::Mxfp4,
            },
        ),
    ];
    let mut tensors = Vec::new();
    let mut expected = Vec::new();
    for (module, spec) in modules {
        let q = quantize(&w, spec).unwrap();
        expected.push(
            q.dequantize(Some(Dtype::F32))
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
        );
        tensors.push((format!("{module}.weight"), array_bytes(&q.weights)));
        tensors.push((format!("{module}.scales"), array_bytes(&q.scales)));
        if let Some(b) = &q.biases {
            tensors.push((format!("{module}.biases"), array_bytes(b)));
        }
    }
    tensors.push((
        "model.norm.weight".into(),
        ("F32".into(), vec![2], f32_bytes(&[1.0, 2.0])),
    ));
    let refs: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors_file(&refs),
    )
    .unwrap();
    let config = json!({"quantization": {
        "group_size": 64, "bits": 4,
        "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
        "model.layers.0.mlp.gate_proj": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
    }});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();

    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let names = checkpoint.names();
    assert!(
        names
            .iter()
            .all(|n| !n.ends_with(".scales") && !n.ends_with(".biases")),
        "{names:?}"
    );
    assert_eq!(names.len(), 4);
    for ((module, spec), want) in modules.iter().zip(&expected) {
        let t = checkpoint.tensor(&format!("{module}.weight")).unwrap();
        let q = t
            .as_quantized()
            .unwrap_or_else(|| panic!("{module} loaded dense"));
        assert_eq!(q.spec, *spec, "{module}");
        assert_eq!(t.shape(), vec![8, 128], "{module}");
        assert_eq!(
            checkpoint.shape(&format!("{module}.weight")).unwrap(),
            vec![8, 128]
        );
        assert_eq!(&dense(&t), want, "{module}");
    }
    assert!(
        !checkpoint
            .tensor("model.norm.weight")
            .unwrap()
            .is_quantized()
    );
}

#[test]
fn mlx_lm_weights_that_disagree_with_the_config_are_refused() {
    let dir = support::scratch();
    let w = Array::from_slice(&vec![0.25f32; 4 * 64], &[4, 64]).unwrap();
    let q = quantize(&w, QuantSpec::affine(64, 4)).unwrap();
    let (w_dtype, w_shape, w_bytes) = array_bytes(&q.weights);
    let (s_dtype, s_shape, s_bytes) = array_bytes(&q.scales);
    let (b_dtype, b_shape, b_bytes) = array_bytes(q.biases.as_ref().unwrap());
    let file = safetensors_file(&[
        ("m.weight", &w_dtype, w_shape, w_bytes),
        ("m.scales", &s_dtype, s_shape, s_bytes),
        ("m.biases", &b_dtype, b_shape, b_bytes),
    ]);
    std::fs::write(dir.path().join("model.safetensors"), file).unwrap();
    // The config claims 8 bits: the packed width no longer matches the scales.
    let config = json!({"quantization": {"group_size": 64, "bits": 8}});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let err = Checkpoint::open(dir.path())
        .unwrap()
        .tensor("m.weight")
        .unwrap_err();
    assert!(
        err.to_string().contains("m.weight") && err.to_string().contains("disagree"),
        "{err}"
    );
    // No quantization section at all.
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    let err = Checkpoint::open(dir.path())
        .unwrap()
        .tensor("m.weight")
        .unwrap_err();
    assert!(err.to_string().contains("no quantization"), "{err}");
}

/// HF-order rows → llama.cpp order, written independently of the crate: the converter's
/// `reshape(n_head, 2, d / 2, cols).swapaxes(1, 2)`.
fn llama_permute(rows: &[Vec<f32>], n_head: usize) -> Vec<Vec<f32>> {
    let head_dim = rows.len() / n_head;
    let half = head_dim / 2;
    let mut out = vec![Vec::new(); rows.len()];
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                out[h * head_dim + 2 * i + j] = rows[h * head_dim + j * half + i].clone();
            }
        }
    }
    out
}

fn f32_data(rows: &[Vec<f32>]) -> Vec<u8> {
    rows.iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn llama_gguf(rng: &mut Rng) -> (GgufWriter, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let (hidden, heads, kv_heads) = (32usize, 4usize, 2usize);
    let head_dim = hidden / heads;
    let q_rows: Vec<Vec<f32>> = (0..hidden).map(|_| values(rng, hidden)).collect();
    let k_rows: Vec<Vec<f32>> = (0..kv_heads * head_dim)
        .map(|_| values(rng, hidden))
        .collect();
    let u32_meta = |v: u32| MetaValue::U32(v);
    let writer = GgufWriter::default()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.embedding_length", u32_meta(hidden as u32))
        .meta("llama.block_count", u32_meta(1))
        .meta("llama.feed_forward_length", u32_meta(64))
        .meta("llama.attention.head_count", u32_meta(heads as u32))
        .meta("llama.attention.head_count_kv", u32_meta(kv_heads as u32))
        .meta("llama.rope.freq_base", MetaValue::F32(100_000.0))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .meta("llama.context_length", u32_meta(2048))
        .meta("tokenizer.ggml.bos_token_id", u32_meta(1))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                (0..10)
                    .map(|i| MetaValue::String(format!("t{i}")))
                    .collect(),
            ),
        )
        .tensor(
            "token_embd.weight",
            &[32, 10],
            8,
            random_blocks("Q8_0", 10, rng),
        )
        .tensor(
            "blk.0.attn_q.weight",
            &[32, 32],
            0,
            f32_data(&llama_permute(&q_rows, heads)),
        )
        .tensor(
            "blk.0.attn_k.weight",
            &[32, 16],
            0,
            f32_data(&llama_permute(&k_rows, kv_heads)),
        )
        .tensor(
            "blk.0.ffn_norm.weight",
            &[32],
            0,
            f32_data(&[vec![1.0; 32]]),
        )
        .tensor("output_norm.weight", &[32], 0, f32_data(&[vec![1.0; 32]]))
        .tensor("rope_freqs.weight", &[4], 0, f32_data(&[vec![1.0; 4]]));
    (writer, q_rows, k_rows)
}

#[test]
fn llama_gguf_reads_as_an_hf_checkpoint() {
    let mut rng = Rng::new(3);
    let (writer, q_rows, k_rows) = llama_gguf(&mut rng);
    let dir = support::scratch();
    let path = dir.path().join("llama.gguf");
    std::fs::write(&path, writer.build()).unwrap();
    let checkpoint = Checkpoint::open(&path).unwrap();
    assert_eq!(checkpoint.format(), Format::Gguf);
    let config = checkpoint.config();
    let expected = json!({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "max_position_embeddings": 2048, "bos_token_id": 1,
        "vocab_size": 10, "tie_word_embeddings": true,
    });
    for (key, value) in expected.as_object().unwrap() {
        assert_eq!(&config[key], value, "config key {key}");
    }
    assert_eq!(
        checkpoint.names(),
        vec![
            "model.embed_tokens.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.norm.weight",
        ]
    );
    // llama.cpp's rope divisors become the config's rope scaling, not a tensor of the model.
    assert_eq!(
        config["rope_scaling"],
        json!({"rope_type": "gguf_rope_freqs", "frequency_factors": [1.0, 1.0, 1.0, 1.0]})
    );
    assert_eq!(
        checkpoint
            .shape("model.layers.0.self_attn.k_proj.weight")
            .unwrap(),
        vec![16, 32]
    );
    assert!(matches!(
        checkpoint.shape("nope"),
        Err(Error::MissingTensor(_))
    ));
    let q = checkpoint
        .tensor("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(dense(&q), q_rows.concat(), "q_proj rows back in HF order");
    let k = checkpoint
        .tensor("model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(
        dense(&k),
        k_rows.concat(),
        "k_proj rows back in HF order (KV heads)"
    );
    let gguf = checkpoint.gguf().unwrap();
    assert!(gguf.tensor_info("blk.0.attn_q.weight").is_some());
    assert!(
        checkpoint
            .tensor("model.embed_tokens.weight")
            .unwrap()
            .is_quantized()
    );
}

#[test]
fn unpermuting_a_quantized_weight_moves_whole_rows() {
    let mut rng = Rng::new(4);
    let blocks = random_blocks("Q4_1", 16 * 2, &mut rng);
    let tensor = quant::gguf_tensor("w", quant::GgmlType::Q4_1, &[16, 64], &blocks).unwrap();
    let rows: Vec<Vec<f32>> = dense(&tensor).chunks(64).map(<[f32]>::to_vec).collect();
    let unpermuted = quant::unpermute_qk_rows(&tensor, 2).unwrap();
    assert!(unpermuted.is_quantized());
    // The GGUF rows were `llama_permute(hf)`; undoing must give `hf` back, so permuting the
    // result again must give the stored rows.
    let hf: Vec<Vec<f32>> = dense(&unpermuted).chunks(64).map(<[f32]>::to_vec).collect();
    assert_eq!(llama_permute(&hf, 2), rows);
    let again = quant::permute_qk_rows(&unpermuted, 2).unwrap();
    assert_eq!(dense(&again), rows.concat());
}

#[test]
fn gemma3_gguf_norms_lose_the_converter_offset_and_get_layer_types() {
    let norm: Vec<f32> = vec![0.5, -0.25, 2.0, 0.0];
    let shifted: Vec<f32> = norm.iter().map(|v| v + 1.0).collect();
    let writer = GgufWriter::default()
        .meta("general.architecture", MetaValue::String("gemma3".into()))
        .meta("gemma3.block_count", MetaValue::U32(7))
        .meta("gemma3.attention.key_length", MetaValue::U32(256))
        .meta("gemma3.attention.sliding_window", MetaValue::U32(512))
        .meta("gemma3.rope.freq_base", MetaValue::F32(1_000_000.0))
        .tensor(
            "blk.0.ffn_norm.weight",
            &[4],
            0,
            f32_data(std::slice::from_ref(&shifted)),
        )
        .tensor(
            "blk.0.attn_q_norm.weight",
            &[4],
            0,
            f32_data(std::slice::from_ref(&shifted)),
        )
        .tensor("output_norm.weight", &[4], 0, f32_data(&[shifted]));
    let dir = support::scratch();
    let path = dir.path().join("gemma.gguf");
    std::fs::write(&path, writer.build()).unwrap();
    let checkpoint = Checkpoint::open(&path).unwrap();
    for name in [
        "model.layers.0.pre_feedforward_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.norm.weight",
    ] {
        assert_eq!(dense(&checkpoint.tensor(name).unwrap()), norm, "{name}");
    }
    let config = checkpoint.config();
    assert_eq!(config["model_type"], "gemma3_text");
    assert_eq!(config["sliding_window"], 512);
    assert_eq!(config["sliding_window_pattern"], 6);
    assert_eq!(config["query_pre_attn_scalar"], 256);
    assert_eq!(config["rope_theta"], 1_000_000.0);
    assert_eq!(config["rope_local_base_freq"], 10_000.0);
    let layer_types: Vec<&str> = config["layer_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        layer_types,
        [
            "sliding_attention",
            "sliding_attention",
            "sliding_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention"
        ]
    );
}
