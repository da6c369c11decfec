//! NetworkPolicy.

use super::*;

/// Whether a NetworkPolicy port entry admits TCP `number` (named `name` on the container).
pub(super) fn admits_port(ports: Option<&Vec<NetworkPolicyPort>>, number: i32, name: &str) -> bool {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return true; // no ports: every port
    };
    ports.iter().any(|p| {
        if p.protocol.as_deref().unwrap_or("TCP") != "TCP" {
            return false;
        }
        match &p.port {
            None => true,
            Some(IntOrString::String(n)) => n == name,
            Some(IntOrString::Int(start)) => {
                let end = p.end_port.unwrap_or(*start);
                (*start..=end).contains(&number)
            }
        }
    })
}

#[test]
pub(super) fn the_runtime_is_on_the_host_network_and_no_network_policy_pretends_to_guard_it() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let runtime = pod_labels(all, RUNTIME);
        // Published ports are forwarded from the node's address (runtime/src/forward.rs).
        let ds = objects(all, "DaemonSet")
            .into_iter()
            .find(|o| str_at(o, "/metadata/name") == RUNTIME)
            .expect("the runtime DaemonSet");
        assert_eq!(
            ds.pointer("/spec/template/spec/hostNetwork"),
            Some(&json!(true)),
            "deploy/{overlay}"
        );
        assert_eq!(
            ds.pointer("/spec/template/spec/dnsPolicy"),
            Some(&json!("ClusterFirstWithHostNet")),
            "deploy/{overlay}: cluster DNS on the host network"
        );
        let env = ds
            .pointer("/spec/template/spec/containers/0/env")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert!(
            env.iter()
                .any(|e| e["name"] == "NODE_IP" && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"),
            "deploy/{overlay}: NODE_IP from status.hostIP is the publish address"
        );
        // NetworkPolicies cannot select host-network pods: one that seemed to would mislead.
        for o in objects(all, "NetworkPolicy") {
            let policy: NetworkPolicy = typed(o);
            let selector = policy.spec.and_then(|s| s.pod_selector).unwrap_or_default();
            assert!(
                !selects(&selector, &runtime),
                "deploy/{overlay}: {} selects the host-network runtime pods, where it has no effect",
                describe(o)
            );
        }
    }
}

#[test]
pub(super) fn network_policy_admits_only_addresses_to_the_admission_port() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let webhook = pod_labels(all, WEBHOOK);
        let (mut isolating, mut admission_admitted, mut ops_admitted) = (0, false, false);
        for o in objects(all, "NetworkPolicy") {
            let policy: NetworkPolicy = typed(o);
            let what = format!("deploy/{overlay}: {}", describe(o));
            let spec = policy.spec.expect("spec");
            if !selects(&spec.pod_selector.clone().unwrap_or_default(), &webhook) {
                continue;
            }
            isolating += 1;
            for rule in spec.ingress.iter().flatten() {
                if admits_port(rule.ports.as_ref(), 8080, "ops") {
                    ops_admitted = true;
                }
                if !admits_port(rule.ports.as_ref(), 9443, "https") {
                    continue;
                }
                let peers = rule.from.clone().unwrap_or_default();
                assert!(!peers.is_empty(), "{what}: admits every pod to the admission port");
                for peer in peers {
                    // The API server is not a pod: an address block is the only right peer.
                    assert!(
                        peer.pod_selector.is_none() && peer.namespace_selector.is_none() && peer.ip_block.is_some(),
                        "{what}: admits pods to the admission port: {peer:?}"
                    );
                }
                admission_admitted = true;
            }
        }
        assert!(
            isolating > 0,
            "deploy/{overlay}: no NetworkPolicy isolates the webhook pods"
        );
        assert!(
            admission_admitted,
            "deploy/{overlay}: the API server must reach the webhook"
        );
        assert!(
            ops_admitted,
            "deploy/{overlay}: the webhook's ops port must stay reachable"
        );
    }
}

/// The controller's ports, by container port name: the access API (the API server's aggregator
/// only) and ops (any pod). The controller listens on nothing else.
const CONTROLLER_ACCESS_PORT: (&str, i32) = ("access", 8443);
const CONTROLLER_OPS_PORT: (&str, i32) = ("ops", 8080);

#[test]
pub(super) fn network_policy_admits_only_the_access_and_ops_ports_to_the_controller() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let controller = pod_labels(all, CONTROLLER);
        // The policy covers every port the controller opens.
        let (_, template) = workloads(all)
            .into_iter()
            .find(|(n, _)| n == CONTROLLER)
            .expect("the controller Deployment");
        let mut declared: Vec<(String, i32)> = pod_spec(&template, CONTROLLER)
            .containers
            .iter()
            .flat_map(|c| c.ports.clone().unwrap_or_default())
            .map(|p| (p.name.unwrap_or_default(), p.container_port))
            .collect();
        declared.sort();
        let mut expected = vec![CONTROLLER_ACCESS_PORT, CONTROLLER_OPS_PORT]
            .into_iter()
            .map(|(n, p)| (n.to_string(), p))
            .collect::<Vec<_>>();
        expected.sort();
        assert_eq!(declared, expected, "deploy/{overlay}: the controller's container ports");

        let (mut isolating, mut access_admitted, mut ops_admitted) = (0, false, false);
        for o in objects(all, "NetworkPolicy") {
            let policy: NetworkPolicy = typed(o);
            let what = format!("deploy/{overlay}: {}", describe(o));
            let spec = policy.spec.expect("spec");
            if !selects(&spec.pod_selector.clone().unwrap_or_default(), &controller) {
                continue;
            }
            isolating += 1;
            assert!(
                spec.policy_types.iter().flatten().any(|t| t == "Ingress"),
                "{what}: not an ingress policy"
            );
            for rule in spec.ingress.iter().flatten() {
                // Every rule names its ports, and only these two: no rule admits "every port".
                let ports = rule.ports.clone().unwrap_or_default();
                assert!(!ports.is_empty(), "{what}: a rule admits every port");
                for port in &ports {
                    let one = Some(vec![port.clone()]);
                    let known = [CONTROLLER_ACCESS_PORT, CONTROLLER_OPS_PORT]
                        .iter()
                        .any(|(name, number)| admits_port(one.as_ref(), *number, name));
                    let exact = matches!(
                        (&port.port, port.end_port),
                        (Some(IntOrString::Int(n)), None) if *n == CONTROLLER_ACCESS_PORT.1 || *n == CONTROLLER_OPS_PORT.1
                    ) || matches!(
                        &port.port,
                        Some(IntOrString::String(n)) if n == CONTROLLER_ACCESS_PORT.0 || n == CONTROLLER_OPS_PORT.0
                    );
                    assert!(known && exact, "{what}: admits another port: {port:?}");
                }
                if admits_port(rule.ports.as_ref(), CONTROLLER_OPS_PORT.1, CONTROLLER_OPS_PORT.0) {
                    ops_admitted = true;
                }
                if !admits_port(rule.ports.as_ref(), CONTROLLER_ACCESS_PORT.1, CONTROLLER_ACCESS_PORT.0) {
                    continue;
                }
                let peers = rule.from.clone().unwrap_or_default();
                assert!(!peers.is_empty(), "{what}: admits every pod to the access API");
                for peer in peers {
                    // The API server's aggregator is not a pod: an address block is the only peer.
                    assert!(
                        peer.pod_selector.is_none() && peer.namespace_selector.is_none() && peer.ip_block.is_some(),
                        "{what}: admits pods to the access API: {peer:?}"
                    );
                }
                access_admitted = true;
            }
        }
        assert!(
            isolating > 0,
            "deploy/{overlay}: no NetworkPolicy isolates the controller pods"
        );
        assert!(
            access_admitted,
            "deploy/{overlay}: the API server must reach the access API"
        );
        assert!(
            ops_admitted,
            "deploy/{overlay}: the controller's ops port must stay reachable"
        );
    }
}
