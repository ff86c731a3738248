//! Ending the collectives a group has in flight ([`sever`]). MLX's ring backend waits on its
//! peers with no timeout and no way to cancel: once a rank is gone, the ranks left may each
//! wait on another that is alive but waits too, and the collective never ends. Shutting down
//! this process's ring connections fails every collective in flight here, within a few of the
//! ring's retries, and the peers' too, whose connections to this process close.
//!
//! The ring's sockets are MLX's, so they are found among this process's descriptors by their
//! addresses (bound to one of this rank's ring addresses, or connected to another rank's), and
//! shut down, not closed: their descriptors stay MLX's to close when the group goes.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::group::hostfile::Hostfile;

/// The most descriptors looked at: far more than a server holds open.
const MAX_DESCRIPTORS: libc::c_int = 1 << 16;

/// Shuts down every ring connection this process (`rank` of `hostfile`) holds; how many.
pub fn sever(hostfile: &Hostfile, rank: usize) -> usize {
    let own = hostfile.addresses(rank);
    let others: Vec<SocketAddr> = (0..hostfile.size())
        .filter(|&r| r != rank)
        .flat_map(|r| hostfile.addresses(r))
        .collect();
    let mut severed = 0;
    for fd in 0..descriptor_limit() {
        let (Some(local), Some(peer)) = (address_of(fd, Side::Local), address_of(fd, Side::Peer))
        else {
            continue;
        };
        if own.contains(&local) || others.contains(&peer) {
            // SAFETY: `shutdown` on a descriptor this process holds; it closes nothing, so no
            // descriptor is freed under MLX's threads.
            #[allow(unsafe_code)]
            let done = unsafe { libc::shutdown(fd, libc::SHUT_RDWR) } == 0;
            severed += usize::from(done);
        }
    }
    severed
}

/// How many descriptors this process may hold, up to [`MAX_DESCRIPTORS`].
fn descriptor_limit() -> libc::c_int {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the struct it is given.
    #[allow(unsafe_code)]
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    if !read {
        return 1024;
    }
    libc::c_int::try_from(limit.rlim_cur)
        .unwrap_or(MAX_DESCRIPTORS)
        .min(MAX_DESCRIPTORS)
}

enum Side {
    Local,
    Peer,
}

/// A socket descriptor's address on `side`; `None` for another kind of descriptor, or a
/// socket not bound or connected over IP.
fn address_of(fd: libc::c_int, side: Side) -> Option<SocketAddr> {
    // SAFETY: all zeroes is a valid `sockaddr_storage`.
    #[allow(unsafe_code)]
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let address = (&raw mut storage).cast::<libc::sockaddr>();
    // SAFETY: both calls write at most `length` bytes into `storage` and fail on a descriptor
    // that is not a socket.
    #[allow(unsafe_code)]
    let read = unsafe {
        match side {
            Side::Local => libc::getsockname(fd, address, &mut length),
            Side::Peer => libc::getpeername(fd, address, &mut length),
        }
    } == 0;
    if !read {
        return None;
    }
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says `storage` holds a `sockaddr_in`.
            #[allow(unsafe_code)]
            let v4 = unsafe { *(&raw const storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(v4.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says `storage` holds a `sockaddr_in6`.
            #[allow(unsafe_code)]
            let v6 = unsafe { *(&raw const storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(v6.sin6_port),
                v6.sin6_flowinfo,
                v6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn severs_the_connections_to_other_ranks_and_no_others() {
        let ring = TcpListener::bind("127.0.0.1:0").unwrap();
        let unrelated = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = ring.local_addr().unwrap();
        // This process is rank 0 of a two-rank group whose rank 1 listens at `peer`.
        let hostfile = Hostfile::parse(&format!(r#"[["127.0.0.1:9"],["{peer}"]]"#)).unwrap();
        let to_rank_1 = TcpStream::connect(peer).unwrap();
        let (mut at_rank_1, _) = ring.accept().unwrap();
        let other = TcpStream::connect(unrelated.local_addr().unwrap()).unwrap();
        let (mut at_other, _) = unrelated.accept().unwrap();
        other.set_nonblocking(true).unwrap();
        at_other.set_nonblocking(true).unwrap();

        assert_eq!(sever(&hostfile, 0), 1);
        let mut byte = [0u8; 1];
        assert_eq!(
            at_rank_1.read(&mut byte).unwrap(),
            0,
            "the ring connection is shut"
        );
        let still_open = at_other.read(&mut byte);
        assert!(
            matches!(&still_open, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "an unrelated connection was shut: {still_open:?}"
        );
        drop(to_rank_1);
    }
}
