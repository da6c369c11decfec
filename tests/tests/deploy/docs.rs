//! Makefile and docs.

use super::*;

#[test]
pub(super) fn makefile_offers_the_deploy_targets() {
    let Ok(help) = Command::new("make").current_dir(repo()).arg("help").output() else {
        println!("skipped: make not found");
        return;
    };
    let help = text(&help.stdout);
    for target in [
        "generate",
        "manifests",
        "fmt",
        "vet",
        "build",
        "test",
        "install",
        "uninstall",
        "docker-build",
        "docker-build-runtime",
        "deploy",
        "undeploy",
        "run",
        "helm-lint",
        "helm-package",
        "scan",
    ] {
        assert!(
            help.lines().any(|l| l.split_whitespace().next() == Some(target)),
            "make help lacks {target}:\n{help}"
        );
    }
    let missing = run(Command::new("make").current_dir(repo()).args(["deploy", "IMG=x"]));
    assert!(!missing.status.success(), "deploy needs RUNTIME_IMG too");
    assert!(text(&missing.stderr).contains("usage: make deploy"));
    let dry = run(Command::new("make").current_dir(repo()).args([
        "-n",
        "deploy",
        "IMG=a:1",
        "RUNTIME_IMG=b:2",
        "OVERLAY=cert-manager",
    ]));
    let dry = text(&dry.stdout);
    assert!(
        dry.contains("deploy/scripts/overlay.sh \"cert-manager\" \"a:1\" \"b:2\"")
            && dry.contains("apply --server-side -k"),
        "{dry}"
    );
}

/// The string constants of `pub mod NAME { … }` in api/src/constants.rs.
pub(super) fn constants_of(module: &str) -> Vec<String> {
    let source = read("api/src/constants.rs");
    let start = source
        .find(&format!("pub mod {module} {{"))
        .unwrap_or_else(|| panic!("no module {module}"));
    let body = &source[start..];
    let body = &body[..body.find("\n}").unwrap_or(body.len())];
    body.lines()
        .filter(|l| l.trim_start().starts_with("pub const"))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_string)
        .collect()
}

#[test]
pub(super) fn operations_doc_explains_every_condition_and_reason() {
    let doc = read("docs/operations.md");
    let mut names = constants_of("condition");
    names.extend(constants_of("reason"));
    assert!(names.len() > 10, "{names:?}");
    // Reasons the code spells out where it uses them (each checked to still be there).
    let literal = [
        ("controller/src/vm/decide/problems.rs", "RuntimeError"),
        ("controller/src/vm/decide/converge.rs", "InvalidSpec"),
        ("controller/src/vm/rules/conditions.rs", "MachineFailed"),
        ("controller/src/placement/choose.rs", "NoNodes"),
        ("controller/src/placement/choose.rs", "PinnedNodeUnknown"),
        ("controller/src/placement/choose.rs", "PinnedNodeIneligible"),
        ("controller/src/placement/choose.rs", "NoEligibleNode"),
        ("controller/src/pki/signer/judge.rs", "RequesterNotRuntime"),
        ("controller/src/pki/signer/judge.rs", "NoNodeClaim"),
        ("controller/src/pki/signer/judge.rs", "UsageNotAllowed"),
        ("controller/src/pki/signer/judge.rs", "InvalidRequest"),
        ("controller/src/pki/signer/judge.rs", "NamesNotAllowed"),
        ("controller/src/pki/signer/handle.rs", "RuntimeNodeVerified"),
    ];
    for (file, reason) in literal {
        assert!(
            read(file).contains(&format!("\"{reason}\"")),
            "{file} no longer uses {reason}; update this list"
        );
        names.push(reason.to_string());
    }
    let mut missing = Vec::new();
    for name in names {
        if !doc.contains(&format!("`{name}`")) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "docs/operations.md does not explain: {missing:?}");
    for section in [
        "## Install",
        "## Upgrade",
        "## Uninstall",
        "## Production notes",
        "## Troubleshooting",
    ] {
        assert!(doc.contains(section), "docs/operations.md lacks {section}");
    }
    // The token replacement, as one command once shell line continuations are joined.
    let joined = doc
        .replace("\\\n", " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let replace = "kubectl -n smolvm-system create secret generic smolvm-runtime-auth \
                   --from-literal=token=$(openssl rand -hex 32) --dry-run=client -o yaml | kubectl apply -f -";
    let replace = replace.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains(&replace),
        "docs/operations.md must show how to replace the token: {replace}"
    );
}
