//! The cluster tier's images, built without a container engine daemon: a root filesystem is put
//! together from the files of named Debian packages (as installed on this Debian machine) and the
//! binaries cargo built, then `buildah` (Debian) turns it into an OCI archive that the node's
//! containerd imports. The operator and runtime images mirror the Dockerfile's `operator` and
//! `runtime` stages: the same entrypoint, user, environment and files, and the runtime's smolvm is
//! unpacked from the same pinned wheel by the same script (`deploy/image/unpack-smolvm.sh`).
//! `tests/tests/deploy/images.rs` keeps these specs and the Dockerfile in step.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::{OPERATOR_IMAGE, PAUSE_IMAGE, PROBE_IMAGE, RUNTIME_IMAGE, host_tool};
use crate::assets::OperatorBins;

/// A file the image carries, from the build host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFile {
    /// Where it comes from on this machine.
    pub source: PathBuf,
    /// Where it lands in the image (a directory is copied whole).
    pub dest: &'static str,
    /// Its mode in the image (`COPY --chmod`), when not the source's.
    pub mode: Option<u32>,
}

/// What an image holds and how it starts.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The image reference the pods name.
    pub reference: &'static str,
    /// The Dockerfile stage it mirrors, if any.
    pub stage: Option<&'static str>,
    /// What the image starts from.
    pub base: Base,
    /// Files beyond the base.
    pub files: Vec<ImageFile>,
    /// `USER`, if not root.
    pub user: Option<&'static str>,
    /// `ENTRYPOINT`.
    pub entrypoint: Vec<&'static str>,
    /// `CMD`.
    pub cmd: Vec<&'static str>,
    /// `ENV`.
    pub env: Vec<(&'static str, &'static str)>,
    /// Symlinks to make (`link`, `target`).
    pub links: Vec<(&'static str, &'static str)>,
}

/// The base of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// Nothing (a static program).
    Scratch,
    /// What `debian:<release>-slim` holds, made from this Debian machine's installed packages:
    /// every package of priority `required` (and every `Essential` one), the libraries they
    /// link against, and these further packages (what the Dockerfile stage `apt-get install`s).
    DebianSlim(&'static [&'static str]),
}

/// The operator image (Dockerfile stage `operator`): the controller and the webhook, as uid 65532.
pub fn operator(bins: &OperatorBins) -> ImageSpec {
    ImageSpec {
        reference: OPERATOR_IMAGE,
        stage: Some("operator"),
        base: Base::DebianSlim(&[]),
        files: vec![
            ImageFile {
                source: bins.controller.clone(),
                dest: "/usr/local/bin/smolvm-controller",
                mode: None,
            },
            ImageFile {
                source: bins.webhook.clone(),
                dest: "/usr/local/bin/smolvm-webhook",
                mode: None,
            },
        ],
        user: Some("65532:65532"),
        entrypoint: vec!["/usr/local/bin/smolvm-controller"],
        cmd: vec![],
        env: vec![],
        links: vec![],
    }
}

/// The runtime image (Dockerfile stage `runtime`): the agent, smolvm unpacked into /opt/smolvm,
/// and the entrypoint that prepares smolvm's library directory.
pub fn runtime(bins: &OperatorBins, smolvm_dist: &Path, entrypoint_script: &Path) -> ImageSpec {
    ImageSpec {
        reference: RUNTIME_IMAGE,
        stage: Some("runtime"),
        base: Base::DebianSlim(&["ca-certificates"]),
        files: vec![
            ImageFile {
                source: smolvm_dist.to_path_buf(),
                dest: "/opt/smolvm",
                mode: None,
            },
            ImageFile {
                source: bins.runtime.clone(),
                dest: "/usr/local/bin/smolvm-runtime",
                mode: None,
            },
            ImageFile {
                source: entrypoint_script.to_path_buf(),
                dest: "/usr/local/bin/smolvm-runtime-entrypoint",
                mode: Some(0o755),
            },
        ],
        user: None,
        entrypoint: vec!["/usr/local/bin/smolvm-runtime-entrypoint"],
        cmd: vec![],
        env: vec![("SMOLVM_DIST", "/opt/smolvm")],
        links: vec![],
    }
}

/// The pods' sandbox image: catatonit (Debian, static) in its pause mode.
pub fn pause() -> anyhow::Result<ImageSpec> {
    Ok(ImageSpec {
        reference: PAUSE_IMAGE,
        stage: None,
        base: Base::Scratch,
        files: vec![ImageFile {
            source: host_tool("catatonit").context("catatonit is not installed")?,
            dest: "/catatonit",
            mode: None,
        }],
        user: Some("65535:65535"),
        entrypoint: vec!["/catatonit", "-P"],
        cmd: vec![],
        env: vec![],
        links: vec![],
    })
}

/// A probe image for pods that test the network: debian-slim's bash (its `/dev/tcp`) and
/// coreutils' `timeout` are the client.
pub fn probe() -> ImageSpec {
    ImageSpec {
        reference: PROBE_IMAGE,
        stage: None,
        base: Base::DebianSlim(&[]),
        files: vec![],
        user: None,
        entrypoint: vec![],
        cmd: vec!["sleep", "infinity"],
        env: vec![],
        links: vec![],
    }
}

/// Builds `spec` under `work` into an OCI archive and returns the archive's path.
pub fn build(spec: &ImageSpec, work: &Path) -> anyhow::Result<PathBuf> {
    let slug: String = spec
        .reference
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let rootfs = work.join(format!("{slug}.rootfs"));
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)?;
    }
    std::fs::create_dir_all(&rootfs)?;
    let mut packages: BTreeSet<String> = BTreeSet::new();
    if let Base::DebianSlim(extra) = spec.base {
        packages.extend(debian_required_packages()?);
        packages.extend(extra.iter().map(|p| (*p).to_string()));
        // What the packages' install scripts make: /bin/sh, and the users and groups.
        std::fs::create_dir_all(rootfs.join("bin"))?;
        std::os::unix::fs::symlink("dash", rootfs.join("bin/sh"))?;
        std::fs::create_dir_all(rootfs.join("etc"))?;
        for (master, file) in [("passwd.master", "etc/passwd"), ("group.master", "etc/group")] {
            std::fs::copy(Path::new("/usr/share/base-passwd").join(master), rootfs.join(file))?;
        }
    }
    for package in &packages {
        copy_package(package, &rootfs)?;
    }
    for file in &spec.files {
        let dest = rootfs.join(file.dest.trim_start_matches('/'));
        copy_tree(&file.source, &dest)
            .with_context(|| format!("copying {} to {}", file.source.display(), file.dest))?;
        if let Some(mode) = file.mode {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
        }
    }
    for (link, target) in &spec.links {
        let at = rootfs.join(link.trim_start_matches('/'));
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if !at.exists() {
            std::os::unix::fs::symlink(target, &at)?;
        }
    }
    for dir in ["tmp", "etc", "proc", "sys", "dev"] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    // Kubernetes bind-mounts /etc/hosts, /etc/hostname and /etc/resolv.conf; give them a place.
    for file in ["etc/hosts", "etc/hostname", "etc/resolv.conf"] {
        std::fs::write(rootfs.join(file), "")?;
    }
    // The libraries the programs link against, package by package, as apt's dependencies would
    // bring them.
    loop {
        let missing = missing_libraries(&rootfs)?;
        if missing.is_empty() {
            break;
        }
        let owners: BTreeSet<String> = missing.iter().filter_map(|(_, path)| owning_package(path)).collect();
        let new: Vec<String> = owners.difference(&packages).cloned().collect();
        if spec.base == Base::Scratch || new.is_empty() {
            bail!(
                "the image lacks shared libraries: {}",
                missing
                    .iter()
                    .map(|(what, _)| what.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        for package in new {
            copy_package(&package, &rootfs)?;
            packages.insert(package);
        }
    }

    let archive = work.join(format!("{slug}.oci.tar"));
    let buildah = Buildah::new(work)?;
    let container = buildah.output(&["from", "scratch"])?;
    let container = container.trim();
    let built = (|| {
        buildah.output(&["copy", container, &format!("{}/", rootfs.display()), "/"])?;
        let mut config = vec!["config".to_string()];
        let json = |v: &[&str]| serde_json::to_string(v).unwrap_or_else(|_| "[]".to_string());
        config.push(format!("--entrypoint={}", json(&spec.entrypoint)));
        config.push(format!("--cmd={}", json(&spec.cmd)));
        if let Some(user) = spec.user {
            config.push(format!("--user={user}"));
        }
        for (k, v) in &spec.env {
            config.push(format!("--env={k}={v}"));
        }
        config.push(container.to_string());
        buildah.output(&config.iter().map(String::as_str).collect::<Vec<_>>())?;
        buildah.output(&[
            "commit",
            "--format=oci",
            container,
            &format!("oci-archive:{}:{}", archive.display(), spec.reference),
        ])
    })();
    let _ = buildah.output(&["rm", container]);
    built?;
    std::fs::remove_dir_all(&rootfs)?;
    Ok(archive)
}

/// buildah with its storage in the run's work directory (vfs: no mounts). One file it keeps on
/// the host: Debian's buildah (1.28) has no flag to move the blob-info cache that `commit`
/// updates, `/var/lib/containers/cache/blob-info-cache-v1.boltdb`, a cache like apt's.
struct Buildah {
    bin: PathBuf,
    root: PathBuf,
    runroot: PathBuf,
}

impl Buildah {
    fn new(work: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            bin: host_tool("buildah").context("buildah is not installed")?,
            root: work.join("buildah/root"),
            runroot: work.join("buildah/run"),
        })
    }

    fn output(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.bin)
            .arg(format!("--root={}", self.root.display()))
            .arg(format!("--runroot={}", self.runroot.display()))
            .arg("--storage-driver=vfs")
            .args(args)
            .env("BUILDAH_ISOLATION", "chroot")
            .output()
            .context("running buildah")?;
        if !out.status.success() {
            bail!(
                "buildah {} failed: {}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Copies the installed files of a Debian package (documentation left out) into `rootfs`.
fn copy_package(package: &str, rootfs: &Path) -> anyhow::Result<()> {
    let out = Command::new("dpkg-query")
        .args(["-L", package])
        .output()
        .context("running dpkg-query")?;
    if !out.status.success() {
        bail!(
            "the Debian package {package} is not installed here (apt-get install {package}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = Path::new(line.trim());
        if !path.is_absolute()
            || [
                "/usr/share/doc",
                "/usr/share/man",
                "/usr/share/locale",
                "/usr/share/lintian",
                "/usr/share/info",
            ]
            .iter()
            .any(|p| path.starts_with(p))
        {
            continue;
        }
        // Directories (and, on a merged-/usr host, symlinks to them such as /lib64) are made as
        // plain directories when a file needs them.
        let Ok(meta) = std::fs::metadata(path) else { continue };
        if meta.is_dir() {
            continue;
        }
        let dest = rootfs.join(path.strip_prefix("/")?);
        copy_tree(path, &dest)?;
    }
    // ca-certificates' bundle is generated at install time, so no package lists it.
    if package == "ca-certificates" {
        let bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
        copy_tree(bundle, &rootfs.join("etc/ssl/certs/ca-certificates.crt"))?;
    }
    Ok(())
}

/// Copies a file, a symlink (as a symlink) or a directory tree.
fn copy_tree(source: &Path, dest: &Path) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(source).with_context(|| format!("reading {}", source.display()))?;
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if meta.file_type().is_symlink() {
        if std::fs::symlink_metadata(dest).is_ok() {
            std::fs::remove_file(dest)?;
        }
        std::os::unix::fs::symlink(std::fs::read_link(source)?, dest)?;
    } else if meta.is_dir() {
        std::fs::create_dir_all(dest)?;
        std::fs::set_permissions(dest, meta.permissions())?;
        for entry in std::fs::read_dir(source)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dest.join(entry.file_name()))?;
        }
    } else {
        std::fs::copy(source, dest)?;
    }
    Ok(())
}

/// The packages a debian-slim image holds: priority `required`, or `Essential`.
fn debian_required_packages() -> anyhow::Result<Vec<String>> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package}\t${Essential}\t${Priority}\t${db:Status-Abbrev}\n"])
        .output()
        .context("running dpkg-query")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split('\t').collect();
            let installed = fields.get(3).is_some_and(|s| s.starts_with("ii"));
            (installed && (fields.get(1) == Some(&"yes") || fields.get(2) == Some(&"required")))
                .then(|| fields[0].to_string())
        })
        .collect())
}

/// The installed package that owns a file (`dpkg-query -S`), under the name the loader found
/// it by or, on a merged-/usr host, under /usr.
fn owning_package(path: &Path) -> Option<String> {
    let under_usr = Path::new("/usr").join(path.strip_prefix("/").ok()?);
    [path.to_path_buf(), under_usr].iter().find_map(|candidate| {
        let out = Command::new("dpkg-query").arg("-S").arg(candidate).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let owner = text.lines().next()?.split(':').next()?.trim().to_string();
        (!owner.is_empty()).then_some(owner)
    })
}

/// Every shared library an ELF file in `rootfs` needs that `rootfs` lacks: what (library and
/// the file needing it) and where the host has it.
fn missing_libraries(rootfs: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut present = BTreeSet::new();
    let mut elves = Vec::new();
    walk(rootfs, &mut |path| {
        if let Some(name) = path.file_name() {
            present.insert(name.to_string_lossy().into_owned());
        }
        if is_elf(path) {
            elves.push(path.to_path_buf());
        }
    })?;
    let mut missing = std::collections::BTreeMap::new();
    for elf in elves {
        let out = Command::new("ldd").arg(&elf).output().context("running ldd")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((name, rest)) = line.trim().split_once(" => ") else {
                continue;
            };
            if !present.contains(name) {
                let host_path = PathBuf::from(rest.split(" (").next().unwrap_or_default().trim());
                let what = format!(
                    "{name} (needed by {})",
                    elf.strip_prefix(rootfs).unwrap_or(&elf).display()
                );
                missing.entry(name.to_string()).or_insert((what, host_path));
            }
        }
    }
    Ok(missing.into_values().collect())
}

fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&path, visit)?;
        } else {
            visit(&path);
        }
    }
    Ok(())
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// smolvm for the runtime image, as the Dockerfile's `smolvm` stage makes it: the pinned wheel
/// (`deploy/image/smolmachines.txt`, sha256-checked by pip) unpacked by
/// `deploy/image/unpack-smolvm.sh` into `work/smolvm-dist`. The wheel is kept in a cache.
pub fn smolvm_dist(repo: &Path, work: &Path) -> anyhow::Result<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("smolvm-operator/wheels");
    std::fs::create_dir_all(&cache)?;
    let pins = repo.join("deploy/image/smolmachines.txt");
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--require-hashes",
            "-r",
        ])
        .arg(&pins)
        .arg("-d")
        .arg(&cache)
        .output()
        .context("running pip download")?;
    if !out.status.success() {
        bail!(
            "pip download -r {} failed: {}",
            pins.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let pinned = std::fs::read_to_string(&pins)?;
    let version = pinned
        .lines()
        .find_map(|l| l.trim().strip_prefix("smolmachines=="))
        .and_then(|rest| rest.split_whitespace().next())
        .context("deploy/image/smolmachines.txt pins no smolmachines version")?;
    let wheel = std::fs::read_dir(&cache)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("smolmachines-{version}-")))
        })
        .with_context(|| format!("no smolmachines {version} wheel in {}", cache.display()))?;
    let dist = work.join("smolvm-dist");
    let out = Command::new("sh")
        .arg(repo.join("deploy/image/unpack-smolvm.sh"))
        .arg(&wheel)
        .arg(&dist)
        .output()
        .context("running deploy/image/unpack-smolvm.sh")?;
    if !out.status.success() {
        bail!(
            "unpack-smolvm.sh failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(dist)
}
