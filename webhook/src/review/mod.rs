//! The pure core of the webhook: an AdmissionReview v1 body in, an AdmissionReview v1 body out.
//!
//! No I/O happens here. [`review`] parses the body, checks that it is an
//! `admission.k8s.io/v1` `AdmissionReview` with a request for the resource the route serves,
//! runs the rules of `smolvm-api` (defaulting M1–M3 on the mutating route, validation V1–V12 on
//! the validating routes) and encodes the response, echoing the request's uid.
//!
//! Malformed input is a [`RequestError`] with the HTTP status the server answers with and a
//! `metav1.Status`-shaped JSON body ([`RequestError::to_json`]).
//!
//! Denials: `allowed: false` with `status.code` 422 and reason `Invalid`, except when every
//! violation is of rule V9 or V10 (who may write binding fields and SmolVMNodes), which is
//! 403 `Forbidden`. The message lists every violation ([`Verdict::message`]); every warning
//! finding becomes one entry of `warnings`.
//!
//! The module by concern:
//! - `wire`: the AdmissionReview envelope, its reference reading ([`parse`]) and [`RequestError`];
//! - `scan`: the fast reading of a whole review in one pass (for speed; answers as [`parse`]
//!   does, or leaves the body to it);
//! - `encode`: the response encoder (for speed; the tests compare it with kube-core's
//!   `AdmissionResponse`);
//! - here: the routes and the review flow from body to [`Reviewed`].

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::Operation as WireOperation;
use serde_json::Value;
use smolvm_api::{
    Policy,
    branch::SourceCatalog,
    class::{ClassCatalog, class_for},
    constants::{GROUP, RESOURCE_SMOLVMCLASSES, RESOURCE_SMOLVMNODES, RESOURCE_SMOLVMPOOLS, RESOURCE_SMOLVMS},
    defaulting::{
        Addition, Shape, additions, default_branch_smolvm, default_branch_source, default_pooled_smolvm,
        default_smolvm, default_smolvm_with_class,
    },
    pool::PoolCatalog,
    validate::{
        Context, Identity, NodeCatalog, Operation, Raw, RuleId, Target, Verdict, validate_branch_request,
        validate_pooled_request, validate_raw, validate_smolvm_with,
    },
};

mod encode;
mod scan;
mod wire;

use encode::*;
use scan::*;
pub use wire::{ADMISSION_API_VERSION, ADMISSION_KIND, RequestError, WireRequest, identity_of, operation_of, parse};

/// One of the webhook's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /mutate/smolvms`: defaulting (M1, M2) of SmolVMs.
    MutateSmolVM,
    /// `POST /validate/smolvms`: V1–V9 on SmolVMs and their status.
    ValidateSmolVM,
    /// `POST /validate/smolvmnodes`: V10 on SmolVMNodes and their status.
    ValidateSmolVMNode,
    /// `POST /validate/smolvmclasses`: V12 (and V2, V3, V4, V11 on the fields) on SmolVMClasses.
    ValidateSmolVMClass,
    /// `POST /validate/smolvmpools`: V14 (and V1 to V4, V11 on the template) on SmolVMPools.
    ValidateSmolVMPool,
}

impl Route {
    /// Every route.
    pub const ALL: [Route; 5] = [
        Route::MutateSmolVM,
        Route::ValidateSmolVM,
        Route::ValidateSmolVMNode,
        Route::ValidateSmolVMClass,
        Route::ValidateSmolVMPool,
    ];

    /// The URL path.
    pub fn path(self) -> &'static str {
        match self {
            Route::MutateSmolVM => "/mutate/smolvms",
            Route::ValidateSmolVM => "/validate/smolvms",
            Route::ValidateSmolVMNode => "/validate/smolvmnodes",
            Route::ValidateSmolVMClass => "/validate/smolvmclasses",
            Route::ValidateSmolVMPool => "/validate/smolvmpools",
        }
    }

    /// The plural resource name the route serves.
    pub fn resource(self) -> &'static str {
        match self {
            Route::MutateSmolVM | Route::ValidateSmolVM => RESOURCE_SMOLVMS,
            Route::ValidateSmolVMNode => RESOURCE_SMOLVMNODES,
            Route::ValidateSmolVMClass => RESOURCE_SMOLVMCLASSES,
            Route::ValidateSmolVMPool => RESOURCE_SMOLVMPOOLS,
        }
    }

    /// `mutate` or `validate` (a metrics label).
    pub fn kind(self) -> &'static str {
        match self {
            Route::MutateSmolVM => "mutate",
            Route::ValidateSmolVM
            | Route::ValidateSmolVMNode
            | Route::ValidateSmolVMClass
            | Route::ValidateSmolVMPool => "validate",
        }
    }
}

/// What happened to a request, for metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `smolvms`, `smolvms/status`, `smolvmnodes` or `smolvmnodes/status`.
    pub resource: String,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'static str,
    /// `allowed` or `denied`.
    pub verdict: &'static str,
    /// Whether a non-empty patch was returned.
    pub patched: bool,
    /// The rules of the violations (empty when allowed).
    pub rules: Vec<RuleId>,
    /// The uid of the request.
    pub uid: String,
}

/// The result of reviewing one body: the encoded AdmissionReview and what it decided.
#[derive(Debug, Clone)]
pub struct Reviewed {
    /// The response body (an `admission.k8s.io/v1` AdmissionReview carrying `response`).
    pub body: Vec<u8>,
    /// What was decided.
    pub outcome: Outcome,
}

/// The status code and reason of a denial: 403 `Forbidden` when every violation is an
/// identity-and-binding rule (V9, V10), 422 `Invalid` otherwise.
pub fn denial_code(verdict: &Verdict) -> (u16, &'static str) {
    let forbidden = !verdict.violations.is_empty()
        && verdict
            .violations
            .iter()
            .all(|v| matches!(v.rule, RuleId::V9 | RuleId::V10));
    if forbidden {
        (403, "Forbidden")
    } else {
        (422, "Invalid")
    }
}

/// A request's objects: parsed (by [`parse`]) or as JSON text (by [`parse_text`]).
#[expect(
    clippy::large_enum_variant,
    reason = "one per review, on the stack: boxing the scans would allocate on every review"
)]
enum Objects<'a> {
    Parsed {
        new: Option<Value>,
        old: Option<Value>,
    },
    Text {
        new: Option<(&'a str, Scanned<'a>)>,
        old: Option<(&'a str, Scanned<'a>)>,
        /// The new object's text without what the rules never read ([`Scanned::slimmed`]), which
        /// they are given instead, when it differs.
        slim: Option<String>,
        /// The same of the old object.
        slim_old: Option<String>,
    },
}

impl<'a> Objects<'a> {
    fn has_new(&self) -> bool {
        match self {
            Objects::Parsed { new, .. } => new.is_some(),
            Objects::Text { new, .. } => new.is_some(),
        }
    }

    /// The same objects as parsed Values (text is parsed once, here).
    fn into_parsed(self) -> Self {
        match self {
            Objects::Text { new, old, .. } => Objects::Parsed {
                new: new.and_then(|(text, _)| serde_json::from_str(text).ok()),
                old: old.and_then(|(text, _)| serde_json::from_str(text).ok()),
            },
            parsed => parsed,
        }
    }

    /// A class's DELETE: the rules read the class being deleted (the request's oldObject) as
    /// the object, as it was read with the review (its text and scan, not read again).
    fn into_deleted(self) -> Self {
        match self {
            Objects::Parsed { old, .. } => Objects::Parsed { new: old, old: None },
            Objects::Text { old, slim_old, .. } => Objects::Text {
                new: old,
                old: None,
                slim: slim_old,
                slim_old: None,
            },
        }
    }

    /// The new object and the old one as the rules take them.
    fn raw(&self) -> Option<(Option<Raw<'_>>, Raw<'_>)> {
        match self {
            Objects::Parsed { new: Some(new), old } => Some((old.as_ref().map(Raw::Value), Raw::Value(new))),
            Objects::Text {
                new: Some((new, _)),
                old,
                slim,
                slim_old,
            } => Some((
                slim_old
                    .as_deref()
                    .or(old.as_ref().map(|(text, _)| *text))
                    .map(Raw::Text),
                Raw::Text(slim.as_deref().unwrap_or(new)),
            )),
            _ => None,
        }
    }

    /// Validates the new SmolVM as `patch` (its defaults) leaves it, against the old object as
    /// it came: the verdict the validating endpoint will reach on the same object, given before
    /// the API server's schema and CEL checks can stop the request at their first objection.
    ///
    /// The reference route: the patched JSON, judged as the validating endpoint judges it
    /// (M1 and M2 alone take the faster [`Objects::validate_with`] first).
    fn validate_defaulted(&self, patch: &json_patch::Patch, operation: Operation, ctx: &Context<'_>) -> Verdict {
        let Some((old, new)) = self.raw() else {
            return Verdict::default();
        };
        let mut patched = match new {
            Raw::Value(new) => new.clone(),
            Raw::Text(text) => match serde_json::from_str(text) {
                Ok(value) => value,
                // Not JSON after all: the rules' own decoding reports it.
                Err(_) => return self.validate(Target::SmolVM, operation, ctx),
            },
        };
        if json_patch::patch(&mut patched, patch).is_err() {
            // A patch that does not apply is a defaulting bug; judge the object as sent.
            return self.validate(Target::SmolVM, operation, ctx);
        }
        validate_raw(Target::SmolVM, operation, old, Raw::Value(&patched), ctx)
    }

    /// [`Objects::validate_defaulted`] with the defaults given as additions: applied to the
    /// decoded text directly, or as their patch on the reference route.
    fn validate_with(&self, additions: &[Addition], operation: Operation, ctx: &Context<'_>) -> Verdict {
        if let Some((old, new @ Raw::Text(_))) = self.raw()
            && let Some(verdict) = validate_smolvm_with(operation, old, new, additions, ctx)
        {
            return verdict;
        }
        let patch = json_patch::Patch(additions.iter().map(|a| a.to_patch()).collect());
        self.validate_defaulted(&patch, operation, ctx)
    }

    fn validate(&self, target: Target, operation: Operation, ctx: &Context<'_>) -> Verdict {
        match self.raw() {
            Some((old, new)) => validate_raw(target, operation, old, new, ctx),
            None => Verdict::default(),
        }
    }
}

/// The rules' target for a validating route (`status`: the status subresource).
fn target_of(route: Route, status: bool) -> Target {
    match (route, status) {
        (Route::ValidateSmolVMClass, _) => Target::SmolVMClass,
        (Route::ValidateSmolVMPool, _) => Target::SmolVMPool,
        (Route::ValidateSmolVMNode, true) => Target::SmolVMNodeStatus,
        (Route::ValidateSmolVMNode, false) => Target::SmolVMNode,
        (_, true) => Target::SmolVMStatus,
        (_, false) => Target::SmolVM,
    }
}

/// The parts of a request that [`review`] uses.
struct Request<'a> {
    uid: String,
    /// The API group and the plural name of the resource the request is for.
    group: String,
    resource: String,
    sub_resource: Option<String>,
    operation: WireOperation,
    user_info: UserInfo,
    objects: Objects<'a>,
}

impl From<WireRequest> for Request<'_> {
    fn from(r: WireRequest) -> Self {
        Request {
            uid: r.uid,
            group: r.resource.group,
            resource: r.resource.resource,
            sub_resource: r.sub_resource,
            operation: r.operation,
            user_info: r.user_info,
            objects: Objects::Parsed {
                new: r.object.filter(|o| !o.is_null()),
                old: r.old_object.filter(|o| !o.is_null()),
            },
        }
    }
}

impl<'a> From<TextRequest<'a>> for Request<'a> {
    fn from(r: TextRequest<'a>) -> Self {
        let (object, old_object) = (r.object, r.old_object);
        Request {
            uid: r.uid,
            group: r.group,
            resource: r.resource,
            sub_resource: r.sub_resource,
            operation: r.operation,
            user_info: r.user_info,
            objects: Objects::Text {
                new: object,
                old: old_object,
                slim: object.and_then(|(text, scan)| scan.slimmed(text)),
                slim_old: old_object.and_then(|(text, scan)| scan.slimmed(text)),
            },
        }
    }
}

/// What the rules know besides the request: the known SmolVMNodes, SmolVMClasses and
/// SmolVMPools.
#[derive(Clone, Copy)]
pub struct Catalogs<'a> {
    /// The known SmolVMNodes.
    pub nodes: &'a dyn NodeCatalog,
    /// The known SmolVMClasses.
    pub classes: &'a dyn ClassCatalog,
    /// The known SmolVMPools.
    pub pools: &'a dyn PoolCatalog,
    /// The known branch sources.
    pub sources: &'a dyn SourceCatalog,
}

impl<'a> Catalogs<'a> {
    /// Known nodes, and no classes, pools or branch sources.
    pub fn nodes(nodes: &'a dyn NodeCatalog) -> Self {
        Catalogs {
            nodes,
            classes: &smolvm_api::class::NO_CLASSES,
            pools: &smolvm_api::pool::NO_POOLS,
            sources: &smolvm_api::branch::NO_SOURCES,
        }
    }
}

/// Reviews one AdmissionReview body for `route` under `policy`, with `catalogs` the known
/// SmolVMNodes and SmolVMClasses.
///
/// A well-formed review is read with its objects left as JSON text, which the rules decode
/// straight into their types; anything else goes through [`parse`], whose errors are the
/// answer. Both give the same response.
pub fn review(route: Route, body: &[u8], policy: &Policy, catalogs: Catalogs<'_>) -> Result<Reviewed, RequestError> {
    match parse_text(body) {
        Some(request) => review_request(route, request.into(), policy, catalogs),
        None => review_request(route, parse(body)?.into(), policy, catalogs),
    }
}

/// [`review`] through [`parse`] only (objects as Values): the reference the fast path is
/// checked against.
#[cfg(test)]
fn review_parsed(route: Route, body: &[u8], policy: &Policy, catalogs: Catalogs<'_>) -> Result<Reviewed, RequestError> {
    review_request(route, parse(body)?.into(), policy, catalogs)
}

fn review_request(
    route: Route,
    request: Request<'_>,
    policy: &Policy,
    catalogs: Catalogs<'_>,
) -> Result<Reviewed, RequestError> {
    let operation = operation_of(&request.operation);
    let sub = request.sub_resource.as_deref().filter(|s| !s.is_empty());
    let mut outcome = Outcome {
        resource: match sub {
            Some(s) => format!("{}/{s}", request.resource),
            None => request.resource.clone(),
        },
        operation: operation.as_str(),
        verdict: "allowed",
        patched: false,
        rules: Vec::new(),
        uid: request.uid.clone(),
    };
    let base = response_to(&request.uid);
    let status = match served(route, &request.group, &request.resource, sub) {
        Ok(status) => status,
        Err(message) => {
            outcome.verdict = "denied";
            return answered(deny(base, 400, "BadRequest", &message), outcome);
        }
    };
    // A class's DELETE is admitted with a warning of how many SmolVMs name it; no other DELETE
    // (nor any CONNECT) reaches the webhook through the shipped configuration: admit them.
    let class_delete = route == Route::ValidateSmolVMClass && operation == Operation::Delete;
    if !matches!(operation, Operation::Create | Operation::Update) && !class_delete {
        return answered(base, outcome);
    }
    let objects = if class_delete {
        let objects = request.objects.into_deleted();
        if !objects.has_new() {
            return answered(base, outcome);
        }
        objects
    } else {
        request.objects
    };
    if !objects.has_new() {
        return Err(RequestError::Malformed(format!(
            "request.object is required for {}",
            operation.as_str()
        )));
    }
    let identity = Identity {
        username: request.user_info.username.unwrap_or_default(),
        groups: request.user_info.groups.unwrap_or_default(),
        extra: request.user_info.extra.unwrap_or_default(),
    };
    let ctx = Context {
        policy,
        nodes: catalogs.nodes,
        classes: catalogs.classes,
        pools: catalogs.pools,
        sources: catalogs.sources,
        identity: &identity,
    };
    let response = match route {
        Route::MutateSmolVM if status => base,
        Route::MutateSmolVM => mutate(objects, operation, &ctx, base, &mut outcome)?,
        Route::ValidateSmolVM | Route::ValidateSmolVMNode | Route::ValidateSmolVMClass | Route::ValidateSmolVMPool => {
            let verdict = objects.validate(target_of(route, status), operation, &ctx);
            let mut response = base;
            if !verdict.warnings.is_empty() {
                response.warnings = Some(verdict.warnings.iter().map(finding_text).collect());
            }
            judged(response, &verdict, &mut outcome)
        }
    };
    answered(response, outcome)
}

/// Whether `route` serves a request for `resource` of API group `group` and subresource `sub`:
/// `Ok(true)` for the status subresource, `Ok(false)` for the main resource, else the message
/// of a 400 denial (a misconfigured webhook rule is denied, not guessed at).
fn served(route: Route, group: &str, resource: &str, sub: Option<&str>) -> Result<bool, String> {
    if group != GROUP || resource != route.resource() {
        return Err(format!(
            "{} serves {GROUP}/{}, not {group}/{resource}",
            route.path(),
            route.resource(),
        ));
    }
    match sub {
        None => Ok(false),
        Some("status") => Ok(true),
        Some(other) => Err(format!("subresource {other:?} is not served by this webhook")),
    }
}

/// The encoded answer to the review `uid`: denied with `code`, `reason` and `message` (a refusal
/// decided after the rules, such as a quota's, V15).
pub fn refusal(uid: &str, code: u16, reason: &'static str, message: &str) -> Result<Vec<u8>, RequestError> {
    encode(deny(response_to(uid), code, reason, message))
}

/// The review's answer, encoded.
fn answered(response: Answer, outcome: Outcome) -> Result<Reviewed, RequestError> {
    Ok(Reviewed {
        body: encode(response)?,
        outcome,
    })
}

/// `response` denied with every violation of `verdict`, if it has any.
fn judged(response: Answer, verdict: &Verdict, outcome: &mut Outcome) -> Answer {
    if verdict.allowed() {
        return response;
    }
    outcome.verdict = "denied";
    outcome.rules = verdict.violated_rules();
    let (code, reason) = denial_code(verdict);
    deny(response, code, reason, &verdict.message())
}

/// The mutating review of a SmolVM (main resource, CREATE or UPDATE): the defaulting patch
/// (M3 from the class at CREATE, then M1 and M2), or every violation of the defaulted object.
fn mutate(
    objects: Objects<'_>,
    operation: Operation,
    ctx: &Context<'_>,
    base: Answer,
    outcome: &mut Outcome,
) -> Result<Answer, RequestError> {
    // What defaulting reads of the object: from the scan of its text (the spec's text read into
    // its shape), else from its Value.
    let text_shape = match &objects {
        Objects::Text {
            new: Some((_, scan)), ..
        } => defaulting_shape(scan),
        _ => None,
    };
    let (objects, shape) = match text_shape {
        Some(shape) => (objects, Some(shape)),
        None => {
            let objects = objects.into_parsed();
            let shape = match &objects {
                Objects::Parsed { new: Some(new), .. } => Some(Shape::of_value(new)),
                _ => None,
            };
            (objects, shape)
        }
    };
    let spec = shape.as_ref().and_then(|s| s.spec.as_ref());
    let creating = operation == Operation::Create;
    if creating && spec.is_some_and(|s| s.pool_ref) {
        return mutate_pooled(objects, operation, ctx, base, outcome);
    }
    if creating && spec.is_some_and(|s| s.branch_of || s.branchable) {
        return mutate_branch(objects, operation, ctx, base, outcome);
    }
    // M3: at CREATE, the class the SmolVM names, or the default class. An unknown name applies
    // none; validation below reports it (V12).
    let class = if creating {
        class_for(spec.and_then(|s| s.class_name.as_deref()), ctx.classes)
            .ok()
            .flatten()
    } else {
        None
    };
    let Some(class) = class else {
        // M1 and M2, decided from the shape; their additions are applied to the decoded object
        // and written out as the patch, with no JSON value built for them.
        let additions = shape.map(|shape| additions(operation, &shape)).unwrap_or_default();
        let verdict = objects.validate_with(&additions, operation, ctx);
        return answer(
            base,
            &verdict,
            additions.is_empty(),
            || Ok(additions_json(&additions)),
            outcome,
        );
    };
    // A class writes annotations and labels, which the shape lacks: defaulting and validation
    // then share one parse of the object.
    let objects = objects.into_parsed();
    let patch = match &objects {
        Objects::Parsed { new: Some(new), .. } => default_smolvm_with_class(operation, new, Some(&class)),
        _ => json_patch::Patch(Vec::new()),
    };
    // Every violation in one answer: the API server checks the CRD schema and its CEL rules
    // after mutating admission and stops at their objection, so the complete list is given
    // here, on the defaulted object, with the validating endpoint's text. Warnings are left to
    // the validating endpoint (said once, not twice).
    let verdict = objects.validate_defaulted(&patch, operation, ctx);
    defaulted(base, &verdict, &patch, outcome)
}

/// The mutating answer: denied with every violation of `verdict`, else `patch` (none when empty).
fn defaulted(
    base: Answer,
    verdict: &Verdict,
    patch: &json_patch::Patch,
    outcome: &mut Outcome,
) -> Result<Answer, RequestError> {
    answer(base, verdict, patch.0.is_empty(), || patch_json(patch), outcome)
}

/// The mutating answer: denied with every violation of `verdict`, else the patch `json` writes
/// (none when `empty`).
fn answer(
    base: Answer,
    verdict: &Verdict,
    empty: bool,
    json: impl FnOnce() -> Result<Vec<u8>, RequestError>,
    outcome: &mut Outcome,
) -> Result<Answer, RequestError> {
    if !verdict.allowed() {
        return Ok(judged(base, verdict, outcome));
    }
    if empty {
        return Ok(base);
    }
    outcome.patched = true;
    Ok(Answer {
        patch: Some(json()?),
        ..base
    })
}

/// The JSON patch of `additions` (an empty list is no patch: the caller sends none).
fn additions_json(additions: &[Addition]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * additions.len() + 2);
    out.push(b'[');
    for (i, addition) in additions.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        addition.write_json(&mut out);
    }
    out.push(b']');
    out
}

/// The mutating review of a SmolVM that names a pool, at CREATE: the pool's template fills it
/// (M4), then its class's defaults, the built-in ones and the finalizer (M3, M1, M2); or every
/// violation at once: each field it sets that a lease cannot carry (V14), then those of the
/// filled object, an unknown pool's included.
fn mutate_pooled(
    objects: Objects<'_>,
    operation: Operation,
    ctx: &Context<'_>,
    base: Answer,
    outcome: &mut Outcome,
) -> Result<Answer, RequestError> {
    mutate_filled(objects, (operation, ctx), base, outcome, |new, namespace| {
        let pool = new
            .pointer("/spec/poolRef/name")
            .and_then(Value::as_str)
            .and_then(|name| ctx.pools.pool(namespace, name));
        let patch = match &pool {
            Some(pool) => default_pooled_smolvm(operation, new, pool, ctx.classes),
            None => default_smolvm(operation, new),
        };
        (patch, validate_pooled_request(new))
    })
}

/// The mutating review of a branch or a branch source, at CREATE. A branch (`branchOf`) takes
/// its spec from its source (M5), then its class's defaults, the built-in ones and the finalizer
/// (M3, M1, M2); or every violation at once: each field it sets that a branch takes from its
/// source (V17), then those of the filled object, an unknown source's included. A branch source
/// (`branchable`) gets its label (M5) and the defaults of any SmolVM.
fn mutate_branch(
    objects: Objects<'_>,
    operation: Operation,
    ctx: &Context<'_>,
    base: Answer,
    outcome: &mut Outcome,
) -> Result<Answer, RequestError> {
    mutate_filled(objects, (operation, ctx), base, outcome, |new, namespace| {
        let source = smolvm_api::branch::source_named(new).and_then(|name| ctx.sources.source(namespace, name));
        let patch = match &source {
            Some(source) => default_branch_smolvm(operation, new, source, ctx.classes),
            None => default_branch_source(operation, new, ctx.classes),
        };
        (patch, validate_branch_request(new))
    })
}

/// The mutating review of a SmolVM filled at CREATE from another object (a pool's template, a
/// branch's source): `fill` gives the patch and the violations of the object as sent, from the
/// object and its namespace; the filled object's own violations join them, in one answer.
/// Filling writes labels and annotations, which the shape lacks: filling, defaulting and
/// validation share one parse of the object.
fn mutate_filled(
    objects: Objects<'_>,
    (operation, ctx): (Operation, &Context<'_>),
    base: Answer,
    outcome: &mut Outcome,
    fill: impl FnOnce(&Value, &str) -> (json_patch::Patch, Verdict),
) -> Result<Answer, RequestError> {
    let objects = objects.into_parsed();
    let Objects::Parsed { new: Some(new), .. } = &objects else {
        return Ok(base);
    };
    let namespace = new.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
    let (patch, mut verdict) = fill(new, namespace);
    verdict.extend(objects.validate_defaulted(&patch, operation, ctx));
    defaulted(base, &verdict, &patch, outcome)
}

#[cfg(test)]
mod tests;
