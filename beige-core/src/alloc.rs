//! Process-wide memory-allocator settings for a long-running gateway process.
//!
//! Owns one thing: telling the C allocator to hand large buffers back to the kernel when
//! they are freed. A gateway moves exec outputs of megabytes (with the output cap
//! raised); glibc's default raises its mmap threshold after the first large free and
//! then serves later large buffers from its heap arenas, which it keeps and fragments,
//! so one 10 MiB output left the gateway 20–30 MiB larger. Binaries that host a gateway
//! call [`return_large_allocations`] at start (the `beige` daemon and the benchmark
//! harness do). The shim sets the same for PID 1.

/// Buffers at least this large are mapped on their own and unmapped when freed.
const MMAP_THRESHOLD: i32 = 256 * 1024;

/// Makes allocations of 256 KiB and more come from their own mappings, returned to the
/// kernel when freed (and grown with `mremap`, without a copy). Best effort and
/// idempotent: on a C library other than glibc it does nothing, and a failure changes
/// only memory use.
#[allow(unsafe_code)]
pub fn return_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter under the allocator's own lock;
    // it has no memory-safety preconditions and may be called from any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}
