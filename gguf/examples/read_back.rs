//! A tiny GGUF file written in memory and read back: its metadata, its tensor directory, one
//! tensor's bytes, and what a file cut short says.
//!
//! ```sh
//! cargo run --example read_back   # from gguf
//! ```

use gguf::{GgmlType, Gguf, MetaValue, Writer};

fn main() -> Result<(), gguf::Error> {
    let embedding: Vec<u8> = (0..4 * 8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let bytes = Writer::default()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.context_length", MetaValue::U32(2048))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                ["<s>", "a", "b", "ab"]
                    .map(|t| MetaValue::String(t.into()))
                    .to_vec(),
            ),
        )
        // Four tokens of eight f32s; GGUF writes dimensions innermost first.
        .tensor("token_embd.weight", &[8, 4], GgmlType::F32.id(), embedding)
        .build();
    println!("{} bytes, GGUF: {}", bytes.len(), gguf::is_gguf(&bytes));

    let file = Gguf::parse(&bytes)?;
    println!(
        "version {}, architecture {:?}",
        file.version(),
        file.architecture()
    );
    for (key, value) in file.metadata() {
        println!("  {key} = {value}");
    }
    for tensor in file.tensors() {
        let data = &bytes[tensor.offset as usize..][..tensor.size as usize];
        let second_row: Vec<f32> = data[32..64]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        println!(
            "  {} {} {:?} at byte {}: row 1 = {second_row:?}",
            tensor.name, tensor.ggml_type, tensor.shape, tensor.offset
        );
    }

    match Gguf::parse(&bytes[..bytes.len() - 4]) {
        Ok(_) => println!("a cut file parsed (it should not)"),
        Err(err) => println!("cut by 4 bytes: {err}"),
    }
    Ok(())
}
