//! [`EgressStream`]: one outbound connection of an agent process, as a backend hands it
//! to the gateway ([`SandboxHost::egress`](super::SandboxHost::egress)). The backend
//! owns how it arrived (the Docker backend: a Unix connection PID 1 dialled per stream,
//! authenticated like the link); the gateway owns what happens to it.

use std::fmt;
use std::pin::Pin;

use beige_protocol::link::EgressEntry;
use tokio::io::{AsyncRead, AsyncWrite};

/// The reading half of an egress stream: bytes from the client in the sandbox.
pub type StreamReader = Pin<Box<dyn AsyncRead + Send>>;
/// The writing half of an egress stream: bytes to the client in the sandbox.
pub type StreamWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// One outbound connection from inside an agent's sandbox, before anything was decided
/// about it. `head` holds what the client sent before the stream was handed over (at
/// least its request head, for the explicit proxy); `reader` continues from there.
#[non_exhaustive]
pub struct EgressStream {
    /// Which of PID 1's listeners took the connection in.
    pub entry: EgressEntry,
    /// The target name PID 1 read (a hint: the gateway parses `head` itself).
    pub name: Option<String>,
    /// The target port PID 1 read.
    pub port: u16,
    /// The client's first bytes, verbatim.
    pub head: Vec<u8>,
    /// The rest of what the client sends.
    pub reader: StreamReader,
    /// Where the answer to the client goes.
    pub writer: StreamWriter,
    /// The boot of the sandbox's PID 1 the stream came from.
    pub boot_id: String,
}

impl EgressStream {
    /// A stream as a backend hands it over.
    pub fn new(
        entry: EgressEntry,
        name: Option<String>,
        port: u16,
        head: Vec<u8>,
        reader: StreamReader,
        writer: StreamWriter,
        boot_id: String,
    ) -> Self {
        Self {
            entry,
            name,
            port,
            head,
            reader,
            writer,
            boot_id,
        }
    }
}

impl fmt::Debug for EgressStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressStream")
            .field("entry", &self.entry)
            .field("name", &self.name)
            .field("port", &self.port)
            .field("head_bytes", &self.head.len())
            .field("boot_id", &self.boot_id)
            .finish_non_exhaustive()
    }
}
