//! Compiled components on disk, keyed by content and engine compatibility.
//!
//! Compiling a planner takes tens of milliseconds; loading its compiled form
//! takes a fraction of one. A file is only ever written whole (temp + rename),
//! so a crash mid-write leaves no half file to load.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

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

pub struct ComponentCache {
    dir: PathBuf,
}

impl ComponentCache {
    pub fn new(dir: PathBuf) -> Self {
        ComponentCache { dir }
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

    /// A previously compiled component, if a usable one is cached.
    pub fn load(&self, engine: &Engine, wasm: &[u8]) -> Option<Component> {
        let path = self.path_for(engine, wasm);
        if !path.exists() {
            return None;
        }
        // SAFETY: the file was written by `store` below from wasmtime's own
        // serialisation, into a directory the operator controls; the name binds
        // it to these exact bytes and this engine's configuration.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => Some(component),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "ignoring unusable cached planner");
                None
            }
        }
    }

    /// Best effort: a cache that cannot be written only costs speed.
    pub fn store(&self, engine: &Engine, wasm: &[u8], component: &Component) {
        let path = self.path_for(engine, wasm);
        let result = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let bytes = component.serialize().map_err(std::io::Error::other)?;
            let temp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&temp, bytes)?;
            std::fs::rename(&temp, &path)
        })();
        if let Err(err) = result {
            tracing::warn!(dir = %self.dir.display(), error = %err, "cannot cache compiled planner");
        }
    }
}
