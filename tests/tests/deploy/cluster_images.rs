//! The cluster tier builds its images without Docker (`smolvm_tests::cluster::images`); these
//! tests keep them in step with the Dockerfile's `operator` and `runtime` stages: the same base,
//! entrypoint, user, environment, files and file modes.

use smolvm_tests::{
    assets::OperatorBins,
    cluster::images::{self, Base, ImageSpec},
};

use super::*;

/// What one Dockerfile stage says about the image it makes.
#[derive(Debug, Default)]
struct Stage {
    from: String,
    entrypoint: Vec<String>,
    user: Option<String>,
    env: BTreeSet<(String, String)>,
    /// Destination path → `--chmod` mode, if any.
    files: BTreeMap<String, Option<u32>>,
    apt_packages: BTreeSet<String>,
}

fn stage(dockerfile: &str, name: &str) -> Stage {
    let mut lines = Vec::new();
    let mut current = String::new();
    for raw in dockerfile.lines() {
        let line = raw.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        // Join continuation lines.
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        lines.push(std::mem::take(&mut current));
    }
    let start = lines
        .iter()
        .position(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {name}")))
        .unwrap_or_else(|| panic!("no stage {name}"));
    let mut stage = Stage {
        from: lines[start].split_whitespace().nth(1).unwrap_or_default().to_string(),
        ..Stage::default()
    };
    for line in lines[start + 1..].iter().take_while(|l| !l.starts_with("FROM ")) {
        let (instruction, rest) = line.split_once(' ').unwrap_or((line, ""));
        match instruction {
            "ENTRYPOINT" => stage.entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT is a JSON array"),
            "USER" => stage.user = Some(rest.trim().to_string()),
            "ENV" => {
                let (k, v) = rest.split_once('=').expect("ENV k=v");
                stage.env.insert((k.trim().to_string(), v.trim().to_string()));
            }
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let mode = words
                    .iter()
                    .find_map(|w| w.strip_prefix("--chmod="))
                    .map(|m| u32::from_str_radix(m, 8).expect("octal --chmod"));
                let paths: Vec<&str> = words.iter().copied().filter(|w| !w.starts_with("--")).collect();
                let (dest, sources) = paths.split_last().expect("COPY has a destination");
                for source in sources {
                    let target = match dest.strip_suffix('/') {
                        Some(dir) => format!("{dir}/{}", source.rsplit('/').next().unwrap_or(source)),
                        None => (*dest).to_string(),
                    };
                    stage.files.insert(target, mode);
                }
            }
            "RUN" => {
                for command in rest.split("&&") {
                    if let Some(args) = command.trim().strip_prefix("apt-get install") {
                        stage.apt_packages.extend(
                            args.split_whitespace()
                                .filter(|w| !w.starts_with('-'))
                                .map(str::to_string),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    stage
}

fn assert_in_step(spec: &ImageSpec) {
    let name = spec.stage.expect("a spec that mirrors a stage");
    let stage = stage(&read("Dockerfile"), name);
    assert!(
        stage.from.starts_with("debian:") && stage.from.ends_with("-slim"),
        "stage {name} is FROM {}: the cluster tier's base mirrors debian-slim",
        stage.from
    );
    let Base::DebianSlim(extra) = spec.base else {
        panic!(
            "stage {name} starts from debian-slim, the cluster tier's {} from {:?}",
            spec.reference, spec.base
        )
    };
    let extra: BTreeSet<String> = extra.iter().map(|p| (*p).to_string()).collect();
    assert_eq!(
        extra, stage.apt_packages,
        "{name}: the packages installed over debian-slim"
    );
    assert_eq!(
        spec.entrypoint.iter().map(|s| (*s).to_string()).collect::<Vec<_>>(),
        stage.entrypoint,
        "{name}: ENTRYPOINT"
    );
    assert_eq!(spec.user.map(str::to_string), stage.user, "{name}: USER");
    let env: BTreeSet<(String, String)> = spec
        .env
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    assert_eq!(env, stage.env, "{name}: ENV");
    let files: BTreeMap<String, Option<u32>> = spec.files.iter().map(|f| (f.dest.to_string(), f.mode)).collect();
    assert_eq!(files, stage.files, "{name}: the files and their --chmod modes");
}

fn bins() -> OperatorBins {
    OperatorBins {
        webhook: PathBuf::from("smolvm-webhook"),
        controller: PathBuf::from("smolvm-controller"),
        runtime: PathBuf::from("smolvm-runtime"),
        plugin: PathBuf::from("kubectl-smolvm"),
    }
}

#[test]
fn the_cluster_tiers_operator_image_is_the_dockerfiles_operator_stage() {
    assert_in_step(&images::operator(&bins()));
}

#[test]
fn the_cluster_tiers_runtime_image_is_the_dockerfiles_runtime_stage() {
    let spec = images::runtime(
        &bins(),
        Path::new("smolvm-dist"),
        &repo().join("deploy/image/runtime-entrypoint.sh"),
    );
    assert_in_step(&spec);
    // The same smolvm: the wheel pinned for the image, unpacked by the script the Dockerfile runs.
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("-r /tmp/smolvm/smolmachines.txt") && dockerfile.contains("unpack-smolvm.sh"));
    let source = read("tests/src/cluster/images.rs");
    assert!(source.contains("deploy/image/smolmachines.txt") && source.contains("deploy/image/unpack-smolvm.sh"));
}

#[test]
fn the_stage_reader_sees_what_a_stage_declares() {
    let dockerfile = "FROM debian:bookworm-slim AS x\nRUN apt-get update \\\n && apt-get install -y --no-install-recommends a b \\\n && rm -rf /var/lib/apt/lists/*\nCOPY --from=y /out/one /out/two /usr/local/bin/\nCOPY --chmod=0755 s.sh /usr/local/bin/s\nENV K=V\nUSER 1:1\nENTRYPOINT [\"/usr/local/bin/s\"]\nFROM scratch AS z\nUSER 2\n";
    let x = stage(dockerfile, "x");
    assert_eq!(x.apt_packages, ["a".to_string(), "b".to_string()].into());
    assert_eq!(x.files.get("/usr/local/bin/one"), Some(&None));
    assert_eq!(x.files.get("/usr/local/bin/two"), Some(&None));
    assert_eq!(x.files.get("/usr/local/bin/s"), Some(&Some(0o755)));
    assert_eq!(x.user.as_deref(), Some("1:1"));
    assert_eq!(x.entrypoint, ["/usr/local/bin/s"]);
    assert_eq!(x.env, [("K".to_string(), "V".to_string())].into());
}
