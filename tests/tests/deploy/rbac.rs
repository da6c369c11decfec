//! RBAC.

use super::*;

/// The full verb list of each ServiceAccount, one row per (account, scope, group/resource, names).
/// Compared with the expected tables below; printed by the audit test. The controller and the
/// runtime hold the same grants in both overlays; only the webhook's differ.
pub(super) const RBAC_CONTROLLER_AND_RUNTIME: &str = "
smolvm-controller  cluster        apiregistration.k8s.io/apiservices  v1alpha1.subresources.vm.smolvm.dev  get,patch
smolvm-controller  cluster        authorization.k8s.io/subjectaccessreviews  -  create
smolvm-controller  cluster        certificates.k8s.io/certificatesigningrequests  -  list,watch
smolvm-controller  cluster        certificates.k8s.io/certificatesigningrequests/approval  -  patch
smolvm-controller  cluster        certificates.k8s.io/certificatesigningrequests/status  -  patch
smolvm-controller  cluster        certificates.k8s.io/signers  vm.smolvm.dev/runtime-serving  approve,sign
smolvm-controller  cluster        core/events  -  list
smolvm-controller  cluster        core/nodes  -  get,list,watch
smolvm-controller  cluster        core/persistentvolumeclaims  -  create,delete,get,list,patch,watch
smolvm-controller  cluster        core/persistentvolumes  -  get,list,watch
smolvm-controller  cluster        core/pods  -  create,delete,get,list,watch
smolvm-controller  cluster        core/resourcequotas  -  get,list,watch
smolvm-controller  cluster        core/resourcequotas/status  -  patch
smolvm-controller  cluster        core/services  -  create,delete,get,list,patch,watch
smolvm-controller  cluster        discovery.k8s.io/endpointslices  -  create,delete,get,list,patch,watch
smolvm-controller  cluster        events.k8s.io/events  -  create
smolvm-controller  cluster        vm.smolvm.dev/smolvmclasses  -  list,watch
smolvm-controller  cluster        vm.smolvm.dev/smolvmnodes  -  get,list,patch,watch
smolvm-controller  cluster        vm.smolvm.dev/smolvmpools  -  get,list,patch,watch
smolvm-controller  cluster        vm.smolvm.dev/smolvmpools/status  -  patch
smolvm-controller  cluster        vm.smolvm.dev/smolvms  -  delete,get,list,patch,watch
smolvm-controller  cluster        vm.smolvm.dev/smolvms/status  -  patch
smolvm-controller  kube-system    core/configmaps  extension-apiserver-authentication  get
smolvm-controller  smolvm-system  coordination.k8s.io/leases  -  create
smolvm-controller  smolvm-system  coordination.k8s.io/leases  smolvm-controller  get,update
smolvm-controller  smolvm-system  core/configmaps  -  create
smolvm-controller  smolvm-system  core/configmaps  smolvm-runtime-ca  patch
smolvm-controller  smolvm-system  core/secrets  -  create
smolvm-controller  smolvm-system  core/secrets  smolvm-access-tls  get,update
smolvm-controller  smolvm-system  core/secrets  smolvm-runtime-auth  get
smolvm-controller  smolvm-system  core/secrets  smolvm-runtime-ca  get,update
smolvm-runtime     cluster        certificates.k8s.io/certificatesigningrequests  -  create,get
smolvm-runtime     cluster        core/nodes  -  get
smolvm-runtime     cluster        vm.smolvm.dev/smolvmnodes  -  create,get,patch
smolvm-runtime     cluster        vm.smolvm.dev/smolvmnodes/status  -  patch
";

/// The webhook in the default overlay (self-signed TLS: its Secret and the caBundle injection).
pub(super) const RBAC_WEBHOOK_DEFAULT: &str = "
smolvm-webhook     cluster        admissionregistration.k8s.io/mutatingwebhookconfigurations  smolvm-webhook  get,patch
smolvm-webhook     cluster        admissionregistration.k8s.io/validatingwebhookconfigurations  smolvm-webhook  get,patch
smolvm-webhook     cluster        vm.smolvm.dev/smolvmnodes  -  list,watch
smolvm-webhook     cluster        vm.smolvm.dev/smolvmclasses  -  list,watch
smolvm-webhook     cluster        vm.smolvm.dev/smolvmpools  -  list,watch
smolvm-webhook     cluster        vm.smolvm.dev/smolvms  -  get,list,watch
smolvm-webhook     cluster        core/resourcequotas  -  get,list,watch
smolvm-webhook     cluster        core/resourcequotas/status  -  patch
smolvm-webhook     smolvm-system  core/secrets  smolvm-webhook-tls  get,update
";

/// deploy/components/workload-secrets: the controller reads, by name, the Secrets and ConfigMaps a
/// SmolVM's workload names, in the namespaces bound one by one (the template binds `default`).
/// Only with the component.
pub(super) const RBAC_WORKLOAD_SECRETS: &str = "
smolvm-controller  default        core/configmaps  -  get
smolvm-controller  default        core/secrets  -  get
";

/// cert-manager mode: the webhook needs neither its TLS Secret nor the webhook configurations.
pub(super) const RBAC_WEBHOOK_CERT_MANAGER: &str = "
smolvm-webhook     cluster        vm.smolvm.dev/smolvmnodes  -  list,watch
smolvm-webhook     cluster        vm.smolvm.dev/smolvmclasses  -  list,watch
smolvm-webhook     cluster        vm.smolvm.dev/smolvmpools  -  list,watch
smolvm-webhook     cluster        vm.smolvm.dev/smolvms  -  get,list,watch
smolvm-webhook     cluster        core/resourcequotas  -  get,list,watch
smolvm-webhook     cluster        core/resourcequotas/status  -  patch
";

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Grant {
    account: String,
    /// `cluster`, or the namespace of a RoleBinding.
    scope: String,
    group: String,
    resource: String,
    /// Sorted; empty means every object of the resource.
    names: Vec<String>,
}

/// Each ServiceAccount's grants (verbs merged), after following every binding to its role.
pub(super) fn effective_rbac(all: &[Value], overlay: &str) -> BTreeMap<Grant, BTreeSet<String>> {
    let cluster_roles: BTreeMap<String, Vec<PolicyRule>> = objects(all, "ClusterRole")
        .map(|o| {
            let role: ClusterRole = typed(o);
            assert!(
                role.aggregation_rule.is_none(),
                "deploy/{overlay}: {} aggregates roles",
                describe(o)
            );
            (str_at(o, "/metadata/name").to_string(), role.rules.unwrap_or_default())
        })
        .collect();
    let roles: BTreeMap<(String, String), Vec<PolicyRule>> = objects(all, "Role")
        .map(|o| {
            let role: Role = typed(o);
            let key = (
                str_at(o, "/metadata/namespace").to_string(),
                str_at(o, "/metadata/name").to_string(),
            );
            (key, role.rules.unwrap_or_default())
        })
        .collect();
    let accounts: BTreeSet<(String, String)> = objects(all, "ServiceAccount")
        .map(|o| {
            (
                str_at(o, "/metadata/namespace").to_string(),
                str_at(o, "/metadata/name").to_string(),
            )
        })
        .collect();

    let mut bindings = Vec::new();
    for o in objects(all, "ClusterRoleBinding") {
        let b: ClusterRoleBinding = typed(o);
        bindings.push((
            describe(o),
            "cluster".to_string(),
            b.role_ref,
            b.subjects.unwrap_or_default(),
        ));
    }
    for o in objects(all, "RoleBinding") {
        let b: RoleBinding = typed(o);
        let ns = str_at(o, "/metadata/namespace").to_string();
        bindings.push((describe(o), ns, b.role_ref, b.subjects.unwrap_or_default()));
    }

    let mut grants: BTreeMap<Grant, BTreeSet<String>> = BTreeMap::new();
    let mut bound = BTreeSet::new();
    for (what, scope, role_ref, subjects) in bindings {
        let rules = match role_ref.kind.as_str() {
            "ClusterRole" => cluster_roles.get(&role_ref.name),
            "Role" => roles.get(&(scope.clone(), role_ref.name.clone())),
            other => panic!("deploy/{overlay}: {what}: roleRef kind {other}"),
        }
        .unwrap_or_else(|| {
            panic!(
                "deploy/{overlay}: {what} binds {} {}, which this install does not define (no built-in roles)",
                role_ref.kind, role_ref.name
            )
        });
        assert!(!subjects.is_empty(), "deploy/{overlay}: {what} has no subjects");
        for subject in subjects {
            assert_eq!(subject.kind, "ServiceAccount", "deploy/{overlay}: {what}");
            let ns = subject.namespace.clone().unwrap_or_default();
            assert!(
                accounts.contains(&(ns.clone(), subject.name.clone())),
                "deploy/{overlay}: {what} binds {ns}/{}, which is not a ServiceAccount of this install",
                subject.name
            );
            bound.insert((ns, subject.name.clone()));
            for rule in rules {
                assert!(
                    rule.non_resource_urls.is_none(),
                    "deploy/{overlay}: {what}: nonResourceURLs"
                );
                let groups = rule.api_groups.clone().unwrap_or_default();
                let resources = rule.resources.clone().unwrap_or_default();
                let mut names = rule.resource_names.clone().unwrap_or_default();
                names.sort();
                assert!(
                    !groups.is_empty() && !resources.is_empty() && !rule.verbs.is_empty(),
                    "deploy/{overlay}: {what}: a rule without groups, resources or verbs: {rule:?}"
                );
                for field in [&groups, &resources, &names, &rule.verbs] {
                    assert!(
                        !field.iter().any(|x| x.contains('*')),
                        "deploy/{overlay}: {what}: wildcard in {rule:?}"
                    );
                }
                for verb in &rule.verbs {
                    assert!(
                        !matches!(verb.as_str(), "escalate" | "bind" | "impersonate"),
                        "deploy/{overlay}: {what}: verb {verb}"
                    );
                }
                for group in &groups {
                    for resource in &resources {
                        let grant = Grant {
                            account: subject.name.clone(),
                            scope: scope.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            names: names.clone(),
                        };
                        grants.entry(grant).or_default().extend(rule.verbs.iter().cloned());
                    }
                }
            }
        }
    }
    for account in &accounts {
        assert!(
            bound.contains(account),
            "deploy/{overlay}: ServiceAccount {}/{} has no binding",
            account.0,
            account.1
        );
    }
    grants
}

pub(super) fn rbac_table(grants: &BTreeMap<Grant, BTreeSet<String>>) -> Vec<String> {
    grants
        .iter()
        .map(|(g, verbs)| {
            let group = if g.group.is_empty() { "core" } else { g.group.as_str() };
            let names = if g.names.is_empty() {
                "-".to_string()
            } else {
                g.names.join(",")
            };
            let verbs: Vec<&str> = verbs.iter().map(String::as_str).collect();
            format!(
                "{:<18} {:<14} {group}/{}  {names}  {}",
                g.account,
                g.scope,
                g.resource,
                verbs.join(",")
            )
        })
        .collect()
}

pub(super) fn normalize(table: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
pub(super) fn rbac_is_least_privilege_and_matches_the_expected_table() {
    require_kubectl!();
    let with_secrets = with_component("default", "workload-secrets");
    for object in &with_secrets {
        check_typed(object).unwrap_or_else(|e| panic!("components/workload-secrets: {e}"));
    }
    for (overlay, all, webhook, extra) in [
        ("default", rendered("default"), RBAC_WEBHOOK_DEFAULT, ""),
        ("cert-manager", rendered("cert-manager"), RBAC_WEBHOOK_CERT_MANAGER, ""),
        (
            "default + components/workload-secrets",
            with_secrets.as_slice(),
            RBAC_WEBHOOK_DEFAULT,
            RBAC_WORKLOAD_SECRETS,
        ),
    ] {
        let expected = format!("{RBAC_CONTROLLER_AND_RUNTIME}{webhook}{extra}");
        let expected = expected.as_str();
        let grants = effective_rbac(all, overlay);
        let table = rbac_table(&grants);
        println!(
            "deploy/{overlay}: every verb of every ServiceAccount\n{}\n",
            table.join("\n")
        );

        for (grant, verbs) in &grants {
            if grant.group.is_empty() && grant.resource.starts_with("secrets") {
                match grant.account.as_str() {
                    RUNTIME => panic!("deploy/{overlay}: the runtime may not touch Secrets: {verbs:?}"),
                    WEBHOOK => {
                        assert_eq!(grant.scope, NAMESPACE, "deploy/{overlay}");
                        // Only its TLS Secret, by name: no `create`, which RBAC could not narrow
                        // (the install creates that Secret empty).
                        assert_eq!(
                            grant.names,
                            ["smolvm-webhook-tls"],
                            "deploy/{overlay}: the webhook may reach only its TLS Secret: {verbs:?}"
                        );
                    }
                    _ => {}
                }
            }
            if grant.account != CONTROLLER {
                assert!(
                    !(grant.group == "certificates.k8s.io" && grant.resource == "signers"),
                    "deploy/{overlay}: only the controller approves and signs: {grant:?}"
                );
            }
        }
        let got = normalize(&table.join("\n"));
        let want = normalize(expected);
        let missing: Vec<_> = want.iter().filter(|l| !got.contains(l)).collect();
        let extra: Vec<_> = got.iter().filter(|l| !want.contains(l)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "deploy/{overlay}: RBAC differs from the expected table\nmissing: {missing:#?}\nunexpected: {extra:#?}"
        );
    }
}

/// The roles for users (bound by no ServiceAccount of the install): each aggregates into the
/// built-in roles named, with exactly these rules. `view` reads SmolVMs and their log; `edit`
/// and `admin` also change SmolVMs and SmolVMPools, run commands in them and copy files (SPEC 6.1).
const USER_ROLES: &str = "
smolvm-editor      admin,edit  vm.smolvm.dev/smolvmpools  create,delete,deletecollection,patch,update
smolvm-editor      admin,edit  vm.smolvm.dev/smolvms  create,delete,deletecollection,patch,update
smolvm-exec        admin,edit  subresources.vm.smolvm.dev/smolvms/exec  create,get
smolvm-exec        admin,edit  subresources.vm.smolvm.dev/smolvms/files  create,get
smolvm-log-viewer  view  subresources.vm.smolvm.dev/smolvms/log  get
smolvm-viewer      view  vm.smolvm.dev/smolvmclasses  get,list,watch
smolvm-viewer      view  vm.smolvm.dev/smolvmpools  get,list,watch
smolvm-viewer      view  vm.smolvm.dev/smolvms  get,list,watch
";

#[test]
pub(super) fn user_roles_aggregate_into_the_built_in_roles_and_grant_nothing_broader() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let bound: BTreeSet<String> = objects(all, "ClusterRoleBinding")
            .map(|o| str_at(o, "/roleRef/name").to_string())
            .collect();
        let mut table = Vec::new();
        for object in objects(all, "ClusterRole") {
            let name = str_at(object, "/metadata/name").to_string();
            if bound.contains(&name) {
                continue;
            }
            let role: ClusterRole = typed(object);
            let labels = role.metadata.labels.unwrap_or_default();
            let into: Vec<&str> = ["admin", "edit", "view"]
                .into_iter()
                .filter(|r| {
                    labels
                        .get(&format!("rbac.authorization.k8s.io/aggregate-to-{r}"))
                        .is_some_and(|v| v == "true")
                })
                .collect();
            assert!(
                !into.is_empty(),
                "deploy/{overlay}: ClusterRole {name} is bound by nothing and aggregates nowhere"
            );
            for rule in role.rules.unwrap_or_default() {
                assert!(rule.resource_names.is_none(), "deploy/{overlay}: {name}: {rule:?}");
                let mut verbs = rule.verbs.clone();
                verbs.sort();
                for group in rule.api_groups.unwrap_or_default() {
                    for resource in rule.resources.clone().unwrap_or_default() {
                        table.push(format!(
                            "{name} {} {group}/{resource} {}",
                            into.join(","),
                            verbs.join(",")
                        ));
                    }
                }
            }
        }
        table.sort();
        assert_eq!(table, normalize(USER_ROLES), "deploy/{overlay}: the user roles");
    }
}

/// The workload-secrets component grants per namespace only: no ClusterRoleBinding of its role,
/// no RoleBinding of it where the cluster's or the operator's own Secrets live, and the
/// ValidatingAdmissionPolicy that refuses such bindings for anyone ships with it.
#[test]
pub(super) fn workload_secrets_are_granted_per_namespace_and_never_in_kube_system() {
    require_kubectl!();
    const ROLE: &str = "smolvm-controller-workload-secrets";
    const POLICY: &str = "smolvm-workload-secrets-per-namespace";
    let all = with_component("default", "workload-secrets");
    for o in objects(&all, "ClusterRoleBinding") {
        let binding: ClusterRoleBinding = typed(o);
        assert_ne!(
            binding.role_ref.name,
            ROLE,
            "{} binds the role cluster-wide",
            describe(o)
        );
    }
    let namespaces: Vec<&str> = objects(&all, "RoleBinding")
        .filter(|o| typed::<RoleBinding>(o).role_ref.name == ROLE)
        .map(|o| str_at(o, "/metadata/namespace"))
        .collect();
    assert_eq!(namespaces, ["default"], "the template binds one namespace");
    let vap: ValidatingAdmissionPolicy = typed(find(&all, "ValidatingAdmissionPolicy", POLICY));
    let spec = vap.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let text = serde_json::to_string(&spec).unwrap_or_default();
    for needle in [
        ROLE,
        "kube-system",
        "smolvm-system",
        "clusterrolebindings",
        "rolebindings",
    ] {
        assert!(text.contains(needle), "{POLICY} does not name {needle}");
    }
    let binding: ValidatingAdmissionPolicyBinding = typed(find(&all, "ValidatingAdmissionPolicyBinding", POLICY));
    let binding = binding.spec.expect("spec");
    assert_eq!(binding.policy_name.as_deref(), Some(POLICY));
    assert_eq!(binding.validation_actions, Some(vec!["Deny".to_string()]));
    // Without the component, the policy is not installed (it guards the component's role).
    for overlay in OVERLAYS {
        assert!(
            !objects(rendered(overlay), "ValidatingAdmissionPolicy").any(|o| str_at(o, "/metadata/name") == POLICY),
            "deploy/{overlay}"
        );
    }
}
