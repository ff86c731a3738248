//! Who may call the server, as the operator set it: the browser origins and host names allowed
//! besides this machine's, and the API key, if any. Read once at start from `MLXKIT_ORIGINS`,
//! `MLXKIT_HOSTS` and `MLXKIT_API_KEY`; `guard`, `cors` and `api_key` apply it.

use crate::server::api_key::{API_KEY_VARIABLE, ApiKey};
use crate::server::hosts::{AllowedHosts, HOSTS_VARIABLE};
use crate::server::origins::{AllowedOrigins, ORIGINS_VARIABLE};

/// The access settings. The default lets in this machine only, with no key.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Browser origins allowed to call the API.
    pub origins: AllowedOrigins,
    /// Host names requests may name.
    pub hosts: AllowedHosts,
    /// The key every request but `/health` must carry, when set.
    pub api_key: Option<ApiKey>,
}

impl Access {
    /// The settings the environment gives.
    pub fn from_env() -> Access {
        let var = |name: &str| std::env::var(name).unwrap_or_default();
        Access {
            origins: AllowedOrigins::with_extra(&var(ORIGINS_VARIABLE)),
            hosts: AllowedHosts::with_extra(&var(HOSTS_VARIABLE)),
            api_key: ApiKey::new(&var(API_KEY_VARIABLE)),
        }
    }
}
