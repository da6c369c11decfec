//! The exposure of a pass: the Service and EndpointSlice writes that make what
//! [`crate::vm::exposure`] wants of the objects observed, and the ServiceExposed condition they
//! give ([`Outcome::expose`]); their removal at deletion ([`removal`]).

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use kube::ResourceExt;
use smolvm_api::{
    SmolVM,
    constants::{condition, reason},
};

use super::observed::Observed;
use super::outcome::{Exposing, ExposureWrite, Note, Outcome};
use super::pass::Progress;
use crate::vm::exposure::{self, Exposure, NotExposed};
use crate::vm::rules;

impl Outcome {
    /// Decides the Service and EndpointSlice from what was observed, and the ServiceExposed
    /// condition they give; `runs`: the machine runs (the endpoint is ready).
    pub(super) fn expose(&mut self, o: &Observed, p: &Progress, runs: bool) {
        let address = address_of(o);
        if o.node_object.is_some() {
            self.status.node_address = address.clone();
        }
        self.status.ports = exposure::ports_summary(o.vm.spec.ports());
        self.exposure = exposing(o, address.as_deref(), runs);
        if p.exposed.as_ref() == Some(&self.exposure.writes) {
            // Written before this pass's machine calls, and still what is wanted.
            self.exposure.writes.clear();
        }
        let changed = match self.exposure.condition.clone() {
            Some((status, why, message)) => self.set(o, condition::SERVICE_EXPOSED, status, why, &message),
            None => rules::clear_condition(&mut self.status.conditions, condition::SERVICE_EXPOSED),
        };
        if changed && let Some(("False", why, message)) = &self.exposure.condition {
            self.events.push(Note::warning(*why, "Expose", message.clone()));
        }
    }

    /// A Service or EndpointSlice write failed: the condition says so (the machine's own status
    /// is still written), with a Warning event when that changed.
    pub fn exposure_failed(&mut self, vm: &SmolVM, error: &str, now: Timestamp) {
        let (namespace, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
        let verb = if self.exposure.removing { "removing" } else { "writing" };
        let message = format!("{verb} Service {namespace}/{name}: {error}");
        let changed = rules::set_condition(
            &mut self.status.conditions,
            condition::SERVICE_EXPOSED,
            "False",
            reason::SERVICE_ERROR,
            &message,
            vm.metadata.generation,
            now,
        );
        if changed {
            self.events
                .push(Note::warning(reason::SERVICE_ERROR, "Expose", message));
        }
    }
}

/// The exposure of a SmolVM, from its spec and the objects observed.
pub(super) fn exposing(o: &Observed, address: Option<&str>, runs: bool) -> Exposing {
    let vm = o.vm;
    let (namespace, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
    if !vm.spec.expose_service() {
        // A Service and EndpointSlice left from an earlier `exposeService: true` go.
        return Exposing {
            writes: removal(vm, o.service, o.slice),
            condition: None,
            removing: true,
        };
    }
    let condition = |status, why, message: String| Some((status, why, message));
    let want = match exposure::desired(vm, o.node, address, runs) {
        Ok(want) => want,
        Err(NotExposed::NoPorts) => {
            return Exposing {
                condition: condition(
                    "False",
                    reason::NO_PORTS,
                    "network.exposeService is true but the SmolVM publishes no port: no Service is made".into(),
                ),
                ..Exposing::default()
            };
        }
        Err(NotExposed::InvalidName) => {
            return Exposing {
                condition: condition(
                    "False",
                    reason::INVALID_SERVICE_NAME,
                    format!(
                        "a Service cannot be named {name:?}: Service names are DNS-1035 labels (at most 63 characters: lowercase letters, digits and '-', starting with a letter)"
                    ),
                ),
                ..Exposing::default()
            };
        }
        Err(NotExposed::Incomplete) => return Exposing::default(),
    };
    let foreign = [
        o.service
            .and_then(|s| exposure::check_owner(&s.metadata, vm).err().map(|w| ("Service", w))),
        o.slice.and_then(|s| {
            exposure::check_owner(&s.metadata, vm)
                .err()
                .map(|w| ("EndpointSlice", w))
        }),
    ]
    .into_iter()
    .flatten()
    .next();
    if let Some((kind, who)) = foreign {
        return Exposing {
            condition: condition(
                "False",
                reason::SERVICE_NOT_OWNED,
                format!(
                    "{kind} {namespace}/{name} {who}; it is left untouched: delete or rename it, or set network.exposeService to false"
                ),
            ),
            ..Exposing::default()
        };
    }
    Exposing {
        writes: exposure_writes(o, &want),
        condition: Some(exposure::condition(&want, &name, o.node, address, runs)),
        removing: false,
    }
}

/// The writes that remove the Service and EndpointSlice of a SmolVM (its own: one it does not
/// own stays).
pub fn removal(vm: &SmolVM, service: Option<&Service>, slice: Option<&EndpointSlice>) -> Vec<ExposureWrite> {
    let owned =
        |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| exposure::check_owner(meta, vm).is_ok();
    let mut writes = Vec::new();
    if slice.is_some_and(|s| owned(&s.metadata)) {
        writes.push(ExposureWrite::DeleteSlice);
    }
    if service.is_some_and(|s| owned(&s.metadata)) {
        writes.push(ExposureWrite::DeleteService);
    }
    writes
}

/// The writes that make the observed Service and EndpointSlice what `want` asks for.
fn exposure_writes(o: &Observed, want: &Exposure) -> Vec<ExposureWrite> {
    let mut writes = Vec::new();
    if !o
        .service
        .is_some_and(|have| exposure::service_matches(have, &want.service))
    {
        writes.push(ExposureWrite::ApplyService(Box::new(want.service.clone())));
    }
    match o.slice {
        Some(have) if exposure::slice_matches(have, &want.slice) => {}
        Some(have) if have.address_type != want.slice.address_type => {
            writes.push(ExposureWrite::DeleteSlice);
            writes.push(ExposureWrite::ApplySlice(Box::new(want.slice.clone())));
        }
        _ => writes.push(ExposureWrite::ApplySlice(Box::new(want.slice.clone()))),
    }
    writes
}

/// The node's InternalIP, which the EndpointSlice points at.
pub(super) fn address_of(o: &Observed) -> Option<String> {
    o.node_object
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.internal_ip.clone())
}
