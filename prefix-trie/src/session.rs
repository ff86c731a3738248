//! [`SessionId`]: the name of one live request, from `begin` to `close` or `abandon`.

use std::fmt;

/// Names one live request (a session) from `begin` to `close` or `abandon`. Ids are never
/// reused, so an ended session's id stays unknown to the trie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub(crate) u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}
