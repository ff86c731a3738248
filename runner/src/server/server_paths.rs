//! Server paths out of what clients read: an error's text may name a file of the store, the
//! cache or the system (the store's I/O errors, a checkpoint's loader, MLX), which tells a
//! client how the server's disk is laid out. Every error a response carries passes through
//! [`hide`] at the edge; the log keeps the whole text.
//!
//! A path is hidden when it is absolute and its first folder is one this machine's root
//! holds, or one that operating systems commonly keep there. The first rule covers a store
//! or cache anywhere (`/work/…`, `/data/…`); the second keeps the answer the same whether or
//! not such a folder exists here, so the text does not tell that either. API routes
//! (`/api/chat`, `/v1/messages`) and JSON pointers (`/properties/name`) name no such folder
//! and stay as written. What remains of a hidden path is its last part when it has three or
//! more (a blob or file name the client can act on), else nothing.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::OnceLock;

/// What replaces the folders of a hidden path.
const HIDDEN: &str = "<server path>";

/// Folders that operating systems keep at the root (Linux, macOS and the BSDs).
const COMMON_ROOT_FOLDERS: &[&str] = &[
    "Applications",
    "Library",
    "System",
    "Users",
    "Volumes",
    "bin",
    "boot",
    "cores",
    "dev",
    "etc",
    "home",
    "lib",
    "lib64",
    "media",
    "mnt",
    "nix",
    "opt",
    "private",
    "proc",
    "root",
    "run",
    "sbin",
    "snap",
    "srv",
    "sys",
    "tmp",
    "usr",
    "var",
];

/// `message` with every server path hidden; borrowed when it names none.
pub fn hide(message: &str) -> Cow<'_, str> {
    hide_under(message, root_folders())
}

fn root_folders() -> &'static HashSet<String> {
    static FOLDERS: OnceLock<HashSet<String>> = OnceLock::new();
    FOLDERS.get_or_init(|| {
        let mut folders: HashSet<String> =
            COMMON_ROOT_FOLDERS.iter().map(|f| f.to_string()).collect();
        if let Ok(entries) = std::fs::read_dir("/") {
            folders.extend(
                entries
                    .flatten()
                    .filter_map(|entry| entry.file_name().into_string().ok()),
            );
        }
        folders
    })
}

fn hide_under<'a>(message: &'a str, root_folders: &HashSet<String>) -> Cow<'a, str> {
    let mut out = String::new();
    // Bytes of `message` already copied to `out`.
    let mut copied = 0;
    let mut previous: Option<char> = None;
    let mut chars = message.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let starts_a_path = c == '/' && previous.is_none_or(opens_a_path);
        previous = Some(c);
        if !starts_a_path {
            continue;
        }
        let rest = &message[start..];
        let length = rest.find(ends_a_path).unwrap_or(rest.len());
        // A sentence's full stop is not part of the path.
        let path = rest[..length].trim_end_matches('.');
        let parts: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
        if !parts
            .first()
            .is_some_and(|first| root_folders.contains(*first))
        {
            continue;
        }
        out.push_str(&message[copied..start]);
        out.push_str(HIDDEN);
        if let [_, _, .., last] = parts.as_slice() {
            out.push('/');
            out.push_str(last);
        }
        copied = start + path.len();
        while chars.peek().is_some_and(|&(at, _)| at < copied) {
            previous = chars.next().map(|(_, c)| c);
        }
    }
    if copied == 0 {
        return Cow::Borrowed(message);
    }
    out.push_str(&message[copied..]);
    Cow::Owned(out)
}

/// Whether a `/` after `c` may begin a path: at the start of a word or of a quotation.
fn opens_a_path(c: char) -> bool {
    c.is_whitespace() || "'\"`([{<=,;:".contains(c)
}

/// Whether `c` ends a path: the end of a word, a quotation or a clause.
fn ends_a_path(c: char) -> bool {
    c.is_whitespace() || "'\"`)]}>,;:".contains(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roots() -> HashSet<String> {
        ["home", "work", "etc", "tmp"]
            .iter()
            .map(|f| f.to_string())
            .collect()
    }

    fn hidden(message: &str) -> String {
        hide_under(message, &roots()).into_owned()
    }

    #[test]
    fn store_and_system_paths_are_hidden_keeping_the_file_name() {
        assert_eq!(
            hidden("creating /work/store/manifests/registry/blocked: File exists (os error 17)"),
            "creating <server path>/blocked: File exists (os error 17)"
        );
        assert_eq!(
            hidden("`/etc/shadow`: not a checkpoint."),
            "`<server path>`: not a checkpoint."
        );
        assert_eq!(
            hidden("open /home/alice failed"),
            "open <server path> failed"
        );
        assert_eq!(
            hidden("reading file:///tmp/x/y/z.json"),
            "reading file:<server path>/z.json"
        );
        assert_eq!(
            hidden("/home/a/b/c and (/tmp/d/e/f.gguf)"),
            "<server path>/c and (<server path>/f.gguf)"
        );
    }

    #[test]
    fn routes_pointers_names_and_urls_stay_as_written() {
        for message in [
            "POST /api/chat expects JSON",
            "use /v1/messages instead",
            "schema at /properties/name/items is unsupported",
            "model `me/foo:v1` not found",
            "see https://example.com/home/page",
            "a/b/c is relative",
            "sha256:abc",
            "",
        ] {
            assert!(
                matches!(hide_under(message, &roots()), Cow::Borrowed(_)),
                "{message}"
            );
        }
    }

    proptest! {
        /// Whatever surrounds it, no folder path under a root folder survives.
        #[test]
        fn no_rooted_path_survives(
            before in "[a-z `(:=]{0,12}",
            folders in proptest::collection::vec("[a-zA-Z0-9._-]{1,8}", 1..5),
            after in "[ ,:)`.][a-z ]{0,12}",
        ) {
            let path = format!("/work/{}", folders.join("/"));
            let message = format!("{before} {path}{after}");
            let out = hidden(&message);
            prop_assert!(!out.contains("/work/"), "{message} -> {out}");
            prop_assert!(out.contains(HIDDEN));
        }

        /// Hiding never panics on any text, and what it leaves hides nothing more.
        #[test]
        fn hiding_is_total_and_settles(message in "\\PC{0,64}") {
            let once = hidden(&message);
            prop_assert_eq!(hidden(&once), once.clone());
        }
    }
}
