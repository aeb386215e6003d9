//! The privilege drop every agent process goes through, on both transports.
//!
//! PID 1 runs as root with a few capabilities (SETUID, SETGID, KILL, SETPCAP); the
//! processes it starts for the gateway (`beige-shim op <name>`, and through `op exec`
//! every command of the agent) must hold none of that. [`PrivDrop`] is prepared *before*
//! fork — agent uid and gid, the kernel's highest capability number, the compiled
//! seccomp program — so the child only makes raw, async-signal-safe calls
//! ([`crate::sys::drop_privileges`]):
//!
//! 1. `setsid`;
//! 2. `setgroups([gid])`, `setresgid(gid)` (only as root);
//! 3. drop every capability from the bounding set (only as root; needs SETPCAP);
//! 4. `setresuid(uid)`, which clears the permitted and effective sets (only as root);
//! 5. `capset` with all-zero sets, so the inheritable set is empty too;
//! 6. clear the ambient set; set no_new_privs;
//! 7. install the child seccomp filter ([`child_filter`]).
//!
//! A process that is not root skips steps 2–4 (it cannot change ids) but still takes
//! the others. Any failure stops the child before it runs anything.
//!
//! The `docker exec` fallback (`beige-shim op <name> --drop UID:GID`, run as root)
//! applies the same steps in-process ([`PrivDrop::apply`]), so agent processes are
//! identical on both transports.

use std::fmt;
use std::str::FromStr;

use crate::sys::{self, DropFailure};

/// Where the kernel tells the highest capability number.
const CAP_LAST_CAP: &str = "/proc/sys/kernel/cap_last_cap";

/// `AUDIT_ARCH_*` values seen in `seccomp_data.arch`.
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
const AUDIT_ARCH_AARCH64: u32 = 0xC000_00B7;
/// Set in the syscall number of x32 calls on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// The i386 numbers of the blocked calls (reachable from x86_64 through `int 0x80`):
/// ptrace, perf_event_open, process_vm_readv, process_vm_writev, kcmp, bpf,
/// userfaultfd, pidfd_getfd.
const I386_BLOCKED: [u32; 8] = [26, 336, 347, 348, 349, 357, 374, 438];

/// The uid and gid the agent's processes run as (`--agent-user 1000:1000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentUser {
    pub uid: u32,
    pub gid: u32,
}

impl FromStr for AgentUser {
    type Err = String;

    /// Parses `UID:GID` (numbers only: the shim does no user-name look-ups).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = s
            .split_once(':')
            .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
        match parsed {
            Some((uid, gid)) => Ok(Self { uid, gid }),
            None => Err(format!("expected UID:GID (numbers), got {s:?}")),
        }
    }
}

impl fmt::Display for AgentUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

/// A privilege drop prepared before fork.
#[derive(Clone)]
pub struct PrivDrop {
    user: AgentUser,
    /// Whether the ids are switched and the bounding set cleared (only as root).
    switch_ids: bool,
    last_cap: u32,
    filter: Vec<libc::sock_filter>,
}

impl fmt::Debug for PrivDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivDrop")
            .field("user", &self.user)
            .field("switch_ids", &self.switch_ids)
            .field("last_cap", &self.last_cap)
            .field("filter_len", &self.filter.len())
            .finish()
    }
}

impl PrivDrop {
    /// Prepares the drop to `user`: reads the highest capability number and compiles the
    /// seccomp program. Fails on an architecture without a filter.
    pub fn prepare(user: AgentUser) -> Result<Self, String> {
        Ok(Self {
            user,
            switch_ids: sys::effective_uid() == 0,
            last_cap: last_cap()?,
            filter: child_filter()?,
        })
    }

    /// The same drop to another user (a spawned process's own uid).
    pub fn with_user(&self, user: AgentUser) -> Self {
        Self {
            user,
            ..self.clone()
        }
    }

    /// The user this drop switches to.
    pub fn user(&self) -> AgentUser {
        self.user
    }

    /// The ids to switch to, when the process is root.
    pub fn ids(&self) -> Option<(u32, u32)> {
        self.switch_ids.then_some((self.user.uid, self.user.gid))
    }

    /// The highest capability number of the running kernel.
    pub fn last_cap(&self) -> u32 {
        self.last_cap
    }

    /// The compiled child seccomp program.
    pub fn filter(&self) -> &[libc::sock_filter] {
        &self.filter
    }

    /// Applies the drop to the calling process, which must be single-threaded.
    pub fn apply(&self) -> Result<(), DropFailure> {
        sys::drop_privileges(self)
    }
}

/// The kernel's highest capability number, from `/proc`, or probed with
/// `PR_CAPBSET_READ` when `/proc/sys` is not readable.
fn last_cap() -> Result<u32, String> {
    if let Some(n) = std::fs::read_to_string(CAP_LAST_CAP)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        return Ok(n);
    }
    (0..=63u32)
        .take_while(|&c| sys::bounding_set_has(c).is_some())
        .last()
        .ok_or_else(|| format!("cannot read {CAP_LAST_CAP} nor probe the bounding set"))
}

/// Builds the command `program args…` for an agent process: stdin and stdout piped,
/// stderr inherited, the container's environment, the privilege drop of `plan` and then
/// `chdir(workdir)` (or `/` when that fails) between fork and exec, and an empty signal
/// mask. The same path starts every op child of PID 1.
#[cfg(test)]
pub fn command(
    program: &std::path::Path,
    args: &[&str],
    workdir: &std::path::Path,
    plan: &PrivDrop,
) -> std::io::Result<std::process::Command> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let workdir = CString::new(workdir.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in the working dir")
    })?;
    let mut command = Command::new(program);
    command
        .arg0(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    sys::drop_privileges_on_exec(&mut command, plan.clone(), workdir);
    Ok(command)
}

/// The architecture the shim runs as, in `seccomp_data.arch` terms.
fn native_arch() -> Option<u32> {
    if cfg!(target_arch = "x86_64") {
        Some(AUDIT_ARCH_X86_64)
    } else if cfg!(target_arch = "aarch64") {
        Some(AUDIT_ARCH_AARCH64)
    } else {
        None
    }
}

/// The native numbers of the blocked calls: `ptrace`, `process_vm_readv`,
/// `process_vm_writev`, `pidfd_getfd`, `kcmp`, `bpf`, `perf_event_open`,
/// `userfaultfd` — the ways one process reads or borrows another's memory or fds.
fn native_blocked() -> [u32; 8] {
    [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_kcmp,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
    ]
    .map(|nr| u32::try_from(nr).unwrap_or(u32::MAX))
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: u16::try_from(code).unwrap_or(0),
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: usize, jf: usize) -> libc::sock_filter {
    libc::sock_filter {
        code: u16::try_from(code).unwrap_or(0),
        jt: u8::try_from(jt).unwrap_or(u8::MAX),
        jf: u8::try_from(jf).unwrap_or(u8::MAX),
        k,
    }
}

fn ret(k: u32) -> libc::sock_filter {
    stmt(libc::BPF_RET | libc::BPF_K, k)
}

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA);

/// One architecture's block: load the syscall number, EPERM for the listed ones (and,
/// with `deny_x32`, for every x32 call), allow the rest.
fn arch_block(blocked: &[u32], deny_x32: bool) -> Vec<libc::sock_filter> {
    // Layout: ld nr | [jset x32] | jeq × n | ret allow | ret EPERM.
    let checks = blocked.len() + usize::from(deny_x32);
    let mut block = vec![stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, DATA_NR)];
    if deny_x32 {
        // To the EPERM at the end: past the remaining checks and the allow.
        block.push(jump(
            libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
            X32_SYSCALL_BIT,
            checks,
            0,
        ));
    }
    for (i, &nr) in blocked.iter().enumerate() {
        let done = i + usize::from(deny_x32) + 1;
        block.push(jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            nr,
            checks - done + 1,
            0,
        ));
    }
    block.push(ret(RET_ALLOW));
    block.push(ret(RET_EPERM));
    block
}

/// The child seccomp program (classic BPF): `ptrace`, `process_vm_readv`,
/// `process_vm_writev`, `pidfd_getfd`, `kcmp`, `bpf`, `perf_event_open` and
/// `userfaultfd` fail with EPERM; everything else is allowed (Docker's own profile, a
/// separate filter, still applies).
///
/// The architecture is checked first. The native one (x86_64 or aarch64) uses the
/// native numbers. On x86_64, i386 calls (`int 0x80`) use the i386 numbers, and *every*
/// x32 call (syscall number with bit 30 set) gets EPERM: x32 has its own numbers for
/// some of these calls, no container workload needs it, and refusing all of it is the
/// simple safe choice. Any other architecture gets EPERM for everything.
pub fn child_filter() -> Result<Vec<libc::sock_filter>, String> {
    let native = native_arch().ok_or_else(|| {
        "no child seccomp filter for this architecture (only x86_64 and aarch64)".to_string()
    })?;
    let is_x86_64 = native == AUDIT_ARCH_X86_64;
    let mut sections = vec![(native, arch_block(&native_blocked(), is_x86_64))];
    if is_x86_64 {
        sections.push((AUDIT_ARCH_I386, arch_block(&I386_BLOCKED, false)));
    }
    let mut prog = vec![stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, DATA_ARCH)];
    for (arch, block) in sections {
        // Not this architecture: skip its block.
        prog.push(jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            arch,
            0,
            block.len(),
        ));
        prog.extend(block);
    }
    prog.push(ret(RET_EPERM));
    Ok(prog)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Stdio;

    /// Runs a classic BPF program over `(arch, nr)` (only the instructions it uses).
    fn eval(prog: &[libc::sock_filter], arch: u32, nr: u32) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let ins = prog[pc];
            let code = u32::from(ins.code);
            pc += 1;
            if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                acc = match ins.k {
                    DATA_NR => nr,
                    DATA_ARCH => arch,
                    other => panic!("load of offset {other}"),
                };
            } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                pc += usize::from(if acc == ins.k { ins.jt } else { ins.jf });
            } else if code == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K {
                pc += usize::from(if acc & ins.k != 0 { ins.jt } else { ins.jf });
            } else if code == libc::BPF_RET | libc::BPF_K {
                return ins.k;
            } else {
                panic!("unexpected instruction {code:#x}");
            }
            assert!(pc < prog.len(), "ran off the end");
        }
    }

    #[test]
    fn filter_blocks_the_list_on_every_arch() {
        let prog = child_filter().unwrap();
        assert!(prog.len() < 64);
        let native = native_arch().unwrap();
        for nr in native_blocked() {
            assert_eq!(eval(&prog, native, nr), RET_EPERM, "native {nr}");
        }
        for nr in [
            libc::SYS_getpid,
            libc::SYS_read,
            libc::SYS_execve,
            libc::SYS_kill,
            libc::SYS_clone,
        ] {
            let nr = u32::try_from(nr).unwrap();
            assert_eq!(eval(&prog, native, nr), RET_ALLOW, "native {nr}");
        }
        assert_eq!(eval(&prog, 0x4000_0028, 20), RET_EPERM, "arm32 compat");
        assert_eq!(eval(&prog, 0, 0), RET_EPERM, "unknown arch");
        if native == AUDIT_ARCH_X86_64 {
            for nr in I386_BLOCKED {
                assert_eq!(eval(&prog, AUDIT_ARCH_I386, nr), RET_EPERM, "i386 {nr}");
            }
            // i386 getpid (20), read (3), execve (11).
            for nr in [20, 3, 11] {
                assert_eq!(eval(&prog, AUDIT_ARCH_I386, nr), RET_ALLOW, "i386 {nr}");
            }
            assert_eq!(eval(&prog, native, X32_SYSCALL_BIT | 39), RET_EPERM, "x32");
            assert_eq!(eval(&prog, native, X32_SYSCALL_BIT | 521), RET_EPERM);
        }
    }

    #[test]
    fn agent_user_parses() {
        assert_eq!(
            "1000:1001".parse::<AgentUser>(),
            Ok(AgentUser {
                uid: 1000,
                gid: 1001
            })
        );
        for bad in ["", "1000", "a:b", "1000:", ":1", "1:2:3", "-1:0"] {
            assert!(bad.parse::<AgentUser>().is_err(), "{bad:?}");
        }
        assert_eq!(AgentUser { uid: 5, gid: 6 }.to_string(), "5:6");
    }

    #[test]
    fn last_cap_is_known() {
        let n = last_cap().unwrap();
        assert!((30..64).contains(&n), "{n}");
    }

    /// The spawn path of PID 1: the child ends with no capability at all, no_new_privs,
    /// the seccomp filter and the agent uid. Needs root (skipped otherwise).
    #[test]
    fn spawned_child_is_unprivileged() {
        if sys::effective_uid() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let plan = PrivDrop::prepare(AgentUser {
            uid: 1000,
            gid: 1000,
        })
        .unwrap();
        let mut cmd = command(
            Path::new("/bin/sh"),
            &[
                "-c",
                r#"grep -E "^(Cap|NoNewPrivs|Seccomp)" /proc/self/status; id -u; id -g; id -G; pwd"#,
            ],
            Path::new("/"),
            &plan,
        )
        .unwrap();
        cmd.stdin(Stdio::null());
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let field = |name: &str| -> String {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .trim()
                .to_string()
        };
        for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(field(cap), "0000000000000000", "{cap} in {text}");
        }
        assert_eq!(field("NoNewPrivs"), "1");
        assert_eq!(field("Seccomp"), "2");
        assert!(field("Seccomp_filters").parse::<u32>().unwrap() >= 1);
        let tail: Vec<&str> = text.lines().rev().take(4).collect();
        assert_eq!(tail, ["/", "1000", "1000", "1000"], "{text}");
    }

    #[test]
    fn failed_drop_stops_the_child() {
        if sys::effective_uid() != 0 {
            return;
        }
        let mut plan = PrivDrop::prepare(AgentUser {
            uid: 1000,
            gid: 1000,
        })
        .unwrap();
        // A capability number the kernel does not know: PR_CAPBSET_READ fails.
        plan.last_cap = 1000;
        let mut cmd = command(
            Path::new("/bin/sh"),
            &["-c", "echo ran"],
            Path::new("/"),
            &plan,
        )
        .unwrap();
        assert!(cmd.output().is_err());
    }
}
