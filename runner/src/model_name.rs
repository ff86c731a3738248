//! Model names: `name[:tag]`, with `latest` as the default tag.

use std::fmt;

/// A parsed model name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName {
    /// The name before the colon (`smollm2`, `library/foo`).
    pub name: String,
    /// The tag after it (`135m`, `latest`).
    pub tag: String,
}

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid model name `{0}`: use letters, digits, `.`, `_`, `-` and `/`, with an optional `:tag`"
)]
pub struct InvalidName(pub String);

impl ModelName {
    /// Parses `name[:tag]`. Path separators are allowed only between name parts, so a name can
    /// never escape the manifests folder.
    pub fn parse(text: &str) -> Result<ModelName, InvalidName> {
        let invalid = || InvalidName(text.to_string());
        let (name, tag) = match text.rsplit_once(':') {
            Some((name, tag)) => (name, tag),
            None => (text, "latest"),
        };
        let ok_part = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && !s.starts_with('.')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        };
        if !name.split('/').all(ok_part) || !ok_part(tag) {
            return Err(invalid());
        }
        Ok(ModelName {
            name: name.to_ascii_lowercase(),
            tag: tag.to_ascii_lowercase(),
        })
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_defaults_the_tag() {
        assert_eq!(
            ModelName::parse("smollm2:135m").unwrap().to_string(),
            "smollm2:135m"
        );
        assert_eq!(ModelName::parse("Foo").unwrap().to_string(), "foo:latest");
        assert_eq!(ModelName::parse("me/foo:v1").unwrap().name, "me/foo");
    }

    #[test]
    fn refuses_names_that_could_escape_the_store() {
        for bad in [
            "",
            "../x",
            "a/../b",
            "a:",
            ":b",
            "a b",
            "a/.hidden",
            "x:../../y",
            "a//b",
        ] {
            assert!(ModelName::parse(bad).is_err(), "{bad}");
        }
    }
}
