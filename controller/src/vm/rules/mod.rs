//! The rules of a SmolVM's lifecycle, as pure functions of what was observed: the next step
//! ([`next_step`]), the node's health, the machine the spec asks for and the action that brings
//! it there, restarts and run goals, conditions, and the events of a transition. [`super::decide`]
//! combines them into one decision per pass.
//!
//! By concern: `step` (the next step from the object alone), `node_health`, `run_goal` (restart
//! requests and run goals), `machine` (its name, spec, wanted state, action and resources),
//! `room` (a resize's or a resume's room on its node), `pool` (a pooled SmolVM's create: lease,
//! cold or wait), `branch` (a branch's source, its node and its create), `lifetime` (when a SmolVM expires),
//! `conditions`, `events`.

mod branch;
mod conditions;
mod events;
mod idle;
mod lifetime;
mod machine;
mod node_health;
mod pool;
mod room;
mod run_goal;
mod step;

pub use branch::{BranchSource, branch_call, is_branch_of, source_of, waiting_on};
pub use conditions::{apply_machine, clear_condition, set_condition, suspended_condition};
pub use events::{Made, StepEvent, TransitionEvent, step_events, transition_event};
pub use idle::{Sleep, Use, WakeBy, idle_message, idle_suspended, sleep, suspend_request, wake_requested};
pub use lifetime::{Expiry, expiry, stamp};
pub use machine::{MachineAction, Want, effective_of, machine_action, machine_name, machine_resources, machine_spec};
pub use node_health::{NodeHealth, node_health};
pub use pool::{PoolOf, PooledCreate, create_call, serving};
pub use room::{Shortfall, resize_shortfall, resume_shortfall};
pub use run_goal::{MAX_RESTART_REQUEST, Restart, RunGoal, exited_message, restart, restart_request, run_goal};
pub use step::{MissingMachine, Step, force_delete, missing_machine, next_step, recreate_lost_machine};
