//! Every name the operator shares between its components: API group, finalizer,
//! annotations, label keys, condition types and reasons, field managers.
//!
//! Keep these in one place so the webhook, the controller and the runtime agent
//! can never disagree about a spelling.

/// The API group of every custom resource of the operator.
pub const GROUP: &str = "vm.smolvm.dev";
/// The API version served.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as it appears in objects.
pub const API_VERSION: &str = "vm.smolvm.dev/v1alpha1";
/// Kind of the namespaced machine resource.
pub const KIND_SMOLVM: &str = "SmolVM";
/// Kind of the cluster-scoped node resource.
pub const KIND_SMOLVM_NODE: &str = "SmolVMNode";
/// Plural resource name of SmolVM.
pub const RESOURCE_SMOLVMS: &str = "smolvms";
/// Plural resource name of SmolVMNode.
pub const RESOURCE_SMOLVMNODES: &str = "smolvmnodes";
/// Kind of the instance-type resource.
pub const KIND_SMOLVM_CLASS: &str = "SmolVMClass";
/// Plural resource name of SmolVMClasses.
pub const RESOURCE_SMOLVMCLASSES: &str = "smolvmclasses";
/// Kind of the warm pool resource.
pub const KIND_SMOLVM_POOL: &str = "SmolVMPool";
/// Plural resource name of SmolVMPools.
pub const RESOURCE_SMOLVMPOOLS: &str = "smolvmpools";
/// On a SmolVMClass: `"true"` makes it the class of SmolVMs that name none (at most one; V12).
pub const ANNOTATION_IS_DEFAULT_CLASS: &str = "vm.smolvm.dev/is-default-class";
/// The only value of [`ANNOTATION_IS_DEFAULT_CLASS`] that makes a class the default.
pub const IS_DEFAULT_CLASS_VALUE: &str = "true";
/// On a SmolVM: the class its defaults came from at CREATE (rule M3).
pub const ANNOTATION_CLASS: &str = "vm.smolvm.dev/class";
/// On a SmolVM: the `metadata.generation` of that class when its defaults were taken (rule M3).
pub const ANNOTATION_CLASS_GENERATION: &str = "vm.smolvm.dev/class-generation";
/// On a SmolVM: its class, as a label, so that `kubectl get svm -l vm.smolvm.dev/class=large`
/// lists a class's SmolVMs and the webhook counts them when the class is deleted (rule M3).
pub const LABEL_CLASS: &str = "vm.smolvm.dev/class";
/// On a SmolVM: the `metadata.generation` of its pool when its spec was taken from the pool's
/// template (rule M4): slots of that generation may serve it.
pub const ANNOTATION_POOL_GENERATION: &str = "vm.smolvm.dev/pool-generation";
/// On a SmolVM: the `metadata.uid` of its pool when its spec was taken from the pool's template
/// (rule M4): a pool deleted and made again under the same name is another pool, whose slots
/// never serve it.
pub const ANNOTATION_POOL_UID: &str = "vm.smolvm.dev/pool-uid";
/// On a SmolVM: its pool, as a label, so that `kubectl get svm -l vm.smolvm.dev/pool=web`
/// lists the SmolVMs served from a pool (rule M4).
pub const LABEL_POOL: &str = "vm.smolvm.dev/pool";

/// On a branch (SPEC 2.6): its source's name, as a label, so that
/// `kubectl get svm -l vm.smolvm.dev/branch-of=SOURCE` lists a source's branches (rule M5).
pub const LABEL_BRANCH_OF: &str = "vm.smolvm.dev/branch-of";
/// On a branch: the `metadata.uid` of its source when its spec was taken from it (rule M5): a
/// source deleted and made again under the same name is another machine, never branched for it.
pub const ANNOTATION_BRANCH_OF_UID: &str = "vm.smolvm.dev/branch-of-uid";
/// On a branchable SmolVM: `"true"`, as a label, so that the webhook's cache of branch sources
/// holds only them (rule M5).
pub const LABEL_BRANCHABLE: &str = "vm.smolvm.dev/branchable";
/// The only value of [`LABEL_BRANCHABLE`].
pub const BRANCHABLE_VALUE: &str = "true";
/// On a branch source being deleted: delete its branches first, then it (SPEC 2.6).
/// Admission-checked like the force-delete annotation (V17).
pub const DELETE_BRANCHES_ANNOTATION: &str = "vm.smolvm.dev/delete-branches";
/// The only accepted value of [`DELETE_BRANCHES_ANNOTATION`].
pub const DELETE_BRANCHES_VALUE: &str = "true";

/// Finalizer that keeps a SmolVM until its node confirmed the machine is gone (rule M2).
pub const FINALIZER: &str = "vm.smolvm.dev/node-cleanup";
/// Escape hatch: remove the finalizer even though the node cannot confirm cleanup (rule V7).
pub const FORCE_DELETE_ANNOTATION: &str = "vm.smolvm.dev/force-delete-local-state";
/// The only value [`FORCE_DELETE_ANNOTATION`] may carry.
pub const FORCE_DELETE_VALUE: &str = "true";

/// Asks for a fresh, empty machine in place of one that was lost from its node (reason
/// MachineLost). Admission-checked like [`FORCE_DELETE_ANNOTATION`]: exactly `"true"`, and only on
/// a SmolVM whose machine is lost.
pub const RECREATE_LOST_MACHINE_ANNOTATION: &str = "vm.smolvm.dev/recreate-lost-machine";
/// The only value [`RECREATE_LOST_MACHINE_ANNOTATION`] may carry.
pub const RECREATE_LOST_MACHINE_VALUE: &str = "true";
/// Asks for one restart of a running machine (`kubectl smolvm restart` sets it to the time of
/// the request, RFC 3339). The controller stops and starts the machine, then removes the
/// annotation (only if it still holds the value it acted on), so each request is honoured once.
pub const RESTART_ANNOTATION: &str = "vm.smolvm.dev/restart-requested-at";
/// Asks the controller to wake a SmolVM it suspended for idleness (`kubectl smolvm resume` and
/// the access API's exec and copy set it to the time of asking, RFC 3339). The controller resumes
/// the machine as any resume (room on the node, the namespace's quota) and removes the
/// annotation once the machine runs. Ignored on a SmolVM not suspended for idleness.
pub const WAKE_ANNOTATION: &str = "vm.smolvm.dev/wake-requested-at";
/// Prefix of every machine name the operator creates on a node: `svm-<metadata.uid>`.
pub const MACHINE_NAME_PREFIX: &str = "svm-";

/// On a SmolVMNode: `"true"` asks its agent to run the guest boot check (the canary) again now;
/// the agent removes the annotation when it acts on it.
pub const RECHECK_BOOT_ANNOTATION: &str = "vm.smolvm.dev/recheck-boot";
/// The only value of [`RECHECK_BOOT_ANNOTATION`] that asks for a check.
pub const RECHECK_BOOT_VALUE: &str = "true";
/// Name of the machine the canary boots on a node (never `svm-…`: orphan collection leaves it alone).
pub const CANARY_MACHINE_NAME: &str = "smolvm-operator-canary";

/// Prefix of the operator's own label keys on a SmolVMNode (the agent's [`AGENT_LABELS`] and the
/// controller's [`LABEL_NODE`]); a Node label with such a key is not mirrored over them.
pub const AGENT_LABEL_PREFIX: &str = "vm.smolvm.dev/";
/// SmolVMNode label: `"true"` or `"false"`, the last canary boot's result (absent while pending
/// or with the check off). A `nodeSelector` can ask for it.
pub const LABEL_GUEST_BOOTABLE: &str = "vm.smolvm.dev/guest-bootable";
/// SmolVMNode label: `"true"` when smolvm runs nested-virtualization machines here.
pub const LABEL_NESTED_VIRT: &str = "vm.smolvm.dev/nested-virt";
/// SmolVMNode label: how many CUDA devices smolvm sees here, when it sees any.
pub const LABEL_GPU_COUNT: &str = "vm.smolvm.dev/gpu-count";
/// The only labels a runtime agent may set on its SmolVMNode (rule V10, as the NodeRestriction
/// admission plugin keeps a kubelet to its own labels): what it found on its host. Every other
/// label is the cluster admin's or mirrored from the Node by the controller, so that a node
/// cannot label itself into another tenant's VMs and pools.
pub const AGENT_LABELS: [&str; 3] = [LABEL_GUEST_BOOTABLE, LABEL_NESTED_VIRT, LABEL_GPU_COUNT];

/// Label the controller sets on SmolVMNodes, naming the Kubernetes Node (mirrors
/// `kubernetes.io/hostname`), when the name fits a label value.
pub const LABEL_NODE: &str = "vm.smolvm.dev/node";
/// Label the operator sets on objects it manages.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "smolvm-operator";
/// Annotation on a SmolVMNode listing the label keys the controller mirrored from the Node, so
/// that labels an admin set directly on the SmolVMNode are never erased.
pub const ANNOTATION_MIRRORED_LABELS: &str = "vm.smolvm.dev/mirrored-labels";

/// `userInfo.extra` key carrying the node name of a pod-bound ServiceAccount token.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
/// `userInfo.extra` key carrying the node UID of a pod-bound ServiceAccount token.
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";

/// Signer name of the CertificateSigningRequests the runtime agents file.
pub const RUNTIME_SIGNER: &str = "vm.smolvm.dev/runtime-serving";
/// Node API protocol version spoken by this build.
pub const PROTOCOL_VERSION: &str = "v1";

/// The Secret holding the node API bearer token (key `token`), in the operator's namespace.
pub const RUNTIME_AUTH_SECRET: &str = "smolvm-runtime-auth";
/// The runtime CA: a Secret only the controller reads, and a public ConfigMap (key `ca.crt`).
pub const RUNTIME_CA: &str = "smolvm-runtime-ca";
/// Annotation on the runtime CA Secret asking the controller to rotate the CA (value `"true"`;
/// the controller removes it when the rotation begins).
pub const ROTATE_RUNTIME_CA_ANNOTATION: &str = "vm.smolvm.dev/rotate-runtime-ca";
/// Field manager of the controller.
pub const FIELD_MANAGER_CONTROLLER: &str = "smolvm-controller";
/// Field manager of the runtime agent.
pub const FIELD_MANAGER_RUNTIME: &str = "smolvm-runtime";
/// Field manager of the webhook (TLS bootstrap only).
pub const FIELD_MANAGER_WEBHOOK: &str = "smolvm-webhook";

/// Condition types.
pub mod condition {
    /// SmolVM: a node was chosen and the binding written.
    pub const SCHEDULED: &str = "Scheduled";
    /// SmolVM: the machine matches `spec.running` on its node. SmolVMNode: the runtime is serving.
    pub const READY: &str = "Ready";
    /// SmolVM: whether the machine is suspended (its memory and disks saved on its node, its
    /// CPU and memory given back), being suspended or resumed, or waiting to resume.
    pub const SUSPENDED: &str = "Suspended";
    /// SmolVM: deletion waits for a node that cannot confirm cleanup.
    pub const DELETION_BLOCKED: &str = "DeletionBlocked";
    /// SmolVM: a resize was accepted but not yet applied on the node.
    pub const RESIZE_PENDING: &str = "ResizePending";
    /// SmolVM with `network.exposeService`: its Service and EndpointSlice route to the node.
    pub const SERVICE_EXPOSED: &str = "ServiceExposed";
    /// SmolVMNode: `/dev/kvm` opened and answered KVM_GET_API_VERSION.
    pub const KVM_AVAILABLE: &str = "KVMAvailable";
    /// SmolVMNode: the supervised `smolvm serve` answers its health check.
    pub const RUNTIME_READY: &str = "RuntimeReady";
    /// SmolVMNode: a canary machine (smolvm's own guest, no image, no network) booted here.
    /// `/dev/kvm` answering (KVMAvailable) is not proof that a guest boots.
    pub const GUEST_BOOTABLE: &str = "GuestBootable";
    /// SmolVM with `spec.volumes`: every volume is mounted in its holder Pod on the VM's node
    /// (True), or why not yet (False: a claim missing or Pending, a ConfigMap or Secret missing,
    /// the holder not yet scheduled or mounted, the holder evicted).
    pub const VOLUMES_READY: &str = "VolumesReady";
    /// SmolVM with `spec.lifecycle`: True (reason Expired) once one of its lifetimes passed and
    /// the controller deleted it (SPEC 2.7); the message says which.
    pub const EXPIRED: &str = "Expired";
}

/// Condition reasons (CamelCase, stable: dashboards and alerts match on them).
pub mod reason {
    /// No eligible node yet.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// Bound to a node.
    pub const BOUND: &str = "Bound";
    /// The machine is being created on the node.
    pub const CREATING: &str = "Creating";
    /// The machine runs.
    pub const RUNNING: &str = "Running";
    /// The machine is stopped as asked.
    pub const STOPPED: &str = "Stopped";
    /// The workload exited on its own and the restart policy (Never, or OnFailure after a clean
    /// exit) keeps the machine stopped until `spec.running` goes false and back to true.
    pub const EXITED: &str = "Exited";
    /// The workload exited on its own and restartPolicy Always started it again (event reason).
    pub const RESTARTED: &str = "Restarted";
    /// A published host port is taken on the node (told by its agent before smolvm is asked).
    pub const HOST_PORT_IN_USE: &str = "HostPortInUse";
    /// A published host port is one the policy excludes (`excludedHostPorts`); the node's agent
    /// refused to create the machine whatever admission did.
    pub const HOST_PORT_EXCLUDED: &str = "HostPortExcluded";
    /// The image was pulled on the node with registry credentials and the SmolVM has none for
    /// its registry (`imagePullSecrets`): the node's agent refused to start it.
    pub const IMAGE_PULL_CREDENTIALS_REQUIRED: &str = "ImagePullCredentialsRequired";
    /// The Service for `network.exposeService` routes to the machine's node and host ports.
    pub const SERVICE_READY: &str = "ServiceReady";
    /// A Service of the SmolVM's name exists and the SmolVM does not own it: it is not touched.
    pub const SERVICE_NOT_OWNED: &str = "ServiceNotOwned";
    /// The bound node reports no InternalIP yet: the Service has no endpoint.
    pub const NO_NODE_ADDRESS: &str = "NoNodeAddress";
    /// `network.exposeService` with no published port: no Service is made.
    pub const NO_PORTS: &str = "NoPorts";
    /// The SmolVM's name cannot name a Service (not a DNS-1035 label).
    pub const INVALID_SERVICE_NAME: &str = "InvalidServiceName";
    /// The API server refused or failed a Service or EndpointSlice call.
    pub const SERVICE_ERROR: &str = "ServiceError";
    /// The node runtime failed to start the machine.
    pub const START_FAILED: &str = "StartFailed";
    /// The node runtime could not create the machine.
    pub const CREATE_FAILED: &str = "CreateFailed";
    /// An env reference (Secret or ConfigMap, or one of their keys) is missing and not optional:
    /// the machine is not created until it appears.
    pub const CREATE_CONFIG_ERROR: &str = "CreateConfigError";
    /// The controller may not read a Secret or ConfigMap the workload refers to.
    pub const SECRET_ACCESS_DENIED: &str = "SecretAccessDenied";
    /// The node runtime failed to stop the machine.
    pub const STOP_FAILED: &str = "StopFailed";
    /// The node runtime failed to resize the machine.
    pub const RESIZE_FAILED: &str = "ResizeFailed";
    /// A resize waits for room on the node (allocatable minus the other VMs bound there).
    pub const INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";
    /// The machine was created on its node and is gone from it (state wiped, disk lost); it is
    /// not re-created empty unless the recreate-lost-machine annotation asks for it.
    pub const MACHINE_LOST: &str = "MachineLost";
    /// The node's heartbeat is stale or its runtime is unreachable.
    pub const NODE_UNREACHABLE: &str = "NodeUnreachable";
    /// The node was replaced under the same name (new UID).
    pub const NODE_REPLACED: &str = "NodeReplaced";
    /// The bound node's SmolVMNode no longer exists.
    pub const NODE_MISSING: &str = "NodeMissing";
    /// Deletion waits for an unreachable runtime.
    pub const RUNTIME_UNREACHABLE: &str = "RuntimeUnreachable";
    /// The finalizer was removed by the force-delete annotation.
    pub const FORCE_DELETED: &str = "ForceDeleted";
    /// A resize waits for the runtime.
    pub const RESIZE_NOT_APPLIED: &str = "ResizeNotApplied";
    /// All is well.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Suspended True: the machine is suspended; the message says since when and how large its
    /// saved state is counted. Also the event of a suspend.
    pub const SUSPENDED: &str = "Suspended";
    /// Suspended False: `spec.suspended` is true and the machine is being paused (or started
    /// first, when it has nothing saved yet).
    pub const SUSPENDING: &str = "Suspending";
    /// Suspended True: `spec.suspended` went false and the machine is being resumed on its node.
    pub const RESUMING: &str = "Resuming";
    /// Suspended True: a resume waits for the node's CPU or memory (the message names what is
    /// missing); bound VMs never move. Also the Warning event.
    pub const RESUME_PENDING: &str = "ResumePending";
    /// Event: the machine resumed with its processes as they were.
    pub const RESUMED: &str = "Resumed";
    /// Suspended True, and its event: the controller suspended the machine because its published
    /// ports and access sessions were quiet for `lifecycle.suspendAfterIdle` (SPEC 2.7);
    /// `spec.suspended` stays false.
    pub const IDLE_SUSPENDED: &str = "IdleSuspended";
    /// Event: a VM suspended for idleness was resumed because a connection arrived at one of its
    /// published ports, or an exec or copy (or `kubectl smolvm resume`) asked for it.
    pub const WOKEN_BY_TRAFFIC: &str = "WokenByTraffic";
    /// Event: `running: false` stopped a suspended machine, and its saved memory was discarded.
    pub const SAVED_STATE_DISCARDED: &str = "SavedStateDiscarded";
    /// The node runtime failed to suspend or resume the machine.
    pub const SUSPEND_FAILED: &str = "SuspendFailed";
    /// The node runtime failed to resume the machine.
    pub const RESUME_FAILED: &str = "ResumeFailed";
    /// Ready False: a branch waits for its source to run on its node (only a running machine
    /// can be branched); looked at again with a backoff of 1 s doubling to 30 s.
    pub const BRANCH_PENDING: &str = "BranchPending";
    /// Event: a branch's machine was made as a copy-on-write clone of its running source (the
    /// note gives the time smolvm took).
    pub const BRANCHED: &str = "Branched";
    /// DeletionBlocked True: a branch source is being deleted while branches of it live on its
    /// node (smolvm keeps a fork base while it has clones); the message names them and the
    /// `vm.smolvm.dev/delete-branches` annotation.
    pub const LIVE_BRANCHES: &str = "LiveBranches";
    /// Event on a branch source: its branches are being deleted before it, as its
    /// `vm.smolvm.dev/delete-branches` annotation asks.
    pub const DELETING_BRANCHES: &str = "DeletingBranches";
    /// Event and condition Expired: a lifetime of `spec.lifecycle` passed
    /// (`activeDeadlineSeconds` after it first ran, or `ttlSecondsAfterFinished` after it
    /// finished) and the controller deleted the SmolVM (SPEC 2.7).
    pub const EXPIRED: &str = "Expired";
    /// Event: a SmolVM naming a pool was served from a ready slot of it on its node.
    pub const SERVED_FROM_POOL: &str = "ServedFromPool";
    /// Event: a SmolVM naming a pool found no ready slot on its node and was created cold
    /// from its template (`whenEmpty: Cold`).
    pub const POOL_EMPTY: &str = "PoolEmpty";
    /// Ready False: a SmolVM naming a pool waits for a ready slot on its node (`whenEmpty:
    /// Wait`); looked at again with a backoff of 1 s doubling to 30 s.
    pub const WAITING_FOR_SLOT: &str = "WaitingForSlot";
    /// SmolVMPool Ready True: every matching node keeps its slots ready.
    pub const SLOTS_READY: &str = "SlotsReady";
    /// SmolVMPool Ready False: slots are being made (the message counts the ready ones).
    pub const SLOTS_FILLING: &str = "SlotsFilling";
    /// SmolVMPool Ready False: a node could not make the pool's slots (the message names the
    /// node and smolvm's cause, cleaned); retried with a backoff.
    pub const SLOTS_FAILING: &str = "SlotsFailing";
    /// SmolVMPool Ready False: the namespace's ResourceQuota stopped the filling (the message
    /// names what is left and what waits for room).
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// Event on a SmolVMPool: ready slots of it on a node were given back to a SmolVM (or
    /// another pool's source) that fit there only with their room (the note names the node, the
    /// slots and the taker).
    pub const SLOTS_GIVEN_BACK: &str = "SlotsGivenBack";
    /// SmolVMPool Ready False: no node that can take VMs matches the pool's nodeSelector.
    pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";
    /// KVM is not usable on the node.
    pub const KVM_UNAVAILABLE: &str = "KVMUnavailable";
    /// `smolvm serve` is down or restarting.
    pub const RUNTIME_DOWN: &str = "RuntimeDown";
    /// SmolVMNode GuestBootable True: the canary machine booted (the message gives how long it took).
    pub const CANARY_BOOTED: &str = "CanaryBooted";
    /// SmolVMNode GuestBootable False: the canary machine did not boot (the message says why,
    /// and what to fix where the cause can be told).
    pub const CANARY_FAILED: &str = "CanaryFailed";
    /// SmolVMNode GuestBootable Unknown: the first canary boot has not finished.
    pub const CANARY_PENDING: &str = "CanaryPending";
    /// Event on a SmolVMNode: its agent's clock is far from the controller's.
    pub const CLOCK_SKEW: &str = "ClockSkew";
    /// Event on a SmolVMNode: its heartbeat went stale (the agent is down, cut off, or cannot
    /// verify the API server).
    pub const HEARTBEAT_LOST: &str = "HeartbeatLost";
    /// Event on a SmolVMNode: its heartbeat is fresh again after a HeartbeatLost.
    pub const HEARTBEAT_RESUMED: &str = "HeartbeatResumed";
    /// VolumesReady True: every volume is mounted in the holder Pod on the VM's node.
    pub const VOLUMES_MOUNTED: &str = "VolumesMounted";
    /// VolumesReady False: a `persistentVolumeClaim` names a claim that does not exist (yet).
    pub const CLAIM_MISSING: &str = "ClaimMissing";
    /// VolumesReady False: a claim is not bound yet (a `WaitForFirstConsumer` claim binds once
    /// the holder Pod is scheduled to the VM's node).
    pub const CLAIM_PENDING: &str = "ClaimPending";
    /// VolumesReady False: a claim named `<smolvm>-<volume>` exists and is not this SmolVM's
    /// (it carries another SmolVM's label, or none).
    pub const CLAIM_CONFLICT: &str = "ClaimConflict";
    /// VolumesReady False: a ConfigMap or Secret volume that is not `optional` names an object
    /// that does not exist.
    pub const VOLUME_SOURCE_MISSING: &str = "VolumeSourceMissing";
    /// VolumesReady False: the holder Pod is waiting to be scheduled or for the kubelet to mount
    /// its volumes (the kubelet's reason, cleaned, is in the message where it gave one).
    pub const HOLDER_PENDING: &str = "HolderPending";
    /// VolumesReady False: the holder Pod was evicted or deleted; the VM was stopped before its
    /// volumes were unmounted, and starts again once a new holder has mounted them. Also the
    /// event on the SmolVM.
    pub const HOLDER_EVICTED: &str = "HolderEvicted";
    /// VolumesReady False: a Pod of the holder's name exists that this SmolVM does not own.
    pub const HOLDER_CONFLICT: &str = "HolderConflict";
    /// Placement: no eligible node can reach a volume's data (a claim bound to a PV whose node
    /// affinity excludes the node).
    pub const VOLUME_NODE_CONFLICT: &str = "VolumeNodeConflict";
}

/// Names of the holder Pods and claims a SmolVM with `spec.volumes` gets (SPEC 2.5).
pub mod volumes {
    /// On holder Pods and on claims made from a claim template: the SmolVM's name, so that
    /// `kubectl get pods,pvc -l vm.smolvm.dev/smolvm=NAME` finds them.
    pub const LABEL_SMOLVM: &str = "vm.smolvm.dev/smolvm";
    /// On holder Pods: `"true"`. The holder admission policy admits the controller's Pods only
    /// with this label.
    pub const LABEL_HOLDER: &str = "vm.smolvm.dev/holder";
    /// The only value of [`LABEL_HOLDER`].
    pub const HOLDER_VALUE: &str = "true";
    /// On holder Pods: the SmolVM's `metadata.uid`, which the kubelet writes into the holder's
    /// identity volume for the agent to check.
    pub const ANNOTATION_SMOLVM_UID: &str = "vm.smolvm.dev/smolvm-uid";
    /// On claims made from a claim template: the volume of the SmolVM it was made for.
    pub const LABEL_VOLUME: &str = "vm.smolvm.dev/volume";
    /// The holder Pod's name is the SmolVM's name and this suffix.
    pub const HOLDER_SUFFIX: &str = "-holder";
    /// The holder's downward-API volume, whose files name its namespace and SmolVM UID.
    pub const IDENTITY_VOLUME: &str = "smolvm-holder-identity";
    /// File of [`IDENTITY_VOLUME`]: the holder's namespace.
    pub const IDENTITY_NAMESPACE_FILE: &str = "namespace";
    /// File of [`IDENTITY_VOLUME`]: the value of [`ANNOTATION_SMOLVM_UID`].
    pub const IDENTITY_SMOLVM_UID_FILE: &str = "smolvm-uid";
    /// The holder's one container.
    pub const HOLDER_CONTAINER: &str = "hold";
    /// The PriorityClass of holder Pods: above ordinary workloads, so that the scheduler never
    /// preempts a holder for them.
    pub const PRIORITY_CLASS: &str = "smolvm-holder";
    /// The header of the holder's preStop request that carries its release token.
    pub const RELEASE_TOKEN_HEADER: &str = "x-smolvm-release-token";
    /// The path of the agent's release hook (the holder's preStop `httpGet`).
    pub const RELEASE_PATH: &str = "/v1/holders/release";
    /// Default port of the agent's release hook, on the node's loopback (the kubelet shares
    /// the agent's host network namespace).
    pub const DEFAULT_RELEASE_PORT: u16 = 10262;
    /// Default of `spec.volumes[].claimTemplate.whenDeleted`.
    pub const DEFAULT_WHEN_DELETED: &str = "Retain";
}
