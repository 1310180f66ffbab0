//! Runtime images: the manifests `make images` writes into
//! `sandbox-images/`, and their compiled code, cached on disk.
//!
//! An image is compiled once per engine and cached as
//! `<cache_dir>/<name>-<image sha256>-<engine fingerprint>.cwasm`, with a
//! `.sha256` beside it that is checked before the artifact is loaded, so a
//! torn or tampered cache file is recompiled instead of trusted. Startup
//! verifies each image against the sha256 in its manifest.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, Module};

use super::limits::ExecLimits;
use super::{SandboxError, engine::TickingEngine};

/// Image manifests the server looks for, by runtime name.
pub const RUNTIMES: &[&str] = &["jq", "javascript", "python"];

/// What `make images` writes next to each artifact.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// Image name (`jq`, `javascript`, `python`).
    pub name: String,
    /// The runtime name requests use.
    pub runtime: String,
    /// Language and implementation version.
    pub language_version: String,
    /// One line for an LLM choosing a runtime.
    pub description: String,
    /// The artifact's file name, next to the manifest.
    pub entry: String,
    /// `module` (WASI preview1) or `component` (wasi:cli/command).
    pub kind: Kind,
    /// Hex SHA-256 of the artifact.
    pub sha256: String,
    /// Limits used when a request names none.
    pub default_limits: ExecLimits,
}

/// How an artifact is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A WASI preview1 command module (`_start`).
    Module,
    /// A `wasi:cli/command` component.
    Component,
}

/// Compiled code, not yet linked.
#[derive(Clone)]
pub enum Artifact {
    /// A core module.
    Module(Module),
    /// A component.
    Component(Component),
}

impl Artifact {
    /// Compiles (and validates) `binary` as a `kind`.
    pub fn compile(engine: &Engine, kind: Kind, binary: &[u8]) -> wasmtime::Result<Artifact> {
        match kind {
            Kind::Module => Module::new(engine, binary).map(Artifact::Module),
            Kind::Component => Component::new(engine, binary).map(Artifact::Component),
        }
    }

    /// The compiled code as bytes, for the compile cache.
    fn serialize(&self) -> wasmtime::Result<Vec<u8>> {
        match self {
            Artifact::Module(m) => m.serialize(),
            Artifact::Component(c) => c.serialize(),
        }
    }

    /// Bytes of its compiled image in memory.
    pub fn image_len(&self) -> usize {
        let r = match self {
            Artifact::Module(m) => m.image_range(),
            Artifact::Component(c) => c.image_range(),
        };
        (r.end as usize).saturating_sub(r.start as usize)
    }
}

/// Reads `<dir>/<name>.json` and checks the artifact it names.
pub fn load_manifest(dir: &Path, name: &str) -> Result<(Manifest, PathBuf), SandboxError> {
    let path = dir.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| SandboxError::Image {
        name: name.to_owned(),
        why: format!("cannot read its manifest ({e}); run `make images`"),
    })?;
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| SandboxError::Image {
        name: name.to_owned(),
        why: format!("its manifest is malformed: {e}"),
    })?;
    if manifest.entry.contains('/') || manifest.entry.starts_with('.') {
        return Err(SandboxError::Image {
            name: name.to_owned(),
            why: format!(
                "its manifest names entry {:?}, which is not a plain file name",
                manifest.entry
            ),
        });
    }
    let artifact = dir.join(&manifest.entry);
    let actual = sha256_file(&artifact).map_err(|e| SandboxError::Image {
        name: name.to_owned(),
        why: format!("cannot read {} ({e}); run `make images`", manifest.entry),
    })?;
    if actual != manifest.sha256 {
        return Err(SandboxError::Image {
            name: name.to_owned(),
            why: format!(
                "{} has sha256 {actual} but its manifest says {}; run `make images`",
                manifest.entry, manifest.sha256
            ),
        });
    }
    Ok((manifest, artifact))
}

/// Loads the image's compiled code from the cache, or compiles and caches
/// it. Blocking: call it off the async threads.
pub fn compile_cached(
    engine: &TickingEngine,
    manifest: &Manifest,
    artifact: &Path,
    cache_dir: &Path,
) -> Result<Artifact, SandboxError> {
    let fail = |why: String| SandboxError::Image {
        name: manifest.name.clone(),
        why,
    };
    let key = format!(
        "{}-{}-{}",
        manifest.name,
        &manifest.sha256[..manifest.sha256.len().min(16)],
        engine.fingerprint()
    );
    let cwasm = cache_dir.join(format!("{key}.cwasm"));
    let sum = cache_dir.join(format!("{key}.sha256"));
    if let Some(a) = load_cached(engine.engine(), manifest.kind, &cwasm, &sum) {
        tracing::debug!(image = %manifest.name, "image loaded from the compile cache");
        return Ok(a);
    }
    let started = std::time::Instant::now();
    let bytes =
        std::fs::read(artifact).map_err(|e| fail(format!("cannot read the artifact: {e}")))?;
    let compiled = Artifact::compile(engine.engine(), manifest.kind, &bytes)
        .map_err(|e| fail(format!("does not compile: {e}")))?;
    let serialized = compiled
        .serialize()
        .map_err(|e| fail(format!("cannot serialize: {e}")))?;
    tracing::info!(
        image = %manifest.name,
        compile_ms = started.elapsed().as_millis() as u64,
        "image compiled"
    );
    if let Err(e) = store_cached(cache_dir, &cwasm, &sum, &serialized) {
        tracing::warn!(image = %manifest.name, error = %e, "could not write the compile cache");
    }
    Ok(compiled)
}

fn load_cached(engine: &Engine, kind: Kind, cwasm: &Path, sum: &Path) -> Option<Artifact> {
    let want = std::fs::read_to_string(sum).ok()?;
    let bytes = std::fs::read(cwasm).ok()?;
    if hex::encode(Sha256::digest(&bytes)) != want.trim() {
        tracing::warn!("a compile cache entry does not match its checksum; recompiling");
        return None;
    }
    // SAFETY: wasmtime requires that deserialized bytes come from a trusted
    // `serialize` of a compatible engine. The file is one this server wrote
    // into its own cache directory, its checksum matched just above, and the
    // key includes the engine's compatibility fingerprint; wasmtime also
    // checks the version and settings in the header and rejects mismatches.
    #[allow(unsafe_code)]
    let loaded = match kind {
        Kind::Module => unsafe { Module::deserialize(engine, &bytes) }.map(Artifact::Module),
        Kind::Component => {
            unsafe { Component::deserialize(engine, &bytes) }.map(Artifact::Component)
        }
    };
    loaded.ok()
}

fn store_cached(dir: &Path, cwasm: &Path, sum: &Path, bytes: &[u8]) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = cwasm.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, cwasm)?;
    std::fs::write(sum, hex::encode(Sha256::digest(bytes)))?;
    Ok(())
}

/// Hex SHA-256 of a file, streamed.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}
