//! The node side made real (DESIGN.md "Node agent"): the agent that serves a node's pods
//! their addresses from the node's pool, and `tidepool-cni`, the CNI IPAM plugin that
//! forwards each CNI request to it (issue 15; being built).
