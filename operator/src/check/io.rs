//! The check's reads: one paged LIST of each resource (IPPools, IPAMNodes, IPAMBlocks,
//! Nodes, Pods, in that order: see the [module documentation](super)). No watch, no GET,
//! no write; the operator's role (`deploy/operator/rbac.yaml`) allows every one of them.

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tidepool_api as api;

use super::{Inputs, Report, check};
use crate::error::Error;

/// Objects per page of a LIST.
const PAGE: u32 = 500;

/// Lists every page of one resource, handing each object to `f`; each page must come within
/// `timeout`.
async fn list_all<K>(
    client: &Client,
    resource: &'static str,
    timeout: Duration,
    mut f: impl FnMut(K),
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = tokio::time::timeout(timeout, api.list(&params))
            .await
            .map_err(|_| Error::ListTimedOut {
                resource,
                after: timeout,
            })?
            .map_err(|source| Error::List { resource, source })?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        page.items.into_iter().for_each(&mut f);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Reads everything a check needs; each page must come within `timeout`.
pub async fn gather(client: &Client, timeout: Duration) -> Result<Inputs, Error> {
    let mut inputs = Inputs::new();
    list_all::<api::IPPool>(client, "ippools", timeout, |p| inputs.add_pool(p)).await?;
    list_all::<api::IPAMNode>(client, "ipamnodes", timeout, |n| inputs.add_ipam_node(&n)).await?;
    list_all::<api::IPAMBlock>(client, "ipamblocks", timeout, |b| inputs.add_block(&b)).await?;
    list_all::<Node>(client, "nodes", timeout, |n| inputs.add_node(&n)).await?;
    list_all::<Pod>(client, "pods", timeout, |p| inputs.add_pod(p)).await?;
    Ok(inputs)
}

/// The check against a server: [`gather`], then [`check`]. What `tidepool-operator check`
/// runs.
pub async fn run(client: &Client, timeout: Duration) -> Result<Report, Error> {
    let inputs = gather(client, timeout).await?;
    Ok(check(&inputs))
}
