//! Files the agent keeps in its state directory (workload digests, suspensions, image credential
//! records): written whole, owner-only, and renamed into place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Serialize, de::DeserializeOwned};

/// One small JSON file per machine in a directory of the state directory
/// (`<dir>/<machine>.json`), created when first needed: the shape of the agent's records of its
/// machines ([`crate::workload_records`], [`crate::suspensions`]).
#[derive(Debug, Clone)]
pub struct MachineFiles {
    dir: PathBuf,
}

impl MachineFiles {
    /// Files kept in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, machine: &str) -> PathBuf {
        // Machine names are checked by the node API (letters, digits, '-', '_'): no separators.
        self.dir.join(format!("{machine}.json"))
    }

    /// The file of `machine`, if there is one that can be read.
    pub fn read(&self, machine: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(machine)).ok()
    }

    /// Writes the file of `machine` as JSON ([`write_private`]).
    pub fn write<T: serde::Serialize>(&self, machine: &str, value: &T) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        write_private(
            &self.path(machine),
            &serde_json::to_vec(value).map_err(std::io::Error::other)?,
        )
    }

    /// Removes the file of `machine` (nothing to do when there is none).
    pub fn remove(&self, machine: &str) {
        let _ = std::fs::remove_file(self.path(machine));
    }

    /// The machines with a file, sorted.
    pub fn names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                name.strip_suffix(".json").map(str::to_string)
            })
            .collect();
        names.sort();
        names
    }
}

/// The agent's records of one kind, one per name: files in a directory of the state directory
/// ([`MachineFiles`]), or, for an agent with no state directory (as some tests run it), this
/// process's memory.
#[derive(Debug)]
pub struct Records<T> {
    store: Store<T>,
}

#[derive(Debug)]
enum Store<T> {
    Files(MachineFiles),
    Memory(Mutex<BTreeMap<String, T>>),
}

impl<T: Serialize + DeserializeOwned + Clone> Records<T> {
    /// Records kept in `dir` (created when first needed).
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            store: Store::Files(MachineFiles::new(dir)),
        }
    }

    /// Records kept in this process's memory only: they go with it.
    pub fn in_memory() -> Self {
        Self {
            store: Store::Memory(Mutex::default()),
        }
    }

    fn memory(map: &Mutex<BTreeMap<String, T>>) -> MutexGuard<'_, BTreeMap<String, T>> {
        map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether there is a record of `name`, readable or not.
    pub fn exists(&self, name: &str) -> bool {
        match &self.store {
            Store::Files(files) => files.path(name).exists(),
            Store::Memory(map) => Self::memory(map).contains_key(name),
        }
    }

    /// The record of `name`; `None` when there is none or it cannot be read.
    pub fn read(&self, name: &str) -> Option<T> {
        match &self.store {
            Store::Files(files) => serde_json::from_slice(&files.read(name)?).ok(),
            Store::Memory(map) => Self::memory(map).get(name).cloned(),
        }
    }

    /// Writes the record of `name` (a new file renamed into place, owner-only, synced).
    pub fn write(&self, name: &str, record: &T) -> std::io::Result<()> {
        match &self.store {
            Store::Files(files) => files.write(name, record),
            Store::Memory(map) => {
                Self::memory(map).insert(name.to_string(), record.clone());
                Ok(())
            }
        }
    }

    /// Forgets `name` (nothing to do when there is no record).
    pub fn remove(&self, name: &str) {
        match &self.store {
            Store::Files(files) => files.remove(name),
            Store::Memory(map) => {
                Self::memory(map).remove(name);
            }
        }
    }

    /// The names with a record, sorted.
    pub fn names(&self) -> Vec<String> {
        match &self.store {
            Store::Files(files) => files.names(),
            Store::Memory(map) => Self::memory(map).keys().cloned().collect(),
        }
    }

    /// Every readable record with its name, sorted by name.
    pub fn all(&self) -> Vec<(String, T)> {
        self.names()
            .into_iter()
            .filter_map(|name| self.read(&name).map(|record| (name, record)))
            .collect()
    }
}

/// Writes `bytes` to `path` through a new owner-only file (`<path>.tmp`, synced) renamed into
/// place, so a reader sees the old content or the new, never a part.
pub fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(tmp, path)
}
