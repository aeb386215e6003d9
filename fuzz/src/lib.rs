//! The shim's DNS stub, compiled on its own for the fuzz targets: `dns.rs` of beige-shim
//! is included as is, with the two things it needs from the rest of the shim replaced
//! by stand-ins that never run in a fuzz target (logging, and binding its sockets).
//! Everything else the targets fuzz is beige-core's own public API.

/// Stand-in for the shim's log: the fuzz targets print nothing.
pub mod link {
    /// Drops the message.
    pub fn log(message: std::fmt::Arguments<'_>) {
        let _ = message;
    }
}

/// Stand-in for the shim's socket calls: the fuzz targets bind nothing.
pub mod sys {
    use std::io;
    use std::net::Ipv4Addr;
    use std::os::fd::OwnedFd;

    /// Always fails: no sockets in a fuzz target.
    pub fn bind_udp(_ip: Ipv4Addr, _port: u16) -> io::Result<OwnedFd> {
        Err(io::Error::other("no sockets in the fuzz build"))
    }

    /// Always fails: no sockets in a fuzz target.
    pub fn listen_tcp(_ip: Ipv4Addr, _port: u16) -> io::Result<OwnedFd> {
        Err(io::Error::other("no sockets in the fuzz build"))
    }
}

/// The shim's DNS stub, as the sandbox runs it.
#[allow(dead_code, clippy::all)]
#[path = "../../beige-shim/src/dns.rs"]
pub mod dns;
