//! Which browser pages may call the API, by the `Origin` their requests carry. Allowed by
//! default, as Ollama allows them: pages on this machine (`http`/`https` on `localhost`, any
//! `*.localhost`, `127.0.0.0/8`, `[::1]` and `0.0.0.0`, any port) and the app schemes of
//! desktop shells (`app://`, `file://`, `tauri://`, `vscode-webview://`, `vscode-file://`).
//! `MLXKIT_ORIGINS` adds more, comma separated: exact origins (`https://chat.example`),
//! patterns with `*` standing for any run of characters (`https://*.example`,
//! `chrome-extension://*`), or `*` alone for every origin. `null`, the origin of sandboxed
//! frames and of pages that hide their referrer, is allowed only when listed: any page can
//! make its requests say it.

/// The environment variable naming extra allowed origins.
pub const ORIGINS_VARIABLE: &str = "MLXKIT_ORIGINS";

const APP_SCHEMES: &[&str] = &[
    "app://",
    "file://",
    "tauri://",
    "vscode-webview://",
    "vscode-file://",
];

/// The origins allowed to call the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedOrigins {
    /// The operator's extra origins and patterns, lower-cased.
    extra: Vec<String>,
}

impl AllowedOrigins {
    /// The defaults plus `list`'s comma-separated origins and patterns (`MLXKIT_ORIGINS`'s
    /// format; blanks and trailing slashes are ignored).
    pub fn with_extra(list: &str) -> AllowedOrigins {
        AllowedOrigins {
            extra: list
                .split(',')
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .filter(|o| !o.is_empty())
                .collect(),
        }
    }

    /// Whether a page from `origin` may call the API.
    pub fn allows(&self, origin: &str) -> bool {
        let origin = origin.trim().to_ascii_lowercase();
        if self.extra.iter().any(|pattern| matches(pattern, &origin)) {
            return true;
        }
        if APP_SCHEMES.iter().any(|scheme| origin.starts_with(scheme)) {
            return true;
        }
        let Some(authority) = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
        else {
            return false;
        };
        crate::server::hosts::split_port(authority).is_some_and(is_local_host)
    }
}

/// A host name or address that is this machine however DNS answers: `localhost` and its
/// subdomains (browsers resolve them to loopback themselves), `127.0.0.0/8`, `::1`, and
/// `0.0.0.0` (which browsers connect to as this machine). `host` is lower-case, IPv6 in
/// brackets.
pub fn is_local_host(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host == "localhost" || host.ends_with(".localhost") || host == "[::1]" {
        return true;
    }
    host.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
fn matches(pattern: &str, text: &str) -> bool {
    let mut pieces = pattern.split('*');
    let Some(first) = pieces.next() else {
        return false;
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        // No `*`: the pattern is the whole text.
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pages_and_app_shells_are_allowed_and_others_are_not() {
        let origins = AllowedOrigins::default();
        for origin in [
            "http://localhost:3000",
            "https://localhost",
            "http://LOCALHOST:8080",
            "http://app.localhost:5173",
            "http://127.0.0.1:8080",
            "http://127.1.2.3",
            "http://[::1]:5173",
            "http://0.0.0.0",
            "tauri://localhost",
            "vscode-webview://abc",
        ] {
            assert!(origins.allows(origin), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "https://evil.example:11434",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:80",
            "http://localhost@evil.example",
            "http://[::2]",
            "ftp://localhost",
            "null",
            "",
        ] {
            assert!(!origins.allows(origin), "{origin}");
        }
    }

    #[test]
    fn the_operator_list_adds_exact_origins_patterns_or_everything() {
        let listed = AllowedOrigins::with_extra(" https://app.example/ , chrome-extension://*");
        assert!(listed.allows("https://app.example"));
        assert!(listed.allows("chrome-extension://abcdef"));
        assert!(!listed.allows("https://app.example.evil"));
        assert!(!listed.allows("http://app.example"));
        assert!(!listed.allows("null"));

        let subdomains = AllowedOrigins::with_extra("https://*.example.com");
        assert!(subdomains.allows("https://chat.example.com"));
        assert!(!subdomains.allows("https://example.com.evil"));

        assert!(AllowedOrigins::with_extra("null").allows("null"));
        assert!(AllowedOrigins::with_extra("*").allows("http://evil.example"));
    }

    #[test]
    fn patterns_match_whole_texts() {
        assert!(matches("a*c", "abc"));
        assert!(matches("a*c", "ac"));
        assert!(!matches("a*c", "abcd"));
        assert!(matches("*", "anything"));
        assert!(matches("a*b*c", "a-b-b-c"));
        assert!(!matches("abc", "abcd"));
    }
}
