//! The disk compile cache: ptxas's output (a cubin) and its log for each compiled
//! specialisation, so a new process loads a kernel without compiling it again.
//!
//! An entry is keyed by a BLAKE3 hash of everything that decides the cubin ([`CacheKey`]); a
//! *module entry* ([`ModuleKey`]) maps a kernel as built to the PTX module the passes made of
//! it, so a warm start skips both. Entries are verified before use and written atomically. The
//! directory is `$KILN_CACHE_DIR`, else `kiln/` under the platform cache directory;
//! `KILN_CACHE_DIR=off` turns the cache off. Layout and keys in full: [`DiskCache`].

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use kiln_ir::Target;
use kiln_ptx::{PtxModule, TensorMapSpec};
use serde::{Deserialize, Serialize};

/// The first bytes of every cubin entry file.
const MAGIC: &[u8; 8] = b"KILNCUB1";
/// The first bytes of every module entry file.
const MODULE_MAGIC: &[u8; 8] = b"KILNMOD1";
/// Magic, payload hash, two lengths.
const HEADER: usize = 8 + 32 + 8 + 8;
/// Cubin entry files end in this.
const SUFFIX: &str = ".cubin";
/// Module entry files end in this.
const MODULE_SUFFIX: &str = ".module";
/// A hash of the compiler's sources (kiln-ir and kiln-ptx), from `build.rs`.
const COMPILER: &str = env!("KILN_COMPILER_FINGERPRINT");

/// What identifies a cached cubin: a hex BLAKE3 hash (see [`DiskCache`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey(String);

impl CacheKey {
    /// The key of `ptx` assembled for `target`, for driver `driver_version`, with the
    /// assembler and options spelled `assembler`.
    pub fn new(ptx: &str, target: Target, driver_version: i32, assembler: &str) -> CacheKey {
        CacheKey(hash_parts(&[
            env!("CARGO_PKG_VERSION"),
            target.name(),
            &driver_version.to_string(),
            assembler,
            ptx,
        ]))
    }

    /// The key as hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What identifies a module entry: a hex BLAKE3 hash of the kernel's IR text as built, the
/// target, kiln's version and compiler fingerprint, and the driver's version.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey(String);

impl ModuleKey {
    /// The key of the kernel whose IR (before the passes) prints as `ir`, compiled for
    /// `target` on driver `driver_version`.
    pub fn new(ir: &str, target: Target, driver_version: i32) -> ModuleKey {
        ModuleKey(hash_parts(&[
            env!("CARGO_PKG_VERSION"),
            COMPILER,
            target.name(),
            &driver_version.to_string(),
            ir,
        ]))
    }

    /// The key as hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A [`PtxModule`] as a module entry stores it.
#[derive(Serialize, Deserialize)]
struct ModuleRecord {
    ptx: String,
    entry: String,
    threads_per_block: u32,
    dynamic_smem_bytes: u32,
    target: String,
    /// `(param, box_dims, swizzle_bytes)` per tensor map.
    tensor_maps: Vec<(usize, Vec<u32>, u32)>,
    persistent: bool,
}

impl ModuleRecord {
    fn of(m: &PtxModule) -> ModuleRecord {
        ModuleRecord {
            ptx: m.ptx.clone(),
            entry: m.entry.clone(),
            threads_per_block: m.threads_per_block,
            dynamic_smem_bytes: m.dynamic_smem_bytes,
            target: m.target.name().to_string(),
            tensor_maps: m
                .tensor_maps
                .iter()
                .map(|t| (t.param, t.box_dims.clone(), t.swizzle_bytes))
                .collect(),
            persistent: m.persistent,
        }
    }

    fn module(self) -> Option<PtxModule> {
        Some(PtxModule {
            ptx: self.ptx,
            entry: self.entry,
            threads_per_block: self.threads_per_block,
            dynamic_smem_bytes: self.dynamic_smem_bytes,
            target: self.target.parse().ok()?,
            tensor_maps: self
                .tensor_maps
                .into_iter()
                .map(|(param, box_dims, swizzle_bytes)| TensorMapSpec {
                    param,
                    box_dims,
                    swizzle_bytes,
                })
                .collect(),
            persistent: self.persistent,
        })
    }
}

/// The hex BLAKE3 hash of `parts`, each length-prefixed so no two different lists hash the
/// same bytes.
pub(crate) fn hash_parts(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new();
    for part in parts {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// A cached compilation: the cubin and the assembler's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedCubin {
    /// ptxas's output, loadable with `cuModuleLoadData`.
    pub cubin: Vec<u8>,
    /// ptxas's `-v` log.
    pub log: String,
}

/// One entry file, as `kiln cache ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    /// The file name (the key and the `.cubin` suffix).
    pub name: String,
    /// Bytes on disk.
    pub bytes: u64,
    /// When it was written.
    pub modified: Option<SystemTime>,
}

/// A cache directory.
///
/// An entry is keyed by a BLAKE3 hash of everything that decides the cubin ([`CacheKey`]): the
/// PTX text (which the IR, the target and kiln's code generation determine), the target, kiln's
/// version, the driver's version and how the cubin was assembled. The directory is
/// `$KILN_CACHE_DIR`, else `kiln/` under the platform cache directory; `KILN_CACHE_DIR=off`
/// turns the cache off.
///
/// An entry file is `KILNCUB1`, the BLAKE3 hash of the payload, the cubin's and the log's
/// lengths (little-endian `u64`), then the cubin and the log. It is verified before use: a
/// truncated, corrupt or foreign file is removed and reported as a miss, never loaded. Writes go
/// to a temporary file in the same directory that is renamed into place, so concurrent
/// processes never see half an entry; the last writer of a key wins with a whole entry.
///
/// Beside the cubins, a *module entry* maps a kernel as built (its IR text before the passes,
/// which names every comptime value and alignment) to the PTX module the passes and the PTX
/// writer made of it ([`ModuleKey`], `KILNMOD1` files of the same layout holding the module as
/// JSON), so a warm start skips both and goes straight to the cubin. Its key includes a
/// fingerprint of the compiler's sources (`build.rs`), so a changed compiler never reuses a
/// stale module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// The cache `$KILN_CACHE_DIR` names, else `kiln/` under the platform cache directory;
    /// `None` when the variable is `off` or the platform has no cache directory.
    pub fn from_env() -> Option<DiskCache> {
        DiskCache::from_setting(std::env::var_os("KILN_CACHE_DIR"))
    }

    /// The cache a `KILN_CACHE_DIR` value (or its absence) selects.
    fn from_setting(value: Option<std::ffi::OsString>) -> Option<DiskCache> {
        match value {
            Some(v) if v == "off" => None,
            Some(v) => Some(DiskCache::at(PathBuf::from(v))),
            None => dirs::cache_dir().map(|d| DiskCache::at(d.join("kiln"))),
        }
    }

    /// The cache in directory `dir` (created on the first write).
    pub fn at(dir: impl Into<PathBuf>) -> DiskCache {
        DiskCache { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}{SUFFIX}", key.as_str()))
    }

    fn module_path(&self, key: &ModuleKey) -> PathBuf {
        self.dir.join(format!("{}{MODULE_SUFFIX}", key.as_str()))
    }

    /// The verified payload parts of the entry file at `path`; `None` when there is none or
    /// it does not verify (then the bad file is removed).
    fn read_verified(path: &Path, magic: &[u8; 8]) -> Option<[Vec<u8>; 2]> {
        let bytes = std::fs::read(path).ok()?;
        let parts = decode(magic, &bytes);
        if parts.is_none() {
            // Best effort: another process may have replaced or removed it meanwhile.
            let _ = std::fs::remove_file(path);
        }
        parts
    }

    /// The verified entry for `key`; `None` when there is none or it does not verify (then
    /// the bad file is removed).
    pub fn get(&self, key: &CacheKey) -> Option<CachedCubin> {
        let [cubin, log] = DiskCache::read_verified(&self.path(key), MAGIC)?;
        Some(CachedCubin {
            cubin,
            log: String::from_utf8(log).ok()?,
        })
    }

    /// Stores `entry` under `key` atomically (see [`DiskCache`]).
    pub fn put(&self, key: &CacheKey, entry: &CachedCubin) -> io::Result<()> {
        write_atomic(
            &self.path(key),
            &encode(MAGIC, [&entry.cubin, entry.log.as_bytes()]),
        )
    }

    /// The verified PTX module stored for `key`, as [`DiskCache::get`] reads cubins.
    pub fn get_module(&self, key: &ModuleKey) -> Option<PtxModule> {
        let [json, _] = DiskCache::read_verified(&self.module_path(key), MODULE_MAGIC)?;
        serde_json::from_slice::<ModuleRecord>(&json).ok()?.module()
    }

    /// Stores `module` under `key` atomically.
    pub fn put_module(&self, key: &ModuleKey, module: &PtxModule) -> io::Result<()> {
        let json = serde_json::to_vec(&ModuleRecord::of(module)).map_err(io::Error::other)?;
        write_atomic(&self.module_path(key), &encode(MODULE_MAGIC, [&json, &[]]))
    }

    /// Where the autotuner keeps its choice for `key` (JSON, see `crate::autotune`).
    pub fn autotune_path(&self, key: &str) -> PathBuf {
        self.dir.join("autotune").join(format!("{key}.json"))
    }

    /// Every entry file, by name.
    pub fn entries(&self) -> io::Result<Vec<EntryInfo>> {
        let mut out = Vec::new();
        let dir = match std::fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in dir {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(SUFFIX) && !name.ends_with(MODULE_SUFFIX) {
                continue;
            }
            let meta = e.metadata()?;
            out.push(EntryInfo {
                name,
                bytes: meta.len(),
                modified: meta.modified().ok(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes every entry file; returns how many.
    pub fn clear(&self) -> io::Result<usize> {
        let entries = self.entries()?;
        for e in &entries {
            match std::fs::remove_file(self.dir.join(&e.name)) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
                _ => {}
            }
        }
        Ok(entries.len())
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory renamed into place,
/// so a concurrent reader sees the old file or the whole new one.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// An entry file's bytes: `magic`, the payload's hash, the two parts' lengths, the parts.
fn encode(magic: &[u8; 8], parts: [&[u8]; 2]) -> Vec<u8> {
    let payload = parts.concat();
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(blake3::hash(&payload).as_bytes());
    for part in parts {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
    }
    out.extend_from_slice(&payload);
    out
}

/// The two parts in `bytes`, when its magic, lengths and hash all agree.
fn decode(magic: &[u8; 8], bytes: &[u8]) -> Option<[Vec<u8>; 2]> {
    let header = bytes.get(..HEADER)?;
    if &header[..8] != magic {
        return None;
    }
    let length = |at: usize| -> Option<usize> {
        let b: [u8; 8] = header[at..at + 8].try_into().ok()?;
        usize::try_from(u64::from_le_bytes(b)).ok()
    };
    let (first, second) = (length(40)?, length(48)?);
    let payload = &bytes[HEADER..];
    if payload.len() != first.checked_add(second)?
        || blake3::hash(payload).as_bytes() != &header[8..40]
    {
        return None;
    }
    Some([payload[..first].to_vec(), payload[first..].to_vec()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8) -> CachedCubin {
        CachedCubin {
            cubin: (0..200u16).map(|i| (i as u8) ^ n).collect(),
            log: format!("ptxas info : Used {n} registers"),
        }
    }

    #[test]
    fn entries_round_trip_and_list() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = DiskCache::at(dir.path().join("kiln"));
        let k = CacheKey::new("ptx", Target::Sm90a, 13000, "verbose");
        assert_eq!(cache.get(&k), None, "nothing cached yet");
        assert_eq!(cache.entries().expect("ls"), []);
        cache.put(&k, &entry(7)).expect("put");
        assert_eq!(cache.get(&k), Some(entry(7)));
        let ls = cache.entries().expect("ls");
        assert_eq!(ls.len(), 1);
        assert_eq!(ls[0].name, format!("{}.cubin", k.as_str()));
        assert_eq!(ls[0].bytes, (HEADER + 200 + entry(7).log.len()) as u64);
        // A second put replaces the entry whole.
        cache.put(&k, &entry(9)).expect("put again");
        assert_eq!(cache.get(&k), Some(entry(9)));
        assert_eq!(cache.clear().expect("clear"), 1);
        assert_eq!(cache.get(&k), None);
    }

    #[test]
    fn keys_differ_in_every_input() {
        let base = CacheKey::new("ptx", Target::Sm90a, 13000, "o");
        for other in [
            CacheKey::new("ptx ", Target::Sm90a, 13000, "o"),
            CacheKey::new("ptx", Target::Sm80, 13000, "o"),
            CacheKey::new("ptx", Target::Sm90a, 12080, "o"),
            CacheKey::new("ptx", Target::Sm90a, 13000, "o2"),
            // The same bytes split differently between two inputs.
            CacheKey::new("xptx", Target::Sm90a, 13000, ""),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(base, CacheKey::new("ptx", Target::Sm90a, 13000, "o"));
        assert_eq!(base.as_str().len(), 64);
    }

    #[test]
    fn corrupt_and_truncated_entries_are_misses_and_removed() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = DiskCache::at(dir.path());
        let k = CacheKey::new("ptx", Target::Sm80, 13000, "");
        let path = cache.path(&k);
        let e = entry(3);
        let good = encode(MAGIC, [&e.cubin, e.log.as_bytes()]);
        let mut flipped = good.clone();
        flipped[HEADER + 17] ^= 1;
        let mut foreign = good.clone();
        foreign[0] = b'X';
        let mut long_len = good.clone();
        long_len[40] = long_len[40].wrapping_add(1);
        for bad in [
            good[..good.len() - 1].to_vec(),
            good[..HEADER - 1].to_vec(),
            flipped,
            foreign,
            long_len,
            Vec::new(),
        ] {
            std::fs::write(&path, &bad).expect("write");
            assert_eq!(
                cache.get(&k),
                None,
                "a bad entry of {} bytes was used",
                bad.len()
            );
            assert!(!path.exists(), "the bad entry is removed");
        }
        std::fs::write(&path, &good).expect("write");
        assert_eq!(cache.get(&k), Some(entry(3)));
    }

    fn module(n: u32) -> PtxModule {
        PtxModule {
            ptx: format!(".version 8.0\n// module {n}\n"),
            entry: "attention".into(),
            threads_per_block: 384,
            dynamic_smem_bytes: 1024 * n,
            target: Target::Sm90a,
            tensor_maps: vec![TensorMapSpec {
                param: 3,
                box_dims: vec![1, 1, 128, 64],
                swizzle_bytes: 128,
            }],
            persistent: true,
        }
    }

    #[test]
    fn module_entries_round_trip_and_verify() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = DiskCache::at(dir.path());
        let k = ModuleKey::new("kernel attention(...)", Target::Sm90a, 13000);
        assert_eq!(cache.get_module(&k), None);
        cache.put_module(&k, &module(2)).expect("put");
        assert_eq!(cache.get_module(&k), Some(module(2)));
        // Listed and cleared with the cubins.
        let ls = cache.entries().expect("ls");
        assert_eq!(ls.len(), 1);
        assert_eq!(ls[0].name, format!("{}.module", k.as_str()));
        // A flipped byte is a miss, and the file goes.
        let path = cache.module_path(&k);
        let mut bad = std::fs::read(&path).expect("read");
        bad[HEADER + 5] ^= 1;
        std::fs::write(&path, &bad).expect("write");
        assert_eq!(cache.get_module(&k), None);
        assert!(!path.exists());
        cache.put_module(&k, &module(3)).expect("put");
        assert_eq!(cache.clear().expect("clear"), 1);
        // The key covers the IR, the target and the driver (and the compiler, at build time).
        for other in [
            ModuleKey::new("kernel attention(..)", Target::Sm90a, 13000),
            ModuleKey::new("kernel attention(...)", Target::Sm80, 13000),
            ModuleKey::new("kernel attention(...)", Target::Sm90a, 12080),
        ] {
            assert_ne!(k, other);
        }
        assert!(!COMPILER.is_empty());
    }

    #[test]
    fn concurrent_writers_leave_a_whole_entry() {
        let dir = tempfile::tempdir().expect("tmp");
        let cache = DiskCache::at(dir.path());
        let k = CacheKey::new("shared", Target::Sm90a, 13000, "");
        std::thread::scope(|s| {
            for n in 0..8u8 {
                let (cache, k) = (cache.clone(), k.clone());
                s.spawn(move || {
                    for _ in 0..20 {
                        cache.put(&k, &entry(n)).expect("put");
                        let got = cache.get(&k).expect("a whole entry is always there");
                        assert!((0..8).any(|m| got == entry(m)));
                    }
                });
            }
        });
        // No temporary file is left behind.
        let files = std::fs::read_dir(dir.path()).expect("ls").count();
        assert_eq!(files, 1);
    }

    #[test]
    fn the_setting_turns_it_off_or_names_the_directory() {
        assert_eq!(DiskCache::from_setting(Some("off".into())), None);
        assert_eq!(
            DiskCache::from_setting(Some("/tmp/kiln-cache-test".into())),
            Some(DiskCache::at("/tmp/kiln-cache-test"))
        );
        // Unset: the platform cache directory's kiln/, where the platform has one.
        if let Some(c) = DiskCache::from_setting(None) {
            assert!(c.dir().ends_with("kiln"), "{}", c.dir().display());
        }
    }
}
