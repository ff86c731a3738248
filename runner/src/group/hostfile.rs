//! The hostfile that names a group's processes, in either JSON `mlx.launch` reads:
//!
//! - its own hostfile: a list of hosts, `[{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...]`, one
//!   rank per host in order. An address without a port takes `mlx.launch`'s: 32323 for the
//!   first, one more for each after it;
//! - the ring backend's `MLX_HOSTFILE`: a list, in rank order, of each rank's `"ip:port"`
//!   addresses, `[["127.0.0.1:5000"], ["127.0.0.1:5001"]]`.
//!
//! Both become the ring's list ([`Hostfile::ring_json`]), which is what MLX reads. Rank 0
//! also listens for its workers' control connections ([`Hostfile::control`]), one port below
//! its first ring address.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde_json::Value;

/// `mlx.launch`'s first ring port (its `--starting-port`).
pub const STARTING_PORT: u16 = 32323;

/// The most ranks a hostfile may name.
const MAX_RANKS: usize = 256;

/// The largest hostfile read.
const MAX_BYTES: u64 = 1 << 20;

/// Every rank's ring addresses, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostfile {
    ranks: Vec<Vec<SocketAddr>>,
}

impl Hostfile {
    /// Reads and checks the hostfile at `path`; the error says what is wrong with it.
    pub fn read(path: &Path) -> Result<Hostfile, String> {
        let shown = path.display();
        let size = std::fs::metadata(path)
            .map_err(|e| format!("reading the hostfile {shown}: {e}"))?
            .len();
        if size > MAX_BYTES {
            return Err(format!(
                "the hostfile {shown} is {size} bytes; a hostfile is at most {MAX_BYTES}"
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the hostfile {shown}: {e}"))?;
        Hostfile::parse(&text).map_err(|e| format!("the hostfile {shown}: {e}"))
    }

    /// Parses a hostfile's text (see the module docs).
    pub fn parse(text: &str) -> Result<Hostfile, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| format!("is not JSON ({e})"))?;
        let Value::Array(entries) = value else {
            return Err("is not a list of hosts".into());
        };
        if entries.len() < 2 {
            return Err(format!(
                "names {} process{}; a group needs at least two",
                entries.len(),
                if entries.len() == 1 { "" } else { "es" }
            ));
        }
        if entries.len() > MAX_RANKS {
            return Err(format!(
                "names {} processes; at most {MAX_RANKS} are served",
                entries.len()
            ));
        }
        let mut ranks = Vec::with_capacity(entries.len());
        for (rank, entry) in entries.iter().enumerate() {
            let addresses = match entry {
                Value::Object(host) => {
                    let ips = host
                        .get("ips")
                        .and_then(Value::as_array)
                        .ok_or_else(|| format!("host {rank} has no `ips` list of addresses"))?;
                    ips.iter()
                        .map(|ip| address(ip, rank, Some(STARTING_PORT as usize + rank)))
                        .collect::<Result<Vec<_>, _>>()?
                }
                Value::Array(addresses) => addresses
                    .iter()
                    .map(|a| address(a, rank, None))
                    .collect::<Result<Vec<_>, _>>()?,
                _ => {
                    return Err(format!(
                        "rank {rank} is neither a host (`{{\"ssh\": ..., \"ips\": [...]}}`) \
                         nor a list of \"ip:port\" addresses"
                    ));
                }
            };
            if addresses.is_empty() {
                return Err(format!("rank {rank} has no address"));
            }
            ranks.push(addresses);
        }
        let mut seen = std::collections::HashSet::new();
        for (rank, addresses) in ranks.iter().enumerate() {
            for address in addresses {
                if !seen.insert(*address) {
                    return Err(format!("rank {rank} reuses the address {address}"));
                }
            }
        }
        Ok(Hostfile { ranks })
    }

    /// How many processes the group holds.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Rank `rank`'s first ring address.
    pub fn address(&self, rank: usize) -> Option<SocketAddr> {
        self.ranks.get(rank).and_then(|a| a.first().copied())
    }

    /// Rank `rank`'s ring addresses (none past the last rank).
    pub fn addresses(&self, rank: usize) -> Vec<SocketAddr> {
        self.ranks.get(rank).cloned().unwrap_or_default()
    }

    /// The ring backend's `MLX_HOSTFILE`: each rank's addresses, in rank order.
    pub fn ring_json(&self) -> String {
        let ranks: Vec<Vec<String>> = self
            .ranks
            .iter()
            .map(|addresses| addresses.iter().map(SocketAddr::to_string).collect())
            .collect();
        serde_json::Value::from(ranks).to_string()
    }

    /// Where rank 0 listens for its workers: its first ring address, one port below.
    pub fn control(&self) -> Result<SocketAddr, String> {
        let first = self.ranks[0][0];
        let port = first
            .port()
            .checked_sub(1)
            .filter(|&p| p > 0)
            .ok_or_else(|| {
                format!(
                    "rank 0's port {} leaves no port below it for control",
                    first.port()
                )
            })?;
        Ok(SocketAddr::new(first.ip(), port))
    }
}

/// One address of `rank`: `"ip:port"`, or a bare IP taking `default_port` where the format
/// gives one. The ring connects to IPs, so a host name is refused.
fn address(value: &Value, rank: usize, default_port: Option<usize>) -> Result<SocketAddr, String> {
    let text = value
        .as_str()
        .ok_or_else(|| format!("rank {rank}'s addresses must be strings"))?;
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    match (text.parse::<IpAddr>(), default_port) {
        (Ok(ip), Some(port)) => {
            let port = u16::try_from(port)
                .map_err(|_| format!("rank {rank}'s default port {port} is out of range"))?;
            Ok(SocketAddr::new(ip, port))
        }
        _ => Err(format!(
            "rank {rank}'s address `{text}` is not an IP address with a port (\"10.0.0.1:32323\"); \
             the ring backend connects to addresses, not host names"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx_launch_hosts_take_consecutive_ports_from_the_starting_port() {
        let file = Hostfile::parse(
            r#"[{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]"#,
        )
        .unwrap();
        assert_eq!(file.size(), 2);
        assert_eq!(
            file.ring_json(),
            r#"[["10.0.0.1:32323"],["10.0.0.2:32324"]]"#
        );
        assert_eq!(file.control().unwrap().to_string(), "10.0.0.1:32322");
    }

    #[test]
    fn a_ring_hostfile_is_kept_as_it_is() {
        let text = r#"[["127.0.0.1:5000"],["127.0.0.1:5001"],["127.0.0.1:5002"]]"#;
        let file = Hostfile::parse(text).unwrap();
        assert_eq!(file.ring_json(), text);
        assert_eq!(file.address(2).unwrap().port(), 5002);
    }

    #[test]
    fn malformed_hostfiles_are_refused_saying_why() {
        for (text, says) in [
            ("{", "is not JSON"),
            (r#"{"ssh": "a"}"#, "is not a list of hosts"),
            (r#"[["127.0.0.1:5000"]]"#, "at least two"),
            (r#"[{"ssh": "a"}, {"ssh": "b"}]"#, "no `ips` list"),
            (r#"[["mac1:5000"], ["127.0.0.1:5001"]]"#, "not host names"),
            (
                r#"[["127.0.0.1:5000"], ["127.0.0.1:5000"]]"#,
                "reuses the address",
            ),
            (r#"[["127.0.0.1:5000"], []]"#, "rank 1 has no address"),
            (r#"[["127.0.0.1:5000"], 7]"#, "neither a host"),
            (r#"[["127.0.0.1:1"], ["127.0.0.1:5001"]]"#, "no port below"),
        ] {
            let error = Hostfile::parse(text)
                .and_then(|f| f.control().map(|_| f))
                .unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
