//! Metric names: one constant per metric, grouped by the binary that exports it.

/// 1, labelled with the binary's version and commit (gauge; `version`, `commit`; every
/// binary).
pub const BUILD_INFO: &str = "tidepool_build_info";

/// Addresses by family and state, cluster-wide (gauge; `family`, `state`).
pub const IPS: &str = "tidepool_ipam_ips";
/// Nodes by category (gauge; `category`).
pub const NODES: &str = "tidepool_ipam_nodes";
/// Addresses of one IPPool (gauge; `pool`, `family`, `state`).
pub const POOL_IPS: &str = "tidepool_ipam_pool_ips";
/// Allocation calls to the IP source (counter; `source`, `outcome`).
pub const ALLOCATION_OPS_TOTAL: &str = "tidepool_ipam_allocation_ops_total";
/// Release calls to the IP source (counter; `source`, `outcome`).
pub const RELEASE_OPS_TOTAL: &str = "tidepool_ipam_release_ops_total";
/// Addresses granted to nodes (counter; `family`).
pub const IPS_ALLOCATED_TOTAL: &str = "tidepool_ipam_ips_allocated_total";
/// Addresses taken back from nodes (counter; `family`).
pub const IPS_RELEASED_TOTAL: &str = "tidepool_ipam_ips_released_total";
/// Duration of one allocate or release call to the source (histogram; `op`, `outcome`).
pub const ALLOCATION_DURATION_SECONDS: &str = "tidepool_ipam_allocation_duration_seconds";
/// `used` entries that are reclaim candidates right now (gauge).
pub const RECLAIM_CANDIDATES: &str = "tidepool_ipam_reclaim_candidates";
/// Reclaims (counter; `reason`, `outcome`).
pub const RECLAIMS_TOTAL: &str = "tidepool_ipam_reclaims_total";
/// Pod gone → tombstone written (histogram).
pub const RECLAIM_LATENCY_SECONDS: &str = "tidepool_ipam_reclaim_latency_seconds";
/// Periodic resyncs (counter).
pub const RESYNC_TOTAL: &str = "tidepool_ipam_resync_total";
/// Duration of one resync (histogram).
pub const RESYNC_DURATION_SECONDS: &str = "tidepool_ipam_resync_duration_seconds";
/// Trigger calls (counter; `trigger`).
pub const TRIGGER_QUEUED_TOTAL: &str = "tidepool_ipam_trigger_queued_total";
/// Trigger calls folded into one run (histogram; `trigger`).
pub const TRIGGER_FOLDS: &str = "tidepool_ipam_trigger_folds";
/// First queued trigger → run start (histogram; `trigger`).
pub const TRIGGER_LATENCY_SECONDS: &str = "tidepool_ipam_trigger_latency_seconds";
/// Duration of one triggered run (histogram; `trigger`).
pub const TRIGGER_DURATION_SECONDS: &str = "tidepool_ipam_trigger_duration_seconds";
/// Budgeted mutating API calls (counter; `api`, `op`, `outcome`).
pub const API_REQUESTS_TOTAL: &str = "tidepool_ipam_api_requests_total";
/// Time waited for a budget token (histogram; `api`).
pub const API_WAIT_SECONDS: &str = "tidepool_ipam_api_wait_seconds";
/// Issues found by repair (counter; `kind`).
pub const REPAIR_ISSUES_TOTAL: &str = "tidepool_ipam_repair_issues_total";
/// Addresses of one node (gauge; `node`, `family`, `state`; only with `--per-node-metrics`).
pub const NODE_IPS: &str = "tidepool_ipam_node_ips";
/// Pods bound to a node, not terminal, with no address of a family the node serves yet
/// (gauge; `family`).
pub const PODS_WAITING: &str = "tidepool_ipam_pods_waiting";
/// The operator's first sight of a pod waiting → its UID in the node's `used` list
/// (histogram).
pub const POD_IP_WAIT_SECONDS: &str = "tidepool_ipam_pod_ip_wait_seconds";
/// Claimed blocks of one IPPool by how used they are (gauge; `pool`, `family`, `state`).
pub const POOL_BLOCKS: &str = "tidepool_ipam_pool_blocks";
/// 1 while an IPPool is valid, 0 while it is Invalid (gauge; `pool`): the pool's `Valid`
/// condition, for alerts.
pub const POOL_VALID: &str = "tidepool_ipam_pool_valid";
/// A pool's scarcity pressure, (used + waiting + cooldown) / capacity (gauge; `pool`,
/// `family`).
pub const POOL_PRESSURE: &str = "tidepool_ipam_pool_pressure";
/// 1 while a pool is scarce, else 0 (gauge; `pool`, `family`).
pub const POOL_SCARCE: &str = "tidepool_ipam_pool_scarce";
/// The share of each node's pre-allocation a pool keeps: 1 unless scarce (gauge; `pool`,
/// `family`).
pub const POOL_PRE_ALLOCATE_RATIO: &str = "tidepool_ipam_pool_pre_allocate_ratio";
/// Addresses given back because their pool was scarce (counter; `pool`, `family`).
pub const SCARCITY_RELEASED_IPS_TOTAL: &str = "tidepool_ipam_scarcity_released_ips_total";
/// Seconds until a pool runs out at its pace of the last 6 hours, +Inf when it is not
/// shrinking (gauge; `pool`, `family`).
pub const POOL_EXHAUSTION_SECONDS: &str = "tidepool_ipam_pool_exhaustion_seconds";
/// 1 while this replica leads, else 0 (gauge).
pub const LEADER: &str = "tidepool_leader";
/// Times this replica became the leader (counter).
pub const LEADER_TRANSITIONS_TOTAL: &str = "tidepool_leader_transitions_total";
/// Writes not sent because this replica did not lead (counter).
pub const LEADER_WRITES_REFUSED_TOTAL: &str = "tidepool_leader_writes_refused_total";

/// CNI requests the node agent answered (counter; `verb`, `outcome`).
pub const AGENT_CNI_REQUESTS_TOTAL: &str = "tidepool_agent_cni_requests_total";
/// The node agent's receipt of a CNI request → its reply, durable write included (histogram;
/// `verb`).
pub const AGENT_CNI_DURATION_SECONDS: &str = "tidepool_agent_cni_duration_seconds";
/// Addresses of the agent's node (gauge; `family`, `state`).
pub const AGENT_IPS: &str = "tidepool_agent_ips";
/// CNI ADDs the node agent holds now for lack of a free address (gauge): the pods that
/// really wait for one (the pods-waiting alert keys on it).
pub const AGENT_ADDS_WAITING: &str = "tidepool_agent_adds_waiting";
/// The node agent's server-side applies of the node side's fields (counter; `outcome`).
pub const AGENT_STATUS_WRITES_TOTAL: &str = "tidepool_agent_status_writes_total";
/// Routes to other nodes' blocks the agent owns now (gauge; only with `--node-routes`).
pub const AGENT_NODE_ROUTES: &str = "tidepool_agent_node_routes";
/// The agent's route adds and deletes (counter; `op`, `outcome`; only with `--node-routes`).
pub const AGENT_NODE_ROUTE_OPS_TOTAL: &str = "tidepool_agent_node_route_ops_total";
