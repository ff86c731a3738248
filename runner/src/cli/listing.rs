//! The tables `list`, `show` and `ps` print, and how they write sizes.

use anyhow::{Context, Result, bail};

use crate::model_name::ModelName;
use crate::store::Store;

/// `list`: every stored model, Ollama's marked.
pub(super) fn list(store: &Store) -> Result<()> {
    println!(
        "{:<32} {:<14} {:>10}  {:<12} QUANT",
        "NAME", "ID", "SIZE", "FAMILY"
    );
    for entry in store.list()? {
        let digest = entry.manifest.digest();
        // Ollama's models are marked; one mlxkit cannot serve says why.
        let note = match (&entry.unusable, entry.from_ollama) {
            (Some(reason), _) => format!("  (ollama; cannot serve: {reason})"),
            (None, true) => "  (ollama)".to_string(),
            (None, false) => String::new(),
        };
        println!(
            "{:<32} {:<14} {:>10}  {:<12} {}{note}",
            entry.name.to_string(),
            digest.trim_start_matches("sha256:").get(..12).unwrap_or(""),
            human_bytes(entry.manifest.size()),
            entry.manifest.details.family,
            entry.manifest.details.quantization_level,
        );
    }
    Ok(())
}

/// `show`: a model's details, parameters and system prompt; with `verbose`, its tensors.
pub(super) fn show(store: &Store, name: &ModelName, verbose: bool) -> Result<()> {
    let entry = store.get(name)?;
    let m = &entry.manifest;
    println!("  Model");
    println!("    architecture        {}", m.details.family);
    println!("    parameters          {}", m.details.parameter_size);
    println!("    context length      {}", m.details.context_length);
    println!("    quantization        {}", m.details.quantization_level);
    println!("    format              {:?}", m.format);
    println!("    size                {}", human_bytes(m.size()));
    println!("    source              {}", m.source);
    if !m.details.capabilities.is_empty() {
        println!(
            "    capabilities        {}",
            m.details.capabilities.join(", ")
        );
    }
    if let Some(draft) = &m.draft {
        println!("    draft model         {draft}");
    }
    if !m.parameters.is_empty() {
        println!("\n  Parameters");
        for (k, v) in &m.parameters {
            println!("    {k:<20}{v}");
        }
    }
    if let Some(system) = &m.system {
        println!("\n  System\n    {system}");
    }
    if verbose {
        let view = store.materialize(m)?;
        let weights = crate::engine::from_store::weights_path(&view, m)
            .with_context(|| format!("model `{name}` has no weights file"))?;
        let checkpoint = quant::Checkpoint::open(&weights)?;
        let source = quant::create::Source::read(&checkpoint)?;
        println!("\n  Tensors ({})", source.tensors.len());
        let width = source
            .tensors
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(0);
        for t in &source.tensors {
            let shape = format!("{:?}", t.shape);
            println!("    {:width$}  {shape:16}  {}", t.name, t.stored.label());
        }
    }
    Ok(())
}

/// `ps`: the models the server at `host` has loaded, asked over its HTTP API.
pub(super) async fn ps(host: String) -> Result<()> {
    let url = format!("http://{host}/api/ps");
    let mut request = reqwest::Client::new().get(&url);
    // The server's key, when it needs one: the same variable serves both sides.
    if let Some(key) = std::env::var(crate::server::api_key::API_KEY_VARIABLE)
        .ok()
        .filter(|key| !key.trim().is_empty())
    {
        request = request.bearer_auth(key.trim());
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("is `mlxkit serve` running at {host}?"))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await?;
    if !status.is_success() {
        bail!(
            "the server at {host} answered {status}: {}",
            body["error"].as_str().unwrap_or("no reason given")
        );
    }
    println!(
        "{:<32} {:>10} {:>10} {:>10}  {:<8} {:>7} {:>6} {:>10}  UNTIL",
        "NAME", "SIZE", "WEIGHTS", "KV", "CONTEXT", "RUNNING", "QUEUED", "CACHE"
    );
    for m in body["models"].as_array().into_iter().flatten() {
        let count = |key: &str| m[key].as_u64().unwrap_or(0);
        println!(
            "{:<32} {:>10} {:>10} {:>10}  {:<8} {:>7} {:>6} {:>10}  {}",
            m["name"].as_str().unwrap_or(""),
            human_bytes(count("size")),
            human_bytes(count("weights_bytes")),
            human_bytes(count("kv_bytes")),
            count("context_length"),
            count("running_sequences"),
            count("queued_requests"),
            human_bytes(count("prefix_cache_bytes")),
            m["expires_at"].as_str().unwrap_or(""),
        );
    }
    Ok(())
}

/// A byte count the way the tables print it.
pub(super) fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0} MB", n / 1e6)
    } else {
        format!("{:.0} KB", n / 1e3)
    }
}
