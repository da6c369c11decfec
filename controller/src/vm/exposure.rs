//! Reach by name: the Service and EndpointSlice a SmolVM with `network.exposeService` gets, as
//! pure functions of the SmolVM, its node's address and whether the machine runs.
//! [`super::decide`] decides the writes from them; [`super::status`] makes them.
//!
//! The Service is selector-less and named like the SmolVM (ClusterIP, one port per published
//! port, named `<protocol>-<guestPort>`, port = guestPort, targetPort = hostPort); its one
//! EndpointSlice points at the node's InternalIP, ready only while the machine runs. Both are
//! owned by the SmolVM, so the garbage collector removes them with it (the controller also
//! deletes them itself on the SmolVM's deletion, so nothing waits on the collector).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::{
    api::{
        core::v1::{Service, ServicePort, ServiceSpec},
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, apis::meta::v1::OwnerReference, util::intstr::IntOrString},
};
use kube::Resource;
use smolvm_api::{Port, SmolVM, constants::reason};

/// `endpointslice.kubernetes.io/managed-by` of the slices the controller writes (the built-in
/// EndpointSlice controller leaves slices managed by others alone).
pub const MANAGED_BY: &str = "smolvm-controller.vm.smolvm.dev";

/// The label selector of the objects the controller makes for SmolVMs (its watches select them).
pub const OWNED_SELECTOR: &str = "app.kubernetes.io/managed-by=smolvm-controller";

/// The Service port name of a published port: `tcp-80`.
pub fn port_name(port: &Port) -> String {
    format!("{}-{}", port.protocol.as_str().to_ascii_lowercase(), port.guest_port)
}

/// The published ports for `kubectl get -o wide`: `8080->80/TCP,5353->53/UDP`; `None` without
/// ports.
pub fn ports_summary(ports: &[Port]) -> Option<String> {
    if ports.is_empty() {
        return None;
    }
    let mut out: String = ports
        .iter()
        .map(|p| format!("{}->{}/{}", p.host_port, p.guest_port, p.protocol.as_str()))
        .collect::<Vec<_>>()
        .join(",");
    // The status field's schema bound.
    if out.len() > 2048 {
        out.truncate(2045);
        out.push_str("...");
    }
    Some(out)
}

/// The ports a Service can carry: the first of each (guestPort, protocol) pair (a Service port
/// number is unique per protocol); the others are returned as skipped.
pub fn service_ports(ports: &[Port]) -> (Vec<&Port>, Vec<&Port>) {
    let mut seen = BTreeSet::new();
    ports
        .iter()
        .partition(|p| seen.insert((p.guest_port, p.protocol.as_str())))
}

/// What the Service of a SmolVM should be.
#[derive(Debug, Clone, PartialEq)]
pub struct Exposure {
    /// The Service.
    pub service: Service,
    /// Its EndpointSlice.
    pub slice: EndpointSlice,
    /// Published ports left out because another has the same guestPort and protocol.
    pub skipped: Vec<Port>,
}

/// Why a SmolVM cannot have its Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotExposed {
    /// It publishes no port (a Service needs one).
    NoPorts,
    /// Its name is not a DNS-1035 label.
    InvalidName,
    /// It lacks a namespace or UID (never the case for a stored object).
    Incomplete,
}

/// The Service and EndpointSlice for `vm`, bound to `node`, whose InternalIP is `address`;
/// endpoints are ready when `running`.
pub fn desired(vm: &SmolVM, node: &str, address: Option<&str>, running: bool) -> Result<Exposure, NotExposed> {
    let name = vm.metadata.name.clone().ok_or(NotExposed::Incomplete)?;
    let namespace = vm.metadata.namespace.clone().ok_or(NotExposed::Incomplete)?;
    let owner = owner_reference(vm).ok_or(NotExposed::Incomplete)?;
    if smolvm_api::syntax::check_dns1035_label(&name).is_err() {
        return Err(NotExposed::InvalidName);
    }
    let (ports, skipped) = service_ports(vm.spec.ports());
    if ports.is_empty() {
        return Err(NotExposed::NoPorts);
    }
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_string(),
            "smolvm-controller".to_string(),
        ),
        ("vm.smolvm.dev/smolvm".to_string(), name.clone()),
    ]);
    let meta = |extra: &[(&str, &str)]| {
        let mut labels = labels.clone();
        labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        }
    };
    let service = Service {
        metadata: meta(&[]),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(port_name(p)),
                        port: p.guest_port,
                        target_port: Some(IntOrString::Int(p.host_port)),
                        protocol: Some(p.protocol.as_str().into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    };
    let ip = address.and_then(|a| a.parse::<IpAddr>().ok());
    let slice = EndpointSlice {
        metadata: meta(&[
            ("kubernetes.io/service-name", &name),
            ("endpointslice.kubernetes.io/managed-by", MANAGED_BY),
        ]),
        address_type: match ip {
            Some(IpAddr::V6(_)) => "IPv6".into(),
            _ => "IPv4".into(),
        },
        endpoints: ip
            .map(|ip| Endpoint {
                addresses: vec![ip.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(running),
                    serving: Some(running),
                    terminating: Some(false),
                }),
                node_name: Some(node.to_string()),
                ..Default::default()
            })
            .into_iter()
            .collect(),
        ports: Some(
            ports
                .iter()
                .map(|p| EndpointPort {
                    name: Some(port_name(p)),
                    port: Some(p.host_port),
                    protocol: Some(p.protocol.as_str().into()),
                    app_protocol: None,
                })
                .collect(),
        ),
    };
    Ok(Exposure {
        service,
        slice,
        skipped: skipped.into_iter().cloned().collect(),
    })
}

/// The controller owner reference of objects the SmolVM owns.
pub fn owner_reference(vm: &SmolVM) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: SmolVM::api_version(&()).into_owned(),
        kind: SmolVM::kind(&()).into_owned(),
        name: vm.metadata.name.clone()?,
        uid: vm.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// Who controls an object: `Ok(())` when this SmolVM does; otherwise a description of the owner
/// for the condition (`Service default/web is owned by Deployment web`, or `… has no owner`).
pub fn check_owner(meta: &ObjectMeta, vm: &SmolVM) -> Result<(), String> {
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    if refs.iter().any(|r| r.uid == uid && !uid.is_empty()) {
        return Ok(());
    }
    Err(
        match refs.iter().find(|r| r.controller == Some(true)).or(refs.first()) {
            Some(r) => format!("is owned by {} {}", r.kind, r.name),
            None => "was not created by this SmolVM".into(),
        },
    )
}

/// Whether the stored Service already is what `want` asks for (the fields the controller sets),
/// so a steady VM costs no write.
pub fn service_matches(have: &Service, want: &Service) -> bool {
    let ports = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name, p.port, p.target_port, p.protocol))
            .collect::<Vec<_>>()
    };
    let selector = have
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|s| !s.is_empty());
    !selector && ports(have) == ports(want) && labels_cover(&have.metadata, &want.metadata)
}

/// Whether the stored EndpointSlice already is what `want` asks for.
pub fn slice_matches(have: &EndpointSlice, want: &EndpointSlice) -> bool {
    let endpoints = |s: &EndpointSlice| {
        s.endpoints
            .iter()
            .map(|e| (e.addresses.clone(), e.conditions.clone(), e.node_name.clone()))
            .collect::<Vec<_>>()
    };
    have.address_type == want.address_type
        && endpoints(have) == endpoints(want)
        && have.ports == want.ports
        && labels_cover(&have.metadata, &want.metadata)
}

fn labels_cover(have: &ObjectMeta, want: &ObjectMeta) -> bool {
    let have = have.labels.clone().unwrap_or_default();
    want.labels.iter().flatten().all(|(k, v)| have.get(k) == Some(v))
}

/// The ServiceExposed condition (status, reason, message) once the Service and EndpointSlice are
/// written.
pub fn condition(
    exposure: &Exposure,
    name: &str,
    node: &str,
    address: Option<&str>,
    running: bool,
) -> (&'static str, &'static str, String) {
    let Some(address) = address else {
        return (
            "False",
            reason::NO_NODE_ADDRESS,
            format!("Service {name} exists but node {node} reports no InternalIP yet, so it has no endpoint"),
        );
    };
    let ports: Vec<String> = exposure
        .service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| format!("{}/{}", p.port, p.protocol.as_deref().unwrap_or("TCP")))
        .collect();
    let mut message = format!(
        "Service {name} routes {} to node {node} ({address}); its endpoint is {}",
        ports.join(", "),
        if running {
            "ready"
        } else {
            "not ready while the machine does not run"
        }
    );
    if !exposure.skipped.is_empty() {
        let skipped: Vec<String> = exposure
            .skipped
            .iter()
            .map(|p| format!("{}->{}/{}", p.host_port, p.guest_port, p.protocol.as_str()))
            .collect();
        message.push_str(&format!(
            "; left out, as their guest port and protocol are already in the Service: {}",
            skipped.join(", ")
        ));
    }
    ("True", reason::SERVICE_READY, message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use smolvm_api::fixtures;

    use super::*;

    fn vm(name: &str, ports: serde_json::Value) -> SmolVM {
        let mut object = fixtures::bound(fixtures::alpine(), "node-a");
        object["metadata"]["name"] = json!(name);
        object["metadata"]["namespace"] = json!("team-a");
        object["metadata"]["uid"] = json!("4d3c2b1a-0f9e-4d8c-b7a6-5f4e3d2c1b0a");
        object["spec"]["network"] = json!({"enabled": true, "exposeService": true, "ports": ports});
        serde_json::from_value(object).expect("a SmolVM")
    }

    #[test]
    fn desired_service_and_slice() {
        let web = vm(
            "web",
            json!([{"hostPort": 8080, "guestPort": 80}, {"hostPort": 5353, "guestPort": 53, "protocol": "UDP"}]),
        );
        let e = desired(&web, "node-a", Some("192.168.50.7"), true).expect("exposed");
        let svc = serde_json::to_value(&e.service).expect("json");
        assert_eq!(svc["apiVersion"], "v1");
        assert_eq!(svc["kind"], "Service");
        assert_eq!(svc["metadata"]["name"], "web");
        assert_eq!(svc["metadata"]["namespace"], "team-a");
        assert_eq!(svc["metadata"]["ownerReferences"][0]["kind"], "SmolVM");
        assert_eq!(svc["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert!(svc["spec"].get("selector").is_none(), "selector-less: {svc}");
        assert_eq!(
            svc["spec"]["ports"],
            json!([
                {"name": "tcp-80", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "udp-53", "port": 53, "targetPort": 5353, "protocol": "UDP"}
            ])
        );
        let slice = serde_json::to_value(&e.slice).expect("json");
        assert_eq!(slice["kind"], "EndpointSlice");
        assert_eq!(slice["metadata"]["labels"]["kubernetes.io/service-name"], "web");
        assert_eq!(
            slice["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
            MANAGED_BY
        );
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(
            slice["endpoints"],
            json!([{"addresses": ["192.168.50.7"], "nodeName": "node-a",
                "conditions": {"ready": true, "serving": true, "terminating": false}}])
        );
        assert_eq!(
            slice["ports"],
            json!([{"name": "tcp-80", "port": 8080, "protocol": "TCP"}, {"name": "udp-53", "port": 5353, "protocol": "UDP"}])
        );
        assert!(e.skipped.is_empty());
    }

    #[test]
    fn desired_table() {
        let ports = json!([{"hostPort": 8080, "guestPort": 80}]);
        // (name, vm, address, running, expected: Ok(addressType, endpoints, ready) or Err)
        type Case = (
            &'static str,
            SmolVM,
            Option<&'static str>,
            bool,
            Result<(&'static str, usize, Option<bool>), NotExposed>,
        );
        let cases: Vec<Case> = vec![
            (
                "running",
                vm("web", ports.clone()),
                Some("10.0.0.5"),
                true,
                Ok(("IPv4", 1, Some(true))),
            ),
            (
                "stopped_is_not_ready",
                vm("web", ports.clone()),
                Some("10.0.0.5"),
                false,
                Ok(("IPv4", 1, Some(false))),
            ),
            (
                "ipv6_node",
                vm("web", ports.clone()),
                Some("fd00::5"),
                true,
                Ok(("IPv6", 1, Some(true))),
            ),
            (
                "no_address_no_endpoint",
                vm("web", ports.clone()),
                None,
                true,
                Ok(("IPv4", 0, None)),
            ),
            (
                "garbled_address_no_endpoint",
                vm("web", ports.clone()),
                Some("node-a.local"),
                true,
                Ok(("IPv4", 0, None)),
            ),
            (
                "no_ports",
                vm("web", json!([])),
                Some("10.0.0.5"),
                true,
                Err(NotExposed::NoPorts),
            ),
            (
                "dotted_name",
                vm("web.v1", ports.clone()),
                Some("10.0.0.5"),
                true,
                Err(NotExposed::InvalidName),
            ),
            (
                "digit_first",
                vm("1web", ports.clone()),
                Some("10.0.0.5"),
                true,
                Err(NotExposed::InvalidName),
            ),
            (
                "long_name",
                vm(&"w".repeat(64), ports.clone()),
                Some("10.0.0.5"),
                true,
                Err(NotExposed::InvalidName),
            ),
        ];
        for (name, vm, address, running, expected) in cases {
            let got = desired(&vm, "node-a", address, running).map(|e| {
                (
                    match e.slice.address_type.as_str() {
                        "IPv6" => "IPv6",
                        _ => "IPv4",
                    },
                    e.slice.endpoints.len(),
                    e.slice
                        .endpoints
                        .first()
                        .and_then(|ep| ep.conditions.as_ref())
                        .and_then(|c| c.ready),
                )
            });
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn a_guest_port_published_twice_is_carried_once() {
        let twice = vm(
            "web",
            json!([{"hostPort": 8080, "guestPort": 80}, {"hostPort": 8081, "guestPort": 80},
                {"hostPort": 8082, "guestPort": 80, "protocol": "UDP"}]),
        );
        let e = desired(&twice, "node-a", Some("10.0.0.5"), true).expect("exposed");
        let names: Vec<_> = e
            .service
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| p.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["tcp-80", "udp-80"]);
        assert_eq!(e.skipped.len(), 1);
        assert_eq!(e.skipped[0].host_port, 8081);
        let (status, why, message) = condition(&e, "web", "node-a", Some("10.0.0.5"), true);
        assert_eq!((status, why), ("True", reason::SERVICE_READY));
        assert!(message.contains("8081->80/TCP"), "{message}");
    }

    #[test]
    fn ownership() {
        let web = vm("web", json!([{"hostPort": 8080, "guestPort": 80}]));
        let mine = desired(&web, "node-a", Some("10.0.0.5"), true).expect("exposed");
        assert_eq!(check_owner(&mine.service.metadata, &web), Ok(()));
        let mut foreign = mine.service.metadata.clone();
        foreign.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "web".into(),
            uid: "other".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        assert_eq!(check_owner(&foreign, &web), Err("is owned by Deployment web".into()));
        foreign.owner_references = None;
        assert_eq!(
            check_owner(&foreign, &web),
            Err("was not created by this SmolVM".into())
        );
    }

    #[test]
    fn a_steady_exposure_matches_and_a_change_does_not() {
        let web = vm("web", json!([{"hostPort": 8080, "guestPort": 80}]));
        let running = desired(&web, "node-a", Some("10.0.0.5"), true).expect("exposed");
        let stopped = desired(&web, "node-a", Some("10.0.0.5"), false).expect("exposed");
        // The API server adds fields (clusterIP, managedFields, ...): still a match.
        let mut stored = running.service.clone();
        if let Some(spec) = stored.spec.as_mut() {
            spec.cluster_ip = Some("10.96.0.10".into());
        }
        stored.metadata.resource_version = Some("7".into());
        assert!(service_matches(&stored, &running.service));
        assert!(slice_matches(&running.slice, &running.slice));
        assert!(!slice_matches(&running.slice, &stopped.slice), "readiness changed");
        let moved = desired(&web, "node-a", Some("10.0.0.6"), true).expect("exposed");
        assert!(!slice_matches(&running.slice, &moved.slice), "address changed");
        // A selector someone added makes the Service another's kind of Service: rewrite it.
        if let Some(spec) = stored.spec.as_mut() {
            spec.selector = Some([("app".to_string(), "web".to_string())].into());
        }
        assert!(!service_matches(&stored, &running.service));
    }

    #[test]
    fn ports_summary_reads_like_docker() {
        let web = vm(
            "web",
            json!([{"hostPort": 8080, "guestPort": 80}, {"hostPort": 5353, "guestPort": 53, "protocol": "UDP"}]),
        );
        assert_eq!(
            ports_summary(web.spec.ports()).as_deref(),
            Some("8080->80/TCP,5353->53/UDP")
        );
        assert_eq!(ports_summary(&[]), None);
    }
}
