//! [`Tokenizer`]: one vocabulary, whichever file it came from.

use std::collections::BTreeSet;
use std::path::Path;

use crate::error::{Error, Result};
use crate::gguf_vocab::build_gguf_vocab;
use crate::hf_config::{HfSideFiles, read_hf_config};
use crate::special_tokens::SpecialTokens;
use crate::{GgufMetadata, read_gguf_metadata};

/// Where a vocabulary was read from; decides who adds BOS/EOS when encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabSource {
    /// A `tokenizer.json`: its own post-processor adds special tokens.
    HuggingFace,
    /// GGUF metadata: BOS/EOS are added from `tokenizer.ggml.add_{bos,eos}_token`.
    Gguf,
}

/// Text ↔ token ids for one checkpoint, with its special tokens and chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// One past the largest id; cached because HF recounts added tokens on every query.
    vocab_size: usize,
    specials: SpecialTokens,
    chat_template: Option<String>,
    source: VocabSource,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("specials", &self.specials)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn id_bound(tokenizer: &tokenizers::Tokenizer) -> usize {
    tokenizer
        .get_vocab(true)
        .values()
        .max()
        .map_or(0, |&max| max as usize + 1)
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when present, `tokenizer_config.json`,
    /// `special_tokens_map.json`, `generation_config.json` and `chat_template.jinja` from `dir`.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let tokenizer_json = read(&dir.join("tokenizer.json"))?;
        let config = read_optional(&dir.join("tokenizer_config.json"))?;
        let map = read_optional(&dir.join("special_tokens_map.json"))?;
        let generation = read_optional(&dir.join("generation_config.json"))?;
        let template = read_optional(&dir.join("chat_template.jinja"))?
            .map(|bytes| {
                String::from_utf8(bytes).map_err(|_| Error::Json {
                    what: "chat_template.jinja".into(),
                    reason: "not valid UTF-8".into(),
                })
            })
            .transpose()?;
        let side = HfSideFiles {
            tokenizer_config: config.as_deref(),
            special_tokens_map: map.as_deref(),
            generation_config: generation.as_deref(),
            chat_template: template.as_deref(),
        };
        Self::from_hf_bytes(&tokenizer_json, &side)
    }

    /// Builds from the bytes of a `tokenizer.json` and its side files.
    pub fn from_hf_bytes(tokenizer_json: &[u8], side: &HfSideFiles<'_>) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json).map_err(Error::tokenizers)?;
        let added = inner.get_added_tokens_decoder();
        let is_special = |text: &str| {
            let id = inner.token_to_id(text)?;
            added.get(&id).is_some_and(|t| t.special).then_some(id)
        };
        let config = read_hf_config(side, |t| inner.token_to_id(t), is_special)?;
        Ok(Tokenizer {
            vocab_size: id_bound(&inner),
            inner,
            specials: config.specials,
            chat_template: config.chat_template,
            source: VocabSource::HuggingFace,
        })
    }

    /// Reads the vocabulary from a GGUF file's metadata (tensor data is never read).
    pub fn from_gguf_file(path: &Path) -> Result<Self> {
        Self::from_gguf_metadata(&read_gguf_metadata(path)?)
    }

    /// Builds from GGUF metadata that was already parsed, by [`read_gguf_metadata`] or by
    /// another GGUF reader.
    pub fn from_gguf_metadata(meta: &GgufMetadata) -> Result<Self> {
        let vocab = build_gguf_vocab(meta)?;
        Ok(Tokenizer {
            vocab_size: id_bound(&vocab.tokenizer),
            inner: vocab.tokenizer,
            specials: vocab.specials,
            chat_template: vocab.chat_template,
            source: VocabSource::Gguf,
        })
    }

    /// Token ids of `text`. Special-token texts in `text` (like `<|im_start|>`) become their
    /// ids; `add_special` adds what the checkpoint adds to plain text (usually BOS).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, add_special)
            .map_err(Error::tokenizers)?;
        let ids = encoding.get_ids();
        if self.source == VocabSource::HuggingFace || !add_special {
            return Ok(ids.to_vec());
        }
        let mut out = Vec::with_capacity(ids.len() + 2);
        if self.specials.add_bos {
            out.extend(self.specials.bos);
        }
        out.extend_from_slice(ids);
        if self.specials.add_eos {
            out.extend(self.specials.eos.first());
        }
        Ok(out)
    }

    /// The text of `ids`; special tokens are left out when `skip_special` is set.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let size = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= size) {
            return Err(Error::UnknownTokenId {
                id,
                vocab_size: size,
            });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(Error::tokenizers)
    }

    /// The id of a token's text (`"<|im_end|>"`, `"Ġthe"`), if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The stored text of a token id, before decoding (byte-level or `▁` marks included).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The most UTF-8 bytes any token's stored text has (at least 4). Stored texts are never
    /// shorter than the text they decode to (byte-level and `▁` marks, `<0x..>` byte tokens
    /// only lengthen them), so a text of `n` bytes needs at least `n` / this many tokens:
    /// enough to refuse an oversize prompt before tokenizing it.
    pub fn longest_token_bytes(&self) -> usize {
        self.inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(4)
    }

    /// One past the largest token id, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Where `other`'s vocabulary differs from this one's — the size, or the first id whose
    /// stored text differs — or `None` when every id means the same token in both (what a
    /// draft model needs to draft for a target).
    pub fn vocabulary_difference(&self, other: &Tokenizer) -> Option<String> {
        if self.vocab_size != other.vocab_size {
            return Some(format!(
                "{} tokens against {}",
                other.vocab_size, self.vocab_size
            ));
        }
        (0..self.vocab_size as u32).find_map(|id| {
            let (ours, theirs) = (self.id_to_token(id), other.id_to_token(id));
            (ours != theirs).then(|| {
                let show = |t: Option<String>| t.map_or("nothing".into(), |t| format!("{t:?}"));
                format!("token {id} is {} against {}", show(theirs), show(ours))
            })
        })
    }

    /// Beginning-of-sequence id, if any.
    pub fn bos(&self) -> Option<u32> {
        self.specials.bos
    }

    /// Every end-of-sequence id named by any source.
    pub fn eos(&self) -> &BTreeSet<u32> {
        &self.specials.eos
    }

    /// Every id that ends generation (EOS, end of turn, end of message).
    pub fn stop_tokens(&self) -> &BTreeSet<u32> {
        &self.specials.stop
    }

    /// Whether `id` ends generation.
    pub fn is_stop(&self, id: u32) -> bool {
        self.specials.stop.contains(&id)
    }

    /// All special ids and flags.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.specials
    }

    /// The text of the BOS token, for chat templates.
    pub fn bos_text(&self) -> Option<String> {
        self.specials.bos.and_then(|id| self.id_to_token(id))
    }

    /// The text of the first EOS token, for chat templates.
    pub fn eos_text(&self) -> Option<String> {
        self.specials
            .eos
            .first()
            .and_then(|&id| self.id_to_token(id))
    }

    /// The chat template the checkpoint ships, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Where the vocabulary came from.
    pub fn source(&self) -> VocabSource {
        self.source
    }

    /// The underlying HF tokenizer, for what this API does not cover (offsets, batching).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
