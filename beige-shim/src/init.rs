//! The `init` role: PID 1 of a sandbox container.
//!
//! `beige-shim init [--agent-user UID:GID] [--link unix|attach|off]
//! [--egress proxy=PORT[,dns=synthetic][,transparent=PORT+PORT…]]`
//!
//! It always owns the container's process lifetime: one single-threaded `poll(2)` loop
//! reads signals from a signalfd, reaps every child and orphan re-parented to it,
//! forwards termination signals to all other processes of the container, and after
//! SIGTERM or SIGINT exits once they are gone (or after [`SHUTDOWN_GRACE`], killing the
//! rest).
//!
//! With `--agent-user` (the container runs as root with only SETUID, SETGID, KILL and
//! SETPCAP), it also hardens itself and, unless `--link off`, holds the link to the
//! gateway and runs core-tool operations as that user ([`crate::link`]):
//!
//! - first thing, it makes itself non-dumpable and ignores SIGPIPE; it never reads
//!   secrets from its environment and never execs;
//! - as PID 1 it ignores signals sent from inside the container (`si_pid` ≠ 0) except
//!   SIGCHLD: Docker and the kubelet signal from outside the PID namespace, where the
//!   sender shows as 0;
//! - `--link attach` moves stdin and stdout (the link) and stderr (its own log) to high
//!   close-on-exec descriptors and reopens 0, 1 and 2 on `/dev/null` before anything
//!   else runs, so no child can reach them;
//! - `--link unix` (the default) dials [`CTL_SOCKET_PATH`] (`--link-socket PATH`
//!   overrides it, for tests);
//! - `--egress proxy=PORT` (3128 in production, 0 for a port the kernel picks) runs the
//!   explicit egress proxy on `127.0.0.1:PORT` ([`crate::egress`]), which relays each
//!   client over its own connection to the link's socket. Its listener is bound before
//!   the link is dialled and before any child runs. Over `--link attach` the listener is
//!   bound too, but every client gets a `503` (egress does not run over attach yet).
//!   Further keys, comma-separated, need `proxy=` too:
//!   - `dns=synthetic` (or `synthetic-all`, the same here) runs the DNS stub on UDP and
//!     TCP `127.0.0.1:53` ([`crate::dns`]), which answers every `A` query with a
//!     synthetic address from `127.77.0.0/16`; the proxy maps such an address in a
//!     request back to its name;
//!   - `transparent=80+443` (ports joined by `+`) listens on `0.0.0.0:PORT` for each
//!     port and relays a client that dialled a synthetic address to the gateway as a
//!     transparent stream for its name ([`crate::egress`]); any other client is closed.
//!
//!   All of these are bound before the link is dialled; one that cannot be bound is
//!   logged and left out (below port 1024 PID 1 relies on the container's sysctl
//!   `net.ipv4.ip_unprivileged_port_start=0`, as it lacks `CAP_NET_BIND_SERVICE`).
//!   Other keys, and other `dns=` modes, are ignored with a warning.
//!
//! Without `--agent-user`, or with `--link off`, there is no link (root sandboxes), and
//! `--egress` is ignored with a warning.
//! Arguments from the first unknown one on are ignored with a warning: Docker appends an
//! image's CMD to the entrypoint.
//!
//! When it is not PID 1 (for example behind Docker's `--init`, or in tests), it does not
//! forward signals — `kill(-1)` would then reach far more than the container — nor
//! filter them by sender, and simply exits on SIGTERM or SIGINT, leaving the real init
//! to clean up.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use beige_protocol::link::CTL_SOCKET_PATH;

use crate::ca;
use crate::dns::{self, DnsListener};
use crate::egress::{self, Egress, ProxyListener, TransparentListener, Upstream};
use crate::link::{self, log, CarrierSpec, Link, LinkConfig};
use crate::privdrop::{AgentUser, PrivDrop};
use crate::sys::{self, SignalFd, SignalSet};

/// How long to wait for other processes after a SIGTERM before killing them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// While shutting down, how often to look whether other processes still exist. Exec'd
/// processes are not our children, so their exit sends us no SIGCHLD.
const SHUTDOWN_POLL: Duration = Duration::from_millis(100);

/// Exit code for unusable arguments.
const EXIT_USAGE: i32 = 2;

/// Signals forwarded to every other process of the container.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Which carrier the link uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkMode {
    Unix,
    Attach,
    Off,
}

/// The value of `--egress`: `key=value` pairs separated by commas.
#[derive(Debug, Default, PartialEq, Eq)]
struct EgressOptions {
    /// `proxy=PORT`: the explicit proxy's port on 127.0.0.1.
    proxy: Option<u16>,
    /// `dns=synthetic` (or `synthetic-all`): the DNS stub on 127.0.0.1:53.
    dns: bool,
    /// `transparent=PORT+PORT…`: the transparent listeners' ports on 0.0.0.0.
    transparent: Vec<u16>,
    /// `ca=<base64url DER>`: the gateway's egress CA, installed in [`ca::CA_DIR`].
    ca: Option<Vec<u8>>,
    /// Pairs of other keys (or values), not supported by this shim.
    ignored: Vec<String>,
}

impl EgressOptions {
    fn parse(value: &str) -> Result<Self, String> {
        let mut options = EgressOptions::default();
        for pair in value.split(',') {
            let Some((key, val)) = pair.split_once('=') else {
                return Err(format!("--egress: expected key=value pairs, got {pair:?}"));
            };
            match key {
                "proxy" => {
                    let port = val
                        .parse()
                        .map_err(|_| format!("--egress: proxy: expected a port, got {val:?}"))?;
                    options.proxy = Some(port);
                }
                "dns" if matches!(val, "synthetic" | "synthetic-all") => options.dns = true,
                "transparent" => {
                    options.transparent = val
                        .split('+')
                        .map(|p| p.parse::<u16>().ok().filter(|&p| p != 0))
                        .collect::<Option<Vec<u16>>>()
                        .ok_or_else(|| {
                            format!(
                                "--egress: transparent: expected ports joined by +, got {val:?}"
                            )
                        })?;
                    options.transparent.sort_unstable();
                    options.transparent.dedup();
                }
                "ca" => {
                    options.ca = Some(ca::decode_flag(val).ok_or_else(|| {
                        "--egress: ca: expected a certificate in unpadded base64url".to_string()
                    })?);
                }
                _ => options.ignored.push(pair.to_string()),
            }
        }
        Ok(options)
    }
}

/// The parsed arguments of `init`.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    agent_user: Option<AgentUser>,
    link: LinkMode,
    socket: PathBuf,
    egress: Option<EgressOptions>,
    /// Arguments from the first unknown one on.
    ignored: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut options = Options {
            agent_user: None,
            link: LinkMode::Unix,
            socket: PathBuf::from(CTL_SOCKET_PATH),
            egress: None,
            ignored: Vec::new(),
        };
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let mut value = |flag: &str| {
                rest.next()
                    .ok_or_else(|| format!("{flag} needs a value"))
                    .cloned()
            };
            match arg.as_str() {
                "--agent-user" => {
                    let user = value(arg)?;
                    options.agent_user =
                        Some(user.parse().map_err(|e| format!("--agent-user: {e}"))?);
                }
                "--link" => {
                    options.link = match value(arg)?.as_str() {
                        "unix" => LinkMode::Unix,
                        "attach" => LinkMode::Attach,
                        "off" => LinkMode::Off,
                        other => {
                            return Err(format!(
                                "--link: expected unix, attach or off, got {other:?}"
                            ))
                        }
                    };
                }
                "--link-socket" => options.socket = PathBuf::from(value(arg)?),
                "--egress" => options.egress = Some(EgressOptions::parse(&value(arg)?)?),
                _ => {
                    options.ignored = std::iter::once(arg).chain(rest).cloned().collect();
                    break;
                }
            }
        }
        Ok(options)
    }

    /// The link's carrier, when there is a link.
    fn link_mode(&self) -> Option<LinkMode> {
        self.agent_user
            .is_some()
            .then_some(self.link)
            .filter(|m| *m != LinkMode::Off)
    }
}

/// Runs the init loop; returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    let options = match Options::parse(args) {
        Ok(options) => options,
        Err(err) => {
            log(format_args!("{err}"));
            return EXIT_USAGE;
        }
    };
    let hardened = options.agent_user.is_some();
    if hardened {
        if let Err(err) = sys::set_non_dumpable() {
            log(format_args!("cannot make PID 1 non-dumpable: {err}"));
        }
        sys::ignore_sigpipe();
    }
    // Before anything else could start a child that inherits them.
    let mut attach_fds = None;
    if options.link_mode() == Some(LinkMode::Attach) {
        match sys::take_stdio() {
            Ok([input, output, stderr]) => {
                link::log_to(stderr);
                attach_fds = Some((input, output));
            }
            Err(err) => log(format_args!("cannot take stdin/stdout for the link: {err}")),
        }
    }
    if !options.ignored.is_empty() {
        // Docker appends an image's CMD to the entrypoint; it is not ours to run.
        log(format_args!("ignoring arguments {:?}", options.ignored));
    }
    // Before the link is dialled and before any child runs, so that nothing else holds
    // the port (the listener is close-on-exec, and op children close it at once).
    let proxy = bind_egress(&options);
    // Before any agent process could touch the image's bundle or the directory.
    if let (Some(_), Some(der)) = (&proxy, options.egress.as_ref().and_then(|e| e.ca.as_ref())) {
        match ca::install_in(std::path::Path::new(ca::CA_DIR), der) {
            Ok(Some(source)) => log(format_args!(
                "egress CA installed in {} (bundle: {source} + the beige CA)",
                ca::CA_DIR
            )),
            Ok(None) => log(format_args!(
                "egress CA installed in {} (no image bundle found: the bundle is the beige CA alone)",
                ca::CA_DIR
            )),
            Err(err) => log(format_args!(
                "cannot install the egress CA in {}: {err}; clients will not trust inspected hosts",
                ca::CA_DIR
            )),
        }
    }
    let pid1 = sys::is_pid1();
    // Signals from inside the container are only filtered where the sender pid means
    // something: as PID 1 of the container's namespace.
    let filter_inside = hardened && pid1;

    let mut signals = vec![libc::SIGCHLD];
    signals.extend_from_slice(&FORWARDED);
    let signal_fd = match SignalSet::block(&signals).and_then(|set| SignalFd::new(&set)) {
        Ok(fd) => fd,
        Err(err) => {
            log(format_args!("cannot receive signals: {err}"));
            return 1;
        }
    };
    let mut link = start_link(&options, attach_fds);
    let mut egress = proxy.map(|listeners| {
        let mut egress = Egress::new(listeners.proxy, upstream(&options, link.as_ref()));
        if let Some(dns) = listeners.dns {
            egress = egress.with_dns(dns);
        }
        for listener in listeners.transparent {
            egress = egress.with_transparent(listener);
        }
        egress
    });

    let mut shutdown_deadline: Option<Instant> = None;
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        fds.clear();
        fds.push(libc::pollfd {
            fd: signal_fd.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let mut timeout = shutdown_deadline.map(|_| SHUTDOWN_POLL);
        let now = Instant::now();
        if let Some(link) = link.as_mut() {
            if let Some(t) = link.prepare(now, &mut fds) {
                timeout = Some(timeout.map_or(t, |s| s.min(t)));
            }
        }
        // The link's descriptors are `fds[1..egress_at]`, the proxy's the rest.
        let egress_at = fds.len();
        if let Some(egress) = egress.as_mut() {
            if let Some(t) = egress.prepare(now, &mut fds) {
                timeout = Some(timeout.map_or(t, |s| s.min(t)));
            }
        }
        if let Err(err) = sys::poll(&mut fds, timeout) {
            log(format_args!("waiting for events failed: {err}"));
            return 1;
        }

        if fds[0].revents != 0 {
            loop {
                let received = match signal_fd.read() {
                    Ok(Some(received)) => received,
                    Ok(None) => break,
                    Err(err) => {
                        log(format_args!("reading signals failed: {err}"));
                        break;
                    }
                };
                let signal = received.signal;
                if signal == libc::SIGCHLD || (filter_inside && received.sender != 0) {
                    continue;
                }
                if pid1 {
                    if let Err(err) = sys::signal_all_as_pid1(signal) {
                        log(format_args!("forwarding signal {signal} failed: {err}"));
                    }
                }
                if (signal == libc::SIGTERM || signal == libc::SIGINT)
                    && shutdown_deadline.is_none()
                {
                    shutdown_deadline = Some(Instant::now() + SHUTDOWN_GRACE);
                }
            }
        }
        if let Some(l) = link.as_mut() {
            l.dispatch(&fds[1..egress_at]);
            if l.is_gone() {
                link = None;
            }
        }
        if let Some(egress) = egress.as_mut() {
            egress.dispatch(&fds[egress_at..]);
        }
        // Any wake-up is a good moment to collect zombies; SIGCHLDs coalesce.
        sys::reap_exited_children();

        if let Some(deadline) = shutdown_deadline {
            if !pid1 || !others_alive() {
                return 0;
            }
            if Instant::now() >= deadline {
                let _ = sys::signal_all_as_pid1(libc::SIGKILL);
                sys::reap_exited_children();
                return 0;
            }
        }
    }
}

/// Sets up the link, when the options ask for one; `None` (a plain init) when they do
/// not or it cannot work.
fn start_link(options: &Options, attach_fds: Option<(OwnedFd, OwnedFd)>) -> Option<Link> {
    let user = options.agent_user?;
    let carrier = match options.link_mode()? {
        LinkMode::Unix => CarrierSpec::Unix(options.socket.clone()),
        LinkMode::Attach => {
            let (input, output) = attach_fds?;
            CarrierSpec::Attach { input, output }
        }
        LinkMode::Off => return None,
    };
    let plan = match PrivDrop::prepare(user) {
        Ok(plan) => plan,
        Err(err) => {
            log(format_args!("no link: {err}"));
            return None;
        }
    };
    if plan.ids().is_none() {
        log(format_args!(
            "not running as root: operations run as uid {} without switching to {user}",
            sys::effective_uid()
        ));
    }
    Some(Link::new(LinkConfig {
        carrier,
        workdir: crate::op::Context::from_env().workspace().to_path_buf(),
        plan,
    }))
}

/// The egress sockets [`bind_egress`] bound.
#[derive(Debug)]
struct EgressListeners {
    proxy: ProxyListener,
    dns: Option<DnsListener>,
    transparent: Vec<TransparentListener>,
}

/// Binds the egress proxy's listener, and the DNS stub's and the transparent
/// listeners' sockets it is asked for, when there is a link to carry their streams.
fn bind_egress(options: &Options) -> Option<EgressListeners> {
    let spec = options.egress.as_ref()?;
    if !spec.ignored.is_empty() {
        log(format_args!(
            "egress: ignoring {:?}: not supported by this shim",
            spec.ignored
        ));
    }
    let Some(port) = spec.proxy else {
        log(format_args!("egress: no proxy=PORT given; no egress proxy"));
        return None;
    };
    match options.link_mode() {
        None => {
            log(format_args!(
                "ignoring --egress: egress needs --agent-user and a link to the gateway"
            ));
            return None;
        }
        Some(LinkMode::Attach) => log(format_args!(
            "egress over the attach link is not supported yet: the proxy answers every \
             client 503"
        )),
        Some(LinkMode::Unix | LinkMode::Off) => {}
    }
    let proxy = match ProxyListener::bind(port) {
        Ok(listener) => {
            let port = listener.port().unwrap_or(port);
            log(format_args!("egress proxy listening on 127.0.0.1:{port}"));
            listener
        }
        Err(err) => {
            log(format_args!(
                "cannot listen on 127.0.0.1:{port} for the egress proxy: {err}"
            ));
            return None;
        }
    };
    let dns = match spec.dns.then(|| DnsListener::bind(dns::DNS_PORT)) {
        None => None,
        Some(Ok(listener)) => {
            log(format_args!(
                "egress DNS stub listening on 127.0.0.1:{} (UDP and TCP)",
                listener.port().unwrap_or(dns::DNS_PORT)
            ));
            Some(listener)
        }
        Some(Err(err)) => {
            log_bind_failure(
                &format!("127.0.0.1:{} for the DNS stub", dns::DNS_PORT),
                &err,
            );
            None
        }
    };
    if !spec.transparent.is_empty() && dns.is_none() {
        log(format_args!(
            "egress: transparent listeners without the DNS stub close every connection"
        ));
    }
    let mut transparent = Vec::new();
    for &port in &spec.transparent {
        match TransparentListener::bind(port) {
            Ok(listener) => {
                log(format_args!(
                    "egress transparent listener on 0.0.0.0:{}",
                    listener.port().unwrap_or(port)
                ));
                transparent.push(listener);
            }
            Err(err) => log_bind_failure(&format!("0.0.0.0:{port} for transparent egress"), &err),
        }
    }
    Some(EgressListeners {
        proxy,
        dns,
        transparent,
    })
}

/// Logs that binding `what` failed, saying what is missing when it was a privilege.
fn log_bind_failure(what: &str, err: &std::io::Error) {
    if err.raw_os_error() == Some(libc::EACCES) {
        log(format_args!(
            "cannot listen on {what}: {err} (PID 1 lacks CAP_NET_BIND_SERVICE: the \
             container needs the sysctl net.ipv4.ip_unprivileged_port_start=0)"
        ));
    } else {
        log(format_args!("cannot listen on {what}: {err}"));
    }
}

/// Where the egress proxy sends its streams: the link's socket, with the link's boot
/// id, when the link runs over it.
fn upstream(options: &Options, link: Option<&Link>) -> Upstream {
    match (options.link_mode(), link) {
        (Some(LinkMode::Unix), Some(link)) => Upstream::Unix {
            socket: options.socket.clone(),
            boot_id: link.boot_id().to_string(),
        },
        (Some(LinkMode::Attach), _) => {
            Upstream::Unavailable(egress::ATTACH_UNSUPPORTED_BODY.to_string())
        }
        _ => Upstream::Unavailable("beige: PID 1 has no link to the gateway".to_string()),
    }
}

/// Whether any other process we may signal still exists (signal 0 only checks).
fn others_alive() -> bool {
    sys::signal_all_as_pid1(0).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Options::parse(&args)
    }

    #[test]
    fn arguments() {
        let o = parse(&[]).unwrap();
        assert_eq!((o.agent_user, o.link_mode()), (None, None));
        assert!(o.ignored.is_empty());

        let o = parse(&["--agent-user", "1000:1000", "--link", "attach"]).unwrap();
        assert_eq!(
            o.agent_user,
            Some(AgentUser {
                uid: 1000,
                gid: 1000
            })
        );
        assert_eq!(o.link_mode(), Some(LinkMode::Attach));

        let o = parse(&["--agent-user", "1:2"]).unwrap();
        assert_eq!(o.link_mode(), Some(LinkMode::Unix));
        assert_eq!(o.socket, PathBuf::from(CTL_SOCKET_PATH));

        let o = parse(&["--agent-user", "1:2", "--link", "off"]).unwrap();
        assert_eq!(o.link_mode(), None);
        // Without an agent user there is no link, whatever --link says.
        assert_eq!(parse(&["--link", "unix"]).unwrap().link_mode(), None);

        let o = parse(&["--link-socket", "/tmp/x.sock", "bash", "--link", "off"]).unwrap();
        assert_eq!(o.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(o.ignored, ["bash", "--link", "off"]);
        assert_eq!(o.link, LinkMode::Unix);

        let o = parse(&["--agent-user", "1:2", "--egress", "proxy=3128"]).unwrap();
        assert_eq!(
            o.egress,
            Some(EgressOptions {
                proxy: Some(3128),
                ..EgressOptions::default()
            })
        );
        let o = parse(&["--egress", "proxy=0,transparent=80+443,dns=synthetic-all"]).unwrap();
        let egress = o.egress.unwrap();
        assert_eq!(egress.proxy, Some(0));
        assert!(egress.dns);
        assert_eq!(egress.transparent, [80, 443]);
        assert!(egress.ignored.is_empty());
        let o = parse(&[
            "--egress",
            "dns=synthetic,proxy=3128,socks=1080,dns=nxdomain-denied",
        ]);
        let egress = o.unwrap().egress.unwrap();
        assert_eq!((egress.proxy, egress.dns), (Some(3128), true));
        assert!(egress.transparent.is_empty());
        assert_eq!(egress.ignored, ["socks=1080", "dns=nxdomain-denied"]);
        assert_eq!(
            parse(&["--egress", "proxy=1,transparent=443"])
                .unwrap()
                .egress
                .unwrap()
                .transparent,
            [443]
        );
        assert!(parse(&["--egress", "proxy=1,transparent=80+"]).is_err());
        assert!(parse(&["--egress", "proxy=1,transparent=0"]).is_err());
        assert!(parse(&["--egress", "proxy=1,transparent=http"]).is_err());
        assert!(parse(&["--egress", "proxy=http"]).is_err());
        assert!(parse(&["--egress", "proxy=65536"]).is_err());
        assert!(parse(&["--egress", "proxy"]).is_err());
        assert!(parse(&["--egress"]).is_err());

        assert!(parse(&["--agent-user"]).is_err());
        assert!(parse(&["--agent-user", "root"]).is_err());
        assert!(parse(&["--link", "tcp"]).is_err());
    }
}
