//! Spawn streams over the shim link (protocol: [`beige_protocol::spawn`]): the gateway
//! side of a process of its own in the sandbox (an MCP server) whose stdin and stdout
//! are a connection of their own.
//!
//! [`LinkHub::spawn`] issues a one-time token, sends the `spawn` op and waits for the
//! connection that presents the token ([`LinkHub::accept_spawn`], reached from the Unix
//! listener after the peer check, so only PID 1 can open one). The op itself stays in
//! flight while the process runs: its result is the process's end ([`SpawnExit`]).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use beige_protocol::link::{encode, Carrier, Frame, FrameDecoder, LinkMessage};
use beige_protocol::op::{OpError, OpReply};
use beige_protocol::spawn::{SpawnExit, SpawnRequest, SPAWN_OP, TOKEN_HEX_LEN};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use super::{first_frame, LinkError, LinkHub};

/// How long the process's connection may take to arrive after the op was sent.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);
/// The op's time limit: a spawned process runs until it ends or its connection is
/// dropped, so in practice none.
const SPAWN_LIMIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A process started in the sandbox with [`LinkHub::spawn`]: its stdin (`writer`) and
/// stdout (`reader`), and its end.
pub struct SpawnedProcess {
    /// The process's stdout.
    pub reader: Pin<Box<dyn AsyncRead + Send>>,
    /// The process's stdin. Shutting it down gives the process end-of-file.
    pub writer: Pin<Box<dyn AsyncWrite + Send>>,
    /// How the process ended, when it has (or why the op was lost).
    pub exit: oneshot::Receiver<Result<SpawnExit, LinkError>>,
}

impl std::fmt::Debug for SpawnedProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnedProcess").finish_non_exhaustive()
    }
}

/// Why a spawn failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The link could not carry the op.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// PID 1 or the process's child refused or failed to start it (its message).
    #[error("{0}")]
    Refused(String),
    /// The process's connection never arrived.
    #[error("the process's connection did not arrive within {} s", OPEN_TIMEOUT.as_secs())]
    NoConnection,
}

/// A connection that opened for a pending spawn: its halves and the bytes read past
/// its `SpawnOpen`.
struct Opened {
    reader: Pin<Box<dyn AsyncRead + Send>>,
    writer: Pin<Box<dyn AsyncWrite + Send>>,
    early: Vec<u8>,
}

/// Spawns waiting for their connection, by token.
#[derive(Default)]
pub(super) struct PendingSpawns(Mutex<HashMap<String, Pending>>);

struct Pending {
    agent: String,
    id: String,
    tx: oneshot::Sender<Opened>,
}

impl std::fmt::Debug for PendingSpawns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingSpawns")
    }
}

impl PendingSpawns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Removes a pending spawn when its waiter gives up.
struct Unregister<'a> {
    hub: &'a LinkHub,
    token: String,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.hub.inner.spawns.lock().remove(&self.token);
    }
}

impl LinkHub {
    /// Starts `request.argv` in the agent's sandbox as a process of its own (the
    /// request's token is replaced by a fresh one) and returns its stdin and stdout as
    /// soon as its connection is up.
    pub async fn spawn(
        &self,
        agent: &str,
        mut request: SpawnRequest,
    ) -> Result<SpawnedProcess, SpawnError> {
        let mut token = [0u8; TOKEN_HEX_LEN / 2];
        rand::Rng::fill(&mut rand::thread_rng(), &mut token[..]);
        request.token = hex::encode(token);
        let id = self.new_id();
        let (open_tx, open_rx) = oneshot::channel();
        self.inner.spawns.lock().insert(
            request.token.clone(),
            Pending {
                agent: agent.to_string(),
                id: id.clone(),
                tx: open_tx,
            },
        );
        let _unregister = Unregister {
            hub: self,
            token: request.token.clone(),
        };
        let payload = serde_json::to_vec(&request)
            .map_err(|e| SpawnError::Refused(format!("cannot encode the request: {e}")))?;
        let (exit_tx, mut exit_rx) = oneshot::channel();
        let hub = self.clone();
        let agent_name = agent.to_string();
        let op_id = id.clone();
        tokio::spawn(async move {
            let result = hub
                .call(&agent_name, &op_id, SPAWN_OP, &payload, SPAWN_LIMIT, None)
                .await
                .map(|bytes| decode_exit(&bytes));
            let _ = exit_tx.send(result);
        });
        let opened = tokio::select! {
            opened = open_rx => opened.ok(),
            // The op ended before its connection came: it was refused or failed.
            ended = &mut exit_rx => {
                return Err(match ended {
                    Ok(Ok(exit)) => SpawnError::Refused(exit_message(&exit)),
                    Ok(Err(e)) => SpawnError::Link(e),
                    Err(_) => SpawnError::Link(LinkError::NotConnected),
                });
            }
            _ = tokio::time::sleep(OPEN_TIMEOUT) => None,
        };
        let Some(opened) = opened else {
            return Err(SpawnError::NoConnection);
        };
        let reader: Pin<Box<dyn AsyncRead + Send>> = if opened.early.is_empty() {
            opened.reader
        } else {
            Box::pin(tokio::io::AsyncReadExt::chain(
                std::io::Cursor::new(opened.early),
                opened.reader,
            ))
        };
        Ok(SpawnedProcess {
            reader,
            writer: opened.writer,
            exit: exit_rx,
        })
    }

    /// A spawn stream's hello was read (the peer is PID 1, checked by the listener):
    /// check it belongs to the link that is up, read its `SpawnOpen` and hand the
    /// connection to the spawn waiting for its token. Anything else is refused and
    /// audited.
    pub(super) async fn accept_spawn<R, W>(
        &self,
        agent: &str,
        carrier: Carrier,
        boot_id: String,
        mut decoder: FrameDecoder,
        mut reader: R,
        mut writer: W,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let open = first_frame(&mut decoder, &mut reader).await;
        let refusal = match (
            self.stream_refusal(agent, carrier, &boot_id, "spawn"),
            &open,
        ) {
            (Some(why), _) => Some(why),
            (
                None,
                Some(Frame {
                    message: LinkMessage::SpawnOpen { id, token },
                    ..
                }),
            ) => {
                let mut spawns = self.inner.spawns.lock();
                match spawns.get(token) {
                    Some(p) if p.agent == agent && &p.id == id => {
                        let pending = spawns.remove(token);
                        drop(spawns);
                        if let Some(pending) = pending {
                            let _ = pending.tx.send(Opened {
                                reader: Box::pin(reader),
                                writer: Box::pin(writer),
                                early: decoder.into_remaining(),
                            });
                        }
                        return;
                    }
                    _ => Some("the spawn stream's token is not one issued for it".to_string()),
                }
            }
            (None, _) => Some("the spawn stream did not open".to_string()),
        };
        let reason = refusal.unwrap_or_default();
        self.reject(agent, None, None, &reason).await;
        let _ = writer
            .write_all(&encode(&LinkMessage::Refused { reason }, b""))
            .await;
    }
}

/// The process's end from the op's reply: a [`SpawnExit`], or an op error PID 1 gave
/// instead (as a `SpawnExit` with its message).
fn decode_exit(bytes: &[u8]) -> SpawnExit {
    if let Ok(OpReply::Error(OpError { message, .. })) = serde_json::from_slice(bytes) {
        return SpawnExit {
            error: Some(message),
            ..SpawnExit::default()
        };
    }
    serde_json::from_slice(bytes).unwrap_or_else(|e| SpawnExit {
        error: Some(format!(
            "the sandbox's reply to the spawn is unreadable: {e}"
        )),
        ..SpawnExit::default()
    })
}

/// What a process that ended before it was connected says about why.
pub(crate) fn exit_message(exit: &SpawnExit) -> String {
    if let Some(e) = &exit.error {
        return e.clone();
    }
    let how = match (exit.exit_code, exit.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".to_string(),
    };
    let tail = exit.stderr_tail.trim();
    if tail.is_empty() {
        format!("the process {how}")
    } else {
        format!("the process {how}; its stderr ends with: {tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_and_errors_are_decoded() {
        let exit = decode_exit(br#"{"exitCode":3,"stderrTail":"no such file"}"#);
        assert_eq!(exit.exit_code, Some(3));
        assert_eq!(
            exit_message(&exit),
            "the process exited with code 3; its stderr ends with: no such file"
        );
        let op_error = decode_exit(br#"{"result":"error","kind":"io","message":"too many"}"#);
        assert_eq!(op_error.error.as_deref(), Some("too many"), "{op_error:?}");
        let junk = decode_exit(b"garbage");
        assert!(junk.error.unwrap().contains("unreadable"));
    }
}
