//! Model names: `name[:tag]`, with `latest` as the default tag.

use std::fmt;

/// The longest name (before the `:`) and the longest tag. A name is stored as one folder
/// whose `/`s are written `%2F`, so 128 characters stay within a file system's 255-byte limit
/// on one path component.
const MAX_LEN: usize = 128;

/// A parsed model name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName {
    /// The name before the colon (`smollm2`, `library/foo`).
    pub name: String,
    /// The tag after it (`135m`, `latest`).
    pub tag: String,
}

/// Why a name was refused: the text, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid model name `{text}`: {rule}")]
pub struct InvalidName {
    /// The name as given.
    pub text: String,
    /// The rule it breaks, in words.
    pub rule: String,
}

impl ModelName {
    /// Parses `name[:tag]`. A name is parts separated by `/`, each of letters, digits, `.`,
    /// `_` and `-`, not starting with `.`; so a name can never escape the manifests folder.
    pub fn parse(text: &str) -> Result<ModelName, InvalidName> {
        let invalid = |rule: String| InvalidName {
            text: text.to_string(),
            rule,
        };
        let (name, tag) = match text.rsplit_once(':') {
            Some((name, tag)) => (name, tag),
            None => (text, "latest"),
        };
        if name.len() > MAX_LEN {
            return Err(invalid(format!(
                "a name is at most {MAX_LEN} characters before the `:`"
            )));
        }
        if tag.len() > MAX_LEN {
            return Err(invalid(format!("a tag is at most {MAX_LEN} characters")));
        }
        if tag.is_empty() {
            return Err(invalid("the tag after `:` is empty".into()));
        }
        for (part, what) in name
            .split('/')
            .map(|p| (p, "a part of the name"))
            .chain([(tag, "the tag")])
        {
            if part.is_empty() {
                return Err(invalid(
                    "a name is parts separated by single `/`s, none of them empty".into(),
                ));
            }
            if part.starts_with('.') {
                return Err(invalid(format!("{what} may not start with `.`")));
            }
            if what == "the tag" && part.contains('/') {
                return Err(invalid("the tag may not contain `/`".into()));
            }
            if let Some(bad) = part
                .chars()
                .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
            {
                return Err(invalid(format!(
                    "`{}` is not allowed: use letters, digits, `.`, `_` and `-`, with `/` \
                     between parts of the name and an optional `:tag`",
                    bad.escape_default()
                )));
            }
        }
        Ok(ModelName {
            name: name.to_ascii_lowercase(),
            tag: tag.to_ascii_lowercase(),
        })
    }

    /// The one folder name under `manifests/` that holds this name's tags: the name with
    /// each `/` written `%2F`. Parts never contain `%`, so every name has its own folder and
    /// `a:b` (folder `a`, file `b`) never meets `a/b:c` (folder `a%2Fb`).
    pub fn folder(&self) -> String {
        self.name.replace('/', "%2F")
    }

    /// The name whose [`folder`](Self::folder) is `folder`, with `tag`; `None` when they do
    /// not make a valid name.
    pub fn from_folder(folder: &str, tag: &str) -> Option<ModelName> {
        let parsed = ModelName::parse(&format!("{}:{tag}", folder.replace("%2F", "/"))).ok()?;
        (parsed.folder() == folder && parsed.tag == tag).then_some(parsed)
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
            "a%2Fb",
            "a:b/c",
        ] {
            assert!(ModelName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refusals_name_the_rule() {
        let rule = |text: &str| ModelName::parse(text).unwrap_err().to_string();
        assert!(
            rule("a b").contains("` ` is not allowed"),
            "{}",
            rule("a b")
        );
        assert!(rule("a//b").contains("none of them empty"));
        assert!(rule("a/.x").contains("may not start with `.`"));
        assert!(rule(&"x".repeat(129)).contains("at most 128"));
        assert!(rule("a:").contains("tag"));
    }

    #[test]
    fn every_name_has_its_own_folder() {
        let a_b = ModelName::parse("a:b").unwrap();
        let a_slash_b = ModelName::parse("a/b:c").unwrap();
        assert_eq!(a_b.folder(), "a");
        assert_eq!(a_slash_b.folder(), "a%2Fb");
        assert_eq!(ModelName::from_folder("a%2Fb", "c"), Some(a_slash_b));
        assert_eq!(ModelName::from_folder("a", "b"), Some(a_b));
        // Folders no name maps to are not names.
        assert_eq!(ModelName::from_folder("a/b", "c"), None);
        assert_eq!(ModelName::from_folder("A", "b"), None);
        assert_eq!(ModelName::from_folder("a", ".tmp123"), None);
        let longest = ModelName::parse(&["abc"; 32].join("/")).unwrap();
        assert!(longest.folder().len() <= 255);
    }
}
