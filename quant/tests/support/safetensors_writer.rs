//! A minimal safetensors writer for test files.

use serde_json::{Map, Value, json};

/// `(name, dtype name, shape, data)` tensors written in order.
pub fn safetensors_file(tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let mut header = Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, data) in tensors {
        let end = offset + data.len() as u64;
        header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    with_header(
        &Value::Object(header).to_string(),
        &tensors
            .iter()
            .flat_map(|t| t.3.clone())
            .collect::<Vec<u8>>(),
    )
}

/// A file made of a raw header string and data.
pub fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}
