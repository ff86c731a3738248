//! Which `Host` a request may name: the defense against DNS rebinding (Ollama's
//! CVE-2024-28224). A page on `attacker.example` whose DNS answer later turns to `127.0.0.1`
//! talks to this server as its own origin, so neither CORS nor the origin check stops it; its
//! requests still say `Host: attacker.example`. Allowed: any IP address (rebinding needs a name
//! the attacker's DNS answers for; a browser sending an address connected to that address
//! itself), `localhost` and `*.localhost` (browsers resolve them to loopback without DNS), a
//! request with no `Host` (HTTP/1.0 clients; browsers always send one), the name the server
//! was told to bind, and `MLXKIT_HOSTS`: comma-separated names, `*.domain` for a domain's
//! subdomains, or `*` for any (which turns the defense off).

use std::net::{Ipv4Addr, Ipv6Addr};

/// The environment variable naming extra allowed host names.
pub const HOSTS_VARIABLE: &str = "MLXKIT_HOSTS";

/// The host names a request may name besides addresses and `localhost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Lower-case names, `*.domain` patterns, or `*`.
    extra: Vec<String>,
}

impl AllowedHosts {
    /// The defaults plus `list`'s comma-separated names (`MLXKIT_HOSTS`'s format).
    pub fn with_extra(list: &str) -> AllowedHosts {
        let mut hosts = AllowedHosts::default();
        for name in list.split(',') {
            hosts.add(name);
        }
        hosts
    }

    /// Allows `name` too (a name the server binds, say); ports and blanks are ignored.
    pub fn add(&mut self, name: &str) {
        let name = name.trim().to_ascii_lowercase();
        let name = split_port(&name).unwrap_or(&name);
        let name = name.strip_suffix('.').unwrap_or(name);
        if !name.is_empty() && !self.extra.iter().any(|e| e == name) {
            self.extra.push(name.to_string());
        }
    }

    /// Whether a request may name `host` (a `Host` header's value, port included or not).
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        if host.is_empty() {
            return true;
        }
        let Some(name) = split_port(&host) else {
            return false;
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        if is_address(name) || name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        self.extra.iter().any(|allowed| {
            allowed == "*"
                || allowed == name
                || allowed
                    .strip_prefix("*.")
                    .is_some_and(|domain| name.ends_with(&format!(".{domain}")))
        })
    }
}

/// An IPv4 address, or an IPv6 one in brackets.
fn is_address(host: &str) -> bool {
    host.parse::<Ipv4Addr>().is_ok()
        || host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|h| h.parse::<Ipv6Addr>().is_ok())
}

/// The host of an authority (`host`, `host:port`, `[v6]`, `[v6]:port`), or `None` when it is
/// malformed (a port that is not a number, user info, a path).
pub fn split_port(authority: &str) -> Option<&str> {
    if authority.contains(['/', '@', '?', '#', ' ']) {
        return None;
    }
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, after) = authority.split_at(end + 1);
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    (port_ok && !host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_are_allowed_and_rebound_names_are_not() {
        let hosts = AllowedHosts::default();
        for host in [
            "localhost",
            "localhost:11434",
            "LOCALHOST.:11434",
            "ollama.localhost:11434",
            "127.0.0.1:11434",
            "127.0.0.1",
            "[::1]:11434",
            "[::1]",
            "192.168.1.20:11434",
            "0.0.0.0:11434",
            "",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
        for host in [
            "attacker.example:11434",
            "attacker.example",
            "localhost.attacker.example",
            "127.0.0.1.nip.io:11434",
            "localhost:port",
            "localhost:11434:1",
            "evil@localhost",
            "[::1",
        ] {
            assert!(!hosts.allows(host), "{host}");
        }
    }

    #[test]
    fn the_operator_list_adds_names_domains_or_everything() {
        let mut hosts = AllowedHosts::with_extra("box.lan, *.corp.example");
        hosts.add("studio.local:11434");
        assert!(hosts.allows("box.lan:11434"));
        assert!(hosts.allows("Studio.Local:11434"));
        assert!(hosts.allows("gpu.corp.example"));
        assert!(!hosts.allows("corp.example"));
        assert!(!hosts.allows("evilcorp.example"));
        assert!(!hosts.allows("attacker.example"));
        assert!(AllowedHosts::with_extra("*").allows("attacker.example:1"));
    }

    #[test]
    fn authorities_split_into_their_host() {
        assert_eq!(split_port("a:1"), Some("a"));
        assert_eq!(split_port("[::1]:8"), Some("[::1]"));
        assert_eq!(split_port("[::1]"), Some("[::1]"));
        assert_eq!(split_port("a:"), None);
        assert_eq!(split_port("[::1]x"), None);
        assert_eq!(split_port(":80"), None);
    }
}
