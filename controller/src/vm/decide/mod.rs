//! Decide: what one pass over a bound SmolVM does next, as a pure function of what was observed
//! ([`Observed`]) and what the pass has done so far ([`Progress`]).
//!
//! [`converge`] answers either with the next node call to make ([`Decision::Act`]) or, once
//! nothing more is to be done in this pass, with the whole [`Outcome`]: the status to write, the
//! Service and EndpointSlice writes, the events, the annotations to drop and when to look again.
//! Every phase and condition of a bound SmolVM is chosen here, and exposure is decided on every
//! path, whatever the machine calls did. The placement and deletion steps have their own small
//! decisions ([`bound`], [`unschedulable`], [`deletion_blocked`]).
//!
//! By concern, each part using only those above it:
//! - `observed`: what the pass observed ([`Observed`], [`Room`]);
//! - `outcome`: what it reports ([`Outcome`], [`Note`], [`Requeue`], the exposure writes);
//! - `pass`: its course ([`Call`], [`Failure`], [`Progress`], [`Decision`]);
//! - `exposing`, `volumes_ready`, `problems`, `settle`: the parts of an outcome (the Service and
//!   EndpointSlice, VolumesReady, a pass that cannot go on, the machine the pass left);
//! - `converge`: the decision of each step of a pass over a bound SmolVM ([`converge()`]);
//! - `binding`, `deletion`: the placement's and the deletion's own decisions.

mod binding;
mod converge;
mod deletion;
mod exposing;
mod observed;
mod outcome;
mod pass;
mod problems;
mod settle;
mod volumes_ready;

pub use binding::{bound, branch_waits, unschedulable};
pub use converge::{MAX_STEPS_PER_PASS, RESUME_RECHECK, converge};
pub use deletion::{DeleteFailure, branches_first, delete_failure, deleted, deletion_blocked};
pub use exposing::removal;
pub use observed::{Observed, Room};
pub use outcome::{AnnotationDrop, Exposing, ExposureWrite, Note, Outcome, Requeue};
pub use pass::{Call, Decision, Failure, Progress};
pub use problems::call_failure;
pub use volumes_ready::waiting_for_volumes;
