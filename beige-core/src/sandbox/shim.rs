//! Locating the static shim and refusing one that is not static.
//!
//! The shim is bind-mounted into images we know nothing about (busybox, musl, glibc),
//! so it must not need a dynamic loader. The check reads the ELF program headers and
//! refuses any binary with a `PT_INTERP` entry.

use std::path::{Path, PathBuf};

use super::SandboxError;

/// Environment variable naming the shim binary.
pub const BEIGE_SHIM_ENV: &str = "BEIGE_SHIM";

/// Find the shim: `BEIGE_SHIM`, then the configured path, then `beige-shim` next to
/// the running executable, then `target/shim/beige-shim` above it (a source checkout).
pub fn locate(configured: Option<&Path>) -> Result<PathBuf, SandboxError> {
    // A path the operator named is used or refused, never silently replaced.
    let explicit = std::env::var_os(BEIGE_SHIM_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| configured.map(Path::to_path_buf));
    if let Some(p) = explicit.filter(|p| p.exists()) {
        check_static(&p)?;
        return Ok(p);
    }
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os(BEIGE_SHIM_ENV).filter(|p| !p.is_empty()) {
        tried.push(PathBuf::from(p));
    }
    if let Some(p) = configured {
        tried.push(p.to_path_buf());
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            tried.push(dir.join("beige-shim"));
            for anc in dir.ancestors().take(4) {
                tried.push(anc.join("shim").join("beige-shim"));
                tried.push(anc.join("target").join("shim").join("beige-shim"));
            }
        }
    }
    // A dynamically linked `beige-shim` (a plain `cargo build` leaves one next to the
    // binaries) is skipped in favour of a later static one; it is reported only when no
    // candidate is usable.
    let mut refused = None;
    for p in &tried {
        if p.is_file() {
            match check_static(p) {
                Ok(()) => return Ok(p.clone()),
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
    }
    if let Some(e) = refused {
        return Err(e);
    }
    Err(SandboxError::Shim {
        path: tried
            .first()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "beige-shim".into()),
        reason: format!(
            "no shim binary found (looked at: {}). Build it with `scripts/build-shim` and set BEIGE_SHIM or `sandbox.shim` to its path.",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// Refuse a binary that is not a static ELF executable.
pub fn check_static(path: &Path) -> Result<(), SandboxError> {
    let fail = |reason: String| SandboxError::Shim {
        path: path.display().to_string(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    match elf_has_interp(&bytes) {
        Some(false) => Ok(()),
        Some(true) => Err(fail(
            "it is dynamically linked (it has an ELF interpreter), so it would not run in images without the same C library. Rebuild it with `scripts/build-shim`, which links it statically.".into(),
        )),
        None => Err(fail(
            "it is not a 64-bit little-endian ELF executable. Rebuild it with `scripts/build-shim`.".into(),
        )),
    }
}

/// `Some(true)` when the ELF file has a `PT_INTERP` program header, `None` when it is
/// not a 64-bit little-endian ELF file.
fn elf_has_interp(b: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return None;
    }
    let u16_at =
        |o: usize| -> Option<u16> { Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?)) };
    let u32_at =
        |o: usize| -> Option<u32> { Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?)) };
    let u64_at =
        |o: usize| -> Option<u64> { Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?)) };
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        if u32_at(phoff.checked_add(i.checked_mul(phentsize)?)?)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_binaries_are_refused() {
        // /bin/sh on the build host is dynamically linked.
        let err = check_static(Path::new("/bin/sh")).unwrap_err();
        assert!(err.to_string().contains("dynamically linked"), "{err}");
        let err = check_static(Path::new("/etc/hostname")).unwrap_err();
        assert!(err.to_string().contains("not a 64-bit"), "{err}");
    }

    #[test]
    fn interp_header_detected() {
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        assert_eq!(elf_has_interp(&elf), Some(false));
        elf[64..68].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        assert_eq!(elf_has_interp(&elf), Some(true));
        assert_eq!(elf_has_interp(&elf[..10]), None);
    }
}
