//! Compiled components on disk, keyed by content and engine compatibility.
//!
//! Compiling a planner takes tens of milliseconds; loading its compiled form
//! takes a fraction of one. But a cached `.cwasm` is native code the host runs,
//! so whoever can write the cache runs code in hourglass:
//!
//! * the directory must belong to this user and be writable by no one else;
//!   [`ComponentCache::open`] refuses it otherwise, and one hourglass creates
//!   is made `0700`;
//! * each entry starts with a SHA-256 of its compiled bytes, checked before
//!   wasmtime sees them; an entry that fails (truncated, corrupted, edited, or
//!   not this user's file) is ignored with a warning and compiled afresh;
//! * an entry is only ever written whole (temp + rename, `0600`), so a crash
//!   mid-write leaves no half file to load.

use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::PlannerError;

/// An entry: this magic, the SHA-256 of the rest, then wasmtime's serialisation.
const MAGIC: &[u8; 16] = b"hourglass-cwasm1";
const HEADER_LEN: usize = MAGIC.len() + 32;

/// Feeds `Hash` output into SHA-256, so the engine's compatibility hash can be
/// part of a stable file name.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        unreachable!("only the digest is used")
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

#[derive(Debug)]
pub struct ComponentCache {
    dir: PathBuf,
}

impl ComponentCache {
    /// The cache in `dir`, created (`0700`) if missing. Refused when the
    /// directory is not this user's or others may write to it.
    pub fn open(dir: PathBuf) -> Result<Self, PlannerError> {
        let refuse = |problem: String| PlannerError::CacheDir { path: dir.display().to_string(), problem };
        create_private_dir(&dir).map_err(|e| refuse(format!("cannot create it: {e}")))?;
        check_dir(&dir).map_err(|problem| {
            refuse(format!(
                "{problem}; compiled planners there are code hourglass runs, so only this user may write there \
                 (chmod go-w it, point planners.cache_dir or HOURGLASS_CACHE_DIR at a directory of this user's, or set planners.cache = false)"
            ))
        })?;
        Ok(ComponentCache { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_for(&self, engine: &Engine, wasm: &[u8]) -> PathBuf {
        let mut hasher = Sha256Hasher(Sha256::new());
        hasher.write(wasm);
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        self.dir.join(format!("{}.cwasm", hex::encode(hasher.0.finalize())))
    }

    /// A previously compiled component, if a usable, intact one is cached.
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> Option<Component> {
        let path = self.path_for(engine, wasm);
        let entry = match self.read_entry(&path) {
            Ok(Some(entry)) => entry,
            Ok(None) => return None,
            Err(problem) => {
                tracing::warn!(path = %path.display(), %problem, "ignoring cached planner; compiling it again");
                return None;
            }
        };
        // SAFETY: the bytes are exactly what `store` wrote from wasmtime's own
        // serialisation (their digest matches), read from a file of this user's
        // in a directory only this user can write; the name binds them to these
        // wasm bytes and this engine's configuration.
        match unsafe { Component::deserialize(engine, &entry[HEADER_LEN..]) } {
            Ok(component) => Some(component),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "ignoring unusable cached planner");
                None
            }
        }
    }

    /// The whole entry with its digest checked; `None` when there is none.
    fn read_entry(&self, path: &Path) -> Result<Option<Vec<u8>>, UnusableEntry> {
        check_dir(&self.dir).map_err(UnusableEntry::UnsafeDirectory)?;
        let mut file = match open_no_follow(path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(UnusableEntry::Unopenable(err)),
        };
        let metadata = file.metadata().map_err(UnusableEntry::Unreadable)?;
        if !metadata.is_file() {
            return Err(UnusableEntry::NotAFile);
        }
        check_owner_and_mode(&metadata).map_err(UnusableEntry::Unsafe)?;
        let mut entry = Vec::with_capacity(metadata.len() as usize);
        file.read_to_end(&mut entry).map_err(UnusableEntry::Unreadable)?;
        if entry.len() < HEADER_LEN || &entry[..MAGIC.len()] != MAGIC {
            return Err(UnusableEntry::NotAnEntry);
        }
        if Sha256::digest(&entry[HEADER_LEN..])[..] != entry[MAGIC.len()..HEADER_LEN] {
            return Err(UnusableEntry::Tampered);
        }
        Ok(Some(entry))
    }

    /// Best effort: a cache that cannot be written only costs speed.
    pub fn store(&self, engine: &Engine, wasm: &[u8], component: &Component) {
        static TEMP_FILES: AtomicU64 = AtomicU64::new(0);
        let path = self.path_for(engine, wasm);
        let result = (|| -> std::io::Result<()> {
            check_dir(&self.dir).map_err(|problem| std::io::Error::other(format!("the cache directory is now {problem}")))?;
            let compiled = component.serialize().map_err(std::io::Error::other)?;
            let mut entry = Vec::with_capacity(HEADER_LEN + compiled.len());
            entry.extend_from_slice(MAGIC);
            entry.extend_from_slice(&Sha256::digest(&compiled));
            entry.extend_from_slice(&compiled);
            let temp = path.with_extension(format!("tmp{}-{}", std::process::id(), TEMP_FILES.fetch_add(1, Ordering::Relaxed)));
            write_private_file(&temp, &entry)?;
            std::fs::rename(&temp, &path).inspect_err(|_| {
                let _ = std::fs::remove_file(&temp);
            })
        })();
        if let Err(err) = result {
            tracing::warn!(dir = %self.dir.display(), error = %err, "cannot cache compiled planner");
        }
    }
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

#[cfg(unix)]
fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

/// Why a cache entry is ignored (and the planner compiled afresh).
#[derive(Debug, thiserror::Error)]
enum UnusableEntry {
    #[error("the cache directory is now {0}")]
    UnsafeDirectory(#[source] UnsafePath),
    #[error("cannot open it: {0}")]
    Unopenable(#[source] std::io::Error),
    #[error("cannot read it: {0}")]
    Unreadable(#[source] std::io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("{0}")]
    Unsafe(#[source] UnsafePath),
    #[error("not an hourglass cache entry")]
    NotAnEntry,
    #[error("its contents do not match their recorded digest")]
    Tampered,
}

/// Why a cache directory or entry is no safe place for code.
#[derive(Debug, thiserror::Error)]
enum UnsafePath {
    #[error("cannot read it: {0}")]
    Unreadable(#[source] std::io::Error),
    #[error("not a directory")]
    NotADirectory,
    #[error("owned by uid {owner}, not by this user (uid {me})")]
    NotOwned { owner: u32, me: u32 },
    #[error("writable by {who} (mode {mode:04o})")]
    Writable { who: &'static str, mode: u32 },
}

/// Why `dir` is no safe place for code, if it is not.
fn check_dir(dir: &Path) -> Result<(), UnsafePath> {
    let metadata = std::fs::metadata(dir).map_err(UnsafePath::Unreadable)?;
    if !metadata.is_dir() {
        return Err(UnsafePath::NotADirectory);
    }
    check_owner_and_mode(&metadata)
}

#[cfg(unix)]
fn check_owner_and_mode(metadata: &std::fs::Metadata) -> Result<(), UnsafePath> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    owner_and_mode_problem(metadata.uid(), metadata.mode(), me).map_or(Ok(()), Err)
}

#[cfg(not(unix))]
fn check_owner_and_mode(_metadata: &std::fs::Metadata) -> Result<(), UnsafePath> {
    Ok(())
}

/// What is wrong with a path owned by `owner` with `mode`, for user `me`.
fn owner_and_mode_problem(owner: u32, mode: u32, me: u32) -> Option<UnsafePath> {
    if owner != me {
        return Some(UnsafePath::NotOwned { owner, me });
    }
    if mode & 0o022 != 0 {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "group and others",
            (true, false) => "group",
            _ => "others",
        };
        return Some(UnsafePath::Writable { who, mode: mode & 0o7777 });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_users_own_unshared_paths_are_safe() {
        assert!(owner_and_mode_problem(1000, 0o40700, 1000).is_none());
        assert!(owner_and_mode_problem(1000, 0o40755, 1000).is_none(), "readable by others is fine");
        assert_eq!(owner_and_mode_problem(0, 0o40700, 1000).unwrap().to_string(), "owned by uid 0, not by this user (uid 1000)");
        assert_eq!(owner_and_mode_problem(1000, 0o40775, 1000).unwrap().to_string(), "writable by group (mode 0775)");
        assert_eq!(owner_and_mode_problem(1000, 0o41777, 1000).unwrap().to_string(), "writable by group and others (mode 1777)");
        assert_eq!(owner_and_mode_problem(1000, 0o40702, 1000).unwrap().to_string(), "writable by others (mode 0702)");
    }
}
