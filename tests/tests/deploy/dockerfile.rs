//! The Dockerfile and its scripts.

use super::*;

pub(super) fn workspace_members() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("workspace members");
    line.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

/// The binaries the two images ship, built by the Dockerfile.
const IMAGE_BINS: [&str; 3] = ["smolvm-controller", "smolvm-webhook", "smolvm-runtime"];

#[test]
pub(super) fn dockerfile_builds_both_images_from_official_bases() {
    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let mut stages = Vec::new();
    for line in &lines {
        if let Some(rest) = line.strip_prefix("FROM ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let image = words[0];
            // No registry host: the first path component of a Docker Hub name has no '.' or ':'.
            let first = image.split('/').next().unwrap_or_default();
            let registry = image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
            assert!(!registry, "FROM {image} names a registry host");
            if let Some(i) = words.iter().position(|w| w.eq_ignore_ascii_case("AS")) {
                stages.push(words[i + 1].to_string());
            }
        }
        if let Some(rest) = line.strip_prefix("COPY ") {
            if rest.starts_with("--from") {
                continue;
            }
            let words: Vec<&str> = rest.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            for source in &words[..words.len() - 1] {
                if *source != "." {
                    assert!(repo().join(source).exists(), "COPY {source}: no such file");
                }
            }
        }
    }
    for stage in ["deps", "build", "smolvm", "runtime", "operator"] {
        assert!(stages.iter().any(|s| s == stage), "no stage {stage}: {stages:?}");
    }
    for member in workspace_members() {
        assert!(
            dockerfile.contains(&format!("COPY {member}/Cargo.toml {member}/Cargo.toml")),
            "the deps stage must copy {member}/Cargo.toml"
        );
    }
    for bin in IMAGE_BINS {
        assert!(dockerfile.contains(&format!("--bin {bin}")), "{bin} is not built");
    }
    // The operator image runs as a non-root user; the runtime's root is documented.
    let operator = dockerfile.split("AS operator").nth(1).expect("operator stage");
    let user = operator
        .lines()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("USER in the operator stage");
    assert!(!user.starts_with('0') && !user.starts_with("root"), "USER {user}");
    assert!(dockerfile.contains("ENTRYPOINT [\"/usr/local/bin/smolvm-runtime-entrypoint\"]"));
}

/// The images ship the binaries of Cargo's `dist` profile (the release profile with fat LTO),
/// the build webhook/bench/run.sh measures.
#[test]
pub(super) fn images_ship_the_dist_profile() {
    let dockerfile = read("Dockerfile");
    let builds: Vec<&str> = dockerfile.lines().filter(|l| l.contains("cargo build")).collect();
    assert!(!builds.is_empty(), "the Dockerfile runs no cargo build");
    for line in builds {
        assert!(line.contains("--profile dist"), "not the dist profile: {line}");
    }
    for bin in IMAGE_BINS {
        assert!(
            dockerfile.contains(&format!("target/dist/{bin}")),
            "{bin} is not copied from target/dist"
        );
    }
    let manifest = read("Cargo.toml");
    let dist = manifest
        .split("[profile.dist]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("[profile.dist] in Cargo.toml");
    for setting in ["inherits = \"release\"", "lto = \"fat\"", "codegen-units = 1"] {
        assert!(dist.contains(setting), "[profile.dist] lacks {setting}");
    }
    assert!(read("webhook/bench/run.sh").contains("cargo build --profile dist"));
}

#[test]
pub(super) fn smolvm_pin_matches_the_ci_install() {
    let install = read(".ci/install-smolvm.sh");
    let version = install
        .lines()
        .find_map(|l| l.strip_prefix("SMOLVM_VERSION=\""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("SMOLVM_VERSION in .ci/install-smolvm.sh");
    let pin = read("deploy/image/smolmachines.txt");
    let line = pin
        .lines()
        .find(|l| l.starts_with("smolmachines=="))
        .expect("the smolmachines requirement");
    assert!(
        line.starts_with(&format!("smolmachines=={version} --hash=sha256:")),
        "deploy/image/smolmachines.txt: {line} (CI installs {version})"
    );
    let hash = line.rsplit(':').next().unwrap_or_default();
    assert!(
        hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{hash}"
    );
    assert!(read("Dockerfile").contains(&format!("smolvm {version}")));
}

/// The files the runtime needs from the wheel: the ones .ci/install-smolvm.sh checks.
pub(super) const SMOLVM_FILES: [&str; 6] = [
    "smol-vmm",
    "libkrun.so",
    "libkrunfw.so.5",
    "agent-rootfs.tar.zst",
    "overlay-template.ext4.zst",
    "storage-template.ext4.zst",
];

pub(super) fn python3() -> Option<&'static str> {
    Command::new("python3")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "python3")
}

/// A wheel-shaped zip with `files` under smol/ (content: their names) and a METADATA.
pub(super) fn fake_wheel(dir: &Path, files: &[&str]) -> PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("smol/licenses")).expect("mkdir");
    std::fs::create_dir_all(tree.join("smolmachines-1.32.2.dist-info")).expect("mkdir");
    for f in files {
        std::fs::write(tree.join("smol").join(f), f.as_bytes()).expect("write");
    }
    std::fs::write(tree.join("smol/__init__.py"), "").expect("write");
    std::fs::write(tree.join("smol/licenses/LICENSE"), "license").expect("write");
    std::fs::write(
        tree.join("smolmachines-1.32.2.dist-info/METADATA"),
        "Metadata-Version: 2.4\nName: smolmachines\nVersion: 1.32.2\n",
    )
    .expect("write");
    let wheel = dir.join("smolmachines-1.32.2-cp39-abi3-manylinux_2_28_x86_64.whl");
    let output = run(Command::new("python3")
        .current_dir(&tree)
        .args(["-m", "zipfile", "-c"])
        .arg(&wheel)
        .args(["smol", "smolmachines-1.32.2.dist-info"]));
    assert!(output.status.success(), "zip: {}", text(&output.stderr));
    wheel
}

pub(super) fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
pub(super) fn unpack_smolvm_copies_what_the_runtime_needs() {
    if python3().is_none() {
        println!("skipped: python3 not found (the image's smolvm stage has it)");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let wheel = fake_wheel(dir.path(), &SMOLVM_FILES);
    let dest = dir.path().join("opt/smolvm");
    let output = run(script("deploy/image/unpack-smolvm.sh").arg(&wheel).arg(&dest));
    assert!(output.status.success(), "unpack-smolvm.sh: {}", text(&output.stderr));
    for f in SMOLVM_FILES {
        let got = std::fs::read_to_string(dest.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(got, f);
    }
    assert_eq!(mode(&dest.join("smol-vmm")), 0o755);
    assert_eq!(mode(&dest.join("libkrun.so")), 0o755);
    assert_eq!(mode(&dest.join("agent-rootfs.tar.zst")), 0o644);
    assert!(dest.join("licenses/LICENSE").is_file());
    assert!(!dest.join("__init__.py").exists(), "the Python SDK stays out");
    assert_eq!(
        std::fs::read_to_string(dest.join("VERSION")).expect("VERSION"),
        "1.32.2\n"
    );

    let broken_dir = tempfile::tempdir().expect("temp dir");
    let broken = fake_wheel(broken_dir.path(), &SMOLVM_FILES[..5]);
    let output = run(script("deploy/image/unpack-smolvm.sh")
        .arg(&broken)
        .arg(broken_dir.path().join("out")));
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("smol/storage-template.ext4.zst is missing"));
    let output = run(script("deploy/image/unpack-smolvm.sh")
        .arg(dir.path().join("nothing.whl"))
        .arg(&dest));
    assert!(!output.status.success());
}

#[test]
pub(super) fn the_pinned_wheel_has_the_files_the_image_copies() {
    // `make test` exports the real smolvm's package directory (.ci/install-smolvm.sh).
    let Some(lib_dir) = std::env::var_os("SMOLVM_LIB_DIR") else {
        println!("skipped: SMOLVM_LIB_DIR is not set (run through `make test`, which installs smolvm)");
        return;
    };
    let lib_dir = PathBuf::from(lib_dir);
    for f in SMOLVM_FILES {
        assert!(lib_dir.join(f).is_file(), "{} lacks {f}", lib_dir.display());
    }
}

/// The variables .ci/install-smolvm.sh exports for smolvm (not its own SMOLVM_HOME).
pub(super) fn install_script_exports() -> BTreeSet<String> {
    read(".ci/install-smolvm.sh")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("echo \"export "))
        .filter_map(|l| l.split('=').next())
        .filter(|v| *v != "SMOLVM_HOME")
        .map(str::to_string)
        .collect()
}

pub(super) struct EntrypointRun {
    ok: bool,
    stderr: String,
    env: BTreeMap<String, String>,
    args: Vec<String>,
}

pub(super) fn run_entrypoint(root: &Path, args: &[&str]) -> EntrypointRun {
    let record = root.join("record");
    let fake = root.join("fake-runtime");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nenv > '{0}.env'\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > '{0}.args'\n",
            record.display()
        ),
    )
    .expect("write the fake runtime");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let _ = std::fs::remove_file(record.with_extension("env"));
    let output = run(script("deploy/image/runtime-entrypoint.sh")
        .args(args)
        .env("SMOLVM_DIST", root.join("dist"))
        .env("SMOLVM_RUNTIME_STATE_DIR", root.join("state"))
        .env("SMOLVM_RUNTIME_BIN", &fake));
    let env = std::fs::read_to_string(record.with_extension("env"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args = std::fs::read_to_string(record.with_extension("args"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    EntrypointRun {
        ok: output.status.success(),
        stderr: text(&output.stderr),
        env,
        args,
    }
}

#[test]
pub(super) fn runtime_entrypoint_prepares_a_persistent_library_directory() {
    let root = tempfile::tempdir().expect("temp dir");
    let dist = root.path().join("dist");
    std::fs::create_dir_all(&dist).expect("mkdir");
    for f in SMOLVM_FILES {
        std::fs::write(dist.join(f), f).expect("write");
    }
    std::fs::write(dist.join("VERSION"), "1.32.2\n").expect("write");

    let first = run_entrypoint(root.path(), &["--log-format", "text", "two words"]);
    assert!(first.ok, "entrypoint: {}", first.stderr);
    let lib = root.path().join("state/lib/smolvm-1.32.2");
    for f in SMOLVM_FILES {
        assert_eq!(std::fs::read_to_string(lib.join(f)).expect("copied"), f);
    }
    assert_eq!(mode(&lib.join("smol-vmm")), 0o755);
    assert_eq!(mode(&lib), 0o755, "smolvm's per-VM uids must traverse it");
    assert_eq!(
        first.args,
        ["--log-format", "text", "two words"],
        "arguments pass through"
    );
    let lib_text = lib.display().to_string();
    let want: BTreeMap<String, String> = [
        ("SMOLVM_LIB_DIR", lib_text.clone()),
        ("SMOLVM_BIN", format!("{lib_text}/smol-vmm")),
        ("SMOLVM_BOOT_BINARY", format!("{lib_text}/smol-vmm")),
        ("SMOLVM_AGENT_ROOTFS_TAR", format!("{lib_text}/agent-rootfs.tar.zst")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in &want {
        assert_eq!(first.env.get(k), Some(v), "{k}");
    }
    assert_eq!(
        want.keys().cloned().collect::<BTreeSet<_>>(),
        install_script_exports(),
        "the image sets the same variables as .ci/install-smolvm.sh"
    );

    // smolvm unpacks its templates into the directory and machines' disks point at them: a
    // restart must keep the directory as it is.
    std::fs::write(lib.join("overlay-template.ext4"), "unpacked by smolvm").expect("write");
    std::fs::write(dist.join("smol-vmm"), "a different build").expect("write");
    let second = run_entrypoint(root.path(), &[]);
    assert!(second.ok, "{}", second.stderr);
    assert_eq!(
        std::fs::read_to_string(lib.join("overlay-template.ext4")).expect("kept"),
        "unpacked by smolvm"
    );
    assert_eq!(std::fs::read_to_string(lib.join("smol-vmm")).expect("kept"), "smol-vmm");

    // A new smolvm version gets a directory of its own; the old one stays.
    std::fs::write(dist.join("VERSION"), "1.40.0\n").expect("write");
    let upgraded = run_entrypoint(root.path(), &[]);
    assert!(upgraded.ok, "{}", upgraded.stderr);
    assert!(root.path().join("state/lib/smolvm-1.40.0/.complete").is_file());
    assert!(lib.join("overlay-template.ext4").is_file());

    // An interrupted earlier copy (no marker) is replaced, not trusted.
    let stale = root.path().join("state/lib/smolvm-1.41.0");
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join("smol-vmm"), "half").expect("write");
    std::fs::write(dist.join("VERSION"), "1.41.0\n").expect("write");
    let repaired = run_entrypoint(root.path(), &[]);
    assert!(repaired.ok, "{}", repaired.stderr);
    assert_ne!(
        std::fs::read_to_string(stale.join("smol-vmm")).expect("replaced"),
        "half"
    );

    // Refusals, with a reason and without starting the runtime.
    std::fs::write(dist.join("VERSION"), "../escape\n").expect("write");
    let bad_version = run_entrypoint(root.path(), &[]);
    assert!(!bad_version.ok && bad_version.stderr.contains("unusable version"));
    assert!(bad_version.env.is_empty());
    std::fs::write(dist.join("VERSION"), "1.50.0\n").expect("write");
    std::fs::remove_file(dist.join("libkrun.so")).expect("remove");
    let missing = run_entrypoint(root.path(), &[]);
    assert!(
        !missing.ok && missing.stderr.contains("libkrun.so is missing"),
        "{}",
        missing.stderr
    );
    assert!(!root.path().join("state/lib/smolvm-1.50.0").exists());
}

/// `cargo fetch --locked --offline` in DIR (for the host platform): Err carries stderr.
pub(super) fn cargo_fetch(dir: &Path) -> Result<(), String> {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let host = Command::new("rustc").arg("-vV").output().ok().and_then(|o| {
        text(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
    });
    let mut command = Command::new(cargo);
    command
        .current_dir(dir)
        .args(["fetch", "--locked", "--offline", "--quiet"]);
    if let Some(host) = host {
        command.args(["--target", &host]);
    }
    let output = run(&mut command);
    if output.status.success() {
        Ok(())
    } else {
        Err(text(&output.stderr))
    }
}

#[test]
pub(super) fn stub_workspace_lets_cargo_resolve_the_dependencies_without_sources() {
    let dir = tempfile::tempdir().expect("temp dir");
    for file in ["Cargo.toml", "Cargo.lock"] {
        std::fs::copy(repo().join(file), dir.path().join(file)).expect("copy");
    }
    for member in workspace_members() {
        std::fs::create_dir_all(dir.path().join(&member)).expect("mkdir");
        std::fs::copy(
            repo().join(&member).join("Cargo.toml"),
            dir.path().join(&member).join("Cargo.toml"),
        )
        .expect("copy a member manifest");
    }
    // With only src/lib.rs in each member Cargo refuses the workspace: the declared bins and
    // benches are missing. (The placeholders must cover every declared target.)
    for member in workspace_members() {
        std::fs::create_dir_all(dir.path().join(&member).join("src")).expect("mkdir");
        std::fs::write(dir.path().join(&member).join("src/lib.rs"), "").expect("write");
    }
    let before = cargo_fetch(dir.path()).expect_err("lib.rs alone must not resolve");
    assert!(before.contains("can't find"), "unexpected failure: {before}");
    let output = run(script("deploy/image/stub-workspace.sh").arg(dir.path()));
    assert!(output.status.success(), "stub-workspace.sh: {}", text(&output.stderr));
    if let Err(e) = cargo_fetch(dir.path()) {
        if e.contains("can't find") {
            panic!("stub-workspace.sh left a target out: {e}");
        }
        println!("skipped: the offline package cache lacks a dependency: {e}");
        return;
    }
    assert!(dir.path().join("controller/src/main.rs").is_file());
    assert!(dir.path().join("webhook/src/main.rs").is_file());
    // Idempotent, and it never overwrites a real file.
    std::fs::write(dir.path().join("api/src/lib.rs"), "// real").expect("write");
    std::fs::remove_file(dir.path().join("webhook/src/main.rs")).expect("remove");
    let again = run(script("deploy/image/stub-workspace.sh").arg(dir.path()));
    assert!(again.status.success());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("api/src/lib.rs")).expect("read"),
        "// real"
    );
    assert!(dir.path().join("webhook/src/main.rs").is_file());
}

#[test]
pub(super) fn every_deploy_script_parses() {
    let mut scripts = Vec::new();
    for sub in ["deploy/image", "deploy/scripts"] {
        for entry in std::fs::read_dir(repo().join(sub)).expect("read").flatten() {
            if entry.path().extension().is_some_and(|e| e == "sh") {
                scripts.push(format!("{sub}/{}", entry.file_name().to_string_lossy()));
            }
        }
    }
    assert!(scripts.len() >= 5, "{scripts:?}");
    for s in scripts {
        let first = read(&s).lines().next().unwrap_or_default().to_string();
        let shell = if first.contains("bash") {
            "bash"
        } else if first == "#!/bin/sh" {
            "sh"
        } else {
            panic!("{s}: unexpected interpreter line {first}")
        };
        let output = run(Command::new(shell).arg("-n").arg(repo().join(&s)));
        assert!(output.status.success(), "{s}: {}", text(&output.stderr));
    }
}
