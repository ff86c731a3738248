//! What a Modelfile's `FROM` (or `DRAFT`) names: a GGUF file, a transformers / mlx-lm folder
//! (or one of its safetensors files), or a model in the store.
//!
//! The file system is asked only through metadata and a 4-byte read of a regular file, so a
//! FIFO, a socket or a device is refused at once instead of blocking a worker on `open`.
//!
//! The rule for what a refusal says (the API lets clients name server paths): a path that is
//! not a checkpoint this server can read — missing, unreadable, not a regular file or folder,
//! or neither a GGUF file nor a folder with `config.json` — gets one message, the same for all,
//! quoting only the text the client sent. So no answer tells whether a server path exists.
//! Once a path *is* a checkpoint, errors about its content may be specific (a client who can
//! create from it learns nothing more than that it succeeded would tell), and name paths only
//! as the client wrote them (see [`ModelSource::redact`]).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::model_name::ModelName;

/// A resolved `FROM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A GGUF file (by its magic).
    Gguf(PathBuf),
    /// A folder with `config.json`, or a `.safetensors` file inside one.
    Safetensors(PathBuf),
    /// A model in the store.
    Stored(ModelName),
}

/// `FROM` (or `DRAFT`) names nothing this server can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{keyword} `{text}` is neither a model in the store nor a GGUF file or model folder \
     (config.json and safetensors) that this server can read"
)]
pub struct UnusableSource {
    /// `FROM` or `DRAFT`.
    pub keyword: &'static str,
    /// The text as given.
    pub text: String,
}

impl ModelSource {
    /// Resolves `text` (a path, `~/` for the home folder, or a model name). `keyword` names
    /// the Modelfile command in the refusal.
    pub fn resolve(text: &str, keyword: &'static str) -> Result<ModelSource, UnusableSource> {
        let unusable = || UnusableSource {
            keyword,
            text: text.to_string(),
        };
        let path = expand_home(text);
        if let Some(source) = checkpoint_at(&path) {
            return Ok(source);
        }
        ModelName::parse(text)
            .map(ModelSource::Stored)
            .map_err(|_| unusable())
    }

    /// The checkpoint's path, for a path source.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ModelSource::Gguf(path) | ModelSource::Safetensors(path) => Some(path),
            ModelSource::Stored(_) => None,
        }
    }

    /// `message` with this source's resolved path written as the client wrote it (`text`),
    /// so an error never shows more of a server path than the client sent (`~/` expanded, say).
    pub fn redact(&self, message: &str, text: &str) -> String {
        match self.path().map(|p| p.display().to_string()) {
            Some(resolved) if !resolved.is_empty() && resolved != text => {
                message.replace(&resolved, text)
            }
            _ => message.to_string(),
        }
    }
}

/// The checkpoint at `path`, if it is one this process can read.
fn checkpoint_at(path: &Path) -> Option<ModelSource> {
    let meta = fs::metadata(path).ok()?;
    if meta.is_dir() {
        return readable_folder(path).then(|| ModelSource::Safetensors(path.to_path_buf()));
    }
    if !meta.is_file() {
        return None;
    }
    // Read here rather than by `gguf::is_gguf_file`: a file too short or unreadable is no
    // checkpoint of either kind.
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .ok()?;
    if gguf::is_gguf(&magic) {
        return Some(ModelSource::Gguf(path.to_path_buf()));
    }
    let is_safetensors = path.extension().is_some_and(|e| e == "safetensors");
    let folder = path.parent()?;
    (is_safetensors && readable_folder(folder))
        .then(|| ModelSource::Safetensors(path.to_path_buf()))
}

/// A folder whose `config.json` and safetensors files are regular files (a FIFO among them
/// would block the reader).
fn readable_folder(dir: &Path) -> bool {
    let config_ok = fs::metadata(dir.join("config.json")).is_ok_and(|m| m.is_file())
        && fs::File::open(dir.join("config.json")).is_ok();
    config_ok
        && fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().all(|e| {
                let name = e.file_name();
                !name.to_string_lossy().ends_with(".safetensors")
                    || fs::metadata(e.path()).is_ok_and(|m| m.is_file())
            })
        })
}

/// `~/rest` as a path under `$HOME`; anything else as it is.
pub fn expand_home(text: &str) -> PathBuf {
    match (text.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_checkpoints_resolve_as_paths() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.bin");
        fs::write(&gguf, b"GGUF....").unwrap();
        assert_eq!(
            ModelSource::resolve(gguf.to_str().unwrap(), "FROM"),
            Ok(ModelSource::Gguf(gguf))
        );
        let folder = dir.path().join("folder");
        fs::create_dir(&folder).unwrap();
        let text = folder.to_str().unwrap().to_string();
        let refused = ModelSource::resolve(&text, "FROM").unwrap_err();
        let missing = format!("{text}/nothing");
        // A folder without config.json reads the same as a path that does not exist.
        assert_eq!(
            refused.to_string().replace(&text, "X"),
            ModelSource::resolve(&missing, "FROM")
                .unwrap_err()
                .to_string()
                .replace(&missing, "X")
        );
        fs::write(folder.join("config.json"), "{}").unwrap();
        assert_eq!(
            ModelSource::resolve(&text, "FROM"),
            Ok(ModelSource::Safetensors(folder))
        );
        assert_eq!(
            ModelSource::resolve("smollm2:135m", "FROM"),
            Ok(ModelSource::Stored(
                ModelName::parse("smollm2:135m").unwrap()
            ))
        );
    }
}
